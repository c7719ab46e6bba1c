//===- DynamicScheduleInit.cpp - @g_counters and @g_init ------------------===//
//
// The dynamic schedule's `@g_counters`, which sizes the counter buffer,
// and `@g_init`, which fills it on the device: the expected counts, the
// tile offsets, the inverse index, every tile's pending count and the
// queue of the tiles ready from the start.
//
//===----------------------------------------------------------------------===//

#include "DynamicScheduler.h"
#include "IndexArithmetic.h"

#include "Event/IR/QueueLayout.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace etc::event;

/// `@g_counters(symbols, table) -> index`: the size of the counter buffer.
void DynamicScheduler::buildCounters(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function =
      createFunction(builder, "_counters", /*withCounters=*/false,
                     builder.getIndexType(), layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  func::ReturnOp::create(b, loc, bufferSize(b, loc, function, layout.end));
}

/// Loads counter `position` as an index.
Value etc::event::loadIndex(OpBuilder &b, Location loc, Value counters,
                            Value position) {
  Value word = memref::LoadOp::create(b, loc, counters, position);
  return arith::IndexCastOp::create(b, loc, b.getIndexType(), word);
}

/// Stores `value` (an index) into counter `position`.
static void storeIndex(OpBuilder &b, Location loc, Value value, Value counters,
                       Value position) {
  Value word = arith::IndexCastOp::create(b, loc, b.getI32Type(), value);
  memref::StoreOp::create(b, loc, word, counters, position);
}

/// Emits `for i in [begin, end): counters[i] = 0`.
static void zeroCounters(OpBuilder &b, Location loc, Value counters,
                         Value begin, Value end) {
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
  scf::ForOp::create(b, loc, begin, end, constantIndex(b, loc, 1), ValueRange{},
                     [&](OpBuilder &nested, Location loc, Value position,
                         ValueRange) {
                       memref::StoreOp::create(nested, loc, zero, counters,
                                               position);
                       scf::YieldOp::create(nested, loc);
                     });
}

Value DynamicScheduler::tileOffset(OpBuilder &b, Location loc,
                                   ScheduledFunction &function,
                                   QueueLayout &layout, Value task) {
  return loadIndex(b, loc, function.counters,
                   addIndex(b, loc, layout.tileOffsets, task));
}

Value DynamicScheduler::findTask(OpBuilder &b, Location loc,
                                 ScheduledFunction &function,
                                 QueueLayout &layout, Value id) {
  Type index = b.getIndexType();
  // The last task k with tileOffsets[k] <= id: keep lo <= k < hi.
  auto search = scf::WhileOp::create(
      b, loc, TypeRange{index, index},
      ValueRange{constantIndex(b, loc, 0), constantIndex(b, loc, tasks.size())},
      [&](OpBuilder &before, Location loc, ValueRange bounds) {
        Value width = subIndex(before, loc, bounds[1], bounds[0]);
        Value more =
            arith::CmpIOp::create(before, loc, arith::CmpIPredicate::ugt,
                                  width, constantIndex(before, loc, 1));
        scf::ConditionOp::create(before, loc, more, bounds);
      },
      [&](OpBuilder &body, Location loc, ValueRange bounds) {
        Value middle =
            divIndex(body, loc, addIndex(body, loc, bounds[0], bounds[1]),
                     constantIndex(body, loc, 2));
        Value start = tileOffset(body, loc, function, layout, middle);
        Value atOrAfter = arith::CmpIOp::create(
            body, loc, arith::CmpIPredicate::ule, start, id);
        Value lo =
            arith::SelectOp::create(body, loc, atOrAfter, middle, bounds[0]);
        Value hi =
            arith::SelectOp::create(body, loc, atOrAfter, bounds[1], middle);
        scf::YieldOp::create(body, loc, ValueRange{lo, hi});
      });
  return search.getResult(0);
}

void DynamicScheduler::forEachTile(
    OpBuilder &b, Location loc, ScheduledFunction &function,
    QueueLayout &layout,
    function_ref<void(OpBuilder &, const TaskFamily &, Value, Value, ValueRange)>
        body) {
  forEachTask(b, loc, [&](OpBuilder &nested, Value task) {
    Value offset = tileOffset(nested, loc, function, layout, task);
    switchOnFamily(
        nested, loc, function, task, TypeRange{},
        [&](OpBuilder &cb, const TaskFamily &family,
            Value record) -> SmallVector<Value> {
          SmallVector<Value> extents = gridOf(function, family);
          scf::ForOp::create(
              cb, loc, constantIndex(cb, loc, 0),
              productIndex(cb, loc, extents), constantIndex(cb, loc, 1),
              ValueRange{},
              [&](OpBuilder &lb, Location loc, Value local, ValueRange) {
                SmallVector<Value> tile = delinearize(lb, loc, local, extents);
                // Dead tiles are never queued, waited for or indexed.
                ifLive(lb, loc, function, family, record, tile,
                       [&](OpBuilder &live) {
                         body(live, family, record,
                              addIndex(live, loc, offset, local), tile);
                       });
                scf::YieldOp::create(lb, loc);
              });
          return {};
        });
  });
}

void DynamicScheduler::forEachIndexedWait(
    OpBuilder &b, ScheduledFunction &function, QueueLayout &layout,
    function_ref<void(OpBuilder &, Location, Value, Value)> body) {
  Location loc = graph.getLoc();
  forEachTile(b, loc, function, layout,
              [&](OpBuilder &nested, const TaskFamily &family, Value record,
                  Value id, ValueRange tile) {
                unsigned familyIndex = &family - plan.families.data();
                for (unsigned entry = 0; entry < family.waitClasses.size();
                     ++entry) {
                  if (kindOf(familyIndex, entry).box)
                    continue;
                  EntryEvent event = entryEvent(nested, loc, function, family,
                                                record, entry, /*notify=*/false);
                  SmallVector<Value> coordinates = entryCoordinates(
                      nested, loc, function, family, record, entry,
                      /*notify=*/false, tile);
                  Value element = addIndex(
                      nested, loc, event.base,
                      linearize(nested, loc, coordinates,
                                function.classes[event.classIndex].sizes));
                  body(nested, loc, id, element);
                }
              });
}

/// Counting sort of the indexed waiting tiles by counter position: count
/// into `offsets[p + 1]`, prefix sum, fill while advancing `offsets[p]`
/// (which then holds the end of p's entries), and shift the offsets back.
void DynamicScheduler::buildInverseIndex(OpBuilder &b,
                                         ScheduledFunction &function,
                                         QueueLayout &layout) {
  Location loc = graph.getLoc();
  Value counters = function.counters;
  Value numElements = function.eventCounters;
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  zeroCounters(b, loc, counters, layout.indexOffsets, layout.indexEntries);

  forEachIndexedWait(
      b, function, layout,
      [&](OpBuilder &nested, Location loc, Value, Value element) {
        Value position = addIndex(nested, loc, layout.indexOffsets,
                                  addIndex(nested, loc, element, one));
        Value count = loadIndex(nested, loc, counters, position);
        storeIndex(nested, loc, addIndex(nested, loc, count, one), counters,
                   position);
      });

  // offsets[p] += offsets[p - 1] for p in [1, numElements].
  scf::ForOp::create(
      b, loc, one, addIndex(b, loc, numElements, one), one, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value element, ValueRange) {
        Value position = addIndex(nested, loc, layout.indexOffsets, element);
        Value previous = loadIndex(nested, loc, counters,
                                   subIndex(nested, loc, position, one));
        Value current = loadIndex(nested, loc, counters, position);
        storeIndex(nested, loc, addIndex(nested, loc, previous, current),
                   counters, position);
        scf::YieldOp::create(nested, loc);
      });

  forEachIndexedWait(
      b, function, layout,
      [&](OpBuilder &nested, Location loc, Value id, Value element) {
        Value cursor = addIndex(nested, loc, layout.indexOffsets, element);
        Value slot = loadIndex(nested, loc, counters, cursor);
        storeIndex(nested, loc, id, counters,
                   addIndex(nested, loc, layout.indexEntries, slot));
        storeIndex(nested, loc, addIndex(nested, loc, slot, one), counters,
                   cursor);
      });

  // offsets[p] = offsets[p - 1] for p from numElements down to 1; then
  // offsets[0] = 0.
  scf::ForOp::create(
      b, loc, zero, numElements, one, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value step, ValueRange) {
        Value element = subIndex(nested, loc, numElements, step);
        Value position = addIndex(nested, loc, layout.indexOffsets, element);
        Value previous = memref::LoadOp::create(
            nested, loc, counters, subIndex(nested, loc, position, one));
        memref::StoreOp::create(nested, loc, previous, counters, position);
        scf::YieldOp::create(nested, loc);
      });
  memref::StoreOp::create(b, loc, arith::ConstantIntOp::create(b, loc, 0, 32),
                          counters, layout.indexOffsets);
}

Value DynamicScheduler::countWaitingOnAny(OpBuilder &b, Location loc,
                                         ScheduledFunction &function,
                                         unsigned classIndex, Value eventBase,
                                         IndexMapAttr map,
                                         ArrayRef<BoxResult> box,
                                         ValueRange tile) {
  const ClassLayout &eventLayout = function.classes[classIndex];
  SmallVector<Value> lower, upper, steps;
  for (auto [result, part] : llvm::enumerate(box)) {
    if (part.kind != BoxResult::Any)
      continue;
    lower.push_back(constantIndex(b, loc, 0));
    upper.push_back(eventLayout.sizes[result]);
    steps.push_back(constantIndex(b, loc, 1));
  }
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
  scf::LoopNest nest = scf::buildLoopNest(
      b, loc, lower, upper, steps, ValueRange{zero},
      [&](OpBuilder &nested, Location loc, ValueRange anyCoordinates,
          ValueRange counted) -> scf::ValueVector {
        SmallVector<Value> coordinates;
        AffineMap affine = map.getMap();
        auto nextAny = anyCoordinates.begin();
        for (unsigned result = 0; result < affine.getNumResults(); ++result) {
          if (box[result].kind == BoxResult::Any) {
            coordinates.push_back(*nextAny++);
            continue;
          }
          coordinates.push_back(affine::AffineApplyOp::create(
              nested, loc, affine.getSubMap(result), tile));
        }
        Value element =
            addIndex(nested, loc, eventBase,
                     linearize(nested, loc, coordinates, eventLayout.sizes));
        Value count =
            memref::LoadOp::create(nested, loc, function.counters, element);
        Value zero = arith::ConstantIntOp::create(nested, loc, 0, 32);
        Value one = arith::ConstantIntOp::create(nested, loc, 1, 32);
        Value notReady = arith::CmpIOp::create(
            nested, loc, arith::CmpIPredicate::sgt, count, zero);
        Value increment =
            arith::SelectOp::create(nested, loc, notReady, one, zero);
        return {arith::AddIOp::create(nested, loc, counted[0], increment)};
      });
  return nest.results.front();
}

void DynamicScheduler::initPending(OpBuilder &b, ScheduledFunction &function,
                                   QueueLayout &layout) {
  Location loc = graph.getLoc();
  if (tasks.empty())
    return;
  // One loop over the global tile ids, each finding its task: its
  // iterations are independent (each writes its own pending count and
  // pushes its own tile), so the GPU spreads them over a CTA's threads.
  auto loop = scf::ForOp::create(
      b, loc, constantIndex(b, loc, 0), layout.totalTiles,
      constantIndex(b, loc, 1), ValueRange{},
      [&](OpBuilder &lb, Location loc, Value id, ValueRange) {
        Value task = findTask(lb, loc, function, layout, id);
        Value local =
            subIndex(lb, loc, id, tileOffset(lb, loc, function, layout, task));
        switchOnFamily(
            lb, loc, function, task, TypeRange{},
            [&](OpBuilder &cb, const TaskFamily &family,
                Value record) -> SmallVector<Value> {
              SmallVector<Value> tile =
                  delinearize(cb, loc, local, gridOf(function, family));
              // Dead tiles are never queued.
              ifLive(cb, loc, function, family, record, tile,
                     [&](OpBuilder &live) {
                       initTilePending(live, function, layout, family, record,
                                       id, tile);
                     });
              return {};
            });
        scf::YieldOp::create(lb, loc);
      });
  loop->setAttr(kIndependentIterationsAttrName, b.getUnitAttr());
}

void DynamicScheduler::initTilePending(OpBuilder &nested,
                                       ScheduledFunction &function,
                                       QueueLayout &layout,
                                       const TaskFamily &family, Value record,
                                       Value id, ValueRange tile) {
  Location loc = graph.getLoc();
  unsigned familyIndex = &family - plan.families.data();
  Value zero = arith::ConstantIntOp::create(nested, loc, 0, 32);
  Value one = arith::ConstantIntOp::create(nested, loc, 1, 32);
  Value pending = zero;
  // An element whose expected count is zero is ready already and
  // never notified: it does not count.
  for (unsigned entry = 0; entry < family.waitClasses.size(); ++entry) {
    const WaitKind &kind = kindOf(familyIndex, entry);
    EntryEvent event = entryEvent(nested, loc, function, family, record,
                                  entry, /*notify=*/false);
    IndexMapAttr map = family.representative.getWaitMap(entry);
    if (kind.box && llvm::any_of(*kind.box, [](const BoxResult &box) {
          return box.kind == BoxResult::Any;
        })) {
      pending = arith::AddIOp::create(
          nested, loc, pending,
          countWaitingOnAny(nested, loc, function, event.classIndex,
                            event.base, map, *kind.box, tile));
      continue;
    }
    SmallVector<Value> coordinates = entryCoordinates(
        nested, loc, function, family, record, entry, /*notify=*/false,
        tile);
    Value element = addIndex(
        nested, loc, event.base,
        linearize(nested, loc, coordinates,
                  function.classes[event.classIndex].sizes));
    Value count =
        memref::LoadOp::create(nested, loc, function.counters, element);
    Value notReady = arith::CmpIOp::create(
        nested, loc, arith::CmpIPredicate::sgt, count, zero);
    pending = arith::AddIOp::create(
        nested, loc, pending,
        arith::SelectOp::create(nested, loc, notReady, one, zero));
  }
  memref::StoreOp::create(nested, loc, pending, function.counters,
                          addIndex(nested, loc, layout.pending, id));
  Value ready = arith::CmpIOp::create(
      nested, loc, arith::CmpIPredicate::eq, pending, zero);
  scf::IfOp::create(nested, loc, ready, [&](OpBuilder &then,
                                            Location loc) {
    QueuePushOp::create(then, loc, id, function.counters, layout.queue,
                        layout.totalTiles)
        .setPerLane(true);
    scf::YieldOp::create(then, loc);
  });
}

void DynamicScheduler::countLiveTiles(OpBuilder &b, Location loc,
                                     ScheduledFunction &function,
                                     Value word) {
  // Counted in place rather than carried through loop results: the GPU
  // initialisation kernel runs every write on one thread, and a loop that
  // writes and has results could not.
  storeIndex(b, loc, constantIndex(b, loc, 0), function.counters, word);
  auto add = [&](OpBuilder &nested, Value amount) {
    Value total = loadIndex(nested, loc, function.counters, word);
    storeIndex(nested, loc, addIndex(nested, loc, total, amount),
               function.counters, word);
  };
  forEachTask(b, loc, [&](OpBuilder &nested, Value task) {
    switchOnFamily(
        nested, loc, function, task, TypeRange{},
        [&](OpBuilder &cb, const TaskFamily &family,
            Value record) -> SmallVector<Value> {
          if (!family.isPredicated()) {
            add(cb, tilesOf(cb, loc, function, family));
            return {};
          }
          SmallVector<Value> extents = gridOf(function, family);
          SmallVector<Value> zeros(extents.size(), constantIndex(cb, loc, 0));
          SmallVector<Value> ones(extents.size(), constantIndex(cb, loc, 1));
          scf::buildLoopNest(
              cb, loc, zeros, extents, ones,
              [&](OpBuilder &lb, Location, ValueRange tile) {
                ifLive(lb, loc, function, family, record, tile,
                       [&](OpBuilder &live) {
                         add(live, constantIndex(live, loc, 1));
                       });
              });
          return {};
        });
  });
}

/// Queue slots are claimed in order, one per pushed tile, and only live
/// tiles are pushed, so slots [live, total) are never filled by a push: a
/// worker that claims one would wait forever. Each holds `total + 1` from
/// the start instead, which a pop returns as tile id `total`, the id that
/// ends the worker loop, exactly as a pop past the capacity does. The
/// queue keeps its closed-form capacity and protocol.
void DynamicScheduler::initLiveTiles(OpBuilder &b, ScheduledFunction &function,
                                     QueueLayout &layout) {
  Location loc = graph.getLoc();
  countLiveTiles(b, loc, function, layout.liveTiles);
  Value live = loadIndex(b, loc, function.counters, layout.liveTiles);
  Value slots = addIndex(b, loc, layout.queue,
                         constantIndex(b, loc, queue::kHeaderWords));
  Value endMarker = arith::IndexCastOp::create(
      b, loc, b.getI32Type(),
      addIndex(b, loc, layout.totalTiles, constantIndex(b, loc, 1)));
  scf::ForOp::create(
      b, loc, addIndex(b, loc, slots, live),
      addIndex(b, loc, slots, layout.totalTiles), constantIndex(b, loc, 1),
      ValueRange{},
      [&](OpBuilder &nested, Location loc, Value position, ValueRange) {
        memref::StoreOp::create(nested, loc, endMarker, function.counters,
                                position);
        scf::YieldOp::create(nested, loc);
      });
}

/// `@g_init(symbols, table, counters)`: expected counts, an empty queue, the
/// tile offsets, the inverse index, the pending counts, and the ready tiles
/// pushed. With live bounds, also the live tile count and the end markers
/// of the slots dead tiles leave unused. Runs once before any worker
/// starts; only the pending-count loop may run on several lanes (it is
/// `event.independent`).
void DynamicScheduler::buildInit(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function = createFunction(
      builder, "_init", /*withCounters=*/true, /*results=*/{}, layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  initRunHeader(b, loc, function, layout.end);
  initEventCounters(b, function);
  zeroCounters(b, loc, function.counters, layout.queue, layout.pending);
  if (anyLive) {
    // Dead tiles get no pending count of their own; `@g_check` reads them.
    zeroCounters(b, loc, function.counters, layout.pending,
                 layout.tileOffsets);
    initLiveTiles(b, function, layout);
  }
  // tileOffsets[0] = 0, tileOffsets[k + 1] = tileOffsets[k] + tiles of k.
  storeIndex(b, loc, constantIndex(b, loc, 0), function.counters,
             layout.tileOffsets);
  forEachTask(b, loc, [&](OpBuilder &nested, Value task) {
    ValueRange tiles = switchOnFamily(
        nested, loc, function, task, TypeRange{nested.getIndexType()},
        [&](OpBuilder &cb, const TaskFamily &family,
            Value) -> SmallVector<Value> {
          return {tilesOf(cb, loc, function, family)};
        });
    Value offset = tileOffset(nested, loc, function, layout, task);
    storeIndex(nested, loc, addIndex(nested, loc, offset, tiles[0]),
               function.counters,
               addIndex(nested, loc, layout.tileOffsets,
                        addIndex(nested, loc, task, constantIndex(nested, loc, 1))));
  });
  if (anyIndexed)
    buildInverseIndex(b, function, layout);
  if (!polled.empty())
    initHandled(b, function, layout);
  initPending(b, function, layout);
  func::ReturnOp::create(b, loc);
  dropUnusedPendingView(layout);
}

/// Every rank's counters hold their expected counts before any rank runs a
/// tile (the runtime meets after `@g_init`), so an element whose counter is
/// positive here is still to arrive; one that is not (count 0) is ready and
/// counted so by the pending counts: it is never handled.
void DynamicScheduler::initHandled(OpBuilder &b, ScheduledFunction &function,
                                   QueueLayout &layout) {
  Location loc = graph.getLoc();
  zeroCounters(b, loc, function.counters, layout.handled,
               addIndex(b, loc, layout.handled, function.eventCounters));
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
  for (unsigned classIndex : polled) {
    const ClassLayout &classLayout = function.classes[classIndex];
    Value end = addIndex(
        b, loc, classLayout.base,
        mulIndex(b, loc, classLayout.numElements,
                 constantIndex(b, loc,
                               plan.classes[classIndex].instances.size())));
    scf::ForOp::create(
        b, loc, classLayout.base, end, constantIndex(b, loc, 1), ValueRange{},
        [&](OpBuilder &nested, Location loc, Value position, ValueRange) {
          Value count =
              memref::LoadOp::create(nested, loc, function.counters, position);
          Value waiting = arith::CmpIOp::create(
              nested, loc, arith::CmpIPredicate::sgt, count, zero);
          Value flag = arith::ExtUIOp::create(nested, loc,
                                              nested.getI32Type(), waiting);
          memref::StoreOp::create(
              nested, loc, flag, function.counters,
              addIndex(nested, loc, layout.handled, position));
          scf::YieldOp::create(nested, loc);
        });
  }
}
