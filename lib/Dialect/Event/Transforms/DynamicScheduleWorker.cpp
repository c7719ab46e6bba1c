//===- DynamicScheduleWorker.cpp - @g_worker of the dynamic schedule ------===//
//
// The dynamic schedule's `@g_worker`: the loop that pops tiles from the
// queue and runs them, readying the waiters of every element a tile's
// notifies complete; on several ranks, the polling of symmetric elements
// and the watchdog's record of what an idle worker waits on.
//
//===----------------------------------------------------------------------===//

#include "DynamicScheduler.h"
#include "IndexArithmetic.h"

#include "Event/IR/RunLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace etc::event;

void DynamicScheduler::readyTile(OpBuilder &b, Location loc,
                                 ScheduledFunction &function,
                                 QueueLayout &layout, Value id) {
  auto notify = NotifyReadyOp::create(b, loc, layout.pendingView, id);
  notify.setPerLane(true);
  scf::IfOp::create(b, loc, notify.getReady(), [&](OpBuilder &then,
                                                   Location loc) {
    auto push = QueuePushOp::create(then, loc, id, function.counters,
                                    layout.queue, layout.totalTiles);
    push.setPerLane(true);
    scf::YieldOp::create(then, loc);
  });
}

void DynamicScheduler::readyWaiters(OpBuilder &b, Location loc,
                                    ScheduledFunction &function,
                                    QueueLayout &layout, unsigned classIndex,
                                    Value number, Value eventBase,
                                    ValueRange coordinates) {
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  if (classHasBoxWaiters[classIndex]) {
    Value offsets =
        constantTable(function, "_waiter_offsets", waiterOffsets.size());
    Value waiterTaskTable =
        constantTable(function, "_waiter_tasks", waiterTasks.size());
    Value waiterKindTable =
        constantTable(function, "_waiter_kinds", waiterKinds.size());
    Value begin = loadConstant(b, loc, offsets, number);
    Value end = loadConstant(b, loc, offsets, addIndex(b, loc, number, one));
    scf::ForOp::create(
        b, loc, begin, end, one, ValueRange{},
        [&](OpBuilder &nested, Location loc, Value waiter, ValueRange) {
          Value task = loadConstant(nested, loc, waiterTaskTable, waiter);
          Value kindNumber = loadConstant(nested, loc, waiterKindTable, waiter);
          Value taskOffset = tileOffset(nested, loc, function, layout, task);
          // One case per closed-form kind that waits on this class; the
          // default is unreachable.
          SmallVector<int64_t> cases;
          for (auto [number, kindIndex] : llvm::enumerate(boxKinds))
            if (waitClassOf(kinds[kindIndex]) == classIndex)
              cases.push_back(number);
          auto switchOp = scf::IndexSwitchOp::create(
              nested, loc, TypeRange{}, kindNumber, cases, cases.size());
          auto fill = [&](Region &region, const WaitKind &kind) {
            OpBuilder::InsertionGuard guard(nested);
            nested.createBlock(&region);
            const TaskFamily &family = plan.families[kind.family];
            SmallVector<Value> extents = gridOf(function, family);
            SmallVector<Value> lower(extents.size(), zero);
            SmallVector<Value> upper(extents);
            Value matches;
            for (auto [result, box] : llvm::enumerate(*kind.box)) {
              Value coordinate = coordinates[result];
              if (box.kind == BoxResult::Any)
                continue;
              if (box.kind == BoxResult::Constant) {
                Value equal = arith::CmpIOp::create(
                    nested, loc, arith::CmpIPredicate::eq, coordinate,
                    constantIndex(nested, loc, box.value));
                matches = matches ? arith::AndIOp::create(nested, loc, matches,
                                                          equal)
                                        .getResult()
                                  : equal;
                continue;
              }
              // The tiles [c * M, c * M + M) along `dim`, inside the grid.
              Value extent = extents[box.dim];
              Value divisor = constantIndex(nested, loc, box.value);
              Value first = mulIndex(nested, loc, coordinate, divisor);
              lower[box.dim] = minIndex(nested, loc, first, extent);
              upper[box.dim] = minIndex(
                  nested, loc, addIndex(nested, loc, first, divisor), extent);
            }
            auto emitLoops = [&](OpBuilder &lb, Location loc) {
              Value record;
              if (family.isPredicated()) {
                useTaskTables(function);
                record = loadConstant(lb, loc, function.taskRecord, task);
              }
              // The box, row-major, spread over the lanes.
              SmallVector<Value> sizes;
              for (auto [low, high] : llvm::zip(lower, upper))
                sizes.push_back(subIndex(lb, loc, high, low));
              Value count = productIndex(lb, loc, sizes);
              Value lane = LaneIdOp::create(lb, loc);
              Value lanes = LaneCountOp::create(lb, loc);
              scf::ForOp::create(
                  lb, loc, lane, count, lanes, ValueRange{},
                  [&](OpBuilder &inner, Location loc, Value position,
                      ValueRange) {
                    SmallVector<Value> tile;
                    for (auto [low, offset] : llvm::zip(
                             lower, delinearize(inner, loc, position, sizes)))
                      tile.push_back(addIndex(inner, loc, low, offset));
                    // A dead waiting tile has no pending count to take.
                    ifLive(inner, loc, function, family, record, tile,
                           [&](OpBuilder &live) {
                             Value id = addIndex(
                                 live, loc, taskOffset,
                                 linearize(live, loc, tile, extents));
                             readyTile(live, loc, function, layout, id);
                           });
                    scf::YieldOp::create(inner, loc);
                  });
            };
            if (!matches) {
              emitLoops(nested, loc);
            } else {
              scf::IfOp::create(nested, loc, matches,
                                [&](OpBuilder &then, Location loc) {
                                  emitLoops(then, loc);
                                  scf::YieldOp::create(then, loc);
                                });
            }
            scf::YieldOp::create(nested, loc);
          };
          for (auto [region, number] :
               llvm::zip(switchOp.getCaseRegions(), cases))
            fill(region, kinds[boxKinds[number]]);
          {
            OpBuilder::InsertionGuard guard(nested);
            nested.createBlock(&switchOp.getDefaultRegion());
            scf::YieldOp::create(nested, loc);
          }
          scf::YieldOp::create(nested, loc);
        });
  }

  if (!classHasIndexedWaiters[classIndex])
    return;
  Value element = addIndex(
      b, loc, eventBase,
      linearize(b, loc, coordinates, function.classes[classIndex].sizes));
  Value position = addIndex(b, loc, layout.indexOffsets, element);
  Value begin = loadIndex(b, loc, function.counters, position);
  Value end = loadIndex(b, loc, function.counters,
                        addIndex(b, loc, position, one));
  Value lane = LaneIdOp::create(b, loc);
  Value lanes = LaneCountOp::create(b, loc);
  scf::ForOp::create(
      b, loc, addIndex(b, loc, begin, lane), end, lanes, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value entry, ValueRange) {
        Value id = loadIndex(nested, loc, function.counters,
                             addIndex(nested, loc, layout.indexEntries, entry));
        readyTile(nested, loc, function, layout, id);
        scf::YieldOp::create(nested, loc);
      });
}

void DynamicScheduler::runTile(OpBuilder &b, Location loc,
                               ScheduledFunction &function,
                               QueueLayout &layout, Value task, Value id) {
  Value local = subIndex(b, loc, id, tileOffset(b, loc, function, layout, task));
  auto tileOf = [&](OpBuilder &nested, const TaskFamily &family) {
    return delinearize(nested, loc, local, gridOf(function, family));
  };
  switchOnFamily(b, loc, function, task, TypeRange{},
                 [&](OpBuilder &cb, const TaskFamily &family,
                     Value record) -> SmallVector<Value> {
                   // A popped tile is ready: it has no waits, so nothing to
                   // skip; its notifies follow, once per event class.
                   emitTileWork(cb, loc, function, family, record, task,
                                tileOf(cb, family), id, layout.end,
                                /*afterWaits=*/false, [&](OpBuilder &nb) {
                                  if (!family.notifyClasses.empty())
                                    ReleaseOp::create(nb, loc);
                                });
                   return {};
                 });

  // The notifies, one entry per iteration. A family's case notifies its
  // entry and reports the element when it became ready; the code that
  // readies an element's waiters then exists once per event class, not
  // once per notify site of every family (which made the worker, and
  // LLVM's time on it, several times larger).
  size_t maxEntries = 0;
  for (const TaskFamily &family : plan.families)
    maxEntries = std::max(maxEntries, family.notifyClasses.size());
  if (maxEntries == 0)
    return;
  Type i1 = b.getI1Type(), index = b.getIndexType();
  SmallVector<Type> reported = {i1, index, index, index, index};
  scf::ForOp::create(
      b, loc, constantIndex(b, loc, 0), constantIndex(b, loc, maxEntries),
      constantIndex(b, loc, 1), ValueRange{},
      [&](OpBuilder &lb, Location loc, Value entry, ValueRange) {
        auto nothing = [&](OpBuilder &nb) -> SmallVector<Value> {
          Value zero = constantIndex(nb, loc, 0);
          return {arith::ConstantIntOp::create(nb, loc, 0, 1), zero, zero, zero,
                  zero};
        };
        ValueRange ready = switchOnFamily(
            lb, loc, function, task, reported,
            [&](OpBuilder &cb, const TaskFamily &family,
                Value record) -> SmallVector<Value> {
              unsigned entries = family.notifyClasses.size();
              SmallVector<int64_t> cases;
              for (unsigned e = 0; e < entries; ++e)
                cases.push_back(e);
              auto entrySwitch = scf::IndexSwitchOp::create(
                  cb, loc, reported, entry, cases, cases.size());
              for (unsigned e = 0; e < entries; ++e) {
                OpBuilder::InsertionGuard guard(cb);
                cb.createBlock(&entrySwitch.getCaseRegions()[e]);
                SmallVector<Value> tile = tileOf(cb, family);
                EntryEvent event = entryEvent(cb, loc, function, family,
                                              record, e, /*notify=*/true);
                SmallVector<Value> coordinates = entryCoordinates(
                    cb, loc, function, family, record, e, /*notify=*/true, tile);
                // A symmetric event's map names the rank first; its
                // elements are readied by the polls of their own rank.
                if (plan.classes[event.classIndex].type.getSymmetric()) {
                  RemoteNotifyOp::create(
                      cb, loc, event.view,
                      ArrayRef<Value>(coordinates).drop_front(),
                      coordinates.front());
                  scf::YieldOp::create(cb, loc, nothing(cb));
                  continue;
                }
                if (!classHasBoxWaiters[event.classIndex] &&
                    !classHasIndexedWaiters[event.classIndex]) {
                  NotifyOp::create(cb, loc, event.view, coordinates)
                      .setReleased(true);
                  scf::YieldOp::create(cb, loc, nothing(cb));
                  continue;
                }
                auto notify =
                    NotifyReadyOp::create(cb, loc, event.view, coordinates);
                notify.setReleased(true);
                Value became = notify.getReady();
                Value linear = linearize(
                    cb, loc, coordinates,
                    function.classes[event.classIndex].sizes);
                scf::YieldOp::create(
                    cb, loc,
                    ValueRange{became,
                               constantIndex(cb, loc, event.classIndex),
                               event.number, event.base, linear});
              }
              {
                OpBuilder::InsertionGuard guard(cb);
                cb.createBlock(&entrySwitch.getDefaultRegion());
                scf::YieldOp::create(cb, loc, nothing(cb));
              }
              return SmallVector<Value>(entrySwitch.getResults());
            });
        SmallVector<int64_t> waited;
        for (unsigned c = 0; c < plan.classes.size(); ++c)
          if ((classHasBoxWaiters[c] || classHasIndexedWaiters[c]) &&
              !plan.classes[c].type.getSymmetric())
            waited.push_back(c);
        if (!waited.empty()) {
          scf::IfOp::create(lb, loc, ready[0], [&](OpBuilder &then,
                                                   Location loc) {
            auto classSwitch = scf::IndexSwitchOp::create(
                then, loc, TypeRange{}, ready[1], waited, waited.size());
            for (auto [region, classIndex] :
                 llvm::zip(classSwitch.getCaseRegions(), waited)) {
              OpBuilder::InsertionGuard guard(then);
              then.createBlock(&region);
              SmallVector<Value> coordinates =
                  delinearize(then, loc, ready[4],
                              function.classes[classIndex].sizes);
              readyWaiters(then, loc, function, layout, classIndex, ready[2],
                           ready[3], coordinates);
              scf::YieldOp::create(then, loc);
            }
            {
              OpBuilder::InsertionGuard guard(then);
              then.createBlock(&classSwitch.getDefaultRegion());
              scf::YieldOp::create(then, loc);
            }
            scf::YieldOp::create(then, loc);
          });
        }
        scf::YieldOp::create(lb, loc);
      });
}

/// `@g_worker(symbols, table, counters)`: pops task ids until the queue is
/// exhausted and runs each in the task whose tile range holds it, found by
/// binary search over the tile offsets.
void DynamicScheduler::buildWorker(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function = createFunction(
      builder, "_worker", /*withCounters=*/true, /*results=*/{}, layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  Type index = b.getIndexType();
  if (!tasks.empty() && graph.getRanksAttr()) {
    buildPollingLoop(b, loc, function, layout);
  } else if (!tasks.empty()) {
    scf::WhileOp::create(
        b, loc, TypeRange{index}, ValueRange{},
        [&](OpBuilder &before, Location loc, ValueRange) {
          Value id = QueuePopOp::create(before, loc, function.counters,
                                        layout.queue, layout.totalTiles);
          Value more = arith::CmpIOp::create(
              before, loc, arith::CmpIPredicate::ult, id, layout.totalTiles);
          scf::ConditionOp::create(before, loc, more, id);
        },
        [&](OpBuilder &after, Location loc, ValueRange arguments) {
          Value id = arguments[0];
          runTile(after, loc, function, layout,
                  findTask(after, loc, function, layout, id), id);
          scf::YieldOp::create(after, loc);
        });
  }
  func::ReturnOp::create(b, loc);
  dropUnusedPendingView(layout);
}

/// Until the queue is exhausted or the run stopped: a tile from the queue
/// runs; with none published, the worker polls the symmetric elements, and
/// backs off (keeping the watchdog) when that readied nothing either. The
/// loop carries when the worker became idle (0 while it is not).
void DynamicScheduler::buildPollingLoop(OpBuilder &b, Location loc,
                                        ScheduledFunction &function,
                                        QueueLayout &layout) {
  Type index = b.getIndexType(), i64 = b.getI64Type();
  Value busy = arith::ConstantIntOp::create(b, loc, 0, 64);
  scf::WhileOp::create(
      b, loc, TypeRange{i64, index}, ValueRange{busy},
      [&](OpBuilder &before, Location loc, ValueRange arguments) {
        Value id = QueueTryPopOp::create(before, loc, function.counters,
                                         layout.queue, layout.totalTiles);
        Value left = arith::CmpIOp::create(before, loc, arith::CmpIPredicate::ne,
                                           id, layout.totalTiles);
        Value stopped = RunAbortedOp::create(before, loc, function.counters);
        Value going = arith::AndIOp::create(
            before, loc, left,
            arith::XOrIOp::create(
                before, loc, stopped,
                arith::ConstantIntOp::create(before, loc, 1, 1)));
        scf::ConditionOp::create(before, loc, going,
                                 ValueRange{arguments[0], id});
      },
      [&](OpBuilder &after, Location loc, ValueRange arguments) {
        Value since = arguments[0], id = arguments[1];
        Value got = arith::CmpIOp::create(after, loc, arith::CmpIPredicate::ult,
                                          id, layout.totalTiles);
        auto branch = scf::IfOp::create(
            after, loc, got,
            [&](OpBuilder &then, Location loc) {
              runTile(then, loc, function, layout,
                      findTask(then, loc, function, layout, id), id);
              scf::YieldOp::create(
                  then, loc, arith::ConstantIntOp::create(then, loc, 0, 64)
                                 .getResult());
            },
            [&](OpBuilder &otherwise, Location loc) {
              SmallVector<Value> found =
                  pollSymmetric(otherwise, loc, function, layout);
              auto next = scf::IfOp::create(
                  otherwise, loc, found[0],
                  [&](OpBuilder &then, Location loc) {
                    scf::YieldOp::create(
                        then, loc,
                        arith::ConstantIntOp::create(then, loc, 0, 64)
                            .getResult());
                  },
                  [&](OpBuilder &still, Location loc) {
                    scf::YieldOp::create(
                        still, loc,
                        idle(still, loc, function, since,
                             ArrayRef<Value>(found).drop_front()));
                  });
              scf::YieldOp::create(otherwise, loc, next.getResult(0));
            });
        scf::YieldOp::create(after, loc, branch.getResult(0));
      });
}

SmallVector<Value> DynamicScheduler::pollSymmetric(OpBuilder &b, Location loc,
                                                   ScheduledFunction &function,
                                                   QueueLayout &layout) {
  Type i1 = b.getI1Type(), index = b.getIndexType();
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  // progress, site class, site event number, site position.
  SmallVector<Value> state = {arith::ConstantIntOp::create(b, loc, 0, 1),
                              constantIndex(b, loc, polled.size()), zero,
                              zero};
  for (auto [polledIndex, classIndex] : llvm::enumerate(polled)) {
    const EventClass &eventClass = plan.classes[classIndex];
    const ClassLayout &classLayout = function.classes[classIndex];
    auto instances = scf::ForOp::create(
        b, loc, zero, constantIndex(b, loc, eventClass.instances.size()), one,
        state,
        [&](OpBuilder &ib, Location loc, Value instance, ValueRange carried) {
          Value number = addIndex(
              ib, loc, constantIndex(ib, loc, eventClass.firstEvent), instance);
          Value base = addIndex(ib, loc, classLayout.base,
                                mulIndex(ib, loc, instance,
                                         classLayout.numElements));
          Value view = ViewOp::create(ib, loc, eventClass.type,
                                      function.counters, base,
                                      classLayout.dynamicSizes);
          auto elements = scf::ForOp::create(
              ib, loc, zero, classLayout.numElements, one, carried,
              [&](OpBuilder &eb, Location loc, Value linear,
                  ValueRange current) {
                Value position = addIndex(eb, loc, base, linear);
                SmallVector<Value> coordinates =
                    delinearize(eb, loc, linear, classLayout.sizes);
                Value done = TestOp::create(eb, loc, layout.handledView,
                                            ValueRange{position});
                auto open = scf::IfOp::create(
                    eb, loc, done,
                    [&](OpBuilder &then, Location loc) {
                      scf::YieldOp::create(then, loc, current);
                    },
                    [&](OpBuilder &pending, Location loc) {
                      Value arrived =
                          TestOp::create(pending, loc, view, coordinates);
                      auto handle = scf::IfOp::create(
                          pending, loc, arrived,
                          [&](OpBuilder &then, Location loc) {
                            Value mine = NotifyReadyOp::create(
                                then, loc, layout.handledView,
                                ValueRange{position});
                            scf::IfOp::create(
                                then, loc, mine,
                                [&](OpBuilder &ready, Location loc) {
                                  readyWaiters(ready, loc, function, layout,
                                               classIndex, number, base,
                                               coordinates);
                                  scf::YieldOp::create(ready, loc);
                                });
                            SmallVector<Value> next(current);
                            next[0] = arith::OrIOp::create(then, loc,
                                                           current[0], mine);
                            scf::YieldOp::create(then, loc, next);
                          },
                          [&](OpBuilder &absent, Location loc) {
                            // The first element still to arrive.
                            Value first = arith::CmpIOp::create(
                                absent, loc, arith::CmpIPredicate::eq,
                                current[1],
                                constantIndex(absent, loc, polled.size()));
                            SmallVector<Value> next(current);
                            SmallVector<Value> mine = {
                                constantIndex(absent, loc, polledIndex), number,
                                linear};
                            for (unsigned k = 0; k < 3; ++k)
                              next[k + 1] = arith::SelectOp::create(
                                  absent, loc, first, mine[k], current[k + 1]);
                            scf::YieldOp::create(absent, loc, next);
                          });
                      scf::YieldOp::create(pending, loc, handle.getResults());
                    });
                scf::YieldOp::create(eb, loc, open.getResults());
              });
          scf::YieldOp::create(ib, loc, elements.getResults());
        });
    state.assign(instances.getResults().begin(), instances.getResults().end());
  }
  return state;
}

/// Whether the watchdog's record can name the first tile of closed-form
/// wait `kind` that waits on an element (`firstWaitingTile`): not when its
/// map has constant results (its tiles wait on one element only), nor when
/// its grid has more dimensions than a record holds.
static bool namesWaitingTile(const WaitKind &kind, unsigned gridRank) {
  return static_cast<int64_t>(gridRank) <= run::kMaxRecordRank &&
         llvm::none_of(*kind.box, [](const BoxResult &box) {
           return box.kind == BoxResult::Constant;
         });
}

/// The first tile of closed-form wait `kind`'s box of tiles waiting on
/// element `coordinates`: the coordinate, or the first of the M tiles of a
/// `floordiv M`, along the dimensions the map names; 0 along the others.
static SmallVector<Value> firstWaitingTile(OpBuilder &b, Location loc,
                                           const WaitKind &kind,
                                           unsigned gridRank,
                                           ValueRange coordinates) {
  SmallVector<Value> tile(gridRank, constantIndex(b, loc, 0));
  for (auto [result, box] : llvm::enumerate(*kind.box)) {
    if (box.kind == BoxResult::Dim)
      tile[box.dim] = coordinates[result];
    else if (box.kind == BoxResult::FloorDiv)
      tile[box.dim] = mulIndex(b, loc, coordinates[result],
                               constantIndex(b, loc, box.value));
  }
  return tile;
}

Value DynamicScheduler::idle(OpBuilder &b, Location loc,
                             ScheduledFunction &function, Value since,
                             ValueRange site) {
  Type i64 = b.getI64Type();
  SmallVector<int64_t> cases;
  for (unsigned k = 0; k < polled.size(); ++k)
    cases.push_back(k);
  auto switchOp = scf::IndexSwitchOp::create(b, loc, TypeRange{i64}, site[0],
                                             cases, cases.size());
  Value waiterTable, waiterKindTable;
  if (!polled.empty()) {
    waiterTable = constantTable(function, "_first_waiter", firstWaiter.size());
    waiterKindTable = constantTable(function, "_first_waiter_kind",
                                    firstWaiterKind.size());
  }
  for (auto [region, classIndex] :
       llvm::zip(switchOp.getCaseRegions(), polled)) {
    OpBuilder::InsertionGuard guard(b);
    b.createBlock(&region);
    const EventClass &eventClass = plan.classes[classIndex];
    const ClassLayout &classLayout = function.classes[classIndex];
    Value number = site[1];
    Value instance =
        subIndex(b, loc, number, constantIndex(b, loc, eventClass.firstEvent));
    Value base = addIndex(b, loc, classLayout.base,
                          mulIndex(b, loc, instance, classLayout.numElements));
    Value view = ViewOp::create(b, loc, eventClass.type, function.counters,
                                base, classLayout.dynamicSizes);
    SmallVector<Value> coordinates =
        delinearize(b, loc, site[2], classLayout.sizes);
    Value task = loadConstant(b, loc, waiterTable, number);
    // With the first waiting task's wait in closed form, its first tile on
    // the element too: one case per such kind of wait on this class.
    SmallVector<int64_t> kindCases;
    for (auto [boxIndex, kindIndex] : llvm::enumerate(boxKinds)) {
      const WaitKind &kind = kinds[kindIndex];
      if (waitClassOf(kind) == classIndex &&
          namesWaitingTile(
              kind, plan.families[kind.family].representative.getGrid().size()))
        kindCases.push_back(boxIndex);
    }
    auto kindSwitch = scf::IndexSwitchOp::create(
        b, loc, TypeRange{i64}, loadConstant(b, loc, waiterKindTable, number),
        kindCases, kindCases.size());
    for (auto [kindRegion, boxIndex] :
         llvm::zip(kindSwitch.getCaseRegions(), kindCases)) {
      OpBuilder::InsertionGuard caseGuard(b);
      b.createBlock(&kindRegion);
      const WaitKind &kind = kinds[boxKinds[boxIndex]];
      SmallVector<Value> words{task, number};
      llvm::append_range(
          words,
          firstWaitingTile(
              b, loc, kind,
              plan.families[kind.family].representative.getGrid().size(),
              coordinates));
      scf::YieldOp::create(b, loc,
                           IdleOp::create(b, loc, function.counters, since,
                                          view, coordinates, words)
                               .getResult());
    }
    {
      OpBuilder::InsertionGuard caseGuard(b);
      b.createBlock(&kindSwitch.getDefaultRegion());
      scf::YieldOp::create(b, loc,
                           IdleOp::create(b, loc, function.counters, since,
                                          view, coordinates,
                                          ValueRange{task, number})
                               .getResult());
    }
    scf::YieldOp::create(b, loc, kindSwitch.getResult(0));
  }
  {
    OpBuilder::InsertionGuard guard(b);
    b.createBlock(&switchOp.getDefaultRegion());
    Value start = IdleOp::create(b, loc, function.counters, since, Value(),
                                 ValueRange{}, ValueRange{});
    scf::YieldOp::create(b, loc, start);
  }
  return switchOp.getResult(0);
}
