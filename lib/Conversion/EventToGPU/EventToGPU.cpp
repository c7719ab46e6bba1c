//===- EventToGPU.cpp - convert-event-to-gpu ------------------------------===//
//
// Lowers a scheduled event program (L3) for the CUDA target: the program's
// functions become kernels of a `gpu.module`, every persistent worker is a
// CTA, and a tile body runs on the CTA's threads. Counters live in global
// memory and are synchronised at GPU scope (the waits on a symmetric
// event's counters, which other GPUs notify, at system scope): a waiting
// CTA has one thread poll and acquire, a notifying CTA has one thread
// decrement with a release atomic, and CTA barriers extend both to the
// other threads.
//
//===----------------------------------------------------------------------===//

#include "Conversion/EventToGPU/EventToGPU.h"
#include "CTA.h"
#include "InitKernel.h"
#include "KernelMemory.h"
#include "KernelOutlining.h"
#include "Conversion/Passes.h"
#include "Conversion/EventCommon/EventAddressing.h"
#include "Conversion/EventCommon/EventQueue.h"
#include "Conversion/EventCommon/EventRunHeader.h"

#include "Event/IR/EventOps.h"
#include "Event/IR/RunLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"

namespace etc {
#define GEN_PASS_DEF_CONVERTEVENTTOGPU
#include "Conversion/Passes.h.inc"
} // namespace etc

using namespace mlir;
using namespace etc;
using namespace etc::event;

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

/// The spin of thread 0 of a CTA: `nanosleep` between polls (32 ns,
/// doubling up to 512 ns), GPU-scope atomics, `%globaltimer`. Polls are
/// relaxed loads (`ld.relaxed.gpu`) and one acquire fence follows the spin:
/// an acquire load or fence invalidates the SM's L1 (`CCTL.IVALL` in SASS),
/// which a loop of acquire loads would pay at every poll.
static SpinTarget gpuSpin(int64_t timeoutMs) {
  return SpinTarget{
      globalTimer,
      [](OpBuilder &b, Location loc, Value sleep) -> Value {
        NVVM::NanosleepOp::create(b, loc, sleep);
        Value doubled = arith::AddIOp::create(b, loc, sleep, sleep);
        Value maxSleep =
            arith::ConstantIntOp::create(b, loc, kWaitMaxSleepNs, 32);
        return arith::MinUIOp::create(b, loc, doubled, maxSleep);
      },
      kWaitFirstSleepNs, kDeviceScope, timeoutMs, SpinAcquire::OnceDone};
}

namespace {
/// Lowers `event.wait` for a CTA: thread 0 polls the counter with relaxed
/// loads until it is no longer positive, sleeping between polls with an
/// exponential back-off, then issues one acquire fence (which makes the
/// poll that saw the counter ready an acquire of the notifiers' releases),
/// and a CTA barrier holds every other thread until it is done. The fence
/// and the barrier together make the producers' writes visible to all
/// threads of the CTA. The polls and the fence are at `counterScope`: GPU
/// scope, or system scope for an element of a symmetric event, which other
/// GPUs notify (NVSHMEM atomics after their puts), since PTX orders another
/// device's writes only at system scope. The spin is bounded by the
/// watchdog: it also ends when the run is stopped, or after the timeout
/// (`%globaltimer`), when the first wait to time out writes the run
/// header's error record. A `deferred` wait is thread 0's spin only: the
/// `event.acquire` after the tile's waits fences (at GPU scope) and
/// synchronises once; a deferred wait on a symmetric event keeps its own
/// system-scope fence, which that acquire does not give.
struct WaitOpLowering : public OpConversionPattern<WaitOp> {
  using OpConversionPattern::OpConversionPattern;

  LogicalResult
  matchAndRewrite(WaitOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    FailureOr<Value> counters = getEventCounters(rewriter, op, op.getEvent());
    if (failed(pointer) || failed(counters))
      return failure();
    Location loc = op.getLoc();
    buildIf(rewriter, loc, isFirstThread(rewriter, loc),
            [&](OpBuilder &b, Location loc) {
              WatchdogSite site = WatchdogSite::forWait(
                  b, loc, blockId(b, loc), adaptor.getSite(), adaptor.getIndices());
              StringRef scope = counterScope(op.getEvent());
              bool system = scope != kDeviceScope;
              buildSpin(b, loc, *counters, *pointer, scope,
                        SpinUntil::CounterReady, site,
                        op.getDeferred() && !system ? SpinAcquire::Deferred
                                                    : SpinAcquire::OnceDone,
                        system ? StringRef(kSpinCounterSystemName)
                               : StringRef());
            });
    if (op.getDeferred())
      rewriter.eraseOp(op);
    else
      rewriter.replaceOpWithNewOp<gpu::BarrierOp>(op);
    return success();
  }
};

/// Decrements the counter at `pointer` by 1 at GPU scope from the calling
/// thread, with release semantics unless `released` (an `event.release`
/// fenced already): a release fence before a relaxed (`monotonic`) atomic,
/// the PTX release pattern (`fence.acq_rel.gpu; atom`). The NVPTX backend of
/// LLVM 22 emits `atomicrmw ... release` as a plain relaxed `atom`, dropping
/// the ordering. Returns the old value.
static Value decrementCounter(OpBuilder &b, Location loc, Value pointer,
                              bool released) {
  Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
  if (!released)
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::release, kDeviceScope);
  return LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::sub, pointer, one,
                                   LLVM::AtomicOrdering::monotonic,
                                   kDeviceScope, /*alignment=*/4);
}

/// Decrements like `decrementCounter` and returns whether this decrement
/// took the counter from 1 to 0, acquiring (a GPU-scope acquire fence) only
/// then: only the notifier that readies the element goes on to act on what
/// the earlier notifiers published.
static Value decrementAndAcquireIfLast(OpBuilder &b, Location loc,
                                       Value pointer, bool released) {
  Value old = decrementCounter(b, loc, pointer, released);
  Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
  Value last =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, old, one);
  buildIf(b, loc, last, [](OpBuilder &b, Location loc) {
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acquire, kDeviceScope);
  });
  return last;
}

/// Lowers `event.acquire` for a CTA: thread 0, which polled the counters of
/// the `deferred` waits before it with relaxed loads, issues one GPU-scope
/// acquire fence, which turns each of those polls that saw its counter
/// ready into an acquire of that counter's notifiers; then a CTA barrier
/// extends what thread 0 acquired to every thread. One fence and one
/// barrier thus serve all the tile's waits (a deferred wait on a symmetric
/// event fenced at system scope itself). When an `event.run_aborted`
/// follows (the static schedule checks the run after a tile's waits), its
/// reducing barrier, which orders memory like `bar.sync`, is that barrier.
struct AcquireOpLowering : public OpConversionPattern<AcquireOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(AcquireOp op, OpAdaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    buildIf(rewriter, loc, isFirstThread(rewriter, loc),
            [&](OpBuilder &b, Location loc) {
              LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acquire,
                                    kDeviceScope);
            });
    if (isa_and_nonnull<RunAbortedOp>(op->getNextNode()))
      rewriter.eraseOp(op);
    else
      rewriter.replaceOpWithNewOp<gpu::BarrierOp>(op);
    return success();
  }
};

/// Lowers `event.release` for a CTA: a barrier, so that every thread has
/// finished its part of the tile, then a GPU-scope release fence by thread
/// 0, the thread that does the `released` notifies that follow. A release
/// fence is cumulative: it orders before thread 0's later atomics the
/// writes that the barrier made visible to thread 0, not only its own, so
/// every thread's writes of the tile are visible at GPU scope before any
/// counter increment. One barrier and one fence thus serve all the tile's
/// notifies.
struct ReleaseOpLowering : public OpConversionPattern<ReleaseOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(ReleaseOp op, OpAdaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    gpu::BarrierOp::create(rewriter, loc);
    buildIf(rewriter, loc, isFirstThread(rewriter, loc),
            [&](OpBuilder &b, Location loc) {
              LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::release,
                                    kDeviceScope);
            });
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.notify` for a CTA: a barrier, so that every thread has
/// finished its part of the tile, then thread 0 decrements the counter by 1
/// with a release atomic at GPU scope. Release is cumulative: it publishes
/// the writes the barrier made visible to thread 0, not only its own. A
/// `released` notify follows an `event.release`, which did the barrier and
/// the fence: thread 0 only decrements (relaxed).
struct NotifyOpLowering : public OpConversionPattern<NotifyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(NotifyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Location loc = op.getLoc();
    bool released = op.getReleased();
    if (!released)
      gpu::BarrierOp::create(rewriter, loc);
    buildIf(rewriter, loc, isFirstThread(rewriter, loc),
            [&](OpBuilder &b, Location loc) {
              decrementCounter(b, loc, *pointer, released);
            });
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers a worker or lane query to the GPU index op it means for a
/// persistent CTA: workers are blocks, lanes are threads (dimension x).
template <typename QueryOp, typename GPUIndexOp>
struct IndexQueryLowering : public OpConversionPattern<QueryOp> {
  using OpConversionPattern<QueryOp>::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueryOp op, typename QueryOp::Adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOpWithNewOp<GPUIndexOp>(op, gpu::Dimension::x);
    return success();
  }
};

/// The most 128-byte lines one `event.prefetch` asks for (256 KiB): a box
/// per SM in flight then stays well inside an H100's 50 MB of L2.
static constexpr int64_t kMaxPrefetchLines = 2048;
static constexpr int64_t kPrefetchLineBytes = 128;

/// Lowers `event.prefetch` to `prefetch.global.L2` (inline PTX) of the
/// box's lines, the box taken as rows of its last dimension: line i of the
/// (row-major) rows x lines-per-row grid, for i = thread, thread + threads,
/// ... below min(rows x lines-per-row, kMaxPrefetchLines).
struct PrefetchOpLowering : public OpConversionPattern<PrefetchOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(PrefetchOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    Value buffer = adaptor.getBuffer();
    auto type = cast<MemRefType>(buffer.getType());
    unsigned bits = type.getElementTypeBitWidth();
    if (type.getRank() == 0 || bits == 0 || bits % 8 != 0) {
      // Nothing worth a line, or elements without a byte size.
      rewriter.eraseOp(op);
      return success();
    }
    int64_t rank = type.getRank();
    auto index = [&](int64_t value) -> Value {
      return arith::ConstantIndexOp::create(rewriter, loc, value);
    };
    auto meta = memref::ExtractStridedMetadataOp::create(rewriter, loc, buffer);
    Value base =
        memref::ExtractAlignedPointerAsIndexOp::create(rewriter, loc, buffer);
    ValueRange offsets = adaptor.getOffsets(), sizes = adaptor.getSizes();
    Value rows = index(1);
    for (int64_t dim = 0; dim + 1 < rank; ++dim)
      rows = arith::MulIOp::create(rewriter, loc, rows, sizes[dim]);
    Value rowBytes = arith::MulIOp::create(rewriter, loc, sizes[rank - 1],
                                           index(bits / 8));
    Value perRow =
        arith::CeilDivUIOp::create(rewriter, loc, rowBytes,
                                   index(kPrefetchLineBytes));
    Value lines = arith::MinUIOp::create(
        rewriter, loc, arith::MulIOp::create(rewriter, loc, rows, perRow),
        index(kMaxPrefetchLines));
    Value thread = gpu::ThreadIdOp::create(rewriter, loc, gpu::Dimension::x);
    Value threads = gpu::BlockDimOp::create(rewriter, loc, gpu::Dimension::x);
    auto loop = scf::ForOp::create(rewriter, loc, thread, lines, threads);
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPointToStart(loop.getBody());
    Value line = loop.getInductionVar();
    Value row = arith::DivUIOp::create(rewriter, loc, line, perRow);
    Value column = arith::RemUIOp::create(rewriter, loc, line, perRow);
    // The element at the row's start: the row number delinearised over the
    // box's leading sizes, plus the box's offsets, dotted with the strides.
    Value element = meta.getOffset();
    Value rest = row;
    for (int64_t dim = rank - 1; dim >= 0; --dim) {
      Value coordinate = offsets[dim];
      if (dim + 1 < rank) {
        Value within = dim == 0 ? rest
                                : arith::RemUIOp::create(rewriter, loc, rest,
                                                         sizes[dim])
                                      .getResult();
        if (dim > 0)
          rest = arith::DivUIOp::create(rewriter, loc, rest, sizes[dim]);
        coordinate = arith::AddIOp::create(rewriter, loc, coordinate, within);
      }
      element = arith::AddIOp::create(
          rewriter, loc, element,
          arith::MulIOp::create(rewriter, loc, coordinate,
                                meta.getStrides()[dim]));
    }
    Value byte = arith::AddIOp::create(
        rewriter, loc,
        arith::MulIOp::create(rewriter, loc, element, index(bits / 8)),
        arith::MulIOp::create(rewriter, loc, column,
                              index(kPrefetchLineBytes)));
    Value address = arith::IndexCastUIOp::create(
        rewriter, loc, rewriter.getI64Type(),
        arith::AddIOp::create(rewriter, loc, base, byte));
    // Inline PTX: LLVM selects its prefetch intrinsic only for sm_90 and
    // PTX 8.0, and sm_80 code is PTX 7.0 (prefetch itself is PTX 2.0).
    auto dialect = LLVM::AsmDialectAttr::get(rewriter.getContext(),
                                             LLVM::AsmDialect::AD_ATT);
    LLVM::InlineAsmOp::create(
        rewriter, loc, TypeRange{}, ValueRange{address},
        rewriter.getStringAttr("{\n\t.reg .u64 %g;"
                               "\n\tcvta.to.global.u64 %g, $0;"
                               "\n\tprefetch.global.L2 [%g];\n\t}"),
        rewriter.getStringAttr("l"), rewriter.getUnitAttr(),
        /*is_align_stack=*/nullptr,
        LLVM::TailCallKindAttr::get(rewriter.getContext(),
                                    LLVM::tailcallkind::TailCallKind::None),
        dialect, /*operand_attrs=*/nullptr);
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.lane_barrier` to `gpu.barrier`: the lanes of a tile are the
/// threads of one CTA.
struct LaneBarrierLowering : public OpConversionPattern<LaneBarrierOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(LaneBarrierOp op, OpAdaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOpWithNewOp<gpu::BarrierOp>(op);
    return success();
  }
};

/// Lowers `event.lane_reduce` to a butterfly of `gpu.shuffle xor` over the
/// group's lanes (offsets (group/2) stride, ..., stride within width 32),
/// combining
/// with `arith.addf` or `arith.maxnumf` at each step, so every lane of the
/// group ends with the result.
struct LaneReduceLowering : public OpConversionPattern<LaneReduceOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(LaneReduceOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    Value value = adaptor.getValue();
    Value width = arith::ConstantIntOp::create(rewriter, loc, 32, 32);
    bool add = op.getKind() == "add";
    int64_t stride = op.getStride();
    for (int64_t offset = op.getGroup() / 2 * stride; offset >= stride;
         offset /= 2) {
      Value distance = arith::ConstantIntOp::create(rewriter, loc, offset, 32);
      Value other = gpu::ShuffleOp::create(rewriter, loc, value, distance,
                                           width, gpu::ShuffleMode::XOR)
                        .getShuffleResult();
      value = add ? arith::AddFOp::create(rewriter, loc, value, other)
                        .getResult()
                  : arith::MaxNumFOp::create(rewriter, loc, value, other)
                        .getResult();
    }
    rewriter.replaceOp(op, value);
    return success();
  }
};

/// Lowers `event.scratch` to a view of the CTA's scratch arena, the
/// kernel's dynamic shared memory (`gpu.dynamic_shared_memory`), at the
/// offset `planScratchArenas` gave it (0 without one), cast to the default
/// memory space, which the tile's code uses. The runtime launches the
/// worker with the arena's size (`event.dynamic_shared_bytes`).
struct ScratchLowering : public OpConversionPattern<ScratchOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(ScratchOp op, OpAdaptor,
                  ConversionPatternRewriter &rewriter) const override {
    MLIRContext *context = op.getContext();
    Location loc = op.getLoc();
    MemRefType type = op.getType();
    auto workgroup =
        gpu::AddressSpaceAttr::get(context, gpu::AddressSpace::Workgroup);
    auto arenaType = MemRefType::get({ShapedType::kDynamic},
                                     rewriter.getI8Type(), AffineMap(),
                                     workgroup);
    Value arena = gpu::DynamicSharedMemoryOp::create(rewriter, loc, arenaType);
    int64_t offset = 0;
    if (auto attr = op->getAttrOfType<IntegerAttr>(kArenaOffsetAttrName))
      offset = attr.getInt();
    Value byte = arith::ConstantIndexOp::create(rewriter, loc, offset);
    auto shared = MemRefType::get(type.getShape(), type.getElementType(),
                                  AffineMap(), workgroup);
    Value view =
        memref::ViewOp::create(rewriter, loc, shared, arena, byte, ValueRange{});
    rewriter.replaceOpWithNewOp<memref::MemorySpaceCastOp>(op, type, view);
    return success();
  }
};

/// Lowers `event.notify_ready` for a CTA: unless `released` (an
/// `event.release` did it), a barrier, so that the tile is finished, and a
/// release fence; then every thread adds to the element at GPU scope
/// (relaxed): thread 0 -1, the others 0, so that no thread branches around
/// the reducing barrier that follows. It hands every thread whether thread
/// 0 took the element to zero, and then every thread acquires (a GPU-scope
/// fence): each read the counter with its own atomic, which extends the
/// notifiers' release sequences to it. With thread 0 alone in a branch
/// before the barrier, the pipeline's greedy rewrites merged several
/// notifies' identical tails into one barrier entered from several task
/// cases, and ptxas let a warp's threads reach it diverged: on an H200 the
/// dynamic examples/mlp.py stopped with CUDA_ERROR_ILLEGAL_INSTRUCTION
/// (docs/gpu.md, "What the first GPU found"). The warp's atomics are one
/// each (ptxas aggregates a warp's atomics on one address). A `per_lane`
/// op is each thread's own: it decrements its element the same way and
/// gets its own result, with no barrier.
struct NotifyReadyOpLowering : public OpConversionPattern<NotifyReadyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(NotifyReadyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Location loc = op.getLoc();
    bool released = op.getReleased();
    if (op.getPerLane()) {
      rewriter.replaceOp(
          op, decrementAndAcquireIfLast(rewriter, loc, *pointer, released));
      return success();
    }
    if (!released) {
      gpu::BarrierOp::create(rewriter, loc);
      LLVM::FenceOp::create(rewriter, loc, LLVM::AtomicOrdering::release,
                            kDeviceScope);
    }
    Value first = isFirstThread(rewriter, loc);
    Value amount = arith::SelectOp::create(
        rewriter, loc, first,
        arith::ConstantIntOp::create(rewriter, loc, -1, 32),
        arith::ConstantIntOp::create(rewriter, loc, 0, 32));
    Value old = LLVM::AtomicRMWOp::create(
        rewriter, loc, LLVM::AtomicBinOp::add, *pointer, amount,
        LLVM::AtomicOrdering::monotonic, kDeviceScope, /*alignment=*/4);
    Value took = arith::CmpIOp::create(
        rewriter, loc, arith::CmpIPredicate::eq, old,
        arith::ConstantIntOp::create(rewriter, loc, 1, 32));
    Value any = barrierAny(rewriter, loc,
                           arith::AndIOp::create(rewriter, loc, first, took));
    buildIf(rewriter, loc, any, [](OpBuilder &b, Location loc) {
      LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acquire,
                            kDeviceScope);
    });
    rewriter.replaceOp(op, any);
    return success();
  }
};

/// Lowers `event.queue_push` for a CTA: thread 0 reserves a slot with an
/// atomic increment of the tail and publishes `task + 1` into it with a
/// release store at GPU scope, or sets the error flag when the queue is full.
/// The release is cumulative, so it carries what thread 0 acquired (the
/// notifies that readied the task) and, through the preceding barrier, the
/// CTA's own writes. In the one-CTA initialisation kernel the op is already
/// on thread 0. A `per_lane` push is the calling thread's own: it pushes
/// with the same protocol, and its release carries what that thread
/// acquired (its `per_lane` `event.notify_ready`).
struct QueuePushOpLowering : public OpConversionPattern<QueuePushOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueuePushOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    auto push = [&](OpBuilder &b, Location loc) {
      buildQueuePush(b, loc, adaptor.getCounters(), adaptor.getQueue(),
                     adaptor.getCapacity(), adaptor.getTask(), kDeviceScope);
    };
    if (op.getPerLane())
      push(rewriter, loc);
    else
      buildIf(rewriter, loc, isFirstThread(rewriter, loc), push);
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.queue_pop` for a CTA: after a barrier (the broadcast word
/// is free), thread 0 claims a slot with an atomic increment of the head,
/// and if it is below the capacity spins with relaxed loads until the slot
/// is published and acquires it with one fence, then writes the task id
/// (or the capacity, when every slot is claimed) to the broadcast word; a
/// second barrier hands it to every thread, so the whole CTA runs the same
/// task. The spin is bounded like `event.wait`'s; one that stops without a
/// task (the run was stopped) yields the capacity.
struct QueuePopOpLowering : public OpConversionPattern<QueuePopOp> {
  using OpConversionPattern::OpConversionPattern;

  LogicalResult
  matchAndRewrite(QueuePopOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Value counters = adaptor.getCounters();
    FailureOr<Value> task = broadcastFromFirstThread(
        rewriter, op, [&](OpBuilder &b, Location loc) {
          auto waitForSlot = [&](OpBuilder &b, Location loc, Value pointer,
                                 Value slot) -> Value {
            WatchdogSite site =
                WatchdogSite::get(b, loc, run::kSitePop, blockId(b, loc),
                                  Value(), ValueRange{}, Value(),
                                  ValueRange{slot});
            Value published =
                buildSpin(b, loc, counters, pointer, kDeviceScope,
                          SpinUntil::SlotPublished, site,
                          SpinAcquire::OnceDone);
            return exhaustedIfEmpty(b, loc, published, adaptor.getCapacity());
          };
          return buildQueuePop(b, loc, counters, adaptor.getQueue(),
                               adaptor.getCapacity(), kDeviceScope,
                               waitForSlot);
        });
    if (failed(task))
      return failure();
    rewriter.replaceOp(op, *task);
    return success();
  }
};

/// Lowers `event.claim` for a CTA: after a barrier (the broadcast word is
/// free), thread 0 increments the element (relaxed, GPU scope) and writes
/// the old value to the broadcast word; a second barrier hands it to every
/// thread, so the whole CTA runs the same claimed tile.
struct ClaimOpLowering : public OpConversionPattern<ClaimOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(ClaimOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> claimed = broadcastFromFirstThread(
        rewriter, op, [&](OpBuilder &b, Location loc) -> Value {
          Value claimed = buildClaim(b, loc, adaptor.getCounters(),
                                     adaptor.getIndex(), kDeviceScope);
          return arith::IndexCastUIOp::create(b, loc, b.getI32Type(), claimed);
        });
    if (failed(claimed))
      return failure();
    rewriter.replaceOp(op, *claimed);
    return success();
  }
};

/// Lowers `event.run_aborted` for a CTA: thread 0 loads the run's status
/// word (relaxed, GPU scope), and one `bar.red.or` hands whether the run
/// stopped to every thread, so the whole CTA takes the same branch.
struct RunAbortedOpLowering : public OpConversionPattern<RunAbortedOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RunAbortedOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    Value stopped =
        onFirstThread(rewriter, loc, [&](OpBuilder &b, Location loc) -> Value {
          return buildRunStopped(b, loc, adaptor.getCounters(), kDeviceScope);
        });
    rewriter.replaceOp(op, barrierAny(rewriter, loc, stopped));
    return success();
  }
};

/// Lowers `event.trace_begin` for a CTA: thread 0 stores the block id, the
/// task, the tile and `%globaltimer` into the trace record. It follows the
/// tile's waits (which end with a barrier) or a pop, so the CTA is past them.
struct TraceBeginOpLowering : public OpConversionPattern<TraceBeginOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(TraceBeginOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    buildIf(rewriter, loc, isFirstThread(rewriter, loc),
            [&](OpBuilder &b, Location loc) {
              buildTraceBegin(b, loc, adaptor.getCounters(),
                              adaptor.getRecord(), blockId(b, loc),
                              adaptor.getTask(), adaptor.getTile(),
                              globalTimer(b, loc));
            });
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.trace_end` for a CTA: a barrier, so that every thread has
/// finished the tile, then thread 0 stores `%globaltimer` as the end.
struct TraceEndOpLowering : public OpConversionPattern<TraceEndOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(TraceEndOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    gpu::BarrierOp::create(rewriter, loc);
    buildIf(rewriter, loc, isFirstThread(rewriter, loc),
            [&](OpBuilder &b, Location loc) {
              buildTraceEnd(b, loc, adaptor.getCounters(), adaptor.getRecord(),
                            globalTimer(b, loc));
            });
    rewriter.eraseOp(op);
    return success();
  }
};
} // namespace

void etc::populateEventToGPUTypeConversions(TypeConverter &typeConverter) {
  populateEventTensorTypeConversion(typeConverter);
}

void etc::populateEventToGPUConversionPatterns(
    const TypeConverter &typeConverter, RewritePatternSet &patterns,
    int64_t watchdogMs) {
  populateEventViewLoweringPattern(typeConverter, patterns);
  // Buffers live in global memory (NVPTX address space 1).
  populateEventBufferLoweringPattern(typeConverter, patterns,
                                     /*addressSpace=*/1);
  populateRemoteToGPUConversionPatterns(typeConverter, patterns);
  populatePollingToGPUConversionPatterns(typeConverter, patterns, watchdogMs);
  patterns.add<WaitOpLowering, QueuePopOpLowering, NotifyOpLowering,
               ReleaseOpLowering, AcquireOpLowering, RunAbortedOpLowering,
               TraceBeginOpLowering, TraceEndOpLowering,
               IndexQueryLowering<WorkerIdOp, gpu::BlockIdOp>,
               IndexQueryLowering<WorkerCountOp, gpu::GridDimOp>,
               IndexQueryLowering<LaneIdOp, gpu::ThreadIdOp>,
               IndexQueryLowering<LaneCountOp, gpu::BlockDimOp>,
               LaneBarrierLowering, LaneReduceLowering, ScratchLowering,
               NotifyReadyOpLowering, QueuePushOpLowering, PrefetchOpLowering,
               ClaimOpLowering>(
      typeConverter, patterns.getContext());
}

//===----------------------------------------------------------------------===//
// Pass
//===----------------------------------------------------------------------===//

namespace {
struct ConvertEventToGPUPass
    : public etc::impl::ConvertEventToGPUBase<ConvertEventToGPUPass> {
  using ConvertEventToGPUBase::ConvertEventToGPUBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    if (watchdogMs <= 0) {
      module.emitError("convert-event-to-gpu: watchdog-ms must be positive, "
                       "found ")
          << static_cast<int64_t>(watchdogMs);
      return signalPassFailure();
    }
    if (lanes < 32 || lanes > 1024 || lanes % 32 != 0 || minCtas < 0 ||
        lanes * minCtas > 2048) {
      module.emitError("convert-event-to-gpu: lanes must be a multiple of 32 "
                       "in [32, 1024] and min-ctas in [0, 2048 / lanes], "
                       "found lanes=")
          << static_cast<int64_t>(lanes)
          << " min-ctas=" << static_cast<int64_t>(minCtas);
      return signalPassFailure();
    }

    dropProgramTables(module);
    // A stall names its task and tile from what the schedule gave it: a
    // tile function that stalls is called through a sited copy, and the
    // private original is dead unless something else calls it.
    auto unsited = [](func::FuncOp func) {
      return func
          .walk([](StallOp stall) {
            return stall.getCounters() ? WalkResult::advance()
                                       : WalkResult::interrupt();
          })
          .wasInterrupted();
    };
    for (auto func : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
      if (func.isPrivate() && unsited(func) &&
          SymbolTable::symbolKnownUseEmpty(func, module))
        func.erase();
    WalkResult unscheduled = module.walk([](StallOp stall) {
      if (stall.getCounters())
        return WalkResult::advance();
      stall.emitOpError("has no counter buffer and site: only a tile function "
                        "that a schedule (event-static-schedule, "
                        "event-dynamic-schedule) calls can stall on a "
                        "barrier, and the schedule gives its stalls those");
      return WalkResult::interrupt();
    });
    if (unscheduled.wasInterrupted())
      return signalPassFailure();

    // The program of each graph: its functions, in order.
    llvm::MapVector<StringAttr, SmallVector<func::FuncOp>> programs;
    for (auto func : module.getOps<func::FuncOp>()) {
      auto graph = func->getAttrOfType<StringAttr>("event.graph");
      if (!graph || func.isExternal())
        continue;
      programs[graph].push_back(func);
    }

    SymbolTable symbols(module);
    llvm::SmallPtrSet<Operation *, 16> cloned;
    for (auto &[graph, funcs] : programs) {
      std::string name = (graph.getValue() + "_kernels").str();
      if (Operation *existing = symbols.lookup(name)) {
        existing->emitOpError("uses the symbol '")
            << name << "' that convert-event-to-gpu needs for the kernels "
            << "of graph '" << graph.getValue() << "'";
        return signalPassFailure();
      }
      OpBuilder b(ctx);
      b.setInsertionPointToEnd(module.getBody());
      auto kernels = gpu::GPUModuleOp::create(b, funcs.front().getLoc(), name);
      symbols.insert(kernels);
      for (func::FuncOp func : funcs) {
        bool worker =
            func.walk([](Operation *op) {
                  return isWorkerOp(op) ? WalkResult::interrupt()
                                        : WalkResult::advance();
                })
                .wasInterrupted();
        bool hasResult = func.getFunctionType().getNumResults() != 0;
        if (worker && hasResult) {
          func.emitOpError("uses worker ops and returns a value; the "
                           "persistent worker kernel cannot return one");
          return signalPassFailure();
        }
        FailureOr<gpu::GPUFuncOp> kernel = outlineKernel(func, kernels);
        if (failed(kernel))
          return signalPassFailure();
        symbols.erase(func);
        if (worker)
          setWorkerBounds(*kernel);
        if (!worker && !hasResult && failed(distributeOverCTA(*kernel)))
          return signalPassFailure();
        if (!worker && hasResult)
          distributeAnyReductions(*kernel);
        if (needsBroadcastWord(*kernel))
          kernel->addWorkgroupAttribution(
              MemRefType::get({1}, b.getI32Type(), AffineMap(),
                              gpu::AddressSpaceAttr::get(
                                  ctx, gpu::AddressSpace::Workgroup)),
              func.getLoc());
      }
      if (failed(cloneCallees(kernels, symbols, cloned)))
        return signalPassFailure();
      markGlobalArguments(kernels);
    }
    // The host copies of functions that only kernels called are dead now.
    for (Operation *func : cloned)
      if (SymbolTable::symbolKnownUseEmpty(func, module))
        symbols.erase(func);
    if (!programs.empty())
      module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                      UnitAttr::get(ctx));
    if (failed(planScratchArenas(module)))
      return signalPassFailure();
    for (auto kernels : module.getOps<gpu::GPUModuleOp>()) {
      bool spins = kernels
                       .walk([](Operation *op) {
                         return isa<WaitOp, QueuePopOp, IdleOp, StallOp>(op)
                                    ? WalkResult::interrupt()
                                    : WalkResult::advance();
                       })
                       .wasInterrupted();
      // Waits on symmetric events spin at system scope.
      bool systemSpins = kernels
                             .walk([](WaitOp op) {
                               return counterScope(op.getEvent()) !=
                                              kDeviceScope
                                          ? WalkResult::interrupt()
                                          : WalkResult::advance();
                             })
                             .wasInterrupted();
      if (spins && failed(defineSpinFunctions(kernels, gpuSpin(watchdogMs),
                                              systemSpins)))
        return signalPassFailure();
      bool stalls = kernels
                        .walk([](StallOp) { return WalkResult::interrupt(); })
                        .wasInterrupted();
      if (stalls && failed(defineStallCheck(kernels, watchdogMs)))
        return signalPassFailure();
    }

    TypeConverter typeConverter;
    populateEventToGPUTypeConversions(typeConverter);
    RewritePatternSet patterns(ctx);
    populateEventToGPUConversionPatterns(typeConverter, patterns, watchdogMs);
    ConversionTarget target(*ctx);
    target.addIllegalDialect<EventDialect>();
    target.markUnknownOpDynamicallyLegal([](Operation *) { return true; });
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      return signalPassFailure();
  }

  /// The worker's launch bounds: `.maxntid lanes, 1, 1` (its tiles are
  /// written for exactly `lanes` threads) and, when asked for,
  /// `.minnctapersm min-ctas`.
  void setWorkerBounds(gpu::GPUFuncOp kernel) {
    // At the default 128 lanes without `min-ctas` the worker has no bounds:
    // `.maxntid 128` alone made ptxas cap it at 128 registers, spilling the
    // real-width step workers that use up to 255.
    if (lanes == 128 && minCtas <= 0)
      return;
    Builder b(kernel.getContext());
    int32_t threads = static_cast<int32_t>(lanes);
    kernel->setAttr(NVVM::NVVMDialect::getMaxntidAttrName(),
                    b.getDenseI32ArrayAttr({threads, 1, 1}));
    if (minCtas > 0)
      kernel->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                      b.getI32IntegerAttr(static_cast<int32_t>(minCtas)));
  }
};
} // namespace
