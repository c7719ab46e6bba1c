// RUN: etc-opt %s -split-input-file -convert-event-to-gpu=watchdog-ms=250 -verify-diagnostics | FileCheck %s --enable-var-scope

// event.stall, in the sited copy of a tile function the worker calls out of
// line: each
// lane on its own reads %globaltimer and keeps the start of its wait; once
// the wait has lasted 1 ms (2^20 ns) it calls @__etc_stall_check, out of
// line (noinline: its work must not hold the tile's registers), with the
// counter buffer, the time stalled, the site (task, tile rank, the tile
// padded to 4 coordinates) and the barrier (address, stage, role 0 = full,
// parity). The check loads the run's status, and once the wait outlives
// the watchdog (250 ms here) while the run goes on, writes the error record
// (site kind 3, a barrier: the element (stage, role, parity), the
// barrier's low state word loaded from shared memory); it returns whether
// to give up (stopped or expired). The unused original of the tile
// function is dropped.

// CHECK-LABEL: gpu.module @g_kernels
// CHECK-NOT:     @g_tile(
// CHECK:         func.func private @g_tile_sited(
// CHECK-SAME:        %[[ADDRESS:[^:]*]]: index, %[[SINCE:[^:]*]]: i64, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[TASK:[^:]*]]: index, %[[I:[^:]*]]: index)
// CHECK:           %[[C1:.*]] = arith.constant 1 : index
// CHECK:           %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK:           %[[FIRST:.*]] = arith.cmpi eq, %[[SINCE]], %{{.*}} : i64
// CHECK:           %[[START:.*]] = arith.select %[[FIRST]], %[[NOW]], %[[SINCE]] : i64
// CHECK:           %[[STALLED:.*]] = arith.subi %[[NOW]], %[[START]] : i64
// CHECK:           %[[CHECK:.*]] = arith.constant 1048576 : i64
// CHECK:           %[[LATE:.*]] = arith.cmpi sgt, %[[STALLED]], %[[CHECK]] : i64
// CHECK:           %[[GIVE_UP:.*]] = scf.if %[[LATE]] -> (i1) {
// CHECK-DAG:         %[[RANK:.*]] = arith.constant 1 : i32
// CHECK-DAG:         %[[FULL:.*]] = arith.constant 0 : i32
// CHECK:             %[[STOP:.*]] = func.call @__etc_stall_check(%[[COUNTERS]], %[[STALLED]], %[[TASK]], %[[RANK]], %[[I]], %{{.*}}, %{{.*}}, %{{.*}}, %[[ADDRESS]], %[[C1]], %[[FULL]], %[[C1]]) : (memref<?xi32>, i64, index, i32, index, index, index, index, index, index, i32, index) -> i1
// CHECK:             scf.yield %[[STOP]] : i1
// CHECK:           } else {
// CHECK:             %[[NO:.*]] = arith.constant false
// CHECK:             scf.yield %[[NO]] : i1
// CHECK:           }
// CHECK-NOT:       event.stall
// CHECK:           arith.extui %[[GIVE_UP]] : i1 to i64

// CHECK:         func.func private @__etc_stall_check(
// CHECK-SAME:        %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[STALLED:[^:]*]]: i64, %[[TASK:[^:]*]]: index, %[[RANK:[^:]*]]: i32,
// CHECK-SAME:        %[[T0:[^:]*]]: index, %[[T1:[^:]*]]: index, %[[T2:[^:]*]]: index, %[[T3:[^:]*]]: index,
// CHECK-SAME:        %[[ADDRESS:[^:]*]]: index, %[[STAGE:[^:]*]]: index, %[[ROLE:[^:]*]]: i32, %[[PARITY:[^:]*]]: index) -> i1
// CHECK-SAME:        attributes {passthrough = ["noinline"]}
// CHECK:           %[[STATUS:.*]] = llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[STOPPED:.*]] = arith.cmpi ne, %[[STATUS]], %{{.*}} : i32
// CHECK:           %[[LIMIT:.*]] = arith.constant 250000000 : i64
// CHECK:           %[[EXPIRED:.*]] = arith.cmpi sgt, %[[STALLED]], %[[LIMIT]] : i64
// CHECK:           %[[GOING:.*]] = arith.xori %[[STOPPED]], %{{.*}} : i1
// CHECK:           %[[REPORT:.*]] = arith.andi %[[EXPIRED]], %[[GOING]] : i1
// CHECK:           scf.if %[[REPORT]] {
// CHECK:             %[[KIND:.*]] = arith.constant 3 : i32
// CHECK:             %[[WORKER:.*]] = gpu.block_id x
// CHECK:             %[[WORKER32:.*]] = arith.index_cast %[[WORKER]] : index to i32
// CHECK:             %[[TASK32:.*]] = arith.index_cast %[[TASK]] : index to i32
// CHECK:             %[[T0_32:.*]] = arith.index_cast %[[T0]] : index to i32
// CHECK:             %[[T1_32:.*]] = arith.index_cast %[[T1]] : index to i32
// CHECK:             %[[T2_32:.*]] = arith.index_cast %[[T2]] : index to i32
// CHECK:             %[[T3_32:.*]] = arith.index_cast %[[T3]] : index to i32
// CHECK:             %[[NO_EVENT:.*]] = arith.constant -1 : i32
// CHECK:             %[[ELEMENT_RANK:.*]] = arith.constant 3 : i32
// CHECK:             %[[STAGE32:.*]] = arith.index_cast %[[STAGE]] : index to i32
// CHECK:             %[[PARITY32:.*]] = arith.index_cast %[[PARITY]] : index to i32
// CHECK:             %[[PAD:.*]] = arith.constant 0 : i32
// CHECK:             %[[WORD:.*]] = arith.index_cast %[[ADDRESS]] : index to i64
// CHECK:             %[[SHARED:.*]] = llvm.inttoptr %[[WORD]] : i64 to !llvm.ptr<3>
// CHECK:             %[[STATE:.*]] = llvm.load volatile %[[SHARED]] {alignment = 8 : i64} : !llvm.ptr<3> -> i32
// CHECK:             %[[MS:.*]] = arith.divsi %[[STALLED]], %{{.*}} : i64
// CHECK:             %[[MS32:.*]] = arith.trunci %[[MS]] : i64 to i32
// CHECK:             llvm.call @__etc_watchdog_report(%{{.*}}, %[[KIND]], %[[WORKER32]], %[[TASK32]], %[[RANK]], %[[T0_32]], %[[T1_32]], %[[T2_32]], %[[T3_32]], %[[NO_EVENT]], %[[ELEMENT_RANK]], %[[STAGE32]], %[[ROLE]], %[[PARITY32]], %[[PAD]], %[[STATE]], %[[MS32]]) : (!llvm.ptr, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32) -> ()
// CHECK:           }
// CHECK:           %[[GIVE:.*]] = arith.ori %[[STOPPED]], %[[EXPIRED]] : i1
// CHECK:           return %[[GIVE]] : i1

func.func private @g_tile(%address: index, %since: i64, %out: memref<?xi64>) attributes {event.tile} {
  %c1 = arith.constant 1 : index
  %start, %give_up = event.stall "full" barrier(%address) stage(%c1) parity(%c1) since(%since)
  memref.store %start, %out[%c1] : memref<?xi64>
  return
}
func.func private @g_tile_sited(%address: index, %since: i64, %out: memref<?xi64>, %counters: memref<?xi32>, %task: index, %i: index) attributes {event.tile} {
  %c1 = arith.constant 1 : index
  %start, %give_up = event.stall "full" barrier(%address) stage(%c1) parity(%c1) since(%since) on %counters site(%task, %i) : memref<?xi32>
  %stop = arith.extui %give_up : i1 to i64
  %both = arith.addi %start, %stop : i64
  memref.store %both, %out[%c1] : memref<?xi64>
  return
}
func.func @g_worker(%counters: memref<?xi32>, %address: index, %since: i64, %out: memref<?xi64>)
    attributes {event.graph = "g", event.schedule = "static", event.workers = 2 : i64} {
  %w = event.worker_id
  func.call @g_tile_sited(%address, %since, %out, %counters, %w, %w) : (index, i64, memref<?xi64>, memref<?xi32>, index, index) -> ()
  return
}

// -----

// In a tile function inlined into the worker (`alwaysinline`: the
// known-rows and warp-specialised Hopper tiles), the check is inline: a
// call among a warp-specialised consumer's live accumulators spills them
// at its register bound. The same status load, watchdog limit and record.

// CHECK-LABEL: gpu.module @i_kernels
// CHECK:         func.func private @i_tile(
// CHECK-SAME:        %[[ADDRESS:[^:]*]]: index, %[[SINCE:[^:]*]]: i64, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[TASK:[^:]*]]: index, %[[I:[^:]*]]: index)
// CHECK-SAME:        passthrough = ["alwaysinline"]
// CHECK:           %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK:           %[[STALLED:.*]] = arith.subi %[[NOW]], %{{.*}} : i64
// CHECK:           %[[LATE:.*]] = arith.cmpi sgt, %[[STALLED]], %{{.*}} : i64
// CHECK:           %[[GIVE_UP:.*]] = scf.if %[[LATE]] -> (i1) {
// CHECK-NOT:         func.call
// CHECK:             %[[STATUS:.*]] = llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[STOPPED:.*]] = arith.cmpi ne, %[[STATUS]], %{{.*}} : i32
// CHECK:             %[[LIMIT:.*]] = arith.constant 250000000 : i64
// CHECK:             %[[EXPIRED:.*]] = arith.cmpi sgt, %[[STALLED]], %[[LIMIT]] : i64
// CHECK:             scf.if %{{.*}} {
// CHECK:               %[[EMPTY:.*]] = arith.constant 1 : i32
// CHECK:               %[[KIND:.*]] = arith.constant 3 : i32
// CHECK:               %[[TASK32:.*]] = arith.index_cast %[[TASK]] : index to i32
// CHECK:               %[[I32:.*]] = arith.index_cast %[[I]] : index to i32
// CHECK:               %[[STATE:.*]] = llvm.load volatile %{{.*}} {alignment = 8 : i64} : !llvm.ptr<3> -> i32
// CHECK:               llvm.call @__etc_watchdog_report(%{{.*}}, %[[KIND]], %{{.*}}, %[[TASK32]], %{{.*}}, %[[I32]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[EMPTY]], %{{.*}}, %{{.*}}, %[[STATE]], %{{.*}})
// CHECK:             }
// CHECK:             %[[STOP:.*]] = arith.ori %[[STOPPED]], %[[EXPIRED]] : i1
// CHECK:             scf.yield %[[STOP]] : i1
// CHECK:           } else {
// CHECK-NOT:       event.stall
// CHECK:           arith.extui %[[GIVE_UP]] : i1 to i64

func.func private @i_tile(%address: index, %since: i64, %out: memref<?xi64>, %counters: memref<?xi32>, %task: index, %i: index) attributes {event.tile, passthrough = ["alwaysinline"]} {
  %c1 = arith.constant 1 : index
  %start, %give_up = event.stall "empty" barrier(%address) stage(%c1) parity(%c1) since(%since) on %counters site(%task, %i) : memref<?xi32>
  %stop = arith.extui %give_up : i1 to i64
  %both = arith.addi %start, %stop : i64
  memref.store %both, %out[%c1] : memref<?xi64>
  return
}
func.func @i_worker(%counters: memref<?xi32>, %address: index, %since: i64, %out: memref<?xi64>)
    attributes {event.graph = "i", event.schedule = "static", event.workers = 2 : i64} {
  %w = event.worker_id
  func.call @i_tile(%address, %since, %out, %counters, %w, %w) : (index, i64, memref<?xi64>, memref<?xi32>, index, index) -> ()
  return
}

// -----

func.func private @h_tile(%address: index, %since: i64, %out: memref<?xi64>) attributes {event.tile} {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.stall' op has no counter buffer and site: only a tile function that a schedule (event-static-schedule, event-dynamic-schedule) calls can stall on a barrier, and the schedule gives its stalls those}}
  %start, %give_up = event.stall "empty" barrier(%address) stage(%c1) parity(%c1) since(%since)
  memref.store %start, %out[%c1] : memref<?xi64>
  return
}
func.func @h_worker(%address: index, %since: i64, %out: memref<?xi64>)
    attributes {event.graph = "h", event.schedule = "static", event.workers = 2 : i64} {
  %w = event.worker_id
  func.call @h_tile(%address, %since, %out) : (index, i64, memref<?xi64>) -> ()
  return
}
