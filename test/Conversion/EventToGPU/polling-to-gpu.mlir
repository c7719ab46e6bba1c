// RUN: etc-opt %s -split-input-file -convert-event-to-gpu | FileCheck %s --enable-var-scope

// The polling ops of the dynamic schedule on several ranks, for a CTA:
// thread 0 of the worker does the work and the CTA shares its answer.

// event.queue_try_pop: between two barriers (the broadcast word is free,
// then written), thread 0 runs the pop that never waits at GPU scope. Its
// loads of the slot are relaxed (an acquire load would invalidate the SM's
// L1 at every retry); one GPU-scope acquire fence follows when it took a
// task (a result below the capacity), and the broadcast word hands the
// task to every thread.

// CHECK-LABEL: gpu.func @g_worker(
// CHECK-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[N:[^:]*]]: index, %[[Q:[^:]*]]: index)
// CHECK-SAME:      workgroup(%[[WORD:.*]] : memref<1xi32, #gpu.address_space<workgroup>>)
// CHECK:         gpu.barrier
// CHECK:         scf.if
// CHECK:           scf.while
// CHECK:             llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             llvm.cmpxchg %{{.*}}, %{{.*}}, %{{.*}} syncscope("device") monotonic monotonic
// CHECK:           %[[TOOK:.*]] = arith.cmpi ult, %[[TASK:.*]], %{{.*}} : i32
// CHECK:           scf.if %[[TOOK]] {
// CHECK-NEXT:        llvm.fence syncscope("device") acquire
// CHECK:           memref.store %[[TASK]], %[[WORD]][%{{.*}}] : memref<1xi32, #gpu.address_space<workgroup>>
// CHECK:         gpu.barrier
// CHECK:         %[[GOT:.*]] = memref.load %[[WORD]][%{{.*}}] : memref<1xi32, #gpu.address_space<workgroup>>
// CHECK:         arith.index_castui %[[GOT]] : i32 to index
// CHECK-NOT:     event.queue_try_pop

func.func @g_worker(%counters: memref<?xi32>, %n: index, %q: index)
    attributes {event.graph = "g", event.schedule = "dynamic", event.workers = 2 : i64} {
  %t = event.queue_try_pop %counters[%q] capacity(%n) : memref<?xi32>
  %c0 = arith.constant 0 : index
  %v = arith.index_cast %t : index to i32
  memref.store %v, %counters[%c0] : memref<?xi32>
  return
}

// -----

// event.test: thread 0 loads the counter relaxed and, if it is no longer
// positive, acquires with a fence; a reducing barrier (bar.red.or) gives
// every thread the answer and orders the CTA after thread 0's acquire. A
// symmetric event's counter is notified by other GPUs (NVSHMEM atomics),
// so its load and fence are at system scope (no syncscope); a local
// event's at GPU scope.

// CHECK-LABEL: gpu.func @g_worker(
// CHECK:         %[[SYM:.*]] = scf.if %{{.*}} -> (i1) {
// CHECK:           %[[COUNT:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[READY:.*]] = arith.cmpi sle, %[[COUNT]], %{{.*}} : i32
// CHECK:           scf.if %[[READY]] {
// CHECK-NEXT:        llvm.fence acquire
// CHECK:           scf.yield %[[READY]] : i1
// CHECK:         } else {
// CHECK:         %[[WORD:.*]] = arith.extui %[[SYM]] : i1 to i32
// CHECK:         nvvm.barrier #nvvm.reduction<or> %[[WORD]] -> i32
// CHECK:         %[[LOCAL:.*]] = scf.if %{{.*}} -> (i1) {
// CHECK:           %[[COUNT2:.*]] = llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[READY2:.*]] = arith.cmpi sle, %[[COUNT2]], %{{.*}} : i32
// CHECK:           scf.if %[[READY2]] {
// CHECK-NEXT:        llvm.fence syncscope("device") acquire
// CHECK:         nvvm.barrier #nvvm.reduction<or>
// CHECK-NOT:     event.test

func.func @g_worker(%counters: memref<?xi32>, %n: index)
    attributes {event.graph = "g", event.schedule = "dynamic", event.workers = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4, symmetric>
  %f = event.view %counters[%c1](%n) : memref<?xi32> -> !event.tensor<?>
  %a = event.test %e[%c1] : !event.tensor<4, symmetric>
  %b = event.test %f[%c0] : !event.tensor<?>
  %both = arith.andi %a, %b : i1
  %v = arith.extui %both : i1 to i32
  memref.store %v, %counters[%c0] : memref<?xi32>
  return
}

// -----

// event.idle: every thread reads %globaltimer and keeps its idle start
// (the clock when `since` is 0); thread 0 alone checks the watchdog and,
// once the worker has been idle longer than it allows while the run goes
// on, writes the error record (the element's counter, loaded relaxed at
// system scope for a symmetric event, and the op's site); then every
// thread backs off with a short nanosleep that grows with the idle time
// (its sixteenth, 32 to 512 ns).

// CHECK-LABEL: gpu.func @g_worker(
// CHECK-SAME:      %[[SINCE:[^:]*]]: i64
// CHECK:         %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK:         %[[FIRST:.*]] = arith.cmpi eq, %[[SINCE]], %{{.*}} : i64
// CHECK:         %[[START:.*]] = arith.select %[[FIRST]], %[[NOW]], %[[SINCE]] : i64
// CHECK:         %[[IDLE:.*]] = arith.subi %[[NOW]], %[[START]] : i64
// CHECK:         scf.if %{{.*}} {
// CHECK:           %[[EXPIRED:.*]] = arith.cmpi sgt, %[[IDLE]], %{{.*}} : i64
// CHECK:           scf.if %{{.*}} {
// CHECK:             llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             llvm.call @__etc_watchdog_report(
// CHECK:         %[[SIXTEENTH:.*]] = arith.shrui %[[IDLE]], %{{.*}} : i64
// CHECK:         %[[AT_LEAST:.*]] = arith.maxui %[[SIXTEENTH]], %{{.*}} : i64
// CHECK:         %[[AT_MOST:.*]] = arith.minui %[[AT_LEAST]], %{{.*}} : i64
// CHECK:         %[[SLEEP:.*]] = arith.trunci %[[AT_MOST]] : i64 to i32
// CHECK:         nvvm.nanosleep %[[SLEEP]]
// CHECK:         nvvm.read.ptx.sreg.globaltimer : i64
// CHECK:         scf.if %{{.*}} {
// CHECK:             llvm.call @__etc_watchdog_report(
// CHECK:         nvvm.nanosleep
// CHECK-NOT:     event.idle
// CHECK:         gpu.return

func.func @g_worker(%counters: memref<?xi32>, %since: i64)
    attributes {event.graph = "g", event.schedule = "dynamic", event.workers = 2 : i64} {
  %c0 = arith.constant 0 : index
  %task = arith.constant 1 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<3, symmetric>
  %start = event.idle %counters since(%since) on %e[%c0] site(%task, %c0) : memref<?xi32>, !event.tensor<3, symmetric>
  %other = event.idle %counters since(%start) : memref<?xi32>
  %v = arith.trunci %other : i64 to i32
  memref.store %v, %counters[%c0] : memref<?xi32>
  return
}

// -----

// event.claim (the static schedule's policy=claim): between two barriers,
// thread 0 increments the element relaxed at GPU scope and hands the old
// value to every thread through the broadcast word.

// CHECK-LABEL: gpu.func @g_worker(
// CHECK-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[NEXT:[^:]*]]: index)
// CHECK-SAME:      workgroup(%[[WORD:.*]] : memref<1xi32, #gpu.address_space<workgroup>>)
// CHECK:         gpu.barrier
// CHECK:         scf.if
// CHECK:           %[[OLD:.*]] = llvm.atomicrmw add %{{.*}}, %{{.*}} syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:           %[[T:.*]] = arith.index_castui %[[OLD]] : i32 to index
// CHECK:           %[[T32:.*]] = arith.index_castui %[[T]] : index to i32
// CHECK:           memref.store %[[T32]], %[[WORD]][%{{.*}}] : memref<1xi32, #gpu.address_space<workgroup>>
// CHECK:         gpu.barrier
// CHECK:         %[[GOT:.*]] = memref.load %[[WORD]][%{{.*}}] : memref<1xi32, #gpu.address_space<workgroup>>
// CHECK:         arith.index_castui %[[GOT]] : i32 to index
// CHECK-NOT:     event.claim

func.func @g_worker(%counters: memref<?xi32>, %next: index)
    attributes {event.graph = "g", event.schedule = "static", event.workers = 2 : i64} {
  %t = event.claim %counters[%next] : memref<?xi32>
  %c0 = arith.constant 0 : index
  %v = arith.index_cast %t : index to i32
  memref.store %v, %counters[%c0] : memref<?xi32>
  return
}
