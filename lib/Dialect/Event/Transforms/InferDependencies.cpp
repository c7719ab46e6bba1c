//===- InferDependencies.cpp - event-infer-dependencies ---------*- C++ -*-===//
//
// Turns an L1 task graph (tasks with access footprints) into an L2 event graph
// (event tensors plus wait/notify maps). Tasks are taken in textual order,
// which is program order; for every buffer the pass derives read-after-write,
// write-after-write and write-after-read dependencies between tasks, and for
// each one builds the smallest event tensor whose wait/notify maps are exact:
// one event dimension per producer grid dimension whose tiles line up with
// the consumer's, every other producer grid dimension collapsed into the
// expected count.
//
// Waits and notifies already on the tasks (declared by the front end for
// accesses no footprint can describe, such as rows chosen by routing data)
// are kept; an existing event that is exactly what inference would build is
// reused, which also makes the pass idempotent.
//
//===----------------------------------------------------------------------===//

#include "Event/Transforms/Passes.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/AffineExpr.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"

namespace etc::event {
#define GEN_PASS_DEF_EVENTINFERDEPENDENCIES
#include "Event/Transforms/Passes.h.inc"
} // namespace etc::event

using namespace mlir;
using namespace etc::event;

namespace {

//===----------------------------------------------------------------------===//
// Footprint analysis
//===----------------------------------------------------------------------===//

/// One buffer access of a task: the buffer, the box every tile touches, and
/// where the access is declared (for diagnostics).
struct Access {
  TaskOp task;
  Value buffer;
  FootprintAttr footprint;
  /// "reads", "writes" or "indices".
  StringRef clause;
  unsigned index;
};

/// How the box of one buffer dimension moves with the tile indices.
struct DimAccess {
  enum class Kind {
    /// Offset `d_gridDim * stride`, static `size`.
    Tiled,
    /// The whole dimension (`?`).
    Whole,
    /// Constant `offset`, static `size`: the same box for every tile.
    Fixed,
    /// Anything else; nothing is assumed about it.
    Unknown,
  };
  Kind kind = Kind::Unknown;
  unsigned gridDim = 0;
  int64_t stride = 0;
  int64_t offset = 0;
  int64_t size = 0;
};

/// Classifies buffer dimension `dim` of `footprint`.
DimAccess classifyDim(FootprintAttr footprint, unsigned dim) {
  DimAccess access;
  if (footprint.isFullDim(dim)) {
    access.kind = DimAccess::Kind::Whole;
    return access;
  }
  access.size = footprint.getSizes()[dim];
  AffineExpr expr = footprint.getOffsets().getResult(dim);
  if (auto constant = dyn_cast<AffineConstantExpr>(expr)) {
    access.kind = DimAccess::Kind::Fixed;
    access.offset = constant.getValue();
    return access;
  }
  if (auto tileIndex = dyn_cast<AffineDimExpr>(expr)) {
    access.kind = DimAccess::Kind::Tiled;
    access.gridDim = tileIndex.getPosition();
    access.stride = 1;
    return access;
  }
  auto product = dyn_cast<AffineBinaryOpExpr>(expr);
  if (!product || product.getKind() != AffineExprKind::Mul)
    return access;
  AffineExpr lhs = product.getLHS(), rhs = product.getRHS();
  if (isa<AffineConstantExpr>(lhs))
    std::swap(lhs, rhs);
  auto tileIndex = dyn_cast<AffineDimExpr>(lhs);
  auto stride = dyn_cast<AffineConstantExpr>(rhs);
  if (!tileIndex || !stride || stride.getValue() <= 0)
    return access;
  access.kind = DimAccess::Kind::Tiled;
  access.gridDim = tileIndex.getPosition();
  access.stride = stride.getValue();
  return access;
}

/// The static value of `value` when it is a constant index.
std::optional<int64_t> getConstantIndex(Value value) {
  APInt constant;
  if (matchPattern(value, m_ConstantInt(&constant)))
    return constant.getSExtValue();
  return std::nullopt;
}

/// Expresses index values as affine expressions over a shared list of opaque
/// symbol values, looking through `arith.constant` and `affine.apply`, so
/// that extents computed by separate but equal ops compare equal.
class ExtentExpressions {
public:
  explicit ExtentExpressions(MLIRContext *context) : context(context) {}

  AffineExpr get(Value value) {
    if (std::optional<int64_t> constant = getConstantIndex(value))
      return getAffineConstantExpr(*constant, context);
    if (auto apply = value.getDefiningOp<affine::AffineApplyOp>()) {
      AffineMap map = apply.getAffineMap();
      SmallVector<AffineExpr> operands;
      for (Value operand : apply.getMapOperands())
        operands.push_back(get(operand));
      ArrayRef<AffineExpr> all(operands);
      return map.getResult(0).replaceDimsAndSymbols(
          all.take_front(map.getNumDims()), all.drop_front(map.getNumDims()));
    }
    auto *it = llvm::find(symbols, value);
    unsigned position = it - symbols.begin();
    if (it == symbols.end())
      symbols.push_back(value);
    return getAffineSymbolExpr(position, context);
  }

  /// True when `lhs <= rhs` for every value of the symbols, as far as affine
  /// simplification can tell (their difference folds to a constant <= 0).
  bool provablyAtMost(AffineExpr lhs, AffineExpr rhs) {
    AffineExpr difference = simplifyAffineExpr(
        foldNestedDivisions(lhs) - foldNestedDivisions(rhs), /*numDims=*/0,
        symbols.size());
    auto constant = dyn_cast<AffineConstantExpr>(difference);
    return constant && constant.getValue() <= 0;
  }

private:
  /// Rewrites `(e ceildiv a) ceildiv b` to `e ceildiv (a * b)` and likewise
  /// for floordiv (exact for positive constants), which affine simplification
  /// does not do, so that e.g. `(B ceildiv 32) ceildiv 2` equals
  /// `B ceildiv 64`.
  static AffineExpr foldNestedDivisions(AffineExpr expr) {
    auto binary = dyn_cast<AffineBinaryOpExpr>(expr);
    if (!binary)
      return expr;
    AffineExpr lhs = foldNestedDivisions(binary.getLHS());
    AffineExpr rhs = foldNestedDivisions(binary.getRHS());
    AffineExprKind kind = binary.getKind();
    auto outer = dyn_cast<AffineConstantExpr>(rhs);
    auto inner = dyn_cast<AffineBinaryOpExpr>(lhs);
    if ((kind == AffineExprKind::CeilDiv || kind == AffineExprKind::FloorDiv) &&
        outer && outer.getValue() > 0 && inner && inner.getKind() == kind) {
      auto innerDivisor = dyn_cast<AffineConstantExpr>(inner.getRHS());
      if (innerDivisor && innerDivisor.getValue() > 0) {
        int64_t divisor = innerDivisor.getValue() * outer.getValue();
        return kind == AffineExprKind::CeilDiv
                   ? inner.getLHS().ceilDiv(divisor)
                   : inner.getLHS().floorDiv(divisor);
      }
    }
    return getAffineBinaryOpExpr(kind, lhs, rhs);
  }

  MLIRContext *context;
  SmallVector<Value> symbols;
};

/// The shape of the event that orders a consumer access after a producer
/// access: the producer grid dimensions kept as event dimensions, and for
/// each the consumer's wait coordinate as an expression of its tile indices.
struct EventPlan {
  SmallVector<unsigned> keptDims;
  SmallVector<AffineExpr> waitExprs;
};

/// Tries to keep producer grid dimension `producerDim` through buffer
/// dimension `bufferDim`; returns the consumer's wait coordinate when every
/// consumer tile overlaps producer tiles with a single index along
/// `producerDim`, and that index is provably inside the producer's grid.
std::optional<AffineExpr> matchDim(Access producer,
                                   Access consumer, unsigned producerDim,
                                   unsigned bufferDim,
                                   ExtentExpressions &extents) {
  DimAccess produced = classifyDim(producer.footprint, bufferDim);
  // Producer tiles along `producerDim` must partition the dimension into
  // windows [i * stride, (i + 1) * stride).
  if (produced.kind != DimAccess::Kind::Tiled ||
      produced.gridDim != producerDim || produced.size > produced.stride)
    return std::nullopt;
  AffineExpr producerExtent =
      extents.get(producer.task.getGrid()[producerDim]);
  DimAccess consumed = classifyDim(consumer.footprint, bufferDim);
  MLIRContext *context = producer.task.getContext();

  if (consumed.kind == DimAccess::Kind::Tiled) {
    // Aligned (ratio 1) or the producer's tile is `ratio` consumer tiles:
    // consumer tile j lies inside producer window j floordiv ratio.
    if (consumed.size > consumed.stride || produced.stride % consumed.stride)
      return std::nullopt;
    int64_t ratio = produced.stride / consumed.stride;
    AffineExpr consumerExtent =
        extents.get(consumer.task.getGrid()[consumed.gridDim]);
    if (!extents.provablyAtMost(consumerExtent.ceilDiv(ratio), producerExtent))
      return std::nullopt;
    AffineExpr tileIndex = getAffineDimExpr(consumed.gridDim, context);
    return ratio == 1 ? tileIndex : tileIndex.floorDiv(ratio);
  }

  if (consumed.kind == DimAccess::Kind::Fixed) {
    // Every consumer tile reads the same box: fine if it lies in one window.
    int64_t first = consumed.offset / produced.stride;
    int64_t last = (consumed.offset + consumed.size - 1) / produced.stride;
    if (consumed.offset < 0 || first != last ||
        !extents.provablyAtMost(getAffineConstantExpr(first + 1, context),
                                producerExtent))
      return std::nullopt;
    return getAffineConstantExpr(first, context);
  }

  // The consumer covers the whole dimension, a multiple of the producer's
  // tile, or something misaligned: it needs every producer tile along this
  // dimension, so the dimension is collapsed into the count.
  return std::nullopt;
}

/// Compares the footprints of a producer and a consumer access of the same
/// buffer dimension by dimension. Producer grid dimensions that do not tile
/// the buffer in step with the consumer (including dimensions absent from
/// the footprint, such as split reductions, and unanalysable offsets) are
/// collapsed: correct, only coarser.
EventPlan planEvent(Access producer, Access consumer,
                    ExtentExpressions &extents) {
  EventPlan plan;
  unsigned numBufferDims = producer.footprint.getSizes().size();
  for (unsigned producerDim = 0; producerDim < producer.task.getGridRank();
       ++producerDim) {
    for (unsigned bufferDim = 0; bufferDim < numBufferDims; ++bufferDim) {
      std::optional<AffineExpr> wait =
          matchDim(producer, consumer, producerDim, bufferDim, extents);
      if (!wait)
        continue;
      plan.keptDims.push_back(producerDim);
      plan.waitExprs.push_back(*wait);
      break;
    }
  }
  return plan;
}

//===----------------------------------------------------------------------===//
// Diagnostics
//===----------------------------------------------------------------------===//

/// Describes `buffer` for diagnostics: its graph argument number if any.
std::string describeBuffer(Value buffer) {
  if (auto arg = dyn_cast<BlockArgument>(buffer))
    return "graph argument #" + std::to_string(arg.getArgNumber());
  return "a buffer defined in the graph";
}

/// Rejects a footprint whose tiles start past the end of a static buffer
/// dimension: the grid and the buffer disagree, and no event could order
/// accesses that do not exist.
LogicalResult verifyInBounds(Access access) {
  auto type = cast<MemRefType>(access.buffer.getType());
  for (unsigned dim = 0; dim < type.getRank(); ++dim) {
    if (type.isDynamicDim(dim))
      continue;
    int64_t dimSize = type.getDimSize(dim);
    DimAccess box = classifyDim(access.footprint, dim);
    int64_t start = 0;
    if (box.kind == DimAccess::Kind::Fixed) {
      start = box.offset;
    } else if (box.kind == DimAccess::Kind::Tiled) {
      std::optional<int64_t> extent =
          getConstantIndex(access.task.getGrid()[box.gridDim]);
      if (!extent || *extent <= 0)
        continue;
      start = (*extent - 1) * box.stride;
    } else {
      continue;
    }
    if (start < dimSize)
      continue;
    return access.task.emitOpError("'")
           << access.task.getName() << "' " << access.clause << " #"
           << access.index << " (" << describeBuffer(access.buffer)
           << ") out of bounds: its last tile starts at offset " << start
           << " of buffer dimension " << dim << ", which has size " << dimSize;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Event construction
//===----------------------------------------------------------------------===//

/// Builds event tensors before their producers and attaches the maps,
/// sharing one event among all consumers of the same (producer, notify map).
class EventBuilder {
public:
  EventBuilder(GraphOp graph, ExtentExpressions &extents)
      : graph(graph), extents(extents), builder(graph.getContext()) {}

  /// Records the events of `tasks` that inference would have built itself:
  /// counted (without `count` when the notifier has live bounds), allocated
  /// in the graph, notified by exactly one task through
  /// an affine map keeping some grid dimensions in increasing order, and
  /// shaped like those dimensions. Inference then reuses them instead of
  /// allocating a duplicate (a second run changes nothing). Whether their
  /// `count` is right is event-check-schedule's to prove.
  void adoptExistingEvents(ArrayRef<TaskOp> tasks) {
    llvm::DenseMap<Value, unsigned> notifyCounts;
    for (TaskOp task : tasks)
      for (Value event : task.getNotifies())
        ++notifyCounts[event];
    for (TaskOp task : tasks) {
      for (auto [entry, event] : llvm::enumerate(task.getNotifies())) {
        auto alloc = event.getDefiningOp<AllocOp>();
        IndexMapAttr indexMap = task.getNotifyMap(entry);
        if (!alloc || alloc->getParentOp() != graph ||
            !alloc.getCount() != task.isPredicated() ||
            notifyCounts[event] != 1 || indexMap.hasIndirect())
          continue;
        std::optional<SmallVector<unsigned>> kept =
            getKeptDims(indexMap.getMap());
        if (kept && hasShapeOf(alloc, task, *kept))
          events[{task.getOperation(), indexMap.getMap()}] = event;
      }
    }
  }

  /// Orders `consumer` after the producer access of each pair in
  /// `dependencies` (both accesses of a pair touch the same buffer). Per producer task,
  /// a plan is dropped when another plan is at least as coarse: waiting on
  /// the coarser element already covers every tile the finer one names.
  void addDependencies(TaskOp consumer,
                       ArrayRef<std::pair<Access, Access>> dependencies) {
    llvm::MapVector<Operation *, SmallVector<EventPlan>> plans;
    for (auto [producer, consumed] : dependencies)
      plans[producer.task.getOperation()].push_back(
          planEvent(producer, consumed, extents));
    for (auto &[producer, producerPlans] : plans)
      for (auto [index, plan] : llvm::enumerate(producerPlans))
        if (!isRedundant(producerPlans, index))
          addEvent(cast<TaskOp>(producer), consumer, plan);
  }

private:
  /// The grid dimensions `map` keeps when its results are distinct tile
  /// indices in increasing order (the form `addEvent` builds).
  static std::optional<SmallVector<unsigned>> getKeptDims(AffineMap map) {
    SmallVector<unsigned> kept;
    for (AffineExpr expr : map.getResults()) {
      auto dim = dyn_cast<AffineDimExpr>(expr);
      if (!dim || (!kept.empty() && dim.getPosition() <= kept.back()))
        return std::nullopt;
      kept.push_back(dim.getPosition());
    }
    return kept;
  }

  /// True when the event `alloc` has one dimension per kept grid dimension
  /// of `producer`, each provably as large as the grid extent.
  bool hasShapeOf(AllocOp alloc, TaskOp producer, ArrayRef<unsigned> kept) {
    EventTensorType type = alloc.getType();
    if (type.getRank() != static_cast<int64_t>(kept.size()))
      return false;
    auto dynamicSize = alloc.getDynamicSizes().begin();
    for (auto [eventDim, gridDim] : llvm::enumerate(kept)) {
      AffineExpr extent = extents.get(producer.getGrid()[gridDim]);
      AffineExpr size =
          type.isDynamicDim(eventDim)
              ? extents.get(*dynamicSize++)
              : getAffineConstantExpr(type.getShape()[eventDim],
                                      graph.getContext());
      if (!extents.provablyAtMost(size, extent) ||
          !extents.provablyAtMost(extent, size))
        return false;
    }
    return true;
  }

  /// Adds a wait to `consumer` before its first indirect wait. Schedulers
  /// wait in list order and load an indirect coordinate right before its
  /// wait, so the inferred waits, which include the one on the producer of
  /// the index buffer, must come first.
  static void insertWait(TaskOp consumer, Value event, IndexMapAttr map) {
    SmallVector<Value> waits(consumer.getWaits());
    SmallVector<Attribute> maps(consumer.getWaitMaps().getValue());
    auto *firstIndirect = llvm::find_if(maps, [](Attribute attr) {
      return cast<IndexMapAttr>(attr).hasIndirect();
    });
    unsigned position = firstIndirect - maps.begin();
    waits.insert(waits.begin() + position, event);
    maps.insert(maps.begin() + position, map);
    consumer.getWaitsMutable().assign(waits);
    consumer.setWaitMapsAttr(ArrayAttr::get(consumer.getContext(), maps));
  }

  /// True when plan `index` names a subset of the producer tiles of an
  /// earlier plan, or of a later plan that is strictly coarser.
  static bool isRedundant(ArrayRef<EventPlan> plans, unsigned index) {
    auto coarserOrEqual = [](const EventPlan &coarse, const EventPlan &fine) {
      return llvm::all_of(llvm::zip(coarse.keptDims, coarse.waitExprs),
                          [&](auto kept) {
                            auto [dim, expr] = kept;
                            auto *it = llvm::find(fine.keptDims, dim);
                            return it != fine.keptDims.end() &&
                                   fine.waitExprs[it - fine.keptDims.begin()] ==
                                       expr;
                          });
    };
    const EventPlan &plan = plans[index];
    for (auto [other, candidate] : llvm::enumerate(plans)) {
      if (other == index || !coarserOrEqual(candidate, plan))
        continue;
      bool equal = coarserOrEqual(plan, candidate);
      if (!equal || other < index)
        return true;
    }
    return false;
  }

  /// Makes `consumer` wait on, and `producer` notify, the event of `plan`.
  void addEvent(TaskOp producer, TaskOp consumer, const EventPlan &plan) {
    MLIRContext *context = graph.getContext();
    SmallVector<AffineExpr> notifyExprs;
    for (unsigned dim : plan.keptDims)
      notifyExprs.push_back(getAffineDimExpr(dim, context));
    AffineMap notifyMap =
        AffineMap::get(producer.getGridRank(), 0, notifyExprs, context);
    AffineMap waitMap =
        AffineMap::get(consumer.getGridRank(), 0, plan.waitExprs, context);

    Value &event = events[{producer.getOperation(), notifyMap}];
    if (!event) {
      event = createEvent(producer, plan.keptDims);
      producer.addNotify(event, IndexMapAttr::get(notifyMap));
    }
    for (auto [index, waited] : llvm::enumerate(consumer.getWaits()))
      if (waited == event && consumer.getWaitMap(index) ==
                                 IndexMapAttr::get(waitMap))
        return;
    insertWait(consumer, event, IndexMapAttr::get(waitMap));
  }

  /// Allocates, right before `producer`, an event with one dimension per
  /// kept grid dimension and every element expecting the product of the
  /// extents of the collapsed ones. When only some of the producer's tiles
  /// run (live bounds), how many notify each element is runtime data: the
  /// event has no `count`, and the scheduled program counts its live
  /// notifiers before the run.
  Value createEvent(TaskOp producer, ArrayRef<unsigned> keptDims) {
    builder.setInsertionPoint(producer);
    Location loc = producer.getLoc();
    SmallVector<int64_t> shape;
    SmallVector<Value> dynamicSizes;
    int64_t staticCount = 1;
    SmallVector<Value> dynamicFactors;
    for (auto [dim, extent] : llvm::enumerate(producer.getGrid())) {
      std::optional<int64_t> constant = getConstantIndex(extent);
      if (llvm::is_contained(keptDims, dim)) {
        shape.push_back(constant ? *constant : ShapedType::kDynamic);
        if (!constant)
          dynamicSizes.push_back(extent);
      } else if (constant) {
        staticCount *= *constant;
      } else {
        dynamicFactors.push_back(extent);
      }
    }
    Value count = producer.isPredicated()
                      ? Value()
                      : buildCount(producer, staticCount, dynamicFactors);
    auto type = EventTensorType::get(graph.getContext(), shape);
    return AllocOp::create(builder, loc, type, dynamicSizes, count);
  }

  /// Materialises `staticCount * prod(dynamicFactors)` before `producer`.
  Value buildCount(TaskOp producer, int64_t staticCount,
                   ArrayRef<Value> dynamicFactors) {
    Location loc = producer.getLoc();
    if (dynamicFactors.empty())
      return getIndexConstant(producer, staticCount);
    Value product = dynamicFactors.front();
    for (Value factor : dynamicFactors.drop_front())
      product = arith::MulIOp::create(builder, loc, product, factor);
    if (staticCount == 1)
      return product;
    MLIRContext *context = graph.getContext();
    AffineMap scale = AffineMap::get(
        0, 1, getAffineSymbolExpr(0, context) * staticCount, context);
    return affine::AffineApplyOp::create(builder, loc, scale,
                                                 ValueRange{product});
  }

  /// An index constant that dominates `producer`: an existing top-level one
  /// before it, or a new one right before it.
  Value getIndexConstant(TaskOp producer, int64_t value) {
    for (Operation &op : graph.getBody().front()) {
      if (&op == producer.getOperation())
        break;
      auto constant = dyn_cast<arith::ConstantIndexOp>(&op);
      if (constant && constant.value() == value)
        return constant;
    }
    return arith::ConstantIndexOp::create(builder, producer.getLoc(), value);
  }

  GraphOp graph;
  ExtentExpressions &extents;
  OpBuilder builder;
  /// Events by (producer task, notify map); the map fixes the shape.
  llvm::DenseMap<std::pair<Operation *, AffineMap>, Value> events;
};

//===----------------------------------------------------------------------===//
// Pass
//===----------------------------------------------------------------------===//

/// The accesses of `task`: reads (including index buffers that are not also
/// listed as reads, taken as whole-buffer reads) and writes.
void collectAccesses(TaskOp task, SmallVectorImpl<Access> &reads,
                     SmallVectorImpl<Access> &writes) {
  for (auto [index, buffer] : llvm::enumerate(task.getReads()))
    reads.push_back({task, buffer, task.getReadFootprint(index), "reads",
                     static_cast<unsigned>(index)});
  for (auto [index, buffer] : llvm::enumerate(task.getIndices())) {
    if (llvm::is_contained(task.getReads(), buffer))
      continue;
    MLIRContext *context = task.getContext();
    auto wholeBuffer = FootprintAttr::get(
        context,
        AffineMap::get(task.getGridRank(), 0,
                       getAffineConstantExpr(0, context), context),
        {ShapedType::kDynamic});
    reads.push_back(
        {task, buffer, wholeBuffer, "indices", static_cast<unsigned>(index)});
  }
  for (auto [index, buffer] : llvm::enumerate(task.getWrites()))
    writes.push_back({task, buffer, task.getWriteFootprint(index), "writes",
                      static_cast<unsigned>(index)});
}

/// Per buffer: the accesses of its last writer, and the reads since then.
struct BufferHistory {
  SmallVector<Access> lastWrites;
  SmallVector<Access> readsSinceWrite;
};

struct EventInferDependenciesPass
    : public etc::event::impl::EventInferDependenciesBase<
          EventInferDependenciesPass> {
  using EventInferDependenciesBase::EventInferDependenciesBase;

  void runOnOperation() override {
    GraphOp graph = getOperation();
    SmallVector<TaskOp> tasks(graph.getBody().getOps<TaskOp>());

    // Reject inconsistent footprints before changing anything.
    for (TaskOp task : tasks) {
      SmallVector<Access> reads, writes;
      collectAccesses(task, reads, writes);
      for (Access access : llvm::concat<Access>(reads, writes))
        if (failed(verifyInBounds(access)))
          return signalPassFailure();
    }

    ExtentExpressions extents(graph.getContext());
    EventBuilder events(graph, extents);
    events.adoptExistingEvents(tasks);
    llvm::MapVector<Value, BufferHistory> history;
    for (TaskOp task : tasks) {
      SmallVector<Access> reads, writes;
      collectAccesses(task, reads, writes);

      // Read after write: wait on the last writer.
      SmallVector<std::pair<Access, Access>> dependencies;
      for (Access read : reads)
        for (Access write : history[read.buffer].lastWrites)
          dependencies.push_back({write, read});
      // Write after read and write after write.
      for (Access write : writes) {
        BufferHistory &buffer = history[write.buffer];
        for (Access read : buffer.readsSinceWrite)
          dependencies.push_back({read, write});
        for (Access previous : buffer.lastWrites)
          dependencies.push_back({previous, write});
      }
      events.addDependencies(task, dependencies);

      for (Access write : writes) {
        BufferHistory &buffer = history[write.buffer];
        if (!buffer.lastWrites.empty() &&
            buffer.lastWrites.front().task == task) {
          buffer.lastWrites.push_back(write);
          continue;
        }
        buffer.lastWrites.assign(1, write);
        buffer.readsSinceWrite.clear();
      }
      // Reads of a buffer this task also writes are ordered before later
      // accesses through the write.
      for (Access read : reads)
        if (!llvm::is_contained(task.getWrites(), read.buffer))
          history[read.buffer].readsSinceWrite.push_back(read);
    }
  }
};

} // namespace
