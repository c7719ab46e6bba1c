//===- CheckSchedule.cpp - event-check-schedule ---------------------------===//
//
// Proves an L2 event graph safe for the static global order before any
// scheduler commits to it: events are allocated in the graph, waits only
// target events of earlier tasks (acyclic, and deadlock-free when all workers
// are co-resident), expected counts balance the notifies, and affine waits
// stay inside their event tensors. Sizes are symbolic, so equalities between
// grid extents, event sizes and counts are proved on the `index` values the
// graph computes from its dimension arguments.
//
//===----------------------------------------------------------------------===//

#include "CheckSchedule.h"
#include "Event/Transforms/Passes.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/AffineExpr.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SmallBitVector.h"

#include <map>

namespace etc::event {
#define GEN_PASS_DEF_EVENTCHECKSCHEDULE
#include "Event/Transforms/Passes.h.inc"
} // namespace etc::event

using namespace mlir;
using namespace etc::event;

//===----------------------------------------------------------------------===//
// Symbolic equality of index values
//===----------------------------------------------------------------------===//

namespace {
/// Proves equalities between `index` values computed from the graph's
/// symbolic dimensions. Values are normalised two ways over shared opaque
/// *atoms* (values it cannot see through, structurally equal ones merged):
/// as polynomials with integer coefficients, which makes sums and products of
/// grid extents canonical, and as affine expressions, which also relate
/// `ceildiv`s (`(s ceildiv 32) ceildiv 2 == s ceildiv 64`).
class SymbolicEquality {
public:
  /// A product of atoms, sorted; the empty monomial is the constant 1.
  using Monomial = SmallVector<unsigned, 4>;
  /// Sum of monomials with their non-zero coefficients.
  using Polynomial = std::map<Monomial, int64_t>;

  explicit SymbolicEquality(MLIRContext *context) : context(context) {}

  static Polynomial constant(int64_t value) {
    Polynomial result;
    if (value != 0)
      result[{}] = value;
    return result;
  }

  static Polynomial add(const Polynomial &lhs, const Polynomial &rhs,
                        int64_t rhsScale = 1) {
    Polynomial result = lhs;
    for (const auto &[monomial, coefficient] : rhs)
      if ((result[monomial] += rhsScale * coefficient) == 0)
        result.erase(monomial);
    return result;
  }

  static Polynomial multiply(const Polynomial &lhs, const Polynomial &rhs) {
    Polynomial result;
    for (const auto &[lhsMonomial, lhsCoefficient] : lhs) {
      for (const auto &[rhsMonomial, rhsCoefficient] : rhs) {
        Monomial product = lhsMonomial;
        product.append(rhsMonomial.begin(), rhsMonomial.end());
        llvm::sort(product);
        if ((result[product] += lhsCoefficient * rhsCoefficient) == 0)
          result.erase(product);
      }
    }
    return result;
  }

  /// The polynomial `value` computes.
  Polynomial polynomial(OpFoldResult value, unsigned depth = 0);

  /// True when `lhs == rhs` holds for every value of the graph's arguments
  /// (as far as this class can prove).
  bool equal(OpFoldResult lhs, OpFoldResult rhs);

  /// True when `size == extent ceildiv divisor` provably holds.
  bool equalsCeilDiv(OpFoldResult size, OpFoldResult extent, int64_t divisor);

private:
  unsigned atom(Value value);
  bool structurallyEqual(Value lhs, Value rhs, unsigned depth = 0);
  AffineExpr expression(OpFoldResult value, unsigned depth = 0);
  AffineExpr simplified(AffineExpr expr) {
    return simplifyAffineExpr(expr, 0, atoms.size());
  }
  std::optional<Polynomial> polynomialOf(AffineExpr expr,
                                         ArrayRef<Polynomial> dims,
                                         ArrayRef<Polynomial> symbols);

  /// Bounds the recursion through chains of index computations.
  static constexpr unsigned kMaxDepth = 16;

  MLIRContext *context;
  SmallVector<Value> atoms;
};
} // namespace

bool SymbolicEquality::structurallyEqual(Value lhs, Value rhs,
                                         unsigned depth) {
  if (lhs == rhs)
    return true;
  std::optional<int64_t> lhsConstant = getConstantIntValue(lhs);
  std::optional<int64_t> rhsConstant = getConstantIntValue(rhs);
  if (lhsConstant || rhsConstant)
    return lhsConstant && rhsConstant && *lhsConstant == *rhsConstant;
  Operation *lhsOp = lhs.getDefiningOp();
  Operation *rhsOp = rhs.getDefiningOp();
  if (!lhsOp || !rhsOp || depth > kMaxDepth || lhsOp->getNumRegions() != 0 ||
      !isMemoryEffectFree(lhsOp) ||
      cast<OpResult>(lhs).getResultNumber() !=
          cast<OpResult>(rhs).getResultNumber())
    return false;
  return OperationEquivalence::isEquivalentTo(
      lhsOp, rhsOp,
      [&](Value a, Value b) {
        return success(structurallyEqual(a, b, depth + 1));
      },
      /*markEquivalent=*/nullptr, OperationEquivalence::IgnoreLocations);
}

unsigned SymbolicEquality::atom(Value value) {
  for (auto [index, known] : llvm::enumerate(atoms))
    if (structurallyEqual(known, value))
      return index;
  atoms.push_back(value);
  return atoms.size() - 1;
}

std::optional<SymbolicEquality::Polynomial>
SymbolicEquality::polynomialOf(AffineExpr expr, ArrayRef<Polynomial> dims,
                               ArrayRef<Polynomial> symbols) {
  if (auto constantExpr = dyn_cast<AffineConstantExpr>(expr))
    return constant(constantExpr.getValue());
  if (auto dim = dyn_cast<AffineDimExpr>(expr))
    return dims[dim.getPosition()];
  if (auto symbol = dyn_cast<AffineSymbolExpr>(expr))
    return symbols[symbol.getPosition()];
  auto binary = cast<AffineBinaryOpExpr>(expr);
  if (binary.getKind() != AffineExprKind::Add &&
      binary.getKind() != AffineExprKind::Mul)
    return std::nullopt;
  std::optional<Polynomial> lhs = polynomialOf(binary.getLHS(), dims, symbols);
  std::optional<Polynomial> rhs = polynomialOf(binary.getRHS(), dims, symbols);
  if (!lhs || !rhs)
    return std::nullopt;
  return binary.getKind() == AffineExprKind::Add ? add(*lhs, *rhs)
                                                 : multiply(*lhs, *rhs);
}

SymbolicEquality::Polynomial SymbolicEquality::polynomial(OpFoldResult value,
                                                          unsigned depth) {
  if (std::optional<int64_t> known = getConstantIntValue(value))
    return constant(*known);
  auto operand = cast<Value>(value);
  Operation *op = operand.getDefiningOp();
  auto opaque = [&] {
    Polynomial result;
    result[{atom(operand)}] = 1;
    return result;
  };
  if (!op || depth > kMaxDepth)
    return opaque();
  if (auto addOp = dyn_cast<arith::AddIOp>(op))
    return add(polynomial(addOp.getLhs(), depth + 1),
               polynomial(addOp.getRhs(), depth + 1));
  if (auto subOp = dyn_cast<arith::SubIOp>(op))
    return add(polynomial(subOp.getLhs(), depth + 1),
               polynomial(subOp.getRhs(), depth + 1), /*rhsScale=*/-1);
  if (auto mulOp = dyn_cast<arith::MulIOp>(op))
    return multiply(polynomial(mulOp.getLhs(), depth + 1),
                    polynomial(mulOp.getRhs(), depth + 1));
  if (auto apply = dyn_cast<affine::AffineApplyOp>(op)) {
    AffineMap map = apply.getAffineMap();
    SmallVector<Polynomial> dims, symbols;
    for (Value dim : apply.getDimOperands())
      dims.push_back(polynomial(dim, depth + 1));
    for (Value symbol : apply.getSymbolOperands())
      symbols.push_back(polynomial(symbol, depth + 1));
    if (std::optional<Polynomial> result =
            polynomialOf(map.getResult(0), dims, symbols))
      return *result;
  }
  return opaque();
}

AffineExpr SymbolicEquality::expression(OpFoldResult value, unsigned depth) {
  if (std::optional<int64_t> known = getConstantIntValue(value))
    return getAffineConstantExpr(*known, context);
  auto operand = cast<Value>(value);
  Operation *op = operand.getDefiningOp();
  auto opaque = [&] { return getAffineSymbolExpr(atom(operand), context); };
  if (!op || depth > kMaxDepth)
    return opaque();
  if (auto apply = dyn_cast<affine::AffineApplyOp>(op)) {
    SmallVector<AffineExpr> dims, symbols;
    for (Value dim : apply.getDimOperands())
      dims.push_back(expression(dim, depth + 1));
    for (Value symbol : apply.getSymbolOperands())
      symbols.push_back(expression(symbol, depth + 1));
    return apply.getAffineMap().getResult(0).replaceDimsAndSymbols(dims,
                                                                   symbols);
  }
  if (op->getNumOperands() != 2)
    return opaque();
  AffineExpr lhs = expression(op->getOperand(0), depth + 1);
  AffineExpr rhs = expression(op->getOperand(1), depth + 1);
  auto divisor = dyn_cast<AffineConstantExpr>(rhs);
  if (isa<arith::AddIOp>(op))
    return lhs + rhs;
  if (isa<arith::SubIOp>(op))
    return lhs - rhs;
  if (isa<arith::MulIOp>(op))
    return lhs * rhs;
  // Sizes are non-negative, so signed and unsigned divisions agree.
  if (isa<arith::CeilDivSIOp, arith::CeilDivUIOp>(op) && divisor &&
      divisor.getValue() > 0)
    return lhs.ceilDiv(divisor.getValue());
  if (isa<arith::FloorDivSIOp, arith::DivSIOp, arith::DivUIOp>(op) &&
      divisor && divisor.getValue() > 0)
    return lhs.floorDiv(divisor.getValue());
  return opaque();
}

bool SymbolicEquality::equal(OpFoldResult lhs, OpFoldResult rhs) {
  std::optional<int64_t> lhsConstant = getConstantIntValue(lhs);
  std::optional<int64_t> rhsConstant = getConstantIntValue(rhs);
  if (lhsConstant && rhsConstant)
    return *lhsConstant == *rhsConstant;
  if (isa<Value>(lhs) && isa<Value>(rhs) &&
      structurallyEqual(cast<Value>(lhs), cast<Value>(rhs)))
    return true;
  if (polynomial(lhs) == polynomial(rhs))
    return true;
  AffineExpr lhsExpr = expression(lhs);
  AffineExpr rhsExpr = expression(rhs);
  return simplified(lhsExpr) == simplified(rhsExpr);
}

bool SymbolicEquality::equalsCeilDiv(OpFoldResult size, OpFoldResult extent,
                                     int64_t divisor) {
  if (divisor == 1)
    return equal(size, extent);
  std::optional<int64_t> sizeConstant = getConstantIntValue(size);
  std::optional<int64_t> extentConstant = getConstantIntValue(extent);
  if (sizeConstant && extentConstant)
    return *sizeConstant == llvm::divideCeil(*extentConstant, divisor);
  AffineExpr sizeExpr = expression(size);
  AffineExpr extentExpr = simplified(expression(extent));
  // ceildiv(ceildiv(x, a), b) == ceildiv(x, a * b) for positive a and b,
  // which affine simplification does not know.
  auto inner = dyn_cast<AffineBinaryOpExpr>(extentExpr);
  if (inner && inner.getKind() == AffineExprKind::CeilDiv)
    if (auto innerDivisor = dyn_cast<AffineConstantExpr>(inner.getRHS());
        innerDivisor && innerDivisor.getValue() > 0)
      return simplified(sizeExpr) ==
             simplified(inner.getLHS().ceilDiv(innerDivisor.getValue() *
                                               divisor));
  return simplified(sizeExpr) == simplified(extentExpr.ceilDiv(divisor));
}

/// `expr` as the IR spells it, for diagnostics.
static std::string print(AffineExpr expr) {
  std::string text;
  llvm::raw_string_ostream os(text);
  expr.print(os);
  return text;
}

//===----------------------------------------------------------------------===//
// The proof
//===----------------------------------------------------------------------===//

namespace {
/// One notify or wait clause entry: task `task` (its position in the graph)
/// names the event as its notify or wait number `entry`.
struct EventUse {
  unsigned task;
  unsigned entry;
};

/// Everything the proof needs about one graph.
class ScheduleChecker {
public:
  ScheduleChecker(GraphOp graph, bool requireStaticOrder)
      : graph(graph), requireStaticOrder(requireStaticOrder),
        symbolic(graph.getContext()),
        tasks(graph.getBody().getOps<TaskOp>()) {}

  LogicalResult check();

private:
  LogicalResult collectEventUses();
  LogicalResult checkOrder(AllocOp alloc);
  LogicalResult checkBalance(AllocOp alloc);
  LogicalResult checkCountable(AllocOp alloc);
  LogicalResult checkWaitRange(AllocOp alloc, EventUse wait);
  LogicalResult checkLiveBounds(unsigned task);

  /// Size of dimension `dim` of the event tensor `alloc` allocates.
  OpFoldResult eventSize(AllocOp alloc, unsigned dim);
  StringRef name(unsigned task) { return tasks[task].getName(); }

  GraphOp graph;
  bool requireStaticOrder;
  SymbolicEquality symbolic;
  SmallVector<TaskOp> tasks;
  llvm::MapVector<Operation *, SmallVector<EventUse>> notifiers, waiters;
};
} // namespace

OpFoldResult ScheduleChecker::eventSize(AllocOp alloc, unsigned dim) {
  EventTensorType type = alloc.getType();
  if (!type.isDynamicDim(dim))
    return Builder(alloc.getContext()).getIndexAttr(type.getShape()[dim]);
  unsigned dynamicIndex = 0;
  for (unsigned before = 0; before < dim; ++before)
    dynamicIndex += type.isDynamicDim(before);
  return alloc.getDynamicSizes()[dynamicIndex];
}

LogicalResult ScheduleChecker::collectEventUses() {
  for (auto [taskIndex, task] : llvm::enumerate(tasks)) {
    auto record = [&, taskIndex = taskIndex, task = task](
                      StringRef clause, OperandRange events,
                      llvm::MapVector<Operation *, SmallVector<EventUse>> &uses)
                      mutable -> LogicalResult {
      for (auto [entry, event] : llvm::enumerate(events)) {
        auto alloc = event.getDefiningOp<AllocOp>();
        if (!alloc || alloc->getParentOp() != graph)
          return task.emitOpError()
                 << clause << " #" << entry
                 << " names an event that is not allocated by an "
                    "'event.alloc' of graph @"
                 << graph.getSymName()
                 << "; the schedule cannot lay out its counters";
        uses[alloc].push_back(
            {static_cast<unsigned>(taskIndex), static_cast<unsigned>(entry)});
      }
      return success();
    };
    if (failed(record("waits", task.getWaits(), waiters)) ||
        failed(record("notifies", task.getNotifies(), notifiers)))
      return failure();
  }
  return success();
}

LogicalResult ScheduleChecker::checkOrder(AllocOp alloc) {
  SmallVector<EventUse> producers = notifiers.lookup(alloc);
  // The graph verifier already rejects waits on events nobody notifies.
  if (producers.empty()) {
    if (!alloc.getCount())
      return alloc.emitOpError("has no 'count', so its expected counts are "
                               "counted from its notifies, but no task "
                               "notifies it");
    return success();
  }
  if (!requireStaticOrder)
    return success();
  for (EventUse wait : waiters.lookup(alloc))
    for (EventUse notify : producers)
      if (notify.task >= wait.task)
        return alloc.emitOpError("is waited on by task '")
               << name(wait.task) << "' (wait #" << wait.entry
               << ") but notified by task '" << name(notify.task)
               << "', which is not earlier in the static order (tasks run in "
                  "textual order); the schedule could deadlock";
  return success();
}

LogicalResult ScheduleChecker::checkBalance(AllocOp alloc) {
  SymbolicEquality::Polynomial notifies = SymbolicEquality::constant(0);
  for (EventUse use : notifiers.lookup(alloc)) {
    TaskOp task = tasks[use.task];
    IndexMapAttr indexMap = task.getNotifyMap(use.entry);
    AffineMap map = indexMap.getMap();
    auto diag = [&]() {
      return alloc.emitOpError("has a 'count' but notify #")
             << use.entry << " of task '" << task.getName() << "' ";
    };
    if (indexMap.hasIndirect())
      return diag() << "loads its coordinates from an index buffer; only "
                       "events without 'count' may be notified indirectly";
    if (task.isPredicated())
      return diag() << "runs only on the tiles its live bounds allow, so how "
                       "many notifies an element receives is runtime data; "
                       "only events without 'count' (counted on the device "
                       "over live tiles) may be notified by it";
    llvm::SmallBitVector kept(task.getGridRank());
    for (auto [result, expr] : llvm::enumerate(map.getResults())) {
      auto dim = dyn_cast<AffineDimExpr>(expr);
      if (!dim || kept.test(dim.getPosition()))
        return diag() << "has map " << AffineMapAttr::get(map)
                      << ", which is not a projected permutation of the tile "
                         "indices; the expected count cannot be proved";
      kept.set(dim.getPosition());
      OpFoldResult extent = task.getGrid()[dim.getPosition()];
      if (!symbolic.equal(eventSize(alloc, result), extent))
        return diag() << "maps tile index d" << dim.getPosition()
                      << " to event dimension " << result
                      << ", but the grid extent and the event size cannot be "
                         "proved equal";
    }
    SymbolicEquality::Polynomial perElement = SymbolicEquality::constant(1);
    for (unsigned dim = 0; dim < task.getGridRank(); ++dim)
      if (!kept.test(dim))
        perElement = SymbolicEquality::multiply(
            perElement, symbolic.polynomial(task.getGrid()[dim]));
    notifies = SymbolicEquality::add(notifies, perElement);
  }
  if (symbolic.polynomial(alloc.getCount()) != notifies) {
    auto diag = alloc.emitOpError(
        "'count' cannot be proved equal to the number of notifies each "
        "element receives from task");
    SmallVector<EventUse> producers = notifiers.lookup(alloc);
    if (producers.size() > 1)
      diag << "s";
    for (auto [index, use] : llvm::enumerate(producers))
      diag << (index ? ", '" : " '") << name(use.task) << "'";
    diag << " (the product of their grid extents over the tile indices the "
            "notify maps drop)";
    return diag;
  }
  return success();
}

LogicalResult ScheduleChecker::checkCountable(AllocOp alloc) {
  // The expected counts of an event without `count` are counted from its
  // notify maps before any task runs, so their index buffers must hold their
  // values from the start.
  for (EventUse use : notifiers.lookup(alloc)) {
    TaskOp task = tasks[use.task];
    IndexMapAttr indexMap = task.getNotifyMap(use.entry);
    for (int64_t buffer : indexMap.getIndirect()) {
      if (buffer < 0)
        continue;
      Value indices = task.getIndices()[buffer];
      for (TaskOp writer : tasks)
        if (llvm::is_contained(writer.getWrites(), indices))
          return alloc.emitOpError("has no 'count', so its expected counts "
                                   "are counted before any task runs, but "
                                   "notify #")
                 << use.entry << " of task '" << task.getName()
                 << "' loads its coordinates from index buffer #" << buffer
                 << ", which task '" << writer.getName()
                 << "' writes during the run";
    }
  }
  return success();
}

LogicalResult ScheduleChecker::checkWaitRange(AllocOp alloc, EventUse wait) {
  TaskOp task = tasks[wait.task];
  IndexMapAttr indexMap = task.getWaitMap(wait.entry);
  for (auto [result, expr] : llvm::enumerate(indexMap.getMap().getResults())) {
    // Indirect coordinates are runtime data; the index buffer's producer
    // is responsible for their range.
    if (indexMap.isIndirect(result))
      continue;
    OpFoldResult size = eventSize(alloc, result);
    auto diag = [&, result = result]() {
      return alloc.emitOpError("is waited on by task '")
             << task.getName() << "' (wait #" << wait.entry
             << ") whose coordinate " << result << " ";
    };
    if (auto constant = dyn_cast<AffineConstantExpr>(expr)) {
      std::optional<int64_t> known = getConstantIntValue(size);
      if (!known || constant.getValue() < 0 || constant.getValue() >= *known)
        return diag() << "is the constant " << constant.getValue()
                      << ", which cannot be proved inside the event size";
      continue;
    }
    unsigned dim;
    int64_t divisor = 1;
    if (auto dimExpr = dyn_cast<AffineDimExpr>(expr)) {
      dim = dimExpr.getPosition();
    } else if (auto binary = dyn_cast<AffineBinaryOpExpr>(expr);
               binary && binary.getKind() == AffineExprKind::FloorDiv &&
               isa<AffineDimExpr>(binary.getLHS()) &&
               isa<AffineConstantExpr>(binary.getRHS()) &&
               cast<AffineConstantExpr>(binary.getRHS()).getValue() > 0) {
      dim = cast<AffineDimExpr>(binary.getLHS()).getPosition();
      divisor = cast<AffineConstantExpr>(binary.getRHS()).getValue();
    } else {
      return diag() << "is '" << print(expr)
                    << "'; only a tile index 'dN' or 'dN floordiv M' can be "
                       "proved inside the event tensor";
    }
    OpFoldResult extent = task.getGrid()[dim];
    if (!symbolic.equalsCeilDiv(size, extent, divisor)) {
      auto error = diag() << "is '" << print(expr) << "', but the event size ";
      if (divisor == 1)
        return error << "cannot be proved equal to the grid extent along d"
                     << dim;
      return error << "cannot be proved equal to the grid extent along d"
                   << dim << " ceildiv " << divisor;
    }
  }
  return success();
}

LogicalResult ScheduleChecker::checkLiveBounds(unsigned taskIndex) {
  // Which tiles run is decided before any task runs (the dynamic scheduler
  // queues live tiles in `@g_init`; expected counts count them), so the
  // values the bounds load must be there from the start.
  TaskOp task = tasks[taskIndex];
  for (auto [index, bound] : llvm::enumerate(task.getLiveBoundList())) {
    Value indices = task.getIndices()[bound.getIndexBuffer()];
    for (TaskOp writer : tasks)
      if (llvm::is_contained(writer.getWrites(), indices))
        return task.emitOpError("live bound #")
               << index << " loads its value from index buffer #"
               << bound.getIndexBuffer() << ", which task '"
               << writer.getName()
               << "' writes during the run; which tiles run is decided "
                  "before any task runs";
  }
  return success();
}

LogicalResult ScheduleChecker::check() {
  if (failed(collectEventUses()))
    return failure();
  for (unsigned task = 0; task < tasks.size(); ++task)
    if (failed(checkLiveBounds(task)))
      return failure();
  for (AllocOp alloc : graph.getBody().getOps<AllocOp>()) {
    if (failed(checkOrder(alloc)))
      return failure();
    // A symmetric event's notifies come from every rank's tiles (through
    // maps of the rank s0), which this rank's graph cannot count: its
    // balance is checked after the run, when `@g_check` finds every
    // counter back at zero on every rank.
    if (alloc.getCount() && !alloc.getType().getSymmetric() &&
        failed(checkBalance(alloc)))
      return failure();
    if (!alloc.getCount() && failed(checkCountable(alloc)))
      return failure();
    for (EventUse wait : waiters.lookup(alloc))
      if (failed(checkWaitRange(alloc, wait)))
        return failure();
  }
  return success();
}

LogicalResult etc::event::checkSchedule(GraphOp graph,
                                        bool requireStaticOrder) {
  return ScheduleChecker(graph, requireStaticOrder).check();
}

//===----------------------------------------------------------------------===//
// Pass
//===----------------------------------------------------------------------===//

namespace {
struct EventCheckSchedulePass
    : public etc::event::impl::EventCheckScheduleBase<EventCheckSchedulePass> {
  using EventCheckScheduleBase::EventCheckScheduleBase;
  void runOnOperation() override {
    if (failed(checkSchedule(getOperation(), staticOrder)))
      signalPassFailure();
    markAllAnalysesPreserved();
  }
};
} // namespace
