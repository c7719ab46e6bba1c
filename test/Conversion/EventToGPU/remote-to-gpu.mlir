// RUN: etc-opt %s -event-static-schedule=workers=2 -convert-event-to-gpu | FileCheck %s --enable-var-scope
// RUN: etc-opt %s -event-static-schedule=workers=2 -convert-event-to-gpu | FileCheck %s --check-prefix=SPIN

// A graph on two ranks, scheduled, then lowered for CUDA: the kernels call
// NVSHMEM's device API, declared in the gpu.module and left external for
// the link with NVSHMEM's device library. The rank is nvshmem_my_pe();
// every thread of the CTA issues the row puts together
// (nvshmemx_putmem_nbi_block); thread 0 completes them (nvshmem_quiet) and
// decrements the remote counter (nvshmem_int_atomic_add of -1).

// CHECK-LABEL: gpu.module @gather_kernels
// CHECK-DAG:     llvm.func @nvshmem_my_pe() -> i32
// CHECK-DAG:     llvm.func @nvshmemx_putmem_nbi_block(!llvm.ptr, !llvm.ptr, i64, i32)
// CHECK-DAG:     llvm.func @nvshmem_quiet()
// CHECK-DAG:     llvm.func @nvshmem_int_atomic_add(!llvm.ptr, i32, i32)
// CHECK-LABEL:   gpu.func @gather_worker(
// CHECK:           %[[PE:.*]] = llvm.call @nvshmem_my_pe() : () -> i32
// CHECK:           scf.for
// CHECK:             llvm.call @nvshmemx_putmem_nbi_block(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
// CHECK:             llvm.call @nvshmem_quiet() : () -> ()
// CHECK-NEXT:        %[[MINUS:.*]] = arith.constant -1 : i32
// CHECK-NEXT:        llvm.call @nvshmem_int_atomic_add(%{{.*}}, %[[MINUS]], %{{.*}}) : (!llvm.ptr, i32, i32) -> ()

// The tile of "use" waits on a symmetric element (other GPUs notify it,
// after their puts) and on a local one. PTX orders another GPU's writes
// only at system scope: the symmetric wait polls relaxed at system scope
// (no syncscope), inline then in @__etc_spin_counter_system, and issues
// its own system-scope acquire fence, although the static schedule marks
// it deferred. The local wait keeps the GPU scope and leaves its fence to
// the tile's event.acquire (GPU scope).
// CHECK:           %[[SYMCOUNT:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           arith.cmpi sle, %[[SYMCOUNT]]
// CHECK:             func.call @__etc_spin_counter_system(
// CHECK:           }
// CHECK-NEXT:      llvm.fence acquire
// CHECK-NEXT:    }
// CHECK:         scf.if
// CHECK:           %[[LOCALCOUNT:.*]] = llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           arith.cmpi sle, %[[LOCALCOUNT]]
// CHECK:             func.call @__etc_spin_counter(
// CHECK:           }
// CHECK-NEXT:    }
// CHECK-NOT:     llvm.fence
// CHECK:         scf.if
// CHECK-NEXT:      llvm.fence syncscope("device") acquire
// CHECK-NEXT:    }
// CHECK-NOT:     event.wait
// CHECK-NOT:     event.acquire

// The system spin: the GPU spin with relaxed loads at system scope, for
// the element and for the run's status word; the GPU-scope one stays.
// SPIN-LABEL: func.func private @__etc_spin_counter_system(
// SPIN:         scf.while
// SPIN:           llvm.load %arg1 atomic monotonic {alignment = 4 : i64}
// SPIN:           nvvm.nanosleep
// SPIN:           llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64}
// SPIN-NOT:     syncscope
// SPIN:         return
// SPIN-LABEL: func.func private @__etc_spin_counter(
// SPIN:           llvm.load %arg1 atomic syncscope("device") monotonic

event.graph @gather(%x: memref<32x64xf32>, %y: memref<64x64xf32>,
                    %z: memref<64x64xf32>,
                    %g: memref<64x64xf32> {event.intermediate, event.symmetric})
    attributes {event.ranks = 2 : i64} {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %e = event.alloc() count(%c1) : !event.tensor<4, symmetric>
  %l = event.alloc() count(%c1) : !event.tensor<4>
  event.task "send" grid(%c2, %c2)
      reads(%x : memref<32x64xf32> (d0, d1) -> (d0 * 16, 0) [16, ?])
      notifies(%e : !event.tensor<4, symmetric> (d0, d1)[s0] -> (d1, s0 * 2 + d0)) {
  ^bb0(%i: index, %p: index):
    %me = event.rank_id
    %row = arith.muli %i, %c16 : index
    %block = arith.muli %me, %c2 : index
    %first = arith.addi %block, %i : index
    %at = arith.muli %first, %c16 : index
    %c0 = arith.constant 0 : index
    event.put %x[%row, %c0] [%c16, %c64] to %g[%at, %c0] rank(%p) : memref<32x64xf32>, memref<64x64xf32>
  }
  event.task "prep" grid(%c4)
      writes(%z : memref<64x64xf32> (d0) -> (d0 * 16, 0) [16, ?])
      notifies(%l : !event.tensor<4> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "use" grid(%c4)
      reads(%g : memref<64x64xf32> (d0) -> (d0 * 16, 0) [16, ?],
            %z : memref<64x64xf32> (d0) -> (d0 * 16, 0) [16, ?])
      writes(%y : memref<64x64xf32> (d0) -> (d0 * 16, 0) [16, ?])
      waits(%e : !event.tensor<4, symmetric> (d0) -> (d0),
            %l : !event.tensor<4> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}
