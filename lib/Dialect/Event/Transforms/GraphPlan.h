//===- GraphPlan.h - What a scheduled program is built from -----*- C++ -*-===//
//
// How `event-static-schedule` and `event-dynamic-schedule` see a graph. A
// scheduled program is table-driven, so that its code grows with the number
// of distinct kinds of task, not with the number of tasks:
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

#ifndef ETC_LIB_DIALECT_EVENT_TRANSFORMS_GRAPHPLAN_H
#define ETC_LIB_DIALECT_EVENT_TRANSFORMS_GRAPHPLAN_H

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace etc::event {

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

/// Merges the graph's identical pure computations (grid sizes, counts), so
/// that tasks and events that compute the same values share families and
/// classes.
void simplifyGraph(GraphOp graph);

} // namespace etc::event

#endif // ETC_LIB_DIALECT_EVENT_TRANSFORMS_GRAPHPLAN_H
