//===- Passes.td - ETC's conversion passes ----------------*- tablegen -*-===//

#ifndef ETC_CONVERSION_PASSES_TD
#define ETC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertEventToCPU : Pass<"convert-event-to-cpu", "::mlir::ModuleOp"> {
  let summary = "Lowers a scheduled event program for CPU worker threads";
  let description = [{
    Lowers the event ops of a scheduled program (L3) for the CPU target,
    where each worker is a host thread and a tile body runs on one lane:
    * every `func.func` that uses `event.worker_id` / `event.worker_count`,
      spins (`event.wait`, `event.queue_pop`) or traces gets two trailing
      `index` arguments `%worker_id, %worker_count` that each host thread
      passes (the watchdog's and the trace's records name the worker);
    * `event.buffer` becomes the memref descriptor the buffer table
      describes;
    * `event.view %counters[%offset]` becomes the address of its first
      counter (`memref.extract_aligned_pointer_as_index`, `llvm.inttoptr`,
      `llvm.getelementptr`); elements are addressed row-major from it;
    * `event.wait` loads the counter (`llvm.load ... atomic acquire`) and,
      unless it is no longer positive, calls `@__etc_spin_counter` (a
      private, never-inlined function the pass defines, so that the worker
      stays small), which polls with acquire loads for the run's spin
      budget (microseconds, the run header's `kSpinMicrosecondsWord`, which
      the runtime writes) and then blocks: `@__etc_sleep` counts the thread
      in the header's sleepers word (seq_cst) and, if the counter still
      holds the value polled, makes the Linux futex wait system call on it
      (through the C library's `syscall`, declared as
      `llvm.func @syscall(i64, ...) -> i64`) for at most 10 ms or the
      watchdog's time left, so that more workers than cores, or a worker
      beside other processes, give their core to the producer they wait for.
      The wait is bounded by the watchdog: between polls it reads the run's
      status word (relaxed; the run header is the last 22 words of the
      counter buffer, found from its size) and the clock
      (`@__etc_monotonic_ns`, defined with `clock_gettime(CLOCK_MONOTONIC)`);
      it stops when the run is stopped, or after `watchdog-ms`, when it
      calls `@__etc_watchdog_report`: the first spin to time out (an atomic
      increment of the claim word that finds 0) writes the error record
      (worker, site, task, tile, event, element, the counter's value,
      milliseconds waited) and then stores the status `kWatchdog` with
      release (`Event/IR/RunLayout.h`);
    * `event.queue_pop` waits for its slot the same way
      (`@__etc_spin_slot`) and returns the capacity (no task) when the spin
      stops without one;
    * `event.run_aborted` is a relaxed load of the status word `!= 0`;
    * `event.trace_begin` / `event.trace_end` store the worker, task, tile
      and the clock into the trace record;
    * `event.notify` is `llvm.atomicrmw sub ... seq_cst` of 1; the notify
      that takes the counter to zero reads the sleepers word (seq_cst) and,
      if it is not 0, calls `@__etc_wake` (the futex wake of every thread
      blocked on the counter); `event.notify_ready` does the same and
      returns whether it took the counter to zero; `event.queue_push`
      wakes the slot it published (after a seq_cst fence);
    * `event.lane_id` is 0, `event.lane_count` is 1, `event.lane_barrier`
      disappears.
    Every public function with a body other than tile functions gets
    `llvm.emit_c_interface`, so the runtime calls `_mlir_ciface_<name>` with
    memref descriptors. The worker's `event.tasks` and `event.events` tables
    (for the front end, which reads them from the scheduled program) are
    dropped.
    For the runtime's pool of worker threads parked in native code, each
    graph's `@<g>_worker` gets `@<g>_worker_packed(%arguments: !llvm.ptr,
    %worker_id, %worker_count)` (its other arguments read from i64 words:
    values, and the addresses of memref descriptors), and the module
    `@_mlir_ciface_<g>_park(%mailbox)` (a pool thread's loop: waits for a
    command in its mailbox, polling and then in futex waits, and calls the
    packed worker it names) and `@_mlir_ciface_<g>_launch` (hands a run to
    the threads' mailboxes and waits for their done count, for at most a
    given time); the mailbox layout is in
    lib/Conversion/EventToCPU/WorkerPool.h.

    Before:
    ```mlir
    func.func @g_worker(%n: index, %counters: memref<?xi32>) {
      %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
      %w = event.worker_id
      ...
      event.wait %e[%i] : !event.tensor<?>
    ```
    After:
    ```mlir
    func.func @g_worker(%n: index, %counters: memref<?xi32>, %worker_id: index,
                        %worker_count: index) attributes {llvm.emit_c_interface} {
      %address = memref.extract_aligned_pointer_as_index %counters : memref<?xi32> -> index
      ...
      %e = llvm.getelementptr %base[%offset] : (!llvm.ptr, i64) -> !llvm.ptr, i32
      ...
      %p = llvm.getelementptr %e[%i64] : (!llvm.ptr, i64) -> !llvm.ptr, i32
      %count = llvm.load %p atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
      %ready = arith.cmpi sle, %count, %c0_i32 : i32
      %last = scf.if %ready -> (i32) {
        scf.yield %count : i32
      } else {
        %spun = func.call @__etc_spin_counter(%counters, %p, <site words>) : (...) -> i32
        scf.yield %spun : i32
      }
    ```
  }];
  let options = [
    Option<"watchdogMs", "watchdog-ms", "int64_t", /*default=*/"5000",
           "How long a wait or queue pop may spin, in milliseconds, before "
           "the watchdog stops the run and reports where it was stuck">,
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::LLVM::LLVMDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect"];
}

def ConvertEventToGPU : Pass<"convert-event-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Lowers a scheduled event program to GPU kernels";
  let description = [{
    Moves the functions of a scheduled program (L3, the `func.func`s that
    carry `event.graph`) into one `gpu.module @<graph>_kernels` per graph,
    as `gpu.func ... kernel`s with the same arguments, and lowers the event
    ops for the CUDA target: one CTA per persistent worker, a tile body on
    the CTA's threads.
    * A function with a result (`g_counters -> index`, `g_check -> i32`)
      becomes a kernel with one more argument, a `memref<1xT>` (`i64` for
      `index`) that thread 0 of block 0 stores the result to.
    * A function that uses no worker op (`g_init`) becomes a one-CTA
      kernel: each top-level `scf.for` that reads no buffer the function
      may write is spread over the CTA's threads, every other loop or
      writing op runs on thread 0 (an op of unknown effects, such as
      `event.queue_push`, counts as writing every buffer), and a
      `gpu.barrier` follows each of them.
    * In the worker kernel, `event.worker_id` / `event.worker_count` are
      `gpu.block_id x` / `gpu.grid_dim x`, `event.lane_id` /
      `event.lane_count` are `gpu.thread_id x` / `gpu.block_dim x`, and
      `event.lane_barrier` is `gpu.barrier`.
    * `event.wait`: thread 0 spins on `llvm.load ... atomic syncscope("device")
      acquire` of the counter until it is no longer positive, sleeping
      between polls with `nvvm.nanosleep` (32 ns, doubling up to 512 ns);
      then `gpu.barrier` releases the CTA. Like on the CPU, the spin is
      bounded by the watchdog (`watchdog-ms`, measured with
      `nvvm.read.ptx.sreg.globaltimer`): it stops when the run's status
      word is set, or on expiry, when the first wait to time out writes the
      run header's error record and sets the status (fence, then a relaxed
      store, at GPU scope);
    * `event.run_aborted`: a barrier, thread 0 loads the status word into
      the broadcast word, a barrier, every thread compares it with 0;
    * `event.trace_begin`: thread 0 stores the block id, task, tile and
      `%globaltimer`; `event.trace_end`: a barrier, then thread 0 stores
      `%globaltimer`.
    * `event.notify`: `gpu.barrier` (every lane has finished the tile), then
      thread 0 does `llvm.fence syncscope("device") release` and
      `llvm.atomicrmw sub ... syncscope("device") monotonic` of 1
      (`fence.acq_rel.gpu; atom.global.add.u32 ..., -1` in PTX: LLVM 22's
      NVPTX backend drops the ordering of a release `atomicrmw`, so the
      release is an explicit fence).
    * `event.notify_ready`: a barrier, then thread 0 decrements with a
      release fence, a relaxed atomic and an acquire fence, and writes
      `old == 1` to the kernel's broadcast word (a
      `memref<1xi32, #gpu.address_space<workgroup>>` attribution added to
      kernels that need one); a second barrier, then every thread reads it.
    * `event.queue_pop`: a barrier, then thread 0 claims a slot (atomic add
      on the head), spins with acquire loads and nanosleep until it is
      published (bounded like a wait), and broadcasts the task id (or the
      capacity, also when the run is stopped) the same way.
    * `event.queue_push`: thread 0 reserves a slot (atomic add on the tail)
      and publishes `task + 1` with a GPU-scope release store, or sets the
      error flag when the queue is full.
    * The polling ops of the dynamic schedule on several ranks:
      `event.queue_try_pop` is thread 0's pop that never waits (relaxed
      loads of the slot at GPU scope, one acquire fence when it took a
      task) between two barriers, through the broadcast word;
      `event.test` is thread 0's relaxed load of the counter and, when it
      is no longer positive, an acquire fence, then `bar.red.or` to the
      CTA, both at system scope for a symmetric event (other GPUs notify
      it with NVSHMEM atomics after their puts) and at GPU scope
      otherwise; `event.idle` keeps the watchdog on thread 0
      (`%globaltimer`, the error record once idle longer than
      `watchdog-ms`) and backs every thread off with `nvvm.nanosleep` of
      a sixteenth of the idle time, 32 to 512 ns.
    * `event.view` becomes the address of its first counter, as on the CPU.
    * `event.scratch` becomes a view of the CTA's scratch arena, the
      kernel's dynamic shared memory (`gpu.dynamic_shared_memory` +
      `memref.view`): a CTA runs one tile at a time, so each function's
      buffers start at offset 0 (16-byte aligned) and the arena is as large
      as the largest function's. The module records each `gpu.module`'s
      arena in `event.dynamic_shared_bytes = {<graph>_kernels = bytes}`,
      the dynamic shared memory the runtime launches the worker with.
    * Memref parameters of the functions the kernels call that every call
      fills with a program buffer (`event.buffer` or a view of one) become
      memrefs in NVPTX's global address space, 1 (the calls cast what they
      pass), so that the tile functions load with `ld.global` (and
      `cp.async` from global memory) rather than generic accesses.
    Unless lanes is 128 and there is no `min-ctas` (then no bounds: `.maxntid
    128` alone makes ptxas cap the worker at 128 registers, and real-width
    step workers use up to 255), the worker kernel gets
    `nvvm.maxntid = array<i32: lanes, 1, 1>` (the
    threads per CTA its tiles are written for and the runtime launches:
    PTX `.maxntid`) and, with `min-ctas`, `nvvm.minctasm = min-ctas`
    (`.minnctapersm`): with both, ptxas knows the registers a thread has
    at entry, 65,536 / (lanes x min-ctas), which `setmaxnreg` needs (it
    ignores it otherwise, warning C7508).
    The module gets `gpu.container_module`. Kernel parameters follow MLIR's
    memref descriptor expansion (see docs/architecture.md). The worker's
    `event.tasks` and `event.events` tables (for the front end, which reads
    them from the scheduled program) are dropped.

    Before:
    ```mlir
    func.func @g_worker(%n: index, %counters: memref<?xi32>) attributes {event.graph = "g", ...} {
      %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
      %w = event.worker_id
      ...
      event.wait %e[%i] : !event.tensor<?>
      ...
      event.notify %e[%j] : !event.tensor<?>
    ```
    After:
    ```mlir
    gpu.module @g_kernels {
      gpu.func @g_worker(%n: index, %counters: memref<?xi32>) kernel {
        %w = gpu.block_id x
        ...
        %tid = gpu.thread_id x
        %first = arith.cmpi eq, %tid, %c0 : index
        scf.if %first {
          %0 = scf.while (%sleep = %c32_i32) : (i32) -> i32 {
            %count = llvm.load %p atomic syncscope("device") acquire {alignment = 4 : i64} : !llvm.ptr -> i32
            %pending = arith.cmpi sgt, %count, %c0_i32 : i32
            scf.condition(%pending) %sleep : i32
          } do {
          ^bb0(%s: i32):
            nvvm.nanosleep %s
            ...
          }
        }
        gpu.barrier
        ...
        gpu.barrier
        scf.if %first {
          llvm.fence syncscope("device") release
          %old = llvm.atomicrmw sub %q, %c1_i32 syncscope("device") monotonic : !llvm.ptr, i32
        }
    ```
  }];
  let options = [
    Option<"watchdogMs", "watchdog-ms", "int64_t", /*default=*/"5000",
           "How long a wait or queue pop may spin, in milliseconds, before "
           "the watchdog stops the run and reports where it was stuck">,
    Option<"lanes", "lanes", "int64_t", /*default=*/"128",
           "Threads per worker CTA (a multiple of 32, at most 1024): the "
           "worker's nvvm.maxntid, set when not 128 or with min-ctas">,
    Option<"minCtas", "min-ctas", "int64_t", /*default=*/"0",
           "Worker CTAs per SM that must fit at once (the worker's "
           "nvvm.minctasm, which with nvvm.maxntid fixes its registers at "
           "entry); 0: no such bound">,
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::gpu::GPUDialect",
                           "::mlir::LLVM::LLVMDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::NVVM::NVVMDialect",
                           "::mlir::scf::SCFDialect"];
}

def ConvertMathToPolynomials : Pass<"convert-math-to-polynomials"> {
  let summary = "Expands transcendental math ops into vectorisable polynomials";
  let description = [{
    Rewrites f32 `math.exp`, `math.tanh`, `math.log`, `math.erf` and the like
    (scalars and vectors) into range reduction and polynomial arithmetic
    (MLIR's polynomial approximations, within a few ULP), so that the CPU
    target computes a vector of them in vector registers instead of calling
    the C library's `expf` once per lane, which LLVM does for
    `llvm.intr.exp` on a vector. `etc-lower-to-cpu` runs it before
    converting math to LLVM.

    Before:
    ```mlir
    %e = math.exp %x : vector<16xf32>
    ```
    After: `arith` and `math.fma` ops on `vector<16xf32>` (a power of two
    from the exponent bits, times a polynomial of the reduced argument).
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::vector::VectorDialect"];
}

#endif // ETC_CONVERSION_PASSES_TD
