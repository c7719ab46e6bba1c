//===- GraphProgramBuilder.cpp - Functions of a scheduled program ---------===//
//
// The parts of a scheduled program that do not depend on the schedule: the
// functions' signatures and attributes, the layout of the event classes in
// the counter buffer, their expected counts, tile bodies, the run header,
// trace records and the end-of-run check.
//
//===----------------------------------------------------------------------===//

#include "GraphProgramBuilder.h"
#include "IndexArithmetic.h"

#include "Event/IR/RunLayout.h"
#include "Event/IR/TransportLayout.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace etc::event;

GraphProgramBuilder::GraphProgramBuilder(const GraphPlan &plan,
                                         StringRef schedule, int64_t workers,
                                         bool trace)
    : plan(plan), graph(plan.graph), schedule(schedule.str()),
      workers(workers), trace(trace),
      tasks(plan.tasks.begin(), plan.tasks.end()) {}

/// The `event.tasks` table: each task's name and grid rank, in order.
static ArrayAttr taskTable(OpBuilder &b, ArrayRef<TaskOp> tasks) {
  return b.getArrayAttr(llvm::map_to_vector(tasks, [&](TaskOp task) -> Attribute {
    return b.getDictionaryAttr({
        b.getNamedAttr("name", task.getNameAttr()),
        b.getNamedAttr("grid_rank", b.getI64IntegerAttr(task.getGridRank())),
    });
  }));
}

/// The `event.events` table: for each event in the order of its global
/// number (`e<number>`), the tasks that notify it and wait on it.
static ArrayAttr eventTable(OpBuilder &b, const GraphPlan &plan) {
  SmallVector<Attribute> events;
  for (const EventClass &eventClass : plan.classes)
    for (AllocOp constAlloc : eventClass.instances) {
      AllocOp alloc = constAlloc;
      SmallVector<Attribute> notifiers, waiters;
      for (TaskOp task : plan.tasks) {
        if (llvm::is_contained(task.getNotifies(), alloc.getResult()))
          notifiers.push_back(task.getNameAttr());
        if (llvm::is_contained(task.getWaits(), alloc.getResult()))
          waiters.push_back(task.getNameAttr());
      }
      events.push_back(b.getDictionaryAttr({
          b.getNamedAttr("name", b.getStringAttr(
                                     "e" + std::to_string(plan.eventNumber(alloc)))),
          b.getNamedAttr("notified_by", b.getArrayAttr(notifiers)),
          b.getNamedAttr("waited_by", b.getArrayAttr(waiters)),
      }));
    }
  return b.getArrayAttr(events);
}

SmallVector<std::string> GraphProgramBuilder::symbolNames(GraphOp graph) {
  SmallVector<std::string> names;
  for (StringRef suffix :
       {"_counters", "_init", "_worker", "_check", "_task_family",
        "_task_record", "_task_records", "_waiter_offsets", "_waiter_tasks",
        "_waiter_kinds", "_first_waiter",
        "_first_waiter_kind"})
    names.push_back((graph.getSymName() + suffix).str());
  return names;
}

void GraphProgramBuilder::createConstantTable(OpBuilder &builder,
                                              StringRef suffix,
                                              ArrayRef<int32_t> values) {
  Location loc = graph.getLoc();
  std::string name = (graph.getSymName() + suffix).str();
  SmallVector<int32_t> data(values);
  if (data.empty())
    data.push_back(0);
  auto type = MemRefType::get({static_cast<int64_t>(data.size())},
                              builder.getI32Type());
  auto tensorType = RankedTensorType::get(type.getShape(), builder.getI32Type());
  memref::GlobalOp::create(builder, loc, name, builder.getStringAttr("private"),
                           type,
                           DenseElementsAttr::get(tensorType, ArrayRef(data)),
                           /*constant=*/true, /*alignment=*/IntegerAttr());
}

void GraphProgramBuilder::createTables(OpBuilder &builder) {
  createConstantTable(builder, "_task_family", plan.taskFamily);
  createConstantTable(builder, "_task_record", plan.taskRecord);
  createConstantTable(builder, "_task_records", plan.records);
}

Value GraphProgramBuilder::constantTable(ScheduledFunction &function,
                                         StringRef suffix, int64_t size) {
  OpBuilder b = OpBuilder::atBlockBegin(&function.op.getBody().front());
  auto type = MemRefType::get({std::max<int64_t>(size, 1)}, b.getI32Type());
  return memref::GetGlobalOp::create(b, function.op.getLoc(), type,
                                     (graph.getSymName() + suffix).str());
}

ScheduledFunction GraphProgramBuilder::createFunction(OpBuilder &builder,
                                                      StringRef suffix,
                                                      bool withCounters,
                                                      TypeRange results) {
  Location loc = graph.getLoc();
  MLIRContext *context = graph.getContext();
  SmallVector<Type> inputs;
  for (Type type : graph.getArgumentTypes())
    if (!isa<MemRefType>(type))
      inputs.push_back(type);
  inputs.push_back(MemRefType::get({ShapedType::kDynamic}, builder.getI64Type()));
  if (withCounters)
    inputs.push_back(
        MemRefType::get({ShapedType::kDynamic}, builder.getI32Type()));
  ScheduledFunction function;
  function.op = func::FuncOp::create(
      builder, loc, (graph.getSymName() + suffix).str(),
      builder.getFunctionType(inputs, results));
  function.op->setAttr("event.graph", graph.getSymNameAttr());
  function.op->setAttr("event.schedule", StringAttr::get(context, schedule));
  function.op->setAttr("event.workers", builder.getI64IntegerAttr(workers));
  if (IntegerAttr ranks = graph.getRanksAttr()) {
    // Remote operations find the transport (`Event/IR/TransportLayout.h`)
    // in the buffer table, after the buffers.
    function.op->setAttr(GraphOp::getRanksAttrName(), ranks);
    function.op->setAttr(transport::kTransportAttrName,
                         builder.getI64IntegerAttr(plan.tableWords));
  }
  if (suffix == "_worker") {
    // What the indices in the worker's waits and trace records refer to.
    function.op->setAttr("event.tasks", taskTable(builder, tasks));
    function.op->setAttr("event.events", eventTable(builder, plan));
    if (trace)
      function.op->setAttr("event.trace", builder.getUnitAttr());
  }

  Block *entry = function.op.addEntryBlock();
  auto next = entry->args_begin();
  for (BlockArgument graphArg : graph.getArguments())
    if (!isa<MemRefType>(graphArg.getType()))
      function.mapping.map(graphArg, *next++);
  BlockArgument table = *next++;
  function.table = table;
  if (graph.getRanksAttr())
    function.op.setArgAttr(table.getArgNumber(), transport::kTableAttrName,
                           builder.getUnitAttr());
  if (withCounters)
    function.counters = *next++;

  OpBuilder b = OpBuilder::atBlockEnd(entry);
  for (Operation &op : graph.getBody().front().without_terminator()) {
    if (isa<TaskOp, AllocOp>(op))
      continue;
    for (Value operand : op.getOperands())
      if (isa<MemRefType>(operand.getType()))
        graphBuffer(function, operand);
    b.clone(op, function.mapping);
  }

  Value offset = constantIndex(b, loc, 0);
  for (const EventClass &eventClass : plan.classes) {
    ClassLayout layout;
    layout.base = offset;
    layout.dynamicSizes = llvm::map_to_vector(
        eventClass.dynamicSizes,
        [&](Value size) { return function.mapping.lookup(size); });
    auto nextDynamic = layout.dynamicSizes.begin();
    for (unsigned dim = 0; dim < eventClass.type.getRank(); ++dim)
      layout.sizes.push_back(
          eventClass.type.isDynamicDim(dim)
              ? *nextDynamic++
              : constantIndex(b, loc, eventClass.type.getShape()[dim]));
    layout.numElements = productIndex(b, loc, layout.sizes);
    Value instances = constantIndex(b, loc, eventClass.instances.size());
    offset = addIndex(b, loc, offset, mulIndex(b, loc, instances,
                                               layout.numElements));
    function.classes.push_back(std::move(layout));
  }
  function.eventCounters = offset;

  return function;
}

Value GraphProgramBuilder::graphBuffer(ScheduledFunction &function,
                                       Value value) {
  if (Value mapped = function.mapping.lookupOrNull(value))
    return mapped;
  auto arg = cast<BlockArgument>(value);
  OpBuilder b = OpBuilder::atBlockBegin(&function.op.getBody().front());
  Location loc = graph.getLoc();
  Value offset = constantIndex(b, loc, plan.tableOffsets[arg.getArgNumber()]);
  Value buffer = BufferOp::create(b, loc, arg.getType(), function.table, offset);
  function.mapping.map(value, buffer);
  return buffer;
}

Value GraphProgramBuilder::loadConstant(OpBuilder &b, Location loc,
                                        Value table, Value index) {
  Value word = memref::LoadOp::create(b, loc, table, ValueRange{index});
  return arith::IndexCastOp::create(b, loc, b.getIndexType(), word);
}

void GraphProgramBuilder::useTaskTables(ScheduledFunction &function) {
  if (function.taskFamily)
    return;
  function.taskFamily =
      constantTable(function, "_task_family", plan.taskFamily.size());
  function.taskRecord =
      constantTable(function, "_task_record", plan.taskRecord.size());
  function.records =
      constantTable(function, "_task_records", plan.records.size());
}

Value GraphProgramBuilder::loadField(OpBuilder &b, Location loc,
                                     ScheduledFunction &function, Value record,
                                     unsigned field) {
  useTaskTables(function);
  return loadConstant(b, loc, function.records,
                      addIndex(b, loc, record, constantIndex(b, loc, field)));
}

ValueRange GraphProgramBuilder::switchOnFamily(
    OpBuilder &b, Location loc, ScheduledFunction &function, Value task,
    TypeRange results,
    function_ref<SmallVector<Value>(OpBuilder &, const TaskFamily &, Value)>
        body) {
  useTaskTables(function);
  Value family = loadConstant(b, loc, function.taskFamily, task);
  Value record = loadConstant(b, loc, function.taskRecord, task);
  // Families 0 .. F-2 are cases and the last is the default, which is
  // what a task of the last family reaches.
  unsigned numFamilies = plan.families.size();
  SmallVector<int64_t> cases;
  for (unsigned index = 0; index + 1 < numFamilies; ++index)
    cases.push_back(index);
  auto switchOp = scf::IndexSwitchOp::create(b, loc, results, family, cases,
                                             cases.size());
  auto fill = [&](Region &region, const TaskFamily &taskFamily) {
    OpBuilder::InsertionGuard guard(b);
    b.createBlock(&region);
    SmallVector<Value> values = body(b, taskFamily, record);
    scf::YieldOp::create(b, loc, values);
  };
  for (unsigned index = 0; index + 1 < numFamilies; ++index)
    fill(switchOp.getCaseRegions()[index], plan.families[index]);
  fill(switchOp.getDefaultRegion(), plan.families.back());
  return switchOp.getResults();
}

void GraphProgramBuilder::forEachTask(
    OpBuilder &b, Location loc, function_ref<void(OpBuilder &, Value)> body) {
  if (tasks.empty())
    return;
  scf::ForOp::create(b, loc, constantIndex(b, loc, 0),
                     constantIndex(b, loc, tasks.size()),
                     constantIndex(b, loc, 1), ValueRange{},
                     [&](OpBuilder &nested, Location, Value task, ValueRange) {
                       body(nested, task);
                       scf::YieldOp::create(nested, loc);
                     });
}

SmallVector<Value> GraphProgramBuilder::gridOf(ScheduledFunction &function,
                                               const TaskFamily &family) {
  return llvm::map_to_vector(family.representative.getGrid(), [&](Value v) {
    return function.mapping.lookup(v);
  });
}

Value GraphProgramBuilder::tilesOf(OpBuilder &b, Location loc,
                                   ScheduledFunction &function,
                                   const TaskFamily &family) {
  return productIndex(b, loc, gridOf(function, family));
}

Value GraphProgramBuilder::totalTiles(OpBuilder &b, Location loc,
                                      ScheduledFunction &function) {
  // Each family's tasks have the same tile count.
  Value total = constantIndex(b, loc, 0);
  for (const TaskFamily &family : plan.families)
    total = addIndex(
        b, loc, total,
        mulIndex(b, loc, constantIndex(b, loc, family.members.size()),
                 tilesOf(b, loc, function, family)));
  return total;
}

GraphProgramBuilder::EntryEvent
GraphProgramBuilder::entryEvent(OpBuilder &b, Location loc,
                                ScheduledFunction &function,
                                const TaskFamily &family, Value record,
                                unsigned entry, bool notify) {
  EntryEvent event;
  event.classIndex =
      notify ? family.notifyClasses[entry] : family.waitClasses[entry];
  const EventClass &eventClass = plan.classes[event.classIndex];
  const ClassLayout &layout = function.classes[event.classIndex];
  Value instance = loadField(
      b, loc, function, record,
      notify ? family.notifyField(entry) : family.waitField(entry));
  event.number =
      addIndex(b, loc, constantIndex(b, loc, eventClass.firstEvent), instance);
  event.base = addIndex(b, loc, layout.base,
                        mulIndex(b, loc, instance, layout.numElements));
  if (function.counters)
    event.view = ViewOp::create(b, loc, eventClass.type, function.counters,
                                event.base, layout.dynamicSizes);
  return event;
}

SmallVector<Value> GraphProgramBuilder::indexBuffers(
    OpBuilder &b, Location loc, ScheduledFunction &function,
    const TaskFamily &family, Value record) {
  SmallVector<Value> buffers;
  for (auto [index, value] :
       llvm::enumerate(family.representative.getIndices())) {
    Value offset = loadField(b, loc, function, record, family.indexField(index));
    buffers.push_back(
        BufferOp::create(b, loc, value.getType(), function.table, offset));
  }
  return buffers;
}

SmallVector<Value> GraphProgramBuilder::entryCoordinates(
    OpBuilder &b, Location loc, ScheduledFunction &function,
    const TaskFamily &family, Value record, unsigned entry, bool notify,
    ValueRange tile) {
  TaskOp task = family.representative;
  IndexMapAttr map = notify ? task.getNotifyMap(entry) : task.getWaitMap(entry);
  SmallVector<Value> buffers;
  if (map.hasIndirect())
    buffers = indexBuffers(b, loc, function, family, record);
  return evaluateIndexMap(b, loc, map, tile, buffers);
}

Value GraphProgramBuilder::liveCondition(OpBuilder &b, Location loc,
                                         ScheduledFunction &function,
                                         const TaskFamily &family, Value record,
                                         ValueRange tile) {
  if (!family.isPredicated())
    return {};
  SmallVector<Value> buffers = indexBuffers(b, loc, function, family, record);
  Value live;
  for (LiveAttr bound : family.liveBounds) {
    Value value =
        evaluateIndexMap(b, loc, bound.getPosition(), tile, buffers).front();
    Value limit = affine::AffineApplyOp::create(b, loc, bound.getBound(),
                                                ValueRange{value});
    // Signed: a negative value (a length of 0 minus something) leaves no
    // tile live rather than wrapping around.
    Value below = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt,
                                        tile[bound.getDim()], limit);
    live = live ? arith::AndIOp::create(b, loc, live, below).getResult()
                : below;
  }
  return live;
}

void GraphProgramBuilder::ifLive(OpBuilder &b, Location loc,
                                 ScheduledFunction &function,
                                 const TaskFamily &family, Value record,
                                 ValueRange tile,
                                 function_ref<void(OpBuilder &)> body) {
  Value live = liveCondition(b, loc, function, family, record, tile);
  if (!live) {
    body(b);
    return;
  }
  scf::IfOp::create(b, loc, live, [&](OpBuilder &then, Location) {
    body(then);
    scf::YieldOp::create(then, loc);
  });
}

/// Gives `stall` the counter buffer and site (task, then the tile) it
/// lacks, by replacing it with a sited copy.
static void siteStall(StallOp stall, Value counters, Value task,
                      ValueRange tile) {
  SmallVector<Value> site{task};
  site.append(tile.begin(), tile.end());
  OpBuilder b(stall);
  auto sited = StallOp::create(
      b, stall.getLoc(), stall.getStart().getType(),
      stall.getGiveUp().getType(), stall.getRoleAttr(), stall.getBarrier(),
      stall.getStage(), stall.getParity(), stall.getSince(), counters, site);
  stall.replaceAllUsesWith(sited);
  stall.erase();
}

/// The stalls of `root` that have no site yet.
static SmallVector<StallOp> unsitedStalls(Operation *root) {
  SmallVector<StallOp> stalls;
  root->walk([&](StallOp stall) {
    if (!stall.getCounters())
      stalls.push_back(stall);
  });
  return stalls;
}

func::FuncOp GraphProgramBuilder::sitedCallee(func::FuncOp callee,
                                              unsigned rank) {
  auto key = std::make_pair(callee.getOperation(), rank);
  if (auto found = sitedCallees.find(key); found != sitedCallees.end())
    return found->second;
  func::FuncOp sited;
  if (!callee.isExternal() && !unsitedStalls(callee).empty()) {
    // Only this graph's tasks of this rank call it (the tile functions
    // etc.compile makes): it gets the arguments itself, keeping its name.
    // Otherwise a copy does, and the original stays for the other callers.
    bool own = true;
    std::optional<SymbolTable::UseRange> uses =
        SymbolTable::getSymbolUses(callee, callee->getParentOp());
    for (const SymbolTable::SymbolUse &use :
         uses ? *uses : SymbolTable::UseRange({})) {
      auto task = use.getUser()->getParentOfType<TaskOp>();
      own &= isa<func::CallOp>(use.getUser()) && task &&
             graph->isAncestor(task) && task.getGridRank() == rank;
    }
    own &= uses.has_value();
    OpBuilder b(callee->getContext());
    if (own) {
      sited = callee;
    } else {
      b.setInsertionPointAfter(callee);
      sited = cast<func::FuncOp>(b.clone(*callee));
      sited.setSymName((callee.getSymName() + "_sited").str());
      // Renames on a clash (a second rank's copy, a user's symbol).
      SymbolTable(callee->getParentOp()).insert(sited);
    }
    Location loc = callee.getLoc();
    unsigned first = sited.getNumArguments();
    SmallVector<unsigned> at(2 + rank, first);
    SmallVector<Type> types{MemRefType::get({ShapedType::kDynamic},
                                            b.getI32Type())};
    // The site as i32 words (what the record holds): narrower arguments
    // than indices at every call of a tile function out of line.
    types.append(1 + rank, b.getI32Type());
    SmallVector<DictionaryAttr> attrs(2 + rank, DictionaryAttr());
    SmallVector<Location> locs(2 + rank, loc);
    (void)sited.insertArguments(at, types, attrs, locs);
    Block &entry = sited.getBody().front();
    ValueRange added = entry.getArguments().drop_front(first);
    b.setInsertionPointToStart(&entry);
    SmallVector<Value> site;
    for (Value word : added.drop_front())
      site.push_back(
          arith::IndexCastOp::create(b, loc, b.getIndexType(), word));
    for (StallOp stall : unsitedStalls(sited))
      siteStall(stall, added[0], site[0], ArrayRef<Value>(site).drop_front());
  }
  sitedCallees[key] = sited;
  return sited;
}

void GraphProgramBuilder::runTileBody(OpBuilder &b, Location loc,
                                      ScheduledFunction &function,
                                      const TaskFamily &family, Value record,
                                      Value task, ValueRange tile) {
  if (func::CallOp call = family.call) {
    SmallVector<Value> operands;
    for (auto [operand, how] : llvm::zip(call.getOperands(), family.operands)) {
      switch (how.kind) {
      case CallOperand::Tile:
        operands.push_back(tile[how.field]);
        break;
      case CallOperand::Fixed:
        operands.push_back(function.mapping.lookup(how.fixed));
        break;
      case CallOperand::Buffer:
        operands.push_back(BufferOp::create(
            b, loc, operand.getType(), function.table,
            loadField(b, loc, function, record, how.field)));
        break;
      }
    }
    auto callee = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(
        graph, call.getCalleeAttr());
    if (func::FuncOp sited =
            callee ? sitedCallee(callee, tile.size()) : func::FuncOp()) {
      operands.push_back(function.counters);
      operands.push_back(
          arith::IndexCastOp::create(b, loc, b.getI32Type(), task));
      for (Value coordinate : tile)
        operands.push_back(
            arith::IndexCastOp::create(b, loc, b.getI32Type(), coordinate));
      func::CallOp::create(b, loc, sited, operands);
      return;
    }
    func::CallOp::create(b, loc, call.getCalleeAttr(), TypeRange{}, operands);
    return;
  }
  // A body that is not one call: a family of one task, cloned.
  TaskOp representative = family.representative;
  representative.getBody().walk([&](Operation *op) {
    for (Value operand : op->getOperands())
      if (auto arg = dyn_cast<BlockArgument>(operand);
          arg && arg.getOwner() == &graph.getBody().front() &&
          isa<MemRefType>(arg.getType()))
        graphBuffer(function, arg);
  });
  for (auto [tileIndex, value] : llvm::zip(representative.getTileIndices(), tile))
    function.mapping.map(tileIndex, value);
  for (Operation &op : representative.getBodyBlock().without_terminator()) {
    Operation *copy = b.clone(op, function.mapping);
    for (StallOp stall : unsitedStalls(copy))
      siteStall(stall, function.counters, task, tile);
  }
}

void GraphProgramBuilder::initEventCounters(OpBuilder &b,
                                            ScheduledFunction &function) {
  Location loc = graph.getLoc();
  bool anyCounted = false;
  for (auto [eventClass, layout] : llvm::zip(plan.classes, function.classes)) {
    Value initial =
        eventClass.count
            ? arith::IndexCastOp::create(b, loc, b.getI32Type(),
                                         function.mapping.lookup(
                                             eventClass.count))
                  .getResult()
            : arith::ConstantIntOp::create(b, loc, 0, 32).getResult();
    anyCounted |= !eventClass.count;
    Value end = addIndex(
        b, loc, layout.base,
        mulIndex(b, loc, constantIndex(b, loc, eventClass.instances.size()),
                 layout.numElements));
    scf::ForOp::create(b, loc, layout.base, end, constantIndex(b, loc, 1),
                       ValueRange{},
                       [&](OpBuilder &nested, Location loc, Value position,
                           ValueRange) {
                         memref::StoreOp::create(nested, loc, initial,
                                                 function.counters, position);
                         scf::YieldOp::create(nested, loc);
                       });
  }
  if (!anyCounted)
    return;
  // Events without `count`: one per notifying tile, counted by evaluating
  // every notify map that targets them.
  forEachTask(b, loc, [&](OpBuilder &nested, Value task) {
    switchOnFamily(
        nested, loc, function, task, TypeRange{},
        [&](OpBuilder &cb, const TaskFamily &family,
            Value record) -> SmallVector<Value> {
          for (auto [entry, classIndex] :
               llvm::enumerate(family.notifyClasses)) {
            if (plan.classes[classIndex].count)
              continue;
            SmallVector<Value> extents = gridOf(function, family);
            // Dead tiles of a predicated task do not notify.
            auto countNotify = [&](OpBuilder &lb, ValueRange tile) {
              EntryEvent event = entryEvent(lb, loc, function, family, record,
                                            entry, /*notify=*/true);
              SmallVector<Value> coordinates =
                  entryCoordinates(lb, loc, function, family, record, entry,
                                   /*notify=*/true, tile);
              Value element =
                  addIndex(lb, loc, event.base,
                           linearize(lb, loc, coordinates,
                                     function.classes[classIndex].sizes));
              // Atomic: the tiles may be counted on several lanes at once.
              Value one = arith::ConstantIntOp::create(lb, loc, 1, 32);
              memref::AtomicRMWOp::create(lb, loc, arith::AtomicRMWKind::addi,
                                          one, function.counters, element);
            };
            // The tiles in one loop, whose iterations only add to counters.
            auto tiles = scf::ForOp::create(
                cb, loc, constantIndex(cb, loc, 0),
                productIndex(cb, loc, extents), constantIndex(cb, loc, 1),
                ValueRange{},
                [&](OpBuilder &lb, Location, Value local, ValueRange) {
                  SmallVector<Value> tile =
                      delinearize(lb, loc, local, extents);
                  ifLive(lb, loc, function, family, record, tile,
                         [&](OpBuilder &live) { countNotify(live, tile); });
                  scf::YieldOp::create(lb, loc);
                });
            tiles->setAttr(kIndependentIterationsAttrName, cb.getUnitAttr());
          }
          return {};
        });
  });
}

Value GraphProgramBuilder::anyNonZero(OpBuilder &b, Location loc,
                                      ScheduledFunction &function, Value begin,
                                      Value end) {
  Value none = arith::ConstantIntOp::create(b, loc, 0, 1);
  auto scan = scf::ForOp::create(
      b, loc, begin, end, constantIndex(b, loc, 1), ValueRange{none},
      [&](OpBuilder &nested, Location loc, Value element, ValueRange found) {
        Value count =
            memref::LoadOp::create(nested, loc, function.counters, element);
        Value zero = arith::ConstantIntOp::create(nested, loc, 0, 32);
        Value nonZero = arith::CmpIOp::create(
            nested, loc, arith::CmpIPredicate::ne, count, zero);
        Value any = arith::OrIOp::create(nested, loc, found[0], nonZero);
        scf::YieldOp::create(nested, loc, any);
      });
  scan->setAttr(kAnyReductionAttrName, b.getUnitAttr());
  return scan.getResult(0);
}

//===----------------------------------------------------------------------===//
// The run header, the watchdog's sites and trace records
//===----------------------------------------------------------------------===//

Value GraphProgramBuilder::bufferSize(OpBuilder &b, Location loc,
                                      ScheduledFunction &function, Value end) {
  if (trace)
    end = addIndex(b, loc, end,
                   mulIndex(b, loc, totalTiles(b, loc, function),
                            constantIndex(b, loc, run::kTraceRecordWords)));
  return addIndex(b, loc, end, constantIndex(b, loc, run::kHeaderWords));
}

/// Stores the i32 (or index) `value` into word `word` of the run header at
/// `header`.
static void storeHeaderWord(OpBuilder &b, Location loc, Value counters,
                            Value header, int64_t word, Value value) {
  if (value.getType().isIndex())
    value = arith::IndexCastOp::create(b, loc, b.getI32Type(), value);
  memref::StoreOp::create(b, loc, value, counters,
                          addIndex(b, loc, header, constantIndex(b, loc, word)));
}

void GraphProgramBuilder::initRunHeader(OpBuilder &b, Location loc,
                                        ScheduledFunction &function,
                                        Value end) {
  Value counters = function.counters;
  Value header = subIndex(b, loc, bufferSize(b, loc, function, end),
                          constantIndex(b, loc, run::kHeaderWords));
  auto zero = [&]() { return arith::ConstantIntOp::create(b, loc, 0, 32); };
  storeHeaderWord(b, loc, counters, header, run::kStatusWord,
                  arith::ConstantIntOp::create(b, loc, run::kRunning, 32));
  storeHeaderWord(b, loc, counters, header, run::kClaimWord, zero());
  if (!trace) {
    storeHeaderWord(b, loc, counters, header, run::kTraceOffsetWord, zero());
    storeHeaderWord(b, loc, counters, header, run::kTraceCountWord, zero());
    return;
  }
  storeHeaderWord(b, loc, counters, header, run::kTraceOffsetWord, end);
  storeHeaderWord(b, loc, counters, header, run::kTraceCountWord,
                  totalTiles(b, loc, function));
  // A record a stopped run leaves unwritten must not show the last run's.
  Value zeroWord = zero();
  scf::ForOp::create(
      b, loc, end, header, constantIndex(b, loc, 1), ValueRange{},
      [&](OpBuilder &nested, Location loc, Value position, ValueRange) {
        memref::StoreOp::create(nested, loc, zeroWord, counters, position);
        scf::YieldOp::create(nested, loc);
      });
}

void GraphProgramBuilder::emitPrefetches(OpBuilder &b, Location loc,
                                         ScheduledFunction &function,
                                         const TaskFamily &family,
                                         Value record, ValueRange tile) {
  for (const TaskFamily::Prefetch &prefetch : family.prefetches) {
    func::CallOp call = family.call;
    Value operand = call.getOperand(prefetch.operand);
    Value buffer = BufferOp::create(
        b, loc, operand.getType(), function.table,
        loadField(b, loc, function, record,
                  family.operands[prefetch.operand].field));
    AffineMap map = prefetch.footprint.getOffsets();
    SmallVector<Value> offsets, sizes;
    for (auto [dim, size] : llvm::enumerate(prefetch.footprint.getSizes())) {
      Value offset = affine::AffineApplyOp::create(
          b, loc, map.getSubMap({static_cast<unsigned>(dim)}), tile);
      Value extent = memref::DimOp::create(b, loc, buffer, dim);
      // Clipped to the buffer: edge tiles of a symbolic dimension are
      // partial, and a box past the end is empty.
      offset = arith::MinSIOp::create(b, loc, offset, extent);
      Value left = subIndex(b, loc, extent, offset);
      offsets.push_back(offset);
      sizes.push_back(ShapedType::isDynamic(size)
                          ? left
                          : arith::MinSIOp::create(
                                b, loc, constantIndex(b, loc, size), left)
                                .getResult());
    }
    PrefetchOp::create(b, loc, buffer, offsets, sizes);
  }
}

void GraphProgramBuilder::emitWaits(OpBuilder &b, Location loc,
                                    ScheduledFunction &function,
                                    const TaskFamily &family, Value record,
                                    Value task, ValueRange tile) {
  auto emitWait = [&](unsigned entry) {
    EntryEvent event =
        entryEvent(b, loc, function, family, record, entry, /*notify=*/false);
    SmallVector<Value> site{task, event.number};
    site.append(tile.begin(), tile.end());
    WaitOp::create(b, loc, event.view,
                   entryCoordinates(b, loc, function, family, record, entry,
                                    /*notify=*/false, tile),
                   site)
        .setDeferred(true);
  };
  // An indirect wait's coordinates are loads from an index buffer that a
  // task of the graph may write, which the tile's direct waits then guard
  // (an MoE combine reads the router's choices to find the expert whose
  // counter it waits on). A deferred wait's polls are relaxed: they order
  // nothing, so on a GPU the index load could see the buffer's old bytes
  // (seen on an H200: combines waited on the wrong expert's counter and
  // read unwritten rows). The direct waits are acquired before any index
  // is loaded; the indirect ones then share a second acquire.
  SmallVector<unsigned> direct, indirect;
  for (unsigned entry = 0; entry < family.waitClasses.size(); ++entry)
    (family.representative.getWaitMap(entry).hasIndirect() ? indirect : direct)
        .push_back(entry);
  llvm::for_each(direct, emitWait);
  if (!direct.empty() && !indirect.empty())
    AcquireOp::create(b, loc);
  llvm::for_each(indirect, emitWait);
  // One acquire completes the tile's (remaining) waits.
  if (!family.waitClasses.empty())
    AcquireOp::create(b, loc);
}

void GraphProgramBuilder::emitTileWork(OpBuilder &b, Location loc,
                                       ScheduledFunction &function,
                                       const TaskFamily &family, Value record,
                                       Value task, ValueRange tile, Value id,
                                       Value records, bool afterWaits,
                                       function_ref<void(OpBuilder &)> notify) {
  auto work = [&](OpBuilder &b) {
    Value at;
    if (trace) {
      at = addIndex(b, loc, records,
                    mulIndex(b, loc, id,
                             constantIndex(b, loc, run::kTraceRecordWords)));
      TraceBeginOp::create(b, loc, function.counters, at, task, tile);
    }
    runTileBody(b, loc, function, family, record, task, tile);
    if (trace)
      TraceEndOp::create(b, loc, function.counters, at);
    notify(b);
  };
  if (!afterWaits || family.waitClasses.empty()) {
    work(b);
    return;
  }
  Value stopped = RunAbortedOp::create(b, loc, function.counters);
  Value running = arith::XOrIOp::create(
      b, loc, stopped, arith::ConstantIntOp::create(b, loc, 1, 1));
  scf::IfOp::create(b, loc, running, [&](OpBuilder &then, Location loc) {
    work(then);
    scf::YieldOp::create(then, loc);
  });
}

LogicalResult GraphProgramBuilder::checkTraceable() {
  if (!trace)
    return success();
  for (TaskOp task : tasks)
    if (static_cast<int64_t>(task.getGridRank()) > run::kMaxRecordRank)
      return task.emitOpError("has a grid of rank ")
             << task.getGridRank() << "; trace records hold at most "
             << run::kMaxRecordRank << " tile coordinates";
  return success();
}

LogicalResult etc::event::checkScheduleSymbolsFree(ModuleOp module,
                                                   StringRef pass) {
  SymbolTable symbols(module);
  for (GraphOp graph : module.getOps<GraphOp>()) {
    for (const std::string &name : GraphProgramBuilder::symbolNames(graph)) {
      if (Operation *existing = symbols.lookup(name))
        return existing->emitError("symbol '")
               << name << "' is taken; " << pass << " needs it for graph @"
               << graph.getSymName();
    }
  }
  return success();
}
