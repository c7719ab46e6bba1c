//===- ScheduleUtils.h - Pieces shared by the schedulers --------*- C++ -*-===//
//
// What `event-static-schedule` and `event-dynamic-schedule` build the same
// way: functions that take a graph's arguments (plus the counter buffer),
// the layout of the event tensors in that buffer, their expected counts,
// evaluation of index maps, cloning of tile bodies, and the end-of-run check.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_EVENT_TRANSFORMS_SCHEDULEUTILS_H
#define ETC_EVENT_TRANSFORMS_SCHEDULEUTILS_H

#include "Event/IR/EventOps.h"
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
// Scheduled functions
//===----------------------------------------------------------------------===//

/// Where the counters of one event tensor live in the flat counter buffer,
/// as values of the function being built.
struct EventLayout {
  mlir::Value offset;
  mlir::Value numElements;
  /// Every dimension's size, static ones as constants.
  llvm::SmallVector<mlir::Value> sizes;
  /// The `event.view` naming the tensor, when the function has counters.
  mlir::Value view;
};

/// One function of a scheduled program being built.
struct ScheduledFunction {
  mlir::func::FuncOp op;
  /// Graph values to their counterparts in the function.
  mlir::IRMapping mapping;
  /// The layout of each `event.alloc`.
  llvm::DenseMap<mlir::Operation *, EventLayout> events;
  /// Number of counters of all event tensors together; they occupy
  /// `[0, eventCounters)` of the counter buffer.
  mlir::Value eventCounters;
  /// The trailing `memref<?xi32>` argument, if the function has one.
  mlir::Value counters;

  llvm::SmallVector<mlir::Value> mapped(mlir::ValueRange values) const;
};

/// Builds the functions of one graph's scheduled program. Schedulers
/// derive from it and add the per-worker loop.
class GraphProgramBuilder {
public:
  GraphProgramBuilder(GraphOp graph, llvm::StringRef schedule,
                      int64_t workers);

  GraphOp getGraph() { return graph; }
  llvm::ArrayRef<TaskOp> getTasks() { return tasks; }

  /// Creates `@<graph><suffix>` with the graph's arguments (plus the counter
  /// buffer when `withCounters`) and the attributes `event.graph`,
  /// `event.schedule` and `event.workers`, clones the graph's index
  /// computations into it and lays out the event tensors one after another,
  /// row-major, from counter 0.
  ScheduledFunction createFunction(mlir::OpBuilder &builder,
                                   llvm::StringRef suffix, bool withCounters,
                                   mlir::TypeRange results);

  /// Writes every event counter's expected count: the event's `count`, or
  /// the number of notifies counted by evaluating every notifying tile's map.
  void initEventCounters(mlir::OpBuilder &b, ScheduledFunction &function);

  /// Clones the body of `task` for tile `tile` at `b`.
  void cloneBody(mlir::OpBuilder &b, ScheduledFunction &function, TaskOp task,
                 mlir::ValueRange tile);

  /// True when some counter in `[begin, end)` is not zero (plain loads: the
  /// check runs after every worker has finished).
  mlir::Value anyNonZero(mlir::OpBuilder &b, mlir::Location loc,
                         ScheduledFunction &function, mlir::Value begin,
                         mlir::Value end);

  /// The names of the functions every scheduler emits for `graph`.
  static llvm::SmallVector<std::string> functionNames(GraphOp graph);

  /// Status codes `@g_check` returns.
  enum CheckStatus : int32_t { kClean = 0, kQueueOverflow = 1, kUnbalanced = 2 };

protected:
  GraphOp graph;
  std::string schedule;
  int64_t workers;
  llvm::SmallVector<TaskOp> tasks;
};

/// Inserts the static schedule of `graph` (the functions
/// `event-static-schedule` documents, round-robin policy) at `builder`,
/// leaving the graph itself in place. The graph must have passed
/// `checkSchedule`.
void buildStaticSchedule(mlir::OpBuilder &builder, GraphOp graph,
                         int64_t workers);

/// Fails with an error when a function name the schedulers need for a graph
/// of `module` is taken; `pass` names the pass in the message.
mlir::LogicalResult checkScheduleSymbolsFree(mlir::ModuleOp module,
                                             llvm::StringRef pass);

} // namespace etc::event

#endif // ETC_EVENT_TRANSFORMS_SCHEDULEUTILS_H
