//===- EventAttrs.td - Attributes of the event dialect ----*- tablegen -*-===//

#ifndef ETC_EVENT_ATTRS_TD
#define ETC_EVENT_ATTRS_TD

include "Event/IR/EventBase.td"

def Event_FootprintAttr : AttrDef<Event_Dialect, "Footprint"> {
  let mnemonic = "box";
  let summary = "The box of a buffer one tile task reads or writes";
  let description = [{
    An access footprint: the rectangular region of a buffer that the tile
    task at grid point `(d0, ..., dn)` accesses. `offsets` maps the tile
    indices to the first element of the box in each buffer dimension; `sizes`
    gives the extent of the box in each dimension, `?` meaning the whole
    dimension (then the offset must be 0). Boxes are clipped to the buffer,
    so edge tiles of a symbolic dimension are partial. Every `mod`,
    `floordiv` and `ceildiv` divides by a positive constant.

    ```mlir
    // Tile (i, j) of a 32x64 tiling of a ?x512 buffer.
    #event.box<(d0, d1) -> (d0 * 32, d1 * 64) [32, 64]>
    // Row block i, all columns.
    #event.box<(d0, d1) -> (d0 * 32, 0) [32, ?]>
    ```
  }];
  let parameters = (ins "::mlir::AffineMap":$offsets,
                        ArrayRefParameter<"int64_t", "box sizes">:$sizes);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Parses and prints `map [sizes]` without the `#event.box<>` wrapper,
    /// as the `event.task` clauses spell it. The task parser passes
    /// `verify = false`: its verifier checks each footprint and can say
    /// which op and clause holds it.
    static ::mlir::Attribute parseBody(::mlir::AsmParser &parser,
                                       bool verify = true);
    void printBody(::mlir::AsmPrinter &printer) const;
    bool isFullDim(unsigned dim) const {
      return ::mlir::ShapedType::isDynamic(getSizes()[dim]);
    }
  }];
}

def Event_IndexMapAttr : AttrDef<Event_Dialect, "IndexMap"> {
  let mnemonic = "map";
  let summary = "Which event element a tile task waits on or notifies";
  let description = [{
    Maps the tile indices `(d0, ..., dn)` of a task to a coordinate of an
    event tensor. Each result of `map` is either the coordinate itself
    (affine) or, when `indirect` names index buffer `k` of the task for that
    result, the coordinate is loaded from that 1-D runtime buffer at the
    position the result computes (data-dependent dynamism, e.g. the expert a
    token is routed to). `-1` in `indirect` marks an affine result; an empty
    `indirect` list means the whole map is affine. Every `mod`, `floordiv`
    and `ceildiv` divides by a positive constant.

    ```mlir
    #event.map<(d0, d1) -> (d0)>                          // affine
    #event.map<(d0, d1) -> (d0, d1) indirect [0, -1]>  // first coordinate
                                                        // loaded from buffer 0
    ```
  }];
  let parameters = (ins "::mlir::AffineMap":$map,
                        OptionalArrayRefParameter<"int64_t", "index buffer of each result">:$indirect);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let builders = [
    AttrBuilderWithInferredContext<(ins "::mlir::AffineMap":$map), [{
      return $_get(map.getContext(), map, ::llvm::ArrayRef<int64_t>{});
    }]>
  ];
  let extraClassDeclaration = [{
    /// Parses and prints `map indirect [...]` without the `#event.map<>`
    /// wrapper, as the `event.task` clauses spell it (`verify` as for
    /// `FootprintAttr::parseBody`).
    static ::mlir::Attribute parseBody(::mlir::AsmParser &parser,
                                       bool verify = true);
    void printBody(::mlir::AsmPrinter &printer) const;
    /// True when result `result` is loaded from an index buffer.
    bool isIndirect(unsigned result) const {
      return !getIndirect().empty() && getIndirect()[result] >= 0;
    }
    /// True when any result is loaded from an index buffer.
    bool hasIndirect() const;
  }];
}

def Event_LiveAttr : AttrDef<Event_Dialect, "Live"> {
  let mnemonic = "live";
  let summary = "Which tiles of a task run: a bound on one tile index read from data";
  let description = [{
    A *live bound* of a task: tile `(d0, ..., dn)` runs only when its index
    `d<dim>` is below a bound computed from runtime data,

        d<dim> < bound(indices[k][position(d0, ..., dn)])

    where `position` (an index map with one indirect result, `indirect [k]`)
    says which element of the task's index buffer `k` to load, and `bound`
    (an affine map of one dimension, the loaded value) turns it into the
    bound. A task may have several live bounds; a tile runs when it is
    below all of them. A tile that does not run (a *dead* tile) waits on
    nothing, computes nothing and notifies nothing.

    This is how the number of tiles a task runs depends on data without
    recompiling: attention over a KV cache runs `ceildiv(length, C)` chunk
    tiles per request out of a grid sized for the longest request:

    ```mlir
    // tile (r, j) runs when j < ceildiv(lengths[r], 64)
    #event.live<d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0) indirect [0]>
    ```

    The index buffer must hold its values before the run (no task writes
    it), so that the scheduled program decides which tiles run before any
    does: `@g_init` counts only live tiles into the expected counts of the
    events they notify (which therefore have no `count`), the static worker
    skips dead tiles, and the dynamic scheduler never queues them.
    Every `mod`, `floordiv` and `ceildiv` divides by a positive constant.
  }];
  let parameters = (ins "unsigned":$dim,
                        "::mlir::AffineMap":$bound,
                        "::etc::event::IndexMapAttr":$position);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Parses and prints `dN below <bound> of <position>` without the
    /// `#event.live<>` wrapper, as the `event.task` `live(...)` clause
    /// spells it (`verify` as for `FootprintAttr::parseBody`).
    static ::mlir::Attribute parseBody(::mlir::AsmParser &parser,
                                       bool verify = true);
    void printBody(::mlir::AsmPrinter &printer) const;
    /// The index buffer the bound's value is loaded from.
    int64_t getIndexBuffer() const { return getPosition().getIndirect()[0]; }
  }];
}

#endif // ETC_EVENT_ATTRS_TD
