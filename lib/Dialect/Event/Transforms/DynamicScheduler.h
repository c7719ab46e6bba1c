//===- DynamicScheduler.h - The dynamic schedule of a graph -----*- C++ -*-===//
//
// The scheduler behind `event-dynamic-schedule`: how the waiters of an
// event element are found (closed-form boxes of tiles, or an inverse index
// built on the device), where the queue and the pending counts lie in the
// counter buffer, and the functions it emits. Its members are defined in
// DynamicScheduler.cpp (waiters, layout, `@g_check`),
// DynamicScheduleInit.cpp (`@g_counters`, `@g_init`) and
// DynamicScheduleWorker.cpp (`@g_worker`).
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_DIALECT_EVENT_TRANSFORMS_DYNAMICSCHEDULER_H
#define ETC_LIB_DIALECT_EVENT_TRANSFORMS_DYNAMICSCHEDULER_H

#include "GraphProgramBuilder.h"

#include "Event/IR/EventOps.h"
#include "mlir/IR/Builders.h"

#include <optional>

namespace etc::event {

/// How one result of a wait map selects tiles: `tile[dim] == c`,
/// `tile[dim] floordiv divisor == c`, for a constant result every tile when
/// `c == constant`, and for `Any` (an indirect result whose index buffer is
/// written during the run) every tile for every `c`.
struct BoxResult {
  enum Kind { Dim, FloorDiv, Constant, Any } kind;
  unsigned dim = 0;
  int64_t value = 0; // The divisor or the constant.
};

/// How the waiters of wait entry `entry` of a family are found: in closed
/// form (`box`), or through the inverse index built in `@g_init`.
struct WaitKind {
  unsigned family;
  unsigned entry;
  std::optional<llvm::SmallVector<BoxResult>> box;
};

/// Where the scheduling state lives in the counter buffer, as values of the
/// function being built.
struct QueueLayout {
  mlir::Value totalTiles;
  /// The first word of the queue (header, then slots).
  mlir::Value queue;
  /// The first pending count, and the pending counts as an event tensor.
  mlir::Value pending;
  mlir::Value pendingView;
  /// The first global tile of each task, then the total (numTasks + 1).
  mlir::Value tileOffsets;
  /// When some task has live bounds: the word holding the number of live
  /// tiles, which `@g_init` counts.
  mlir::Value liveTiles;
  /// The inverse index, when some wait needs it: `eventCounters + 1`
  /// offsets (by counter position), then the waiting tile ids.
  mlir::Value indexOffsets;
  mlir::Value indexEntries;
  /// On several ranks, when some tile waits on a symmetric event: one
  /// *handled* flag per event counter, and the flags as an event tensor.
  mlir::Value handled;
  mlir::Value handledView;
  /// The size of the whole counter buffer.
  mlir::Value end;
};

/// Erases the pending-count view of a function that does not use it.
void dropUnusedPendingView(QueueLayout &layout);

/// Loads counter `position` as an index.
mlir::Value loadIndex(mlir::OpBuilder &b, mlir::Location loc,
                      mlir::Value counters, mlir::Value position);

/// Builds the tables and functions of one graph's dynamic schedule.
class DynamicScheduler : public GraphProgramBuilder {
public:
  DynamicScheduler(const GraphPlan &plan, int64_t workers, bool forceIndex,
                   bool trace);

  /// Inserts the constant tables, `@g_counters`, `@g_init`, `@g_worker` and
  /// `@g_check` at `builder`.
  void build(mlir::OpBuilder &builder);

private:
  /// A function with the queue laid out after the event tensors.
  ScheduledFunction createFunction(mlir::OpBuilder &builder,
                                   llvm::StringRef suffix, bool withCounters,
                                   mlir::TypeRange results,
                                   QueueLayout &layout);
  void buildCounters(mlir::OpBuilder &builder);
  void buildInit(mlir::OpBuilder &builder);
  void buildWorker(mlir::OpBuilder &builder);
  void buildCheck(mlir::OpBuilder &builder);

  /// Sets the handled flag of every element of the polled classes to
  /// whether it is still to arrive (`@g_init`).
  void initHandled(mlir::OpBuilder &b, ScheduledFunction &function,
                   QueueLayout &layout);
  /// The worker loop of a graph on several ranks: takes tiles with
  /// `event.queue_try_pop`, and polls the symmetric elements when the queue
  /// has nothing published.
  void buildPollingLoop(mlir::OpBuilder &b, mlir::Location loc,
                        ScheduledFunction &function, QueueLayout &layout);
  /// Scans every element of the polled classes; the worker that takes an
  /// arrived element's handled flag to zero readies its waiters. Returns
  /// whether it readied any element, then the first element still to
  /// arrive: its class (`polled.size()` when none), event number and
  /// linear position.
  llvm::SmallVector<mlir::Value> pollSymmetric(mlir::OpBuilder &b,
                                               mlir::Location loc,
                                               ScheduledFunction &function,
                                               QueueLayout &layout);
  /// `event.idle` of a worker that found nothing, naming the element
  /// `pollSymmetric` reported (when there is one). Returns the idle start.
  mlir::Value idle(mlir::OpBuilder &b, mlir::Location loc,
                   ScheduledFunction &function, mlir::Value since,
                   mlir::ValueRange site);

  /// The first global tile of task `task`.
  mlir::Value tileOffset(mlir::OpBuilder &b, mlir::Location loc,
                         ScheduledFunction &function, QueueLayout &layout,
                         mlir::Value task);
  /// The task whose tile range holds global tile `id`: a binary search
  /// over the tile offsets.
  mlir::Value findTask(mlir::OpBuilder &b, mlir::Location loc,
                       ScheduledFunction &function, QueueLayout &layout,
                       mlir::Value id);
  /// Calls `body(b, family, record, id, tile)` for every tile of every task,
  /// `id` its global tile id.
  void forEachTile(mlir::OpBuilder &b, mlir::Location loc,
                   ScheduledFunction &function, QueueLayout &layout,
                   llvm::function_ref<void(mlir::OpBuilder &,
                                           const TaskFamily &, mlir::Value,
                                           mlir::Value, mlir::ValueRange)>
                       body);
  /// Builds the inverse index in `@g_init`.
  void buildInverseIndex(mlir::OpBuilder &b, ScheduledFunction &function,
                         QueueLayout &layout);
  /// Calls `body(b, id, element)` for every tile and every wait entry that
  /// uses the inverse index; `element` is the counter position of its wait
  /// element.
  void forEachIndexedWait(mlir::OpBuilder &b, ScheduledFunction &function,
                          QueueLayout &layout,
                          llvm::function_ref<void(mlir::OpBuilder &,
                                                  mlir::Location, mlir::Value,
                                                  mlir::Value)>
                              body);
  /// The number of not yet ready elements a tile waits on through a wait
  /// entry with `Any` results: every coordinate there, the others evaluated.
  mlir::Value countWaitingOnAny(mlir::OpBuilder &b, mlir::Location loc,
                                ScheduledFunction &function,
                                unsigned classIndex, mlir::Value eventBase,
                                IndexMapAttr map,
                                llvm::ArrayRef<BoxResult> box,
                                mlir::ValueRange tile);
  /// Sets every tile's pending count and pushes the ready tiles (`@g_init`).
  void initPending(mlir::OpBuilder &b, ScheduledFunction &function,
                   QueueLayout &layout);
  /// Sets the pending count of live tile `tile` (global id `id`) of a task
  /// of `family` and pushes it when it is ready.
  void initTilePending(mlir::OpBuilder &b, ScheduledFunction &function,
                       QueueLayout &layout, const TaskFamily &family,
                       mlir::Value record, mlir::Value id,
                       mlir::ValueRange tile);
  /// Counts the live tiles of all tasks into counter `word` (`@g_init`).
  void countLiveTiles(mlir::OpBuilder &b, mlir::Location loc,
                      ScheduledFunction &function, mlir::Value word);
  /// Counts the live tiles into `layout.liveTiles` and publishes the end
  /// marker in every queue slot no live tile will use (`@g_init`).
  void initLiveTiles(mlir::OpBuilder &b, ScheduledFunction &function,
                     QueueLayout &layout);

  /// Emits the tile with global id `id` of task `task`: the body, then the
  /// notifies.
  void runTile(mlir::OpBuilder &b, mlir::Location loc,
               ScheduledFunction &function, QueueLayout &layout,
               mlir::Value task, mlir::Value id);
  /// Emits the code that readies the waiters of element `coordinates` of
  /// the event numbered `number` (class `classIndex`, first counter
  /// `eventBase`), run by the notifier that took it to zero. Every lane of
  /// the worker runs it, and the waiting tiles are spread over the lanes:
  /// lane l readies waiters l, l + lanes, ... of each closed-form box and
  /// of the element's inverse-index row.
  void readyWaiters(mlir::OpBuilder &b, mlir::Location loc,
                    ScheduledFunction &function, QueueLayout &layout,
                    unsigned classIndex, mlir::Value number,
                    mlir::Value eventBase, mlir::ValueRange coordinates);
  /// Decrements the pending count of tile `id`, pushing it when it is the
  /// last: the calling lane's own (`per_lane`) decrement and push.
  void readyTile(mlir::OpBuilder &b, mlir::Location loc,
                 ScheduledFunction &function, QueueLayout &layout,
                 mlir::Value id);

  const WaitKind &kindOf(unsigned family, unsigned entry) const {
    return kinds[firstKind[family] + entry];
  }
  unsigned waitClassOf(const WaitKind &kind) const {
    return plan.families[kind.family].waitClasses[kind.entry];
  }

  /// The wait kinds, family by family, entry by entry.
  llvm::SmallVector<WaitKind> kinds;
  llvm::SmallVector<unsigned> firstKind;
  /// The closed-form kinds, numbered for the waiter tables.
  llvm::SmallVector<unsigned> boxKinds;
  /// For each event number, its waiting (task, box kind) pairs, CSR.
  llvm::SmallVector<int32_t> waiterOffsets, waiterTasks, waiterKinds;
  /// Per class: whether some wait entry waits on it in closed form, through
  /// the inverse index.
  llvm::SmallVector<bool> classHasBoxWaiters, classHasIndexedWaiters;
  /// Whether any wait uses the inverse index.
  bool anyIndexed = false;
  /// Whether some task has live bounds, so that fewer tiles than the grids
  /// hold run.
  bool anyLive = false;
  /// The symmetric classes some tile waits on (a graph on several ranks):
  /// their elements are readied by polling (`pollSymmetric`).
  llvm::SmallVector<unsigned> polled;
  /// For each event number, the first task that waits on it, or -1, and
  /// the closed-form kind (numbered as in `boxKinds`) of that wait, or -1.
  llvm::SmallVector<int32_t> firstWaiter, firstWaiterKind;
};

} // namespace etc::event

#endif // ETC_LIB_DIALECT_EVENT_TRANSFORMS_DYNAMICSCHEDULER_H
