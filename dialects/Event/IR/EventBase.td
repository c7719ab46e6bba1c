//===- EventBase.td - The event dialect definition --------*- tablegen -*-===//
//
// The `event` dialect: tile tasks connected by event tensors.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_EVENT_BASE_TD
#define ETC_EVENT_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Event_Dialect : Dialect {
  let name = "event";
  let cppNamespace = "::etc::event";
  let summary = "Tile tasks connected by symbolically shaped event tensors";
  let description = [{
    The `event` dialect describes a computation as a graph of *tasks*. A task
    is a grid of tile tasks: one instance of its body runs for every point of
    its (possibly symbolic) grid and computes one output tile. Dependencies
    between tile tasks are *event tensors*: N-d arrays of 32-bit counters.
    Each counter starts at its expected count, every `notify` decrements it
    with release semantics, and a `wait` returns once it reaches zero, with
    acquire semantics.

    The dialect spans three levels:
    * L1, the task graph: `event.graph` holding `event.task`s that declare the
      tiles of each buffer they read and write (access footprints);
    * L2, the event graph: dependency inference adds `event.alloc`ed event
      tensors and a wait/notify map on each task, affine in the tile indices
      or indirect through a runtime index buffer;
    * L3, the persistent program: scheduling turns the graph into one worker
      function using the imperative `event.wait` / `event.notify` ops.
  }];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerTypesAndAttributes();
  }];
  let dependentDialects = [
    "::mlir::affine::AffineDialect",
    "::mlir::arith::ArithDialect",
    "::mlir::memref::MemRefDialect",
  ];
}

class Event_Op<string mnemonic, list<Trait> traits = []>
    : Op<Event_Dialect, mnemonic, traits>;

#endif // ETC_EVENT_BASE_TD
