//===- ScheduleUtils.h - Pieces shared by the schedulers --------*- C++ -*-===//
//
// What `event-static-schedule` and `event-dynamic-schedule` build the same
// way. A scheduled program is table-driven, so that its code grows with the
// number of distinct kinds of task, not with the number of tasks:
//
// * tasks are grouped into *families*: tasks that call the same tile
//   function with the same grid and whose waits and notifies use the same
//   index maps on events of the same *class* (same type, sizes and count).
//   The tasks of identical layers form one family each;
// * what differs between the tasks of a family (which buffers, which event
//   of the class) is constant data: one record per task in a module-level
//   `memref.global` constant, and the code of a family runs any of its
//   tasks from its record;
// * buffers reach the program through the buffer table (`event.buffer`),
//   so that kernels take a few parameters whatever the number of buffers;
// * the event tensors of a class lie one after another in the counter
//   buffer, so that an event's counters are found from its class and its
//   number in the class.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_EVENT_TRANSFORMS_SCHEDULEUTILS_H
#define ETC_EVENT_TRANSFORMS_SCHEDULEUTILS_H

#include "Event/IR/EventOps.h"
#include "Event/IR/TransportLayout.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace etc::event {

//===----------------------------------------------------------------------===//
// Index arithmetic that folds as it is built
//===----------------------------------------------------------------------===//

mlir::Value constantIndex(mlir::OpBuilder &b, mlir::Location loc,
                          int64_t value);
mlir::Value addIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value subIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value mulIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value remIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value divIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value minIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
/// The product of `factors` (1 when empty).
mlir::Value productIndex(mlir::OpBuilder &b, mlir::Location loc,
                         mlir::ValueRange factors);

/// Row-major position of `coordinates` in a tensor of shape `sizes`.
mlir::Value linearize(mlir::OpBuilder &b, mlir::Location loc,
                      mlir::ValueRange coordinates, mlir::ValueRange sizes);

/// Inverse of `linearize`: the coordinates of row-major position `linear`.
llvm::SmallVector<mlir::Value> delinearize(mlir::OpBuilder &b,
                                           mlir::Location loc,
                                           mlir::Value linear,
                                           mlir::ValueRange sizes);

/// The event coordinates `indexMap` gives tile `tile`: affine results applied
/// to the tile indices, indirect results loaded from `indexBuffers` (the
/// task's index buffers, already remapped) and cast to `index`.
llvm::SmallVector<mlir::Value> evaluateIndexMap(mlir::OpBuilder &b,
                                                mlir::Location loc,
                                                IndexMapAttr indexMap,
                                                mlir::ValueRange tile,
                                                mlir::ValueRange indexBuffers);

//===----------------------------------------------------------------------===//
// The plan of a graph: buffer table, event classes, task families, records
//===----------------------------------------------------------------------===//

/// Event tensors that share a type, dynamic sizes and `count` (or have none):
/// their counters lie one after another in the counter buffer.
struct EventClass {
  EventTensorType type;
  /// The graph values of the `?` sizes, in order.
  llvm::SmallVector<mlir::Value> dynamicSizes;
  /// The graph value of the expected count, or null (counted on the device).
  mlir::Value count;
  /// The allocations of the class, in textual order.
  llvm::SmallVector<AllocOp> instances;
  /// The global number of the first instance: events are numbered class by
  /// class, so event `firstEvent + i` is instance `i`.
  int64_t firstEvent = 0;
};

/// How a family's tile call gets one of its operands.
struct CallOperand {
  enum Kind {
    /// A graph buffer, from the buffer table at the offset in record field
    /// `field`.
    Buffer,
    /// Tile index `field`.
    Tile,
    /// The same graph value for every task of the family.
    Fixed,
  } kind;
  unsigned field = 0;
  mlir::Value fixed;
};

/// Tasks that one piece of code runs, each from its record.
///
/// A record is a row of i32 fields: the buffer-table offset of each
/// `Buffer` operand of the tile call, then of each index buffer, then the
/// number (within its class) of the event of each wait entry, then of each
/// notify entry.
struct TaskFamily {
  /// The first task of the family; its grid, maps and body stand for all.
  /// (Mutable: op accessors are not const.)
  mutable TaskOp representative;
  /// The tasks, as indices into the graph's task list.
  llvm::SmallVector<unsigned> members;
  /// The tile call, or null when the body is not one call: the family then
  /// has one task and its body is cloned.
  mlir::func::CallOp call;
  llvm::SmallVector<CallOperand> operands;
  unsigned numBufferFields = 0;
  unsigned numIndexBuffers = 0;
  /// The event class of each wait and notify entry.
  llvm::SmallVector<unsigned> waitClasses;
  llvm::SmallVector<unsigned> notifyClasses;
  /// The live bounds of the family's tasks (empty: every tile runs).
  llvm::SmallVector<LiveAttr> liveBounds;
  /// A box a tile reads from a buffer that no task writes (a weight):
  /// planned with `prefetch`, so that the static schedule can ask for it
  /// before the tile's waits. The buffer is the call's operand `operand`.
  struct Prefetch {
    unsigned operand;
    FootprintAttr footprint;
  };
  llvm::SmallVector<Prefetch> prefetches;

  bool isPredicated() const { return !liveBounds.empty(); }

  unsigned indexField(unsigned index) const { return numBufferFields + index; }
  unsigned waitField(unsigned entry) const {
    return indexField(numIndexBuffers) + entry;
  }
  unsigned notifyField(unsigned entry) const {
    return waitField(waitClasses.size()) + entry;
  }
  unsigned numFields() const { return notifyField(notifyClasses.size()); }
};

/// How a scheduled program finds the buffers, events and tasks of a graph.
class GraphPlan {
public:
  /// Plans `graph`, which must have passed `checkSchedule`. Fails with an
  /// error on a buffer argument the buffer table cannot describe. With
  /// `prefetch`, families also record (and agree on) the boxes their tiles
  /// read from buffers no task writes (`TaskFamily::prefetches`).
  static mlir::FailureOr<GraphPlan> build(GraphOp graph, bool prefetch = false);

  GraphOp graph;
  llvm::SmallVector<TaskOp> tasks;
  /// Buffer-table word offset of each memref argument (by argument number);
  /// -1 for index arguments.
  llvm::SmallVector<int64_t> tableOffsets;
  /// The words the buffers take in the buffer table; a graph on several
  /// ranks has its transport block from there on.
  int64_t tableWords = 0;
  std::vector<EventClass> classes;
  /// Each allocation's (class, number within the class).
  llvm::DenseMap<mlir::Operation *, std::pair<unsigned, unsigned>> eventOf;
  std::vector<TaskFamily> families;
  /// Each task's family and the index of its record's first field in
  /// `records`.
  llvm::SmallVector<int32_t> taskFamily;
  llvm::SmallVector<int32_t> taskRecord;
  llvm::SmallVector<int32_t> records;

  int64_t numEvents() const {
    return classes.empty() ? 0
                           : classes.back().firstEvent +
                                 classes.back().instances.size();
  }
  /// The global number of allocation `alloc`.
  int64_t eventNumber(AllocOp alloc) const {
    auto [classIndex, instance] = eventOf.lookup(alloc);
    return classes[classIndex].firstEvent + instance;
  }

private:
  mlir::LogicalResult planBuffers();
  void planEvents();
  void planFamilies(bool prefetch);
};

//===----------------------------------------------------------------------===//
// Scheduled functions
//===----------------------------------------------------------------------===//

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

  /// Emits the tile `tile` of the task whose record starts at `record`:
  /// the call of the family's tile function, or a clone of its body.
  void runTileBody(mlir::OpBuilder &b, mlir::Location loc,
                   ScheduledFunction &function, const TaskFamily &family,
                   mlir::Value record, mlir::ValueRange tile);

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
};

/// How the static schedule's workers share the global tile order.
enum class StaticPolicy {
  /// Worker w of W runs the global tiles t with t mod W == w.
  RoundRobin,
  /// Each worker claims the next global tile from a shared counter.
  Claim,
};

/// The policy that `policy=` option text names, or failure.
mlir::FailureOr<StaticPolicy> parseStaticPolicy(llvm::StringRef text);

/// The `policy=` values `parseStaticPolicy` accepts, for error messages.
inline constexpr llvm::StringLiteral kStaticPolicies = "round-robin, claim";

/// Inserts the static schedule of the planned graph (the tables and
/// functions `event-static-schedule` documents) at `builder`, leaving the
/// graph itself in place. The graph must have passed `checkSchedule`.
void buildStaticSchedule(mlir::OpBuilder &builder, const GraphPlan &plan,
                         int64_t workers, bool trace = false,
                         StaticPolicy policy = StaticPolicy::RoundRobin);


/// Fails with an error when a symbol the schedulers need for a graph of
/// `module` is taken; `pass` names the pass in the message.
mlir::LogicalResult checkScheduleSymbolsFree(mlir::ModuleOp module,
                                             llvm::StringRef pass);

/// Merges the graph's identical pure computations (grid sizes, counts), so
/// that tasks and events that compute the same values share families and
/// classes.
void simplifyGraph(GraphOp graph);

} // namespace etc::event

#endif // ETC_EVENT_TRANSFORMS_SCHEDULEUTILS_H
