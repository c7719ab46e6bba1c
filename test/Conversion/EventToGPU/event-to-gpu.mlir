// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -convert-event-to-gpu -verify-diagnostics | FileCheck %s
// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -convert-event-to-gpu=watchdog-ms=250 -verify-diagnostics | FileCheck %s --check-prefix=LIMIT

// LIMIT-LABEL: func.func private @__etc_spin_counter(
// LIMIT:         arith.constant 250000000 : i64

// The worker becomes a kernel: workers are blocks, lanes are threads. A wait
// has thread 0 load the counter with a GPU-scope relaxed load and, unless it
// is ready, call the out-of-line spin (defined in the gpu.module), which
// polls with relaxed loads and an exponential nanosleep back-off, bounded by
// the watchdog (the run's status, %globaltimer; the first to time out
// reports its site, which names the block); then one GPU-scope acquire
// fence and a CTA barrier. A notify is a CTA barrier, then
// thread 0's GPU-scope release fence and atomic decrement.

// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK-NOT:   func.func @
// CHECK:       gpu.module @g_kernels {
// CHECK-LABEL:   func.func private @__etc_spin_counter(
// CHECK-SAME:        %{{[^:]*}}: memref<?xi32>, %[[ELEMENT:[^:]*]]: !llvm.ptr,
// CHECK-SAME:        attributes {passthrough = ["noinline"]}
// CHECK:           %[[FIRSTSLEEP:.*]] = arith.constant 32 : i32
// CHECK:           scf.while (%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %[[FIRSTSLEEP]]) : (i64, i1, i32) -> (i64, i1, i32, i32) {
// CHECK:             %[[COUNT:.*]] = llvm.load %[[ELEMENT]] atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[READY:.*]] = arith.cmpi sle, %[[COUNT]], %{{.*}} : i32
// CHECK:           } do {
// CHECK:           ^bb0(%{{.*}}: i64, %{{.*}}: i1, %[[SLEPT:.*]]: i32, %{{.*}}: i32):
// CHECK:             nvvm.nanosleep %[[SLEPT]]
// CHECK:             %[[DOUBLED:.*]] = arith.addi %[[SLEPT]], %[[SLEPT]] : i32
// CHECK:             %[[MAXSLEEP:.*]] = arith.constant 512 : i32
// CHECK:             %[[NEXT:.*]] = arith.minui %[[DOUBLED]], %[[MAXSLEEP]] : i32
// CHECK:             llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK:             arith.constant 5000000000 : i64
// CHECK:             scf.if %{{.*}} {
// CHECK:               llvm.call @__etc_watchdog_report(
// CHECK:             }
// CHECK:             scf.yield %{{.*}}, %{{.*}}, %[[NEXT]] : i64, i1, i32
// CHECK:           }
// CHECK-LABEL:   llvm.func internal @__etc_watchdog_report(
// CHECK:           llvm.atomicrmw add %{{.*}}, %{{.*}} syncscope("device") monotonic
// CHECK:           llvm.fence syncscope("device") release
// CHECK:           llvm.store %{{.*}}, %{{.*}} atomic syncscope("device") monotonic
// CHECK-LABEL:   gpu.func @g_worker(
// CHECK-SAME:        %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>) kernel {
// CHECK-DAG:       %[[C5:.*]] = arith.constant 5 : index
// CHECK:           %[[ADDRESS:.*]] = memref.extract_aligned_pointer_as_index %[[COUNTERS]] : memref<?xi32> -> index
// CHECK:           %[[ADDRESS64:.*]] = arith.index_castui %[[ADDRESS]] : index to i64
// CHECK:           %[[BASE:.*]] = llvm.inttoptr %[[ADDRESS64]] : i64 to !llvm.ptr
// CHECK:           %[[OFFSET:.*]] = arith.index_cast %[[C5]] : index to i64
// CHECK:           %[[VIEW:.*]] = llvm.getelementptr %[[BASE]][%[[OFFSET]]] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:           %[[W:.*]] = gpu.block_id x
// CHECK:           %[[NW:.*]] = gpu.grid_dim x
// CHECK:           scf.for %[[T:.*]] = %[[W]] to %[[N]] step %[[NW]] {
// CHECK:             %[[T64:.*]] = arith.index_cast %[[T]] : index to i64
// CHECK:             %[[WAITED:.*]] = llvm.getelementptr %[[VIEW]][%[[T64]]] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:             %[[TID:.*]] = gpu.thread_id x
// CHECK:             %[[C0:.*]] = arith.constant 0 : index
// CHECK:             %[[FIRST:.*]] = arith.cmpi eq, %[[TID]], %[[C0]] : index
// CHECK:             scf.if %[[FIRST]] {
// CHECK:               %[[BLOCK:.*]] = gpu.block_id x
// CHECK:               %[[WORKER:.*]] = arith.index_cast %[[BLOCK]] : index to i32
// CHECK:               %[[COUNT:.*]] = llvm.load %[[WAITED]] atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:               %[[READY:.*]] = arith.cmpi sle, %[[COUNT]], %{{.*}} : i32
// CHECK:               scf.if %[[READY]] -> (i32) {
// CHECK:               } else {
// CHECK:                 func.call @__etc_spin_counter(%[[COUNTERS]], %[[WAITED]], %{{.*}}, %[[WORKER]], {{.*}}) : (memref<?xi32>, !llvm.ptr, {{.*}}) -> i32
// CHECK:               }
// CHECK-NEXT:          llvm.fence syncscope("device") acquire
// CHECK-NEXT:        }
// CHECK-NEXT:        gpu.barrier
// CHECK:             %[[LANE:.*]] = gpu.thread_id x
// CHECK:             %[[LANES:.*]] = gpu.block_dim x
// CHECK:             "test.body"(%[[T]], %[[LANE]], %[[LANES]])
// CHECK-NEXT:        gpu.barrier
// CHECK-NEXT:        "test.body"(%[[T]])
// CHECK:             %[[NOTIFIED:.*]] = llvm.getelementptr %[[VIEW]][%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK-NEXT:        gpu.barrier
// CHECK-NEXT:        %[[TID:.*]] = gpu.thread_id x
// CHECK-NEXT:        %[[C0:.*]] = arith.constant 0 : index
// CHECK-NEXT:        %[[FIRST:.*]] = arith.cmpi eq, %[[TID]], %[[C0]] : index
// CHECK-NEXT:        scf.if %[[FIRST]] {
// CHECK-NEXT:          %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-NEXT:          llvm.fence syncscope("device") release
// CHECK-NEXT:          llvm.atomicrmw sub %[[NOTIFIED]], %[[ONE]] syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK-NEXT:        }
// CHECK-NEXT:      }
// CHECK-NEXT:      gpu.return
// CHECK-NOT:   event.
func.func @g_worker(%n: index, %counters: memref<?xi32>) attributes {event.graph = "g"} {
  %c5 = arith.constant 5 : index
  %e = event.view %counters[%c5](%n) : memref<?xi32> -> !event.tensor<?>
  %w = event.worker_id
  %nw = event.worker_count
  scf.for %t = %w to %n step %nw {
    event.wait %e[%t] : !event.tensor<?>
    %lane = event.lane_id
    %lanes = event.lane_count
    "test.body"(%t, %lane, %lanes) : (index, index, index) -> ()
    event.lane_barrier
    "test.body"(%t) : (index) -> ()
    event.notify %e[%t] : !event.tensor<?>
  }
  return
}

// -----

// A tile with several waits acquires once: each `deferred` wait is thread
// 0's relaxed poll (and spin) only, and `event.acquire` is thread 0's
// GPU-scope acquire fence, then one CTA barrier.

// CHECK-LABEL: gpu.func @a_worker(
// CHECK:         scf.if %{{.*}} {
// CHECK:           llvm.load %{{.*}} atomic syncscope("device") monotonic
// CHECK:           func.call @__etc_spin_counter(
// CHECK:         {{^ *}}}{{$}}
// CHECK-NOT:     llvm.fence
// CHECK-NOT:     gpu.barrier
// CHECK:         scf.if %{{.*}} {
// CHECK:           llvm.load %{{.*}} atomic syncscope("device") monotonic
// CHECK:           func.call @__etc_spin_counter(
// CHECK:         {{^ *}}}{{$}}
// CHECK-NOT:     gpu.barrier
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      llvm.fence syncscope("device") acquire
// CHECK-NEXT:    }
// CHECK-NEXT:    gpu.barrier
// CHECK-NEXT:    "test.body"
func.func @a_worker(%n: index, %counters: memref<?xi32>) attributes {event.graph = "a"} {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  %w = event.worker_id
  event.wait %e[%w] deferred : !event.tensor<?>
  event.wait %e[%c0] deferred : !event.tensor<?>
  event.acquire
  "test.body"(%w) : (index) -> ()
  return
}

// -----

// A prefetch is a loop of the CTA's threads over the box's 128-byte lines
// (rows of the last dimension; at most 2048), each a prefetch.global.L2 of
// the line's address: the buffer's aligned pointer plus the byte offset of
// the row's first element (offsets and row coordinates dotted with the
// strides) plus 128 bytes per line, in inline PTX (LLVM selects its
// prefetch intrinsic only for sm_90).

// CHECK-LABEL: gpu.func @p_worker(
// CHECK-SAME:      %[[W:[^:]*]]: memref<64x32xbf16>, %[[I:[^:]*]]: index, %[[J:[^:]*]]: index, %[[ROWS:[^:]*]]: index, %[[COLS:[^:]*]]: index
// CHECK:           %{{.*}}, %[[OFFSET:.*]], %{{.*}}:2, %[[STRIDES:.*]]:2 = memref.extract_strided_metadata %[[W]]
// CHECK:           %[[BASE:.*]] = memref.extract_aligned_pointer_as_index %[[W]]
// CHECK:           %[[C2:.*]] = arith.constant 2 : index
// CHECK-NEXT:      %[[ROWBYTES:.*]] = arith.muli %[[COLS]], %[[C2]] : index
// CHECK-NEXT:      %[[C128:.*]] = arith.constant 128 : index
// CHECK-NEXT:      %[[PERROW:.*]] = arith.ceildivui %[[ROWBYTES]], %[[C128]] : index
// CHECK-NEXT:      %[[C2048:.*]] = arith.constant 2048 : index
// CHECK-NEXT:      %[[ALL:.*]] = arith.muli %{{.*}}, %[[PERROW]] : index
// CHECK-NEXT:      %[[LINES:.*]] = arith.minui %[[ALL]], %[[C2048]] : index
// CHECK-NEXT:      %[[TID:.*]] = gpu.thread_id  x
// CHECK-NEXT:      %[[NTID:.*]] = gpu.block_dim  x
// CHECK-NEXT:      scf.for %[[LINE:.*]] = %[[TID]] to %[[LINES]] step %[[NTID]] {
// CHECK-NEXT:        %[[ROW:.*]] = arith.divui %[[LINE]], %[[PERROW]] : index
// CHECK-NEXT:        %[[COL:.*]] = arith.remui %[[LINE]], %[[PERROW]] : index
// CHECK-NEXT:        %[[E1:.*]] = arith.muli %[[J]], %[[STRIDES]]#1 : index
// CHECK-NEXT:        %[[S1:.*]] = arith.addi %[[OFFSET]], %[[E1]] : index
// CHECK-NEXT:        %[[R:.*]] = arith.addi %[[I]], %[[ROW]] : index
// CHECK-NEXT:        %[[E0:.*]] = arith.muli %[[R]], %[[STRIDES]]#0 : index
// CHECK-NEXT:        %[[ELEMENT:.*]] = arith.addi %[[S1]], %[[E0]] : index
// CHECK-NEXT:        %[[LINE128:.*]] = arith.constant 128 : index
// CHECK-NEXT:        %[[INLINE:.*]] = arith.muli %[[COL]], %[[LINE128]] : index
// CHECK-NEXT:        %[[BYTES:.*]] = arith.constant 2 : index
// CHECK-NEXT:        %[[FIRST:.*]] = arith.muli %[[ELEMENT]], %[[BYTES]] : index
// CHECK-NEXT:        %[[BYTE:.*]] = arith.addi %[[FIRST]], %[[INLINE]] : index
// CHECK-NEXT:        %[[AT:.*]] = arith.addi %[[BASE]], %[[BYTE]] : index
// CHECK-NEXT:        %[[AT64:.*]] = arith.index_castui %[[AT]] : index to i64
// CHECK-NEXT:        llvm.inline_asm has_side_effects asm_dialect = att "{{.*}}cvta.to.global.u64 %g, $0;{{.*}}prefetch.global.L2 [%g];{{.*}}", "l" %[[AT64]] : (i64) -> ()
// CHECK-NEXT:      }
func.func @p_worker(%w: memref<64x32xbf16>, %i: index, %j: index, %rows: index, %cols: index, %counters: memref<?xi32>) attributes {event.graph = "p"} {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%rows) : memref<?xi32> -> !event.tensor<?>
  event.prefetch %w[%i, %j] [%rows, %cols] : memref<64x32xbf16>
  event.wait %e[%i] : !event.tensor<?>
  return
}

// -----

// An acquire right before a run_aborted leaves the barrier to the latter's
// reducing barrier.

// CHECK-LABEL: gpu.func @r_worker(
// CHECK:           func.call @__etc_spin_counter(
// CHECK-NOT:     gpu.barrier
// CHECK:           llvm.fence syncscope("device") acquire
// CHECK-NEXT:    }
// CHECK-NOT:     gpu.barrier
// CHECK:         nvvm.barrier #nvvm.reduction<or>
func.func @r_worker(%n: index, %counters: memref<?xi32>) attributes {event.graph = "r"} {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  %w = event.worker_id
  event.wait %e[%w] deferred : !event.tensor<?>
  event.acquire
  %stopped = event.run_aborted %counters : memref<?xi32>
  "test.use"(%stopped) : (i1) -> ()
  return
}

// -----

// A function with a result reports it through one more argument, written by
// thread 0 of block 0 (an index as i64). Functions without `event.graph`
// stay on the host; each graph has its own gpu.module.

// CHECK-LABEL: func.func @host_helper()
// CHECK:       gpu.module @a_kernels {
// CHECK-LABEL:   gpu.func @a_counters(
// CHECK-SAME:        %[[N:[^:]*]]: index, %[[RESULT:[^:]*]]: memref<1xi64>) kernel {
// CHECK:           %[[TOTAL:.*]] = arith.muli %[[N]], %[[N]] : index
// CHECK:           %[[TOTAL64:.*]] = arith.index_cast %[[TOTAL]] : index to i64
// CHECK:           %[[BLOCK:.*]] = gpu.block_id x
// CHECK:           %[[C0:.*]] = arith.constant 0 : index
// CHECK:           %[[FIRSTBLOCK:.*]] = arith.cmpi eq, %[[BLOCK]], %[[C0]] : index
// CHECK:           %[[TID:.*]] = gpu.thread_id x
// CHECK:           %[[FIRSTTHREAD:.*]] = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK:           %[[FIRST:.*]] = arith.andi %[[FIRSTBLOCK]], %[[FIRSTTHREAD]] : i1
// CHECK:           scf.if %[[FIRST]] {
// CHECK:             memref.store %[[TOTAL64]], %[[RESULT]][%[[C0]]] : memref<1xi64>
// CHECK:           }
// CHECK:           gpu.return
// CHECK:       gpu.module @b_kernels {
// CHECK-LABEL:   gpu.func @b_check(
// CHECK-SAME:        %{{.*}}: memref<?xi32>, %[[RESULT:[^:]*]]: memref<1xi32>) kernel {
// CHECK:             memref.store %{{.*}}, %[[RESULT]][%{{.*}}] : memref<1xi32>
func.func @host_helper() {
  return
}
func.func @a_counters(%n: index) -> index attributes {event.graph = "a"} {
  %total = arith.muli %n, %n : index
  return %total : index
}
func.func @b_check(%counters: memref<?xi32>) -> i32 attributes {event.graph = "b"} {
  %c0 = arith.constant 0 : index
  %first = memref.load %counters[%c0] : memref<?xi32>
  return %first : i32
}

// -----

// The initialisation kernel runs on one CTA: a loop that only stores is
// strided over the threads, a loop that reads counters it writes (counting
// notifies at run time) runs on thread 0, and a barrier follows each (one
// per run of consecutive thread-0 ops).

// CHECK-LABEL: gpu.func @g_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[ROUTE:[^:]*]]: memref<?xi32>, %[[COUNTERS:[^:]*]]: memref<?xi32>) kernel {
// CHECK-DAG:     %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:.*]] = arith.constant 1 : index
// CHECK:         %[[TID:.*]] = gpu.thread_id x
// CHECK:         %[[THREADS:.*]] = gpu.block_dim x
// CHECK:         %[[OFFSET:.*]] = arith.muli %[[TID]], %[[C1]] : index
// CHECK:         %[[START:.*]] = arith.addi %[[C0]], %[[OFFSET]] : index
// CHECK:         %[[STEP:.*]] = arith.muli %[[C1]], %[[THREADS]] : index
// CHECK:         scf.for %[[I:.*]] = %[[START]] to %[[N]] step %[[STEP]] {
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[I]]] : memref<?xi32>
// CHECK-NEXT:    }
// CHECK-NEXT:    gpu.barrier
// CHECK-NEXT:    %[[TID:.*]] = gpu.thread_id x
// CHECK-NEXT:    %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-NEXT:    %[[FIRST:.*]] = arith.cmpi eq, %[[TID]], %[[ZERO]] : index
// CHECK-NEXT:    scf.if %[[FIRST]] {
// CHECK-NEXT:      scf.for %[[T:.*]] = %[[C0]] to %[[N]] step %[[C1]] {
// CHECK:             memref.load %[[COUNTERS]]
// CHECK:             memref.store %{{.*}}, %[[COUNTERS]]
// CHECK:           }
// A store outside loops runs on thread 0 too, in the same block as the
// thread-0 op before it (only ops without memory effects between them);
// a read-only op runs on every thread, after the barrier.
// CHECK-NEXT:      memref.store %{{.*}}, %[[ROUTE]][%[[C0]]] : memref<?xi32>
// CHECK-NEXT:    }
// CHECK-NEXT:    gpu.barrier
// CHECK-NEXT:    %{{.*}} = memref.load %[[COUNTERS]][%[[C0]]] : memref<?xi32>
// CHECK-NEXT:    gpu.return
func.func @g_init(%n: index, %route: memref<?xi32>, %counters: memref<?xi32>) attributes {event.graph = "g"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i32
  %one = arith.constant 1 : i32
  scf.for %i = %c0 to %n step %c1 {
    memref.store %zero, %counters[%i] : memref<?xi32>
  }
  scf.for %t = %c0 to %n step %c1 {
    %raw = memref.load %route[%t] : memref<?xi32>
    %at = arith.index_cast %raw : i32 to index
    %old = memref.load %counters[%at] : memref<?xi32>
    %new = arith.addi %old, %one : i32
    memref.store %new, %counters[%at] : memref<?xi32>
  }
  memref.store %zero, %route[%c0] : memref<?xi32>
  %first = memref.load %counters[%c0] : memref<?xi32>
  return
}

// -----

// expected-error @+1 {{'func.func' op uses worker ops and returns a value; the persistent worker kernel cannot return one}}
func.func @g_worker(%n: index) -> index attributes {event.graph = "g"} {
  %w = event.worker_id
  return %w : index
}

// -----

// expected-error @+1 {{'func.func' op returns 2 values; a kernel can report at most one}}
func.func @g_counters(%n: index) -> (index, index) attributes {event.graph = "g"} {
  return %n, %n : index, index
}

// -----

// expected-error @+1 {{'func.func' op returns 'memref<?xi32>'; a kernel can report an index, integer or float}}
func.func @g_counters(%counters: memref<?xi32>) -> memref<?xi32> attributes {event.graph = "g"} {
  return %counters : memref<?xi32>
}

// -----

// expected-error @+1 {{'func.func' op uses the symbol 'g_kernels' that convert-event-to-gpu needs for the kernels of graph 'g'}}
func.func @g_kernels() {
  return
}
func.func @g_init() attributes {event.graph = "g"} {
  return
}

// -----

// An op with unknown effects runs on thread 0, and makes every loop that
// reads a buffer run on thread 0 too: it might write that buffer.

// CHECK-LABEL: gpu.func @g_init(
// CHECK-SAME:      %[[INPUT:[^:]*]]: memref<?xi32>, %[[COUNTERS:[^:]*]]: memref<?xi32>) kernel {
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      "test.opaque"() : () -> ()
// CHECK-NEXT:      scf.for
// CHECK-NEXT:        memref.load %[[INPUT]]
// CHECK-NEXT:        memref.store
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:    gpu.barrier
// CHECK-NEXT:    gpu.return
func.func @g_init(%input: memref<?xi32>, %counters: memref<?xi32>) attributes {event.graph = "g"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  "test.opaque"() : () -> ()
  scf.for %i = %c0 to %c8 step %c1 {
    %v = memref.load %input[%i] : memref<?xi32>
    memref.store %v, %counters[%i] : memref<?xi32>
  }
  return
}

// -----

// A loop the scheduler marks `event.independent` is strided over the
// threads although it reads what the kernel wrote before it; its per-lane
// pushes are each thread's own.

// CHECK-LABEL: gpu.func @g_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>) kernel {
// CHECK:         scf.if
// CHECK:           memref.store
// CHECK:         gpu.barrier
// CHECK:         %[[TID:.*]] = gpu.thread_id x
// CHECK:         %[[THREADS:.*]] = gpu.block_dim x
// CHECK:         %[[OFFSET:.*]] = arith.muli %[[TID]], %{{.*}} : index
// CHECK:         %[[START:.*]] = arith.addi %{{.*}}, %[[OFFSET]] : index
// CHECK:         %[[STEP:.*]] = arith.muli %{{.*}}, %[[THREADS]] : index
// CHECK:         scf.for %[[I:.*]] = %[[START]] to %[[N]] step %[[STEP]] {
// CHECK:           memref.load %[[COUNTERS]]
// CHECK-NOT:       gpu.thread_id
// CHECK:           llvm.atomicrmw add
// CHECK:           llvm.store %{{.*}}, %{{.*}} atomic syncscope("device") release
// CHECK:         } {event.independent}
// CHECK-NEXT:    gpu.barrier
func.func @g_init(%n: index, %counters: memref<?xi32>) attributes {event.graph = "g"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0 : i32
  memref.store %zero, %counters[%c0] : memref<?xi32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %counters[%c0] : memref<?xi32>
    %ready = arith.cmpi eq, %v, %zero : i32
    scf.if %ready {
      event.queue_push %i, %counters[%c8] capacity(%n) per_lane : memref<?xi32>
    }
  } {event.independent}
  return
}

// -----

// A marked loop nested in a top-level op that writes nothing else (a loop
// over tasks counting their tiles' notifies with atomics): the op runs on
// every thread and only the marked loop is strided.

// CHECK-LABEL: gpu.func @g_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>) kernel {
// CHECK-NOT:     scf.if
// CHECK:         scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      %[[TILES:.*]] = memref.load %[[COUNTERS]][%[[K]]]
// CHECK:           %[[TID:.*]] = gpu.thread_id x
// CHECK:           %[[THREADS:.*]] = gpu.block_dim x
// CHECK:           %[[OFFSET:.*]] = arith.muli %[[TID]], %{{.*}} : index
// CHECK:           %[[START:.*]] = arith.addi %{{.*}}, %[[OFFSET]] : index
// CHECK:           %[[STEP:.*]] = arith.muli %{{.*}}, %[[THREADS]] : index
// CHECK:           scf.for %{{.*}} = %[[START]] to %{{.*}} step %[[STEP]] {
// CHECK:             memref.atomic_rmw addi
// CHECK:           } {event.independent}
// CHECK:         }
// CHECK-NEXT:    gpu.barrier
func.func @g_init(%n: index, %counters: memref<?xi32>) attributes {event.graph = "g"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = arith.constant 1 : i32
  scf.for %k = %c0 to %n step %c1 {
    %raw = memref.load %counters[%k] : memref<?xi32>
    %tiles = arith.index_cast %raw : i32 to index
    scf.for %t = %c0 to %tiles step %c1 {
      %old = memref.atomic_rmw addi %one, %counters[%t] : (i32, memref<?xi32>) -> i32
    } {event.independent}
  }
  return
}

// -----

func.func @g_init(%counters: memref<?xi32>) attributes {event.graph = "g"} {
  %c0 = arith.constant 0 : index
  %one = arith.constant 1 : i32
  // expected-error @+1 {{'memref.atomic_rmw' op writes memory and has results, so it cannot run on one thread of the initialisation kernel}}
  %old = memref.atomic_rmw addi %one, %counters[%c0] : (i32, memref<?xi32>) -> i32
  return
}

// -----

// Dynamic scheduling: a worker kernel that pops tasks gets a broadcast word
// in shared memory. A pop has thread 0 claim a slot and wait until it is
// published (a relaxed load, then the out-of-line spin, then one acquire
// fence; a spin that gives up, the run being stopped, yields the capacity)
// and hands it to the CTA through the broadcast word between two barriers.
// A notify_ready has thread 0 decrement with a release fence and acquire (a
// fence) only when it took the element to zero, and hands the result to the
// CTA with one barrier that reduces it (`bar.red.or`). A push is thread 0
// reserving a slot and publishing `task + 1` with a release store, or
// raising the error flag.

// CHECK-LABEL: gpu.func @d_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>)
// CHECK-SAME:      workgroup(%[[WORD:.*]] : memref<1xi32, #gpu.address_space<workgroup>>)
// CHECK-SAME:      kernel {
// CHECK:         %[[Q:.*]] = arith.constant 4 : index
// CHECK:         scf.while
// CHECK:           %[[C0:.*]] = arith.constant 0 : index
// CHECK-NEXT:      gpu.barrier
// CHECK:           scf.if %{{.*}} {
// CHECK:             %[[HEAD:.*]] = llvm.getelementptr %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:             %[[SLOT:.*]] = llvm.atomicrmw add %[[HEAD]], %{{.*}} syncscope("device") monotonic
// CHECK:             %[[SLOTINDEX:.*]] = arith.index_castui %[[SLOT]] : i32 to index
// CHECK:             %[[FITS:.*]] = arith.cmpi ult, %[[SLOTINDEX]], %[[N]] : index
// CHECK:             %[[TASK:.*]] = scf.if %[[FITS]] -> (i32) {
// CHECK:               llvm.load %{{.*}} atomic syncscope("device") monotonic
// CHECK:               arith.cmpi ne
// CHECK:               func.call @__etc_spin_slot(
// CHECK:               }
// CHECK-NEXT:          llvm.fence syncscope("device") acquire
// CHECK:               arith.select
// CHECK:               arith.subi
// CHECK:             } else {
// CHECK:               %[[EXHAUSTED:.*]] = arith.index_castui %[[N]] : index to i32
// CHECK:               scf.yield %[[EXHAUSTED]] : i32
// CHECK:             }
// CHECK:             memref.store %[[TASK]], %[[WORD]][%[[C0]]] : memref<1xi32, #gpu.address_space<workgroup>>
// CHECK:           }
// CHECK-NEXT:      gpu.barrier
// CHECK-NEXT:      %[[POPPED:.*]] = memref.load %[[WORD]][%[[C0]]]
// CHECK-NEXT:      %[[ID:.*]] = arith.index_castui %[[POPPED]] : i32 to index
// CHECK:         } do {
// The notify has no branch before its reducing barrier: every thread adds,
// thread 0 -1 and the others 0; after the barrier every thread acquires
// when thread 0 took the element to zero.
// CHECK:           gpu.barrier
// CHECK-NEXT:      llvm.fence syncscope("device") release
// CHECK-NEXT:      %[[TID:.*]] = gpu.thread_id  x
// CHECK-NEXT:      %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-NEXT:      %[[FIRST:.*]] = arith.cmpi eq, %[[TID]], %[[ZERO]] : index
// CHECK-NEXT:      %[[ADD0:.*]] = arith.constant 0 : i32
// CHECK-NEXT:      %[[SUB1:.*]] = arith.constant -1 : i32
// CHECK-NEXT:      %[[AMOUNT:.*]] = arith.select %[[FIRST]], %[[SUB1]], %[[ADD0]] : i32
// CHECK-NEXT:      %[[OLD:.*]] = llvm.atomicrmw add %{{.*}}, %[[AMOUNT]] syncscope("device") monotonic
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-NEXT:      %[[TOOK:.*]] = arith.cmpi eq, %[[OLD]], %[[ONE]] : i32
// CHECK-NEXT:      %[[MINE:.*]] = arith.andi %[[FIRST]], %[[TOOK]] : i1
// CHECK-NEXT:      %[[FLAG:.*]] = arith.extui %[[MINE]] : i1 to i32
// CHECK-NEXT:      %[[ANY:.*]] = nvvm.barrier #nvvm.reduction<or> %[[FLAG]] -> i32
// CHECK-NEXT:      %[[NONE:.*]] = arith.constant 0 : i32
// CHECK-NEXT:      %[[READY:.*]] = arith.cmpi ne, %[[ANY]], %[[NONE]] : i32
// CHECK-NEXT:      scf.if %[[READY]] {
// CHECK-NEXT:        llvm.fence syncscope("device") acquire
// CHECK-NEXT:      }
// CHECK:           scf.if %[[READY]] {
// CHECK:             scf.if %{{.*}} {
// CHECK:               %[[TAIL:.*]] = llvm.getelementptr
// CHECK:               %[[RESERVED:.*]] = llvm.atomicrmw add %[[TAIL]], %{{.*}} syncscope("device") monotonic
// CHECK:               scf.if %{{.*}} {
// CHECK:                 llvm.store %{{.*}}, %{{.*}} atomic syncscope("device") release {alignment = 4 : i64} : i32, !llvm.ptr
// CHECK:               } else {
// CHECK:                 llvm.store %{{.*}}, %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : i32, !llvm.ptr
// CHECK:               }
// CHECK:             }
// CHECK:           }
func.func @d_worker(%n: index, %counters: memref<?xi32>) attributes {event.graph = "d"} {
  %c0 = arith.constant 0 : index
  %q = arith.constant 4 : index
  %pending = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  %last = scf.while : () -> index {
    %id = event.queue_pop %counters[%q] capacity(%n) : memref<?xi32>
    %more = arith.cmpi ult, %id, %n : index
    scf.condition(%more) %id : index
  } do {
  ^bb0(%id: index):
    %ready = event.notify_ready %pending[%id] : !event.tensor<?>
    scf.if %ready {
      event.queue_push %id, %counters[%q] capacity(%n) : memref<?xi32>
    }
    scf.yield
  }
  return
}

// -----

// A tile with several notifies publishes its writes once: `event.release` is
// a CTA barrier and thread 0's GPU-scope release fence, and each `released`
// notify is thread 0's relaxed decrement, without barrier or fence. A
// `released` notify_ready has no release fence and no barrier but the
// `bar.red.or` that hands its result to the CTA. `per_lane` ops are each
// thread's own: a push without the thread-0 guard, a notify_ready without
// barriers, with a release fence and an acquire fence when it took the
// element to zero.

// CHECK-LABEL: gpu.func @n_worker(
// CHECK:         "test.body"
// CHECK-NEXT:    gpu.barrier
// CHECK-NEXT:    %[[TID:.*]] = gpu.thread_id x
// CHECK-NEXT:    %[[C0:.*]] = arith.constant 0 : index
// CHECK-NEXT:    %[[FIRST:.*]] = arith.cmpi eq, %[[TID]], %[[C0]] : index
// CHECK-NEXT:    scf.if %[[FIRST]] {
// CHECK-NEXT:      llvm.fence syncscope("device") release
// CHECK-NEXT:    {{^ *}}}{{$}}
// CHECK-NOT:     gpu.barrier
// CHECK-NOT:     llvm.fence
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      arith.constant 1 : i32
// CHECK-NEXT:      llvm.atomicrmw sub %{{.*}}, %{{.*}} syncscope("device") monotonic
// CHECK-NEXT:    {{^ *}}}{{$}}
// CHECK-NOT:     gpu.barrier
// CHECK-NOT:     llvm.fence
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      arith.constant 1 : i32
// CHECK-NEXT:      llvm.atomicrmw sub %{{.*}}, %{{.*}} syncscope("device") monotonic
// CHECK-NEXT:    {{^ *}}}{{$}}
// CHECK-NOT:     gpu.barrier
// CHECK-NOT:     llvm.fence
// CHECK:         gpu.thread_id x
// CHECK-NEXT:    arith.constant 0 : index
// CHECK-NEXT:    arith.cmpi eq
// CHECK-NEXT:    arith.constant 0 : i32
// CHECK-NEXT:    arith.constant -1 : i32
// CHECK-NEXT:    arith.select
// CHECK-NEXT:    llvm.atomicrmw add %{{.*}}, %{{.*}} syncscope("device") monotonic
// CHECK:         nvvm.barrier #nvvm.reduction<or>
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      llvm.fence syncscope("device") acquire
// CHECK-NEXT:    {{^ *}}}{{$}}
// CHECK-NOT:     gpu.barrier
// CHECK:         %[[PENDING:.*]] = llvm.getelementptr
// CHECK-NEXT:    arith.constant 1 : i32
// CHECK-NEXT:    llvm.fence syncscope("device") release
// CHECK-NEXT:    llvm.atomicrmw sub %[[PENDING]], %{{.*}} syncscope("device") monotonic
// CHECK-NEXT:    arith.constant 1 : i32
// CHECK-NEXT:    %[[MINE:.*]] = arith.cmpi eq
// CHECK-NEXT:    scf.if %[[MINE]] {
// CHECK-NEXT:      llvm.fence syncscope("device") acquire
// CHECK-NEXT:    {{^ *}}}{{$}}
// CHECK-NEXT:    scf.if %[[MINE]] {
// CHECK:           arith.constant 1 : i32
// CHECK:           llvm.atomicrmw add
// CHECK:           llvm.store %{{.*}}, %{{.*}} atomic syncscope("device") release
// CHECK:         gpu.return
func.func @n_worker(%n: index, %counters: memref<?xi32>) attributes {event.graph = "n"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %q = arith.constant 8 : index
  %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  %w = event.worker_id
  "test.body"(%w) : (index) -> ()
  event.release
  event.notify %e[%w] released : !event.tensor<?>
  event.notify %e[%c1] released : !event.tensor<?>
  %ready = event.notify_ready %e[%c0] released : !event.tensor<?>
  %lane = event.lane_id
  %last = event.notify_ready %e[%lane] per_lane : !event.tensor<?>
  scf.if %last {
    event.queue_push %lane, %counters[%q] capacity(%n) per_lane : memref<?xi32>
  }
  return
}

// -----

// Tile functions (and what they call) are copied into the gpu.module, where
// their lane ops become thread queries; the host copies are then dead and
// erased.

// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK-NOT:   func.func private @t_tile
// CHECK:       gpu.module @t_kernels {
// CHECK:         gpu.func @t_worker(
// CHECK:           func.call @t_tile_0(%{{.*}}, %{{.*}}) : (memref<?xf32>, index) -> ()
// CHECK-DAG:     func.func private @t_tile_0(%{{.*}}: memref<?xf32>, %{{.*}}: index) attributes {event.tile} {
// CHECK-DAG:       gpu.thread_id x
// CHECK-DAG:       gpu.block_dim x
// CHECK-DAG:       func.call @t_helper(
// CHECK-DAG:     func.func private @t_helper(
func.func private @t_helper(%x: memref<?xf32>, %i: index) {
  %v = arith.constant 1.0 : f32
  memref.store %v, %x[%i] : memref<?xf32>
  return
}
func.func private @t_tile_0(%x: memref<?xf32>, %i: index) attributes {event.tile} {
  %lane = event.lane_id
  %lanes = event.lane_count
  scf.for %e = %lane to %i step %lanes {
    func.call @t_helper(%x, %e) : (memref<?xf32>, index) -> ()
  }
  return
}
func.func @t_worker(%x: memref<?xf32>, %n: index) attributes {event.graph = "t"} {
  %w = event.worker_id
  func.call @t_tile_0(%x, %w) : (memref<?xf32>, index) -> ()
  return
}

// -----

// A call of a function the module does not define cannot run on the device.

func.func private @host_only(%i: index)
func.func @u_worker(%n: index) attributes {event.graph = "u"} {
  %w = event.worker_id
  // expected-error @+1 {{'func.call' op uses 'host_only', which is not a function or memref.global defined in the module}}
  func.call @host_only(%w) : (index) -> ()
  return
}

// -----

// A lane reduction is a shuffle butterfly within the warp; scratch memory is
// a view of the CTA's arena of dynamic shared memory, used through generic
// addresses. The module records the arena's size.

// CHECK-LABEL: module attributes {event.dynamic_shared_bytes = {r_kernels = 512 : i64}
// CHECK-LABEL: gpu.module @r_kernels
// CHECK-NOT:     memref.global
// CHECK:         gpu.func @r_worker(
// CHECK:           %[[W16:.*]] = arith.constant 16 : i32
// CHECK:           %[[S16:.*]], %{{.*}} = gpu.shuffle  xor %{{.*}}, %[[W16]], %{{.*}} : f32
// CHECK:           %[[A16:.*]] = arith.addf %{{.*}}, %[[S16]] : f32
// CHECK:           gpu.shuffle  xor %[[A16]], %{{.*}} : f32
// CHECK:           gpu.shuffle  xor
// CHECK:           gpu.shuffle  xor
// CHECK:           %[[S1:.*]], %{{.*}} = gpu.shuffle  xor
// CHECK:           %[[SUM:.*]] = arith.addf %{{.*}}, %[[S1]] : f32
// CHECK:           %[[A:.*]] = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
// CHECK:           %[[AT:.*]] = arith.constant 0 : index
// CHECK:           %[[V:.*]] = memref.view %[[A]][%[[AT]]][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<4x32xf32, #gpu.address_space<workgroup>>
// CHECK:           %[[P:.*]] = memref.memory_space_cast %[[V]] : memref<4x32xf32, #gpu.address_space<workgroup>> to memref<4x32xf32>
// CHECK:           memref.store %[[SUM]], %[[P]]
func.func @r_worker(%x: f32) attributes {event.graph = "r"} {
  %w = event.worker_id
  %c0 = arith.constant 0 : index
  %sum = event.lane_reduce "add" %x {group = 32} : f32
  %partials = event.scratch : memref<4x32xf32>
  memref.store %sum, %partials[%c0, %c0] : memref<4x32xf32>
  return
}

// -----

// `event.run_aborted` gives every thread of the CTA thread 0's reading of
// the run's status (the run header ends the counter buffer) with one
// barrier that reduces it (`bar.red.or`); `event.trace_begin` has thread 0 store the block, task,
// tile and %globaltimer; `event.trace_end` waits for every thread, then
// thread 0 stores %globaltimer.

// CHECK-LABEL: gpu.func @h_worker(
// CHECK-SAME:      ) kernel {
// CHECK-NOT:     gpu.barrier
// CHECK:         %[[MINE:.*]] = scf.if %{{.*}} -> (i1) {
// CHECK:           memref.dim
// CHECK:           %[[STATUS:.*]] = llvm.load %{{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[NOTRUNNING:.*]] = arith.cmpi ne, %[[STATUS]], %{{.*}} : i32
// CHECK:           scf.yield %[[NOTRUNNING]] : i1
// CHECK-NEXT:    } else {
// CHECK:         }
// CHECK-NEXT:    %[[FLAG:.*]] = arith.extui %[[MINE]] : i1 to i32
// CHECK-NEXT:    %[[ANY:.*]] = nvvm.barrier #nvvm.reduction<or> %[[FLAG]] -> i32
// CHECK-NEXT:    %[[NONE:.*]] = arith.constant 0 : i32
// CHECK-NEXT:    %[[STOPPED:.*]] = arith.cmpi ne, %[[ANY]], %[[NONE]] : i32
// CHECK:         "test.use"(%[[STOPPED]])
// CHECK:         scf.if %{{.*}} {
// CHECK-DAG:       %[[BLOCK:.*]] = gpu.block_id x
// CHECK-DAG:       %[[START:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK:           arith.index_cast %[[BLOCK]] : index to i32
// CHECK:           arith.trunci %[[START]] : i64 to i32
// CHECK:         gpu.barrier
// CHECK:         scf.if %{{.*}} {
// CHECK:           %[[END:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK:           arith.trunci %[[END]] : i64 to i32
// CHECK:         gpu.return
func.func @h_worker(%counters: memref<?xi32>, %record: index) attributes {event.graph = "h"} {
  %w = event.worker_id
  %stopped = event.run_aborted %counters : memref<?xi32>
  "test.use"(%stopped) : (i1) -> ()
  event.trace_begin %counters[%record] task(%w) tile(%w) : memref<?xi32>
  event.trace_end %counters[%record] : memref<?xi32>
  return
}

// -----

// The schedulers' task and event tables are for the front end, which reads
// them from the scheduled program; the lowering drops them.

// CHECK-LABEL: gpu.module @t_kernels
// CHECK:         gpu.func @t_worker() kernel {
func.func @t_worker() attributes {event.graph = "t", event.tasks = [{grid_rank = 1 : i64, name = "copy_0"}], event.events = [{name = "e0", notified_by = ["copy_0"], waited_by = []}]} {
  %w = event.worker_id
  return
}

// -----

// Scratch buffers share one arena per CTA (a CTA runs one tile at a time):
// each function's start at offset 0, 16-byte aligned one after another, and
// the arena is the largest function's (12 -> 16, + 1024 bytes). A buffer
// from the table that reaches a tile function is global memory: the
// function takes it as a global memref (the call casts it), so that its
// loads are global ones.

// CHECK-LABEL: module attributes {event.dynamic_shared_bytes = {s_kernels = 1040 : i64}
// CHECK:       gpu.func @s_worker(
// CHECK:         %[[G:.*]] = memref.memory_space_cast %{{.*}} : memref<?xf32> to memref<?xf32, 1>
// CHECK-NEXT:    func.call @s_tile_0(%[[G]], %{{.*}}) : (memref<?xf32, 1>, index) -> ()
// CHECK-NEXT:    func.call @s_tile_1(%{{.*}}, %{{.*}}) : (memref<?xf32>, index) -> ()
// CHECK:       func.func private @s_tile_0(%[[B:.*]]: memref<?xf32, 1>, %{{.*}}: index)
// CHECK:         gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
// CHECK-NEXT:    %[[O0:.*]] = arith.constant 0 : index
// CHECK-NEXT:    memref.view %{{.*}}[%[[O0]]][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<3xf32, #gpu.address_space<workgroup>>
// CHECK:         gpu.dynamic_shared_memory
// CHECK-NEXT:    %[[O16:.*]] = arith.constant 16 : index
// CHECK-NEXT:    memref.view %{{.*}}[%[[O16]]][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<256xf32, #gpu.address_space<workgroup>>
// CHECK:         memref.load %[[B]][%{{.*}}] : memref<?xf32, 1>
// CHECK:       func.func private @s_tile_1(%[[Y:.*]]: memref<?xf32>, %{{.*}}: index)
// CHECK-NOT:     memory_space_cast %[[Y]]
// CHECK:         gpu.dynamic_shared_memory
// CHECK-NEXT:    %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT:    memref.view %{{.*}}[%[[Z]]][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<64xf32, #gpu.address_space<workgroup>>
func.func private @s_tile_0(%x: memref<?xf32>, %i: index) attributes {event.tile} {
  %c0 = arith.constant 0 : index
  %a = event.scratch : memref<3xf32>
  %b = event.scratch : memref<256xf32>
  %v = memref.load %x[%i] : memref<?xf32>
  memref.store %v, %a[%c0] : memref<3xf32>
  memref.store %v, %b[%c0] : memref<256xf32>
  return
}
func.func private @s_tile_1(%y: memref<?xf32>, %i: index) attributes {event.tile} {
  %c0 = arith.constant 0 : index
  %c = event.scratch : memref<64xf32>
  %v = memref.load %y[%i] : memref<?xf32>
  memref.store %v, %c[%c0] : memref<64xf32>
  return
}
func.func @s_worker(%n: index, %table: memref<?xi64>, %other: memref<?xf32>) attributes {event.graph = "s"} {
  %c0 = arith.constant 0 : index
  %x = event.buffer %table[%c0] : memref<?xi64> -> memref<?xf32>
  %w = event.worker_id
  func.call @s_tile_0(%x, %w) : (memref<?xf32>, index) -> ()
  // Not every call passes a table buffer: no cast.
  func.call @s_tile_1(%x, %w) : (memref<?xf32>, index) -> ()
  func.call @s_tile_1(%other, %w) : (memref<?xf32>, index) -> ()
  return
}

// -----

// Two functions that both use scratch memory cannot nest: their buffers
// would share the arena's first bytes.

func.func private @v_inner(%i: index) {
  %c0 = arith.constant 0 : index
  %a = event.scratch : memref<4xf32>
  %f = arith.constant 1.0 : f32
  memref.store %f, %a[%c0] : memref<4xf32>
  return
}
// expected-error @+1 {{'func.func' op uses scratch memory and calls 'v_inner', which uses scratch memory too}}
func.func private @v_outer(%i: index) {
  %c0 = arith.constant 0 : index
  %b = event.scratch : memref<4xf32>
  %f = arith.constant 2.0 : f32
  memref.store %f, %b[%c0] : memref<4xf32>
  func.call @v_inner(%i) : (index) -> ()
  return
}
func.func @v_worker(%n: index) attributes {event.graph = "v"} {
  %w = event.worker_id
  func.call @v_outer(%w) : (index) -> ()
  return
}

// -----

// The end-of-run check's `event.any` scans are spread over the CTA's
// threads (thread i from i, in steps of the thread count), and one
// reducing barrier gives every thread the OR of all of them.

// CHECK-LABEL: gpu.func @c_check(
// CHECK:         %[[T:.*]] = gpu.thread_id  x
// CHECK:         %[[N:.*]] = gpu.block_dim  x
// CHECK:         %[[OFF:.*]] = arith.muli %[[T]], %[[ONE:.*]] : index
// CHECK:         %[[START:.*]] = arith.addi %[[ZERO:.*]], %[[OFF]] : index
// CHECK:         %[[STEP:.*]] = arith.muli %[[ONE]], %[[N]] : index
// CHECK:         %[[MINE:.*]] = scf.for %{{.*}} = %[[START]] to %{{.*}} step %[[STEP]] iter_args(%{{.*}} = %{{.*}}) -> (i1) {
// CHECK:         } {event.any}
// CHECK:         %[[W:.*]] = arith.extui %[[MINE]] : i1 to i32
// CHECK:         %[[ALL:.*]] = nvvm.barrier #nvvm.reduction<or> %[[W]] -> i32
// CHECK:         %[[ANY:.*]] = arith.cmpi ne, %[[ALL]], %{{.*}} : i32
// CHECK:         arith.extui %[[ANY]] : i1 to i32
func.func @c_check(%n: index, %counters: memref<?xi32>) -> i32 attributes {event.graph = "c"} {
  %false = arith.constant false
  %zero = arith.constant 0 : i32
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %any = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %false) -> (i1) {
    %v = memref.load %counters[%i] : memref<?xi32>
    %nz = arith.cmpi ne, %v, %zero : i32
    %o = arith.ori %acc, %nz : i1
    scf.yield %o : i1
  } {event.any}
  %r = arith.extui %any : i1 to i32
  return %r : i32
}
