// RUN: etc-opt %s -split-input-file -etc-lower-to-cpu | FileCheck %s --implicit-check-not='{{^ *(%[^ ]+ = )?"?(amx|arith|cf|func|memref|scf|vector|x86vector)\.}}'

// The CPU matmul tiles' x86 instructions reach the LLVM dialect as LLVM's
// x86 intrinsics: AVX-512 BF16 dot products (x86vector.avx512.dot) and
// AMX tiles, whose accumulators cross the K loop as block arguments of
// type !llvm.x86_amx.

// CHECK-LABEL: llvm.func @dot(
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"(%{{.*}}, %{{.*}}, %{{.*}}) : (vector<16xf32>, vector<32xbf16>, vector<32xbf16>) -> vector<16xf32>
func.func @dot(%acc: vector<16xf32>, %a: memref<?x64xbf16>, %b: memref<?x64xbf16>) -> vector<16xf32> {
  %c0 = arith.constant 0 : index
  %va = vector.load %a[%c0, %c0] : memref<?x64xbf16>, vector<32xbf16>
  %vb = vector.load %b[%c0, %c0] : memref<?x64xbf16>, vector<32xbf16>
  %r = x86vector.avx512.dot %acc, %va, %vb : vector<32xbf16> -> vector<16xf32>
  return %r : vector<16xf32>
}

// -----

// CHECK-LABEL: llvm.func @tiles(
// CHECK:         %[[ZERO:.*]] = llvm.call_intrinsic "llvm.x86.tilezero.internal"
// CHECK:         llvm.br ^[[LOOP:bb[0-9]+]](%{{.*}}, %[[ZERO]] : i64, !llvm.x86_amx)
// CHECK:       ^[[LOOP]](%{{.*}}: i64, %[[ACC:.*]]: !llvm.x86_amx):
// CHECK:         %[[A:.*]] = llvm.call_intrinsic "llvm.x86.tileloadd64.internal"
// CHECK:         %[[B:.*]] = llvm.call_intrinsic "llvm.x86.tileloadd64.internal"
// CHECK:         %[[SUM:.*]] = llvm.call_intrinsic "llvm.x86.tdpbf16ps.internal"(%{{.*}}, %{{.*}}, %{{.*}}, %[[ACC]], %[[A]], %[[B]])
// CHECK:         llvm.br ^[[LOOP]](%{{.*}}, %[[SUM]] : i64, !llvm.x86_amx)
// CHECK:         llvm.call_intrinsic "llvm.x86.tilestored64.internal"
func.func @tiles(%a: memref<16x?xbf16>, %b: memref<?x32xbf16>, %c: memref<16x16xf32>, %k: index) {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %c32 = arith.constant 32 : index
  %zero = amx.tile_zero : !amx.tile<16x16xf32>
  %sum = scf.for %kk = %c0 to %k step %c32 iter_args(%acc = %zero) -> (!amx.tile<16x16xf32>) {
    %pairs = arith.divui %kk, %c16 : index
    %ta = amx.tile_load %a[%c0, %kk] : memref<16x?xbf16> into !amx.tile<16x32xbf16>
    %tb = amx.tile_load %b[%pairs, %c0] : memref<?x32xbf16> into !amx.tile<16x32xbf16>
    %next = amx.tile_mulf %ta, %tb, %acc : !amx.tile<16x32xbf16>, !amx.tile<16x32xbf16>, !amx.tile<16x16xf32>
    scf.yield %next : !amx.tile<16x16xf32>
  }
  amx.tile_store %c[%c0, %c0], %sum : memref<16x16xf32>, !amx.tile<16x16xf32>
  return
}
