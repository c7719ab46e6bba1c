"""The MLIR builder of `etc.Graph`: a graph's record as an L1 `event.graph`.

`build_module(graph, target)` walks what a `Graph` recorded (symbols,
buffers, operator calls) and emits the L1 module through the upstream
`mlir` bindings and the generated `event` op classes. The builder gives each
operator family of `etc.ops` the interface it builds its tasks with
(`etc.ops.base.TaskBuilder`: grid extents, `emit_task`, the buffers'
values, explicit events between families) and emits every distinct tile
kernel once.

Conventions the rest of the compiler relies on:

* graph arguments: one `index` per symbol (creation order), the inputs
  (creation order), the state buffers (`state()`, creation order), the
  outputs (`output()` order), then every other buffer (operator results that
  are not outputs, and `tensor()` scratch buffers) in creation order, marked
  with the unit attribute `event.intermediate` (and `event.symmetric` for
  the buffers other ranks put into);
* one task per operator, named `<op>_<k>` (`matmul_0`, `add_1`, ...), in call
  order, except `moe`, which lowers to five tasks `moe_<k>_router`, `_route`,
  `_up`, `_down` and `_combine` plus explicit events for the accesses whose
  rows depend on routing data (see docs/moe.md);
* every distinct tile computation is one private `func.func` with the unit
  attribute `event.tile`, named `<graph>_tile_<kernel>_<n>`, taking the
  buffers it touches and then the tile indices; a task body is one
  `func.call` of it, so identical layers share their tile functions (see
  `etc.ops.base` for how tile bodies use lanes and dtypes).
"""

from __future__ import annotations

from typing import Optional, Sequence

from mlir import ir
from mlir.dialects import affine, arith, func

from . import ops, packed
from .dialects import event
from .graph_values import CeilDiv, Dim, Operation, Tensor
from .ops.base import element_type
from .ops.collective import arrival_waits

__all__ = ["GraphBuilder", "build_module"]


def build_module(graph, target: ops.Target) -> ir.Module:
    """The L1 module of `graph` (an `etc.Graph`), with the tile kernels
    for `target`, in the current context and location; unverified."""
    return GraphBuilder(graph, target).build()


class GraphBuilder:
    """Builds the L1 module of one graph in the current context: the graph's
    tasks, and each distinct tile kernel once as a private function that
    the task bodies call. The operator families see it as their
    `etc.ops.base.TaskBuilder`."""

    def __init__(self, graph, target: ops.Target):
        self.g = graph
        self.target = target
        self.index = ir.IndexType.get()
        self.buffers: dict[int, ir.Value] = {}  # id(Tensor) -> block argument
        self.symbols: dict[str, ir.Value] = {}  # symbol name -> block argument
        self.grid_cache: dict = {}
        self.module: Optional[ir.Module] = None
        self.graph_op = None
        # Kernel key -> its function, and how many functions each stem has.
        self.kernels: dict[tuple, func.FuncOp] = {}
        self.stems: dict[str, int] = {}
        # Explicit events an operator's tasks leave for a later operator's
        # (e.g. when attention layers share a scratch buffer), by key.
        self.events: dict = {}

    def memref_type(self, t: Tensor) -> ir.MemRefType:
        """A tensor's buffer type: its shape and element type, or for a
        packed weight (a format of `etc.packed`) its blocks as bytes,
        (..., bytes per row) of i8."""
        dyn = ir.ShapedType.get_dynamic_size()
        if packed.is_packed(t.dtype):
            shape = packed.storage_shape(t.shape, t.dtype)
            return ir.MemRefType.get([d if isinstance(d, int) else dyn for d in shape],
                                     ir.IntegerType.get_signless(8))
        return ir.MemRefType.get([d if isinstance(d, int) else dyn for d in t.shape],
                                 element_type(t.dtype))

    def build(self) -> ir.Module:
        g = self.g
        self.module = module = ir.Module.create()
        types, attrs, locs, owners = [], [], [], []
        for name in g.symbols:
            types.append(self.index)
            attrs.append(ir.DictAttr.get({}))
            locs.append(ir.Location.name(name))
            owners.append(("symbol", name))
        for kind, t in g.argument_tensors():
            types.append(self.memref_type(t))
            marks = {}
            if kind == "intermediate":
                marks["event.intermediate"] = ir.UnitAttr.get()
                if g.is_symmetric(t):
                    marks["event.symmetric"] = ir.UnitAttr.get()
            attrs.append(ir.DictAttr.get(marks))
            locs.append(ir.Location.name(t.name))
            owners.append(("tensor", t))
        with ir.InsertionPoint(module.body):
            self.graph_op = event.GraphOp(g.name, ir.TypeAttr.get(ir.FunctionType.get(types, [])),
                                          arg_attrs=ir.ArrayAttr.get(attrs))
            if g.ranks > 1:
                self.graph_op.attributes["event.ranks"] = ir.IntegerAttr.get(
                    ir.IntegerType.get_signless(64), g.ranks)
        block = self.graph_op.body.blocks.append(*types, arg_locs=locs)
        for (what, owner), arg in zip(owners, block.arguments):
            if what == "symbol":
                self.symbols[owner] = arg
            else:
                self.buffers[id(owner)] = arg
        with ir.InsertionPoint(block):
            for op in g.operations:
                ops.family(op.kind).build_tasks(self, op)
            event.YieldOp()
        return module

    # -- grid ----------------------------------------------------------

    def grid_extent(self, dim: Dim, tile: int, scale: int = 1) -> ir.Value:
        """ceil(dim / tile) (times `scale`), as a constant or an
        affine.apply of the symbol."""
        if isinstance(dim, CeilDiv):  # ceil(ceil(s / d) / t) = ceil(s / (d t))
            return self.grid_extent(dim.symbol, dim.divisor * tile, scale)
        if isinstance(dim, int):
            key = ("static", -(-dim // tile) * scale)
        else:
            key = ("symbol", dim.name, tile, scale)
        if key not in self.grid_cache:
            if key[0] == "static":
                self.grid_cache[key] = arith.constant(self.index, key[1])
            else:
                expr = ir.AffineExpr.get_ceil_div(ir.AffineSymbolExpr.get(0),
                                                  ir.AffineConstantExpr.get(tile))
                if scale != 1:
                    expr = ir.AffineExpr.get_mul(expr, ir.AffineConstantExpr.get(scale))
                amap = ir.AffineMap.get(0, 1, [expr])
                self.grid_cache[key] = affine.apply(amap, [self.symbols[dim.name]])
        return self.grid_cache[key]

    # -- tasks ---------------------------------------------------------

    def emit_task(self, op: Operation, name: str, grid: list, reads: list, writes: list,
                  kernel: type, waits: Sequence = (), notifies: Sequence = (),
                  indices: Sequence[Tensor] = (), live: Sequence = ()) -> None:
        """One `event.task` whose body calls `kernel`'s function: footprints as
        (tensor, box) pairs, explicit events as (event value, map) pairs,
        live bounds as `#event.live` attributes over `indices`."""
        # Drop repeated identical reads (e.g. add(x, x)).
        unique_reads = []
        for t, fp in reads:
            if not any(u is t and str(f) == str(fp) for u, f in unique_reads):
                unique_reads.append((t, fp))
        # Rows another rank puts here (all_gather) are waited for.
        waits = [*arrival_waits(self, unique_reads), *waits]
        task = event.TaskOp(
            name, grid,
            [self.buffers[id(t)] for t, _ in unique_reads],
            [self.buffers[id(t)] for t, _ in writes],
            [e for e, _ in waits], [e for e, _ in notifies],
            [self.buffers[id(t)] for t in indices],
            ir.ArrayAttr.get([fp for _, fp in unique_reads]),
            ir.ArrayAttr.get([fp for _, fp in writes]),
            ir.ArrayAttr.get([m for _, m in waits]),
            ir.ArrayAttr.get([m for _, m in notifies]),
            live_bounds=ir.ArrayAttr.get(list(live)) if live else None)
        names = ["i", "j", "k"][:len(grid)]
        body = task.body.blocks.append(*([self.index] * len(grid)),
                                       arg_locs=[ir.Location.name(n) for n in names])
        tensors = kernel.tensors(op)
        callee = self.kernel_function(op, kernel, tensors)
        with ir.InsertionPoint(body):
            func.CallOp(callee, [self.buffers[id(t)] for t in tensors] + list(body.arguments))
            event.YieldOp()

    def kernel_function(self, op: Operation, kernel: type, tensors: list) -> func.FuncOp:
        """The function of `kernel` for `op`'s tile, created on first use.

        Two tasks share a function when they have the same kernel, operator
        kind, parameters and tile, and buffers of the same types and dtypes
        aliased alike: the function depends on nothing else (it takes its buffers
        and tile indices as arguments), so identical layers share one."""
        types = [self.memref_type(t) for t in tensors]
        # A kernel reads a buffer passed twice (add(x, x)) through its first
        # parameter, so which parameters alias is part of what it computes.
        aliases = tuple(next(j for j, u in enumerate(tensors) if u is t) for t in tensors)
        # The dtypes too: packed formats of equal row bytes share a buffer type.
        key = (kernel, op.kind, tuple(sorted(op.params.items())), op.tile,
               tuple(str(t) for t in types), tuple(t.dtype for t in tensors), aliases)
        if key in self.kernels:
            return self.kernels[key]
        stem = f"{self.g.name}_tile_{kernel.name(op)}"
        number = self.stems.get(stem, 0)
        self.stems[stem] = number + 1
        inputs = types + [self.index] * kernel.grid_rank
        # After the graph, so that the graph stays the module's first op.
        with ir.InsertionPoint(self.module.body):
            function = func.FuncOp(f"{stem}_{number}", ir.FunctionType.get(inputs, []),
                                   visibility="private")
        function.attributes["event.tile"] = ir.UnitAttr.get()
        if (kernel.out_of_line_on_gpu or kernel.inline_on_gpu) and self.target.gpu_kernels \
                and not self.target.simulate_lanes:
            function.attributes["passthrough"] = ir.ArrayAttr.get(
                [ir.StringAttr.get("alwaysinline" if kernel.inline_on_gpu else "noinline")])
        elif self.target.kind == "cpu":
            # A CPU tile stays a call in the worker: inlined, every tile
            # made the worker one function of all the kernel's loops, and
            # LLVM's loop passes are superlinear in the size of the
            # function around a loop. SmolLM2-135M Q4_K_M at -O2: JIT
            # 9.0 s -> 4.9 s, the B = 1 decode unchanged (75 / 78 tok/s;
            # docs/benchmarks.md, "Compile time of a model's step kernel").
            # A tile task's call costs nanoseconds against its microseconds.
            function.attributes["passthrough"] = ir.ArrayAttr.get(
                [ir.StringAttr.get("noinline")])
        entry = function.add_entry_block()
        with ir.InsertionPoint(entry):
            kernel(op, tensors, list(entry.arguments), entry, self.target).emit()
            func.ReturnOp([])
        self.kernels[key] = function
        return function
