//===- EventTypes.td - Types of the event dialect ---------*- tablegen -*-===//

#ifndef ETC_EVENT_TYPES_TD
#define ETC_EVENT_TYPES_TD

include "Event/IR/EventBase.td"
include "mlir/IR/BuiltinTypeInterfaces.td"

def Event_TensorType : TypeDef<Event_Dialect, "EventTensor"> {
  let mnemonic = "tensor";
  let summary = "An N-d array of 32-bit event counters";
  let description = [{
    An event tensor is an N-d array of 32-bit counters. Each dimension is
    static or dynamic (`?`); dynamic sizes are supplied by `event.alloc`.
    A rank-0 event tensor is a single counter.

    A `symmetric` event tensor lives on every rank of a graph that runs on
    several devices (`event.ranks`), at the same place in each rank's
    counters, so that a tile on one rank can notify an element of another
    rank's copy (`event.remote_notify`, a notify map whose first result is
    the rank). Waits are always on the waiting rank's own copy.

    ```mlir
    !event.tensor<?x8>   // one counter per (row block, column block)
    !event.tensor<>      // a single counter
    !event.tensor<?, symmetric>   // one per row block, on every rank
    ```
  }];
  let parameters = (ins ArrayRefParameter<"int64_t", "dimension sizes">:$shape,
                        DefaultValuedParameter<"bool", "false", "on every rank">:$symmetric);
  let hasCustomAssemblyFormat = 1;
  let builders = [
    TypeBuilder<(ins "::llvm::ArrayRef<int64_t>":$shape), [{
      return $_get($_ctxt, shape, false);
    }]>,
  ];
  let extraClassDeclaration = [{
    int64_t getRank() const { return getShape().size(); }
    bool isDynamicDim(unsigned dim) const {
      return ::mlir::ShapedType::isDynamic(getShape()[dim]);
    }
    /// Number of `?` dimensions, i.e. of sizes `event.alloc` must supply.
    unsigned getNumDynamicDims() const;
    /// Number of counters, or std::nullopt when a dimension is dynamic.
    std::optional<int64_t> getNumElements() const;
  }];
}

#endif // ETC_EVENT_TYPES_TD
