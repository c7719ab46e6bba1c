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

    ```mlir
    !event.tensor<?x8>   // one counter per (row block, column block)
    !event.tensor<>      // a single counter
    ```
  }];
  let parameters = (ins ArrayRefParameter<"int64_t", "dimension sizes">:$shape);
  let hasCustomAssemblyFormat = 1;
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
