//===- GraphProgramBuilder.h - Functions of a scheduled program -*- C++ -*-===//
//
// What every scheduler emits the same way for a planned graph: the
// functions' signatures and attributes, the constant tables, the layout of
// the event classes in the counter buffer, their expected counts, index
// maps, tile bodies, the run header, trace records and the end-of-run
// check. `StaticScheduler` and `DynamicScheduler` derive from
// `GraphProgramBuilder` and add the per-worker loop.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_DIALECT_EVENT_TRANSFORMS_GRAPHPROGRAMBUILDER_H
#define ETC_LIB_DIALECT_EVENT_TRANSFORMS_GRAPHPROGRAMBUILDER_H

#include "GraphPlan.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace etc::event {

/// The layout of one event class in the counter buffer, as values of the
/// function being built.
struct ClassLayout {
  /// The first counter of the class's first event.
  mlir::Value base;
  /// Counters per event.
  mlir::Value numElements;
  /// Every dimension's size, static ones as constants.
  llvm::SmallVector<mlir::Value> sizes;
  /// The dynamic sizes, as `event.view` takes them.
  llvm::SmallVector<mlir::Value> dynamicSizes;
};

/// One function of a scheduled program being built.
struct ScheduledFunction {
  mlir::func::FuncOp op;
  /// Graph values to their counterparts in the function (symbols, the
  /// graph's index computations, buffers read from the table).
  mlir::IRMapping mapping;
  /// The buffer table and the counter buffer (null without counters).
  mlir::Value table;
  mlir::Value counters;
  /// The layout of each event class.
  llvm::SmallVector<ClassLayout> classes;
  /// Number of counters of all event tensors together; they occupy
  /// `[0, eventCounters)` of the counter buffer.
  mlir::Value eventCounters;
  /// The task tables, as `memref.get_global`s at the function's start, once
  /// `GraphProgramBuilder::useTaskTables` made them.
  mlir::Value taskFamily, taskRecord, records;
};

/// Builds the functions of one graph's scheduled program. Schedulers
/// derive from it and add the per-worker loop.
class GraphProgramBuilder {
public:
  GraphProgramBuilder(const GraphPlan &plan, llvm::StringRef schedule,
                      int64_t workers, bool trace = false);

  /// Creates `@<graph><suffix>(symbols..., table[, counters])` with the
  /// attributes `event.graph`, `event.schedule` and `event.workers` (the
  /// worker also gets the tables its waits and trace records refer to,
  /// `event.tasks` and `event.events`, and `event.trace` when tracing),
  /// clones the graph's index computations into it (reading buffers they
  /// use from the table), and lays out the event classes one after another
  /// from counter 0.
  ScheduledFunction createFunction(mlir::OpBuilder &builder,
                                   llvm::StringRef suffix, bool withCounters,
                                   mlir::TypeRange results);

  /// Inserts the module-level constant tables of the plan (task families,
  /// record offsets, records) before `builder`'s insertion point.
  void createTables(mlir::OpBuilder &builder);

  /// Inserts the private constant `memref.global @<graph><suffix> :
  /// memref<N x i32>` holding `values` (one 0 when empty, so that the type
  /// stays valid).
  void createConstantTable(mlir::OpBuilder &builder, llvm::StringRef suffix,
                           llvm::ArrayRef<int32_t> values);

  /// `memref.get_global @<graph><suffix>` (a table of `size` entries) at the
  /// start of `function`.
  mlir::Value constantTable(ScheduledFunction &function,
                            llvm::StringRef suffix, int64_t size);

  /// The graph buffer `value` (a memref argument of the graph), read from
  /// the table at the start of `function`.
  mlir::Value graphBuffer(ScheduledFunction &function, mlir::Value value);

  /// Reads the task tables in `function` (once).
  void useTaskTables(ScheduledFunction &function);

  /// Field `field` of the record starting at `record`, as an index.
  mlir::Value loadField(mlir::OpBuilder &b, mlir::Location loc,
                        ScheduledFunction &function, mlir::Value record,
                        unsigned field);

  /// Entry `index` of the i32 constant table `table`, as an index.
  mlir::Value loadConstant(mlir::OpBuilder &b, mlir::Location loc,
                           mlir::Value table, mlir::Value index);

  /// Calls `body(b, family, record)` in the case of `scf.index_switch` on
  /// the family of task `task` and returns the switch's results (of types
  /// `results`, which every case yields).
  mlir::ValueRange switchOnFamily(
      mlir::OpBuilder &b, mlir::Location loc, ScheduledFunction &function,
      mlir::Value task, mlir::TypeRange results,
      llvm::function_ref<llvm::SmallVector<mlir::Value>(
          mlir::OpBuilder &, const TaskFamily &, mlir::Value record)>
          body);

  /// Runs `body(b, task)` for every task in order, as an `scf.for`.
  void forEachTask(mlir::OpBuilder &b, mlir::Location loc,
                   llvm::function_ref<void(mlir::OpBuilder &, mlir::Value)> body);

  /// The grid extents and tile count of `family`'s tasks.
  llvm::SmallVector<mlir::Value> gridOf(ScheduledFunction &function,
                                        const TaskFamily &family);
  mlir::Value tilesOf(mlir::OpBuilder &b, mlir::Location loc,
                      ScheduledFunction &function, const TaskFamily &family);

  /// The total number of tiles of all tasks (a loop over the tasks).
  mlir::Value totalTiles(mlir::OpBuilder &b, mlir::Location loc,
                         ScheduledFunction &function);

  /// The event of wait (`notify = false`) or notify entry `entry` of the
  /// task whose record starts at `record`: its `event.view`, its class and
  /// its global number.
  struct EntryEvent {
    mlir::Value view;
    unsigned classIndex;
    mlir::Value number;
    /// The first counter of the event.
    mlir::Value base;
  };
  EntryEvent entryEvent(mlir::OpBuilder &b, mlir::Location loc,
                        ScheduledFunction &function, const TaskFamily &family,
                        mlir::Value record, unsigned entry, bool notify);

  /// The index buffers of the task whose record starts at `record`.
  llvm::SmallVector<mlir::Value> indexBuffers(mlir::OpBuilder &b,
                                              mlir::Location loc,
                                              ScheduledFunction &function,
                                              const TaskFamily &family,
                                              mlir::Value record);

  /// The coordinates of the element that entry `entry` of tile `tile`
  /// waits on (or notifies).
  llvm::SmallVector<mlir::Value>
  entryCoordinates(mlir::OpBuilder &b, mlir::Location loc,
                   ScheduledFunction &function, const TaskFamily &family,
                   mlir::Value record, unsigned entry, bool notify,
                   mlir::ValueRange tile);

  /// Whether tile `tile` of the task whose record starts at `record` runs
  /// (an `i1`: below every live bound), or null when the family has no
  /// live bounds and every tile runs.
  mlir::Value liveCondition(mlir::OpBuilder &b, mlir::Location loc,
                            ScheduledFunction &function,
                            const TaskFamily &family, mlir::Value record,
                            mlir::ValueRange tile);

  /// `event.prefetch` of each of the family's planned prefetch boxes for
  /// tile `tile`, clipped to the buffer.
  void emitPrefetches(mlir::OpBuilder &b, mlir::Location loc,
                      ScheduledFunction &function, const TaskFamily &family,
                      mlir::Value record, mlir::ValueRange tile);

  /// Calls `body(b)` where tile `tile` runs: inside `scf.if` on its live
  /// condition, or directly when every tile of the family runs.
  void ifLive(mlir::OpBuilder &b, mlir::Location loc,
              ScheduledFunction &function, const TaskFamily &family,
              mlir::Value record, mlir::ValueRange tile,
              llvm::function_ref<void(mlir::OpBuilder &)> body);

  /// Emits the tile `tile` of task `task`, whose record starts at
  /// `record`: the call of the family's tile function, or a clone of its
  /// body. A tile function that stalls on a barrier (`event.stall`) is
  /// called through its sited copy (`sitedCallee`) with the counter buffer,
  /// `task` and `tile`; a cloned body's stalls get them directly.
  void runTileBody(mlir::OpBuilder &b, mlir::Location loc,
                   ScheduledFunction &function, const TaskFamily &family,
                   mlir::Value record, mlir::Value task, mlir::ValueRange tile);

  /// Tile function `callee` with stalls that name their site: `callee`'s
  /// arguments, then the counter buffer, the task index and `rank` tile
  /// coordinates (i32), which every `event.stall` in it gets as its counters
  /// and site; null when `callee` does not stall. `callee` itself when only
  /// this graph's tasks of rank `rank` call it (it is rewritten once; the
  /// graph is erased after the build), else a copy next to it,
  /// `@<callee>_sited`, made once per callee and rank; the original stays
  /// for the other callers (convert-event-to-gpu drops it when unused).
  mlir::func::FuncOp sitedCallee(mlir::func::FuncOp callee, unsigned rank);

  /// Writes every event counter's expected count: the class's `count`, or
  /// the number of notifies counted by evaluating the map of every notifying
  /// tile that runs (dead tiles of predicated tasks do not notify), with
  /// atomic adds in `event.independent` loops over each task's tiles.
  void initEventCounters(mlir::OpBuilder &b, ScheduledFunction &function);

  /// True when some counter in `[begin, end)` is not zero (plain loads: the
  /// check runs after every worker has finished).
  mlir::Value anyNonZero(mlir::OpBuilder &b, mlir::Location loc,
                         ScheduledFunction &function, mlir::Value begin,
                         mlir::Value end);

  /// The names of the functions and tables every scheduler emits for
  /// `graph`.
  static llvm::SmallVector<std::string> symbolNames(GraphOp graph);

  /// Status codes `@g_check` returns.
  enum CheckStatus : int32_t { kClean = 0, kQueueOverflow = 1, kUnbalanced = 2 };

  //===--------------------------------------------------------------------===//
  // The run header, the watchdog's sites and trace records
  //===--------------------------------------------------------------------===//

  /// The size of a counter buffer whose event counters and scheduler state
  /// end at `end`: the trace records (when tracing) follow, then the run
  /// header (`Event/IR/RunLayout.h`) ends the buffer.
  mlir::Value bufferSize(mlir::OpBuilder &b, mlir::Location loc,
                         ScheduledFunction &function, mlir::Value end);

  /// Resets the run header of a buffer whose state ends at `end` (status,
  /// claim, trace location) and, when tracing, zeroes the trace records
  /// from `end` on (`@g_init`).
  void initRunHeader(mlir::OpBuilder &b, mlir::Location loc,
                     ScheduledFunction &function, mlir::Value end);

  /// Emits the waits of tile `tile` of task `task` (of `family`, record
  /// `record`), each with its site (task, event number, tile) for the
  /// watchdog's record, `deferred`, then one `event.acquire`.
  void emitWaits(mlir::OpBuilder &b, mlir::Location loc,
                 ScheduledFunction &function, const TaskFamily &family,
                 mlir::Value record, mlir::Value task, mlir::ValueRange tile);

  /// Emits the work of tile `tile` (global tile id `id`) of task `task`: the
  /// trace start (records from `records` on), the tile body, the trace end,
  /// then `notify`. With `afterWaits`, all of it runs only if the run was
  /// not stopped (`event.run_aborted`), since a stopped wait leaves the
  /// inputs unready.
  void emitTileWork(mlir::OpBuilder &b, mlir::Location loc,
                    ScheduledFunction &function, const TaskFamily &family,
                    mlir::Value record, mlir::Value task, mlir::ValueRange tile,
                    mlir::Value id, mlir::Value records, bool afterWaits,
                    llvm::function_ref<void(mlir::OpBuilder &)> notify);

  /// Fails when tracing is asked for a task whose grid has more dimensions
  /// than a trace record holds.
  mlir::LogicalResult checkTraceable();

protected:
  const GraphPlan &plan;
  GraphOp graph;
  std::string schedule;
  int64_t workers;
  /// Whether the workers write trace records.
  bool trace;
  llvm::SmallVector<TaskOp> tasks;
  /// `sitedCallee`'s copies by callee and tile rank (null: no stall).
  llvm::DenseMap<std::pair<mlir::Operation *, unsigned>, mlir::func::FuncOp>
      sitedCallees;
};

/// Fails with an error when a symbol the schedulers need for a graph of
/// `module` is taken; `pass` names the pass in the message.
mlir::LogicalResult checkScheduleSymbolsFree(mlir::ModuleOp module,
                                             llvm::StringRef pass);

} // namespace etc::event

#endif // ETC_LIB_DIALECT_EVENT_TRANSFORMS_GRAPHPROGRAMBUILDER_H
