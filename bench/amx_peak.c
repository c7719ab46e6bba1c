// The bf16 peak of this CPU, for the floors of docs/benchmarks.md: tight
// loops of independent tdpbf16ps (AMX), vdpbf16ps (AVX-512 BF16) or
// vfmadd231ps, per thread in CPU time and over all threads in wall time.
//
//   gcc -O2 -march=native -mamx-tile -mamx-bf16 -pthread bench/amx_peak.c -o /tmp/amx_peak
//   /tmp/amx_peak THREADS MODE [ITERATIONS]
//
// MODE 0: tdpbf16ps on 2 x 2 accumulator tiles (the GEMM tile's pattern);
// 2: tdpbf16ps on 6 accumulators sharing one pair of operands; 1:
// vdpbf16ps on 24 zmm accumulators; 3: vfmadd231ps on 24.
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double cpu_now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

typedef struct { uint8_t palette, start; uint8_t pad[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static long ITERS = 20000000;
static int MODE = 0;
static double result_cpu[8];

static void *amx(void *arg) {
  int id = (int)(long)arg;
  cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int i = 0; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
  _tile_loadconfig(&c);
  static __attribute__((aligned(64))) uint16_t buf[16 * 32];
  _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  double t0 = cpu_now();
  for (long i = 0; i < ITERS; i++) {
    if (MODE == 2) { _tile_dpbf16ps(0, 6, 7); _tile_dpbf16ps(1, 6, 7); _tile_dpbf16ps(2, 6, 7); _tile_dpbf16ps(3, 6, 7); _tile_dpbf16ps(4, 6, 7); _tile_dpbf16ps(5, 6, 7); }
    else { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
  }
  result_cpu[id] = cpu_now() - t0;
  static __attribute__((aligned(64))) float out[256];
  _tile_stored(0, out, 64); _tile_release();
  return NULL;
}

static void *avx(void *arg) {
  int id = (int)(long)arg;
  __m512 acc[24]; for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps(0);
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = a;
  double t0 = cpu_now();
  for (long i = 0; i < ITERS; i++) {

    if (MODE == 3) {
#pragma GCC unroll 24
 for (int j = 0; j < 24; j++) acc[j] = _mm512_fmadd_ps((__m512)a, (__m512)b, acc[j]); }
    else {
#pragma GCC unroll 24
 for (int j = 0; j < 24; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b); }
    __asm__ volatile("" : "+v"(a));
  }
  result_cpu[id] = cpu_now() - t0;
  float s = 0; for (int i = 0; i < 24; i++) s += _mm512_reduce_add_ps(acc[i]);
  if (s == 1.2345f) printf("x");
  return NULL;
}

int main(int argc, char **argv) {
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { perror("arch_prctl"); return 1; }
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  MODE = argc > 2 ? atoi(argv[2]) : 0;
  if (argc > 3) ITERS = atol(argv[3]);
  pthread_t t[8];
  double w0 = now();
  for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, MODE & 1 ? avx : amx, (void *)(long)i);
  for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
  double wall = now() - w0;
  // flops per iteration: AMX 4 x (16*16*32*2); AVX 24 x (16*32)
  double flops = MODE == 3 ? 24.0 * 16 * 2 : MODE == 1 ? 24.0 * 16 * 2 * 2 : (MODE == 2 ? 6.0 : 4.0) * 16 * 16 * 32 * 2;
  flops *= ITERS;
  for (int i = 0; i < threads; i++)
    printf("%s thread %d: %.1f GFLOP/s (cpu time %.3f s)\n", MODE == 3 ? "vfmadd231ps" : MODE == 1 ? "vdpbf16ps" : "tdpbf16ps", i, flops / result_cpu[i] / 1e9, result_cpu[i]);
  printf("%s %d threads: %.1f GFLOP/s wall (%.3f s)\n", MODE == 3 ? "vfmadd231ps" : MODE == 1 ? "vdpbf16ps" : "tdpbf16ps", threads, threads * flops / wall / 1e9, wall);
  return 0;
}
