"""Property test of `event-infer-dependencies` on random graphs built with etc.Graph.

Random chains, fan-in and fan-out of the operators (with random static
shapes, tiles and `out=` buffer reuse) are built to L1, the pass is run in
process, and the resulting L2 graph is checked tile by tile at the concrete
shapes:

* balance: every event element a tile waits on receives exactly its
  expected count of notifies (otherwise a waiter could run early, or hang);
* read after write, directly: every consumer tile waits on an event element
  notified by every producer tile that last wrote an element of its read box;
* every hazard (read after write, write after read, write after write)
  between two tiles of different tasks whose boxes intersect is ordered by
  the event edges, possibly transitively;
* over-synchronisation: the share of waited producer tiles whose boxes do
  not intersect the consumer's, printed per example and in total.

Footprints and index maps are read back from the IR attributes.
"""

import itertools
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlir import ir
from mlir.passmanager import PassManager

import etc

PIPELINE = "builtin.module(event.graph(event-infer-dependencies))"

#: Over-synchronisation totals over every checked graph: [non-intersecting, waited].
OVERSYNC = [0, 0]


def infer(module: ir.Module) -> None:
    """Runs the dependency inference in process."""
    PassManager.parse(PIPELINE).run(module.operation)
    assert module.operation.verify()


# ----------------------------------------------------------------------
# Reading the IR back
# ----------------------------------------------------------------------


def eval_affine(expr, dims, syms=()) -> int:
    if isinstance(expr, ir.AffineDimExpr):
        return dims[expr.position]
    if isinstance(expr, ir.AffineSymbolExpr):
        return syms[expr.position]
    if isinstance(expr, ir.AffineConstantExpr):
        return expr.value
    lhs, rhs = eval_affine(expr.lhs, dims, syms), eval_affine(expr.rhs, dims, syms)
    if isinstance(expr, ir.AffineAddExpr):
        return lhs + rhs
    if isinstance(expr, ir.AffineMulExpr):
        return lhs * rhs
    if isinstance(expr, ir.AffineModExpr):
        return lhs % rhs
    if isinstance(expr, ir.AffineFloorDivExpr):
        return lhs // rhs
    if isinstance(expr, ir.AffineCeilDivExpr):
        return -(-lhs // rhs)
    raise AssertionError(f"unknown affine expression {expr}")


def parse_map(text: str) -> ir.AffineMap:
    return ir.AffineMapAttr(ir.Attribute.parse(f"affine_map<{text}>")).value


def parse_footprint(attr):
    """(offsets map, sizes with None for '?') of a #event.box attribute."""
    m = re.fullmatch(r"#event\.box<(.*) \[([^\]]*)\]>", str(attr))
    assert m, f"cannot read footprint {attr}"
    sizes = [None if s.strip() == "?" else int(s) for s in m.group(2).split(",")]
    return parse_map(m.group(1)), sizes


def parse_index_map(attr) -> ir.AffineMap:
    m = re.fullmatch(r"#event\.map<(.*?)( indirect \[.*\])?>", str(attr))
    assert m, f"cannot read index map {attr}"
    assert not m.group(2), f"random dense graphs need no indirect maps, got {attr}"
    return parse_map(m.group(1))


class IndexEvaluator:
    """Evaluates `index` SSA values of a graph body at concrete symbol values."""

    BINARY = {
        "arith.addi": lambda a, b: a + b,
        "arith.subi": lambda a, b: a - b,
        "arith.muli": lambda a, b: a * b,
        "arith.divui": lambda a, b: a // b,
        "arith.divsi": lambda a, b: int(a / b),
        "arith.floordivsi": lambda a, b: a // b,
        "arith.ceildivui": lambda a, b: -(-a // b),
        "arith.ceildivsi": lambda a, b: -(-a // b),
        "arith.remui": lambda a, b: a % b,
        "arith.maxsi": max, "arith.maxui": max, "arith.minsi": min, "arith.minui": min,
    }

    def __init__(self, symbol_args: dict):
        self.symbol_args = symbol_args  # graph arg number -> value

    def __call__(self, value) -> int:
        if isinstance(value, ir.BlockArgument):
            return self.symbol_args[value.arg_number]
        op = value.owner.operation
        name = op.name
        if name == "arith.constant":
            return ir.IntegerAttr(op.attributes["value"]).value
        if name == "affine.apply":
            amap = ir.AffineMapAttr(op.attributes["map"]).value
            vals = [self(v) for v in op.operands]
            dims, syms = vals[:amap.n_dims], vals[amap.n_dims:]
            (result,) = [eval_affine(r, dims, syms) for r in amap.results]
            return result
        if name in ("affine.max", "affine.min"):
            amap = ir.AffineMapAttr(op.attributes["map"]).value
            vals = [self(v) for v in op.operands]
            dims, syms = vals[:amap.n_dims], vals[amap.n_dims:]
            results = [eval_affine(r, dims, syms) for r in amap.results]
            return max(results) if name == "affine.max" else min(results)
        if name in self.BINARY:
            a, b = (self(v) for v in op.operands)
            return self.BINARY[name](a, b)
        raise AssertionError(f"cannot evaluate index value defined by {name}")


def clip_box(offsets: ir.AffineMap, sizes, tile, shape):
    box = []
    for expr, size, dim in zip(offsets.results, sizes, shape):
        lo = eval_affine(expr, tile)
        hi = dim if size is None else lo + size
        if size is None:
            assert lo == 0, "a whole-dimension footprint must have offset 0"
        box.append((max(lo, 0), min(hi, dim)))
    return tuple(box)


def boxes_meet(a, b) -> bool:
    return all(max(lo1, lo2) < min(hi1, hi2) for (lo1, hi1), (lo2, hi2) in zip(a, b))


def box_slices(box):
    return tuple(slice(lo, hi) for lo, hi in box)


def event_shape(value, evaluate) -> tuple:
    """The concrete shape of an event tensor made by event.alloc."""
    alloc = value.owner.operation
    assert alloc.name == "event.alloc", f"events come from event.alloc, found {alloc.name}"
    m = re.fullmatch(r"!event\.tensor<(.*)>", str(value.type))
    dims = [d for d in m.group(1).split("x")] if m.group(1) else []
    segments = list(ir.DenseI32ArrayAttr(alloc.attributes["operandSegmentSizes"]))
    dynamic = [evaluate(v) for v in list(alloc.operands)[:segments[0]]]
    count = evaluate(alloc.operands[segments[0]]) if segments[1] else None
    shape = []
    for d in dims:
        shape.append(dynamic.pop(0) if d == "?" else int(d))
    return tuple(shape), count


# ----------------------------------------------------------------------
# The check
# ----------------------------------------------------------------------


def check_l2(g: etc.Graph, module: ir.Module, symbols: dict, label: str = "") -> tuple:
    """Checks the L2 module of `g` at the symbol values `symbols`; returns
    (non-intersecting waited producer tiles, waited producer tiles)."""
    args = g.arguments
    graph_op = module.body.operations[0]
    block = graph_op.regions[0].blocks[0]
    symbol_args = {i: symbols[a.name] for i, a in enumerate(args) if a.kind == "symbol"}
    evaluate = IndexEvaluator(symbol_args)
    buffer_shape = {i: tuple(symbols[d] if isinstance(d, str) else d for d in a.shape)
                    for i, a in enumerate(args) if a.kind != "symbol"}

    # Every tile of every task, in global order: its boxes and events.
    tiles = []      # (task index, task name, tile, reads, writes, waits, notifies)
    events = {}     # event value -> (shape, count)
    task_names = []
    for op in block.operations:
        if op.operation.name != "event.task":
            continue
        t_index = len(task_names)
        name = ir.StringAttr(op.attributes["name"]).value
        task_names.append(name)
        grid = [evaluate(v) for v in op.grid]
        reads = [(v.arg_number, *parse_footprint(f))
                 for v, f in zip(op.reads, op.attributes["read_footprints"])]
        writes = [(v.arg_number, *parse_footprint(f))
                  for v, f in zip(op.writes, op.attributes["write_footprints"])]
        waits = [(v, parse_index_map(m)) for v, m in zip(op.waits, op.attributes["wait_maps"])]
        notifies = [(v, parse_index_map(m))
                    for v, m in zip(op.notifies, op.attributes["notify_maps"])]
        for v, _ in waits + notifies:
            if v not in events:
                events[v] = event_shape(v, evaluate)
        for tile in itertools.product(*(range(n) for n in grid)):
            def element(v, amap):
                coord = tuple(eval_affine(r, tile) for r in amap.results)
                shape = events[v][0]
                assert all(0 <= c < n for c, n in zip(coord, shape)), \
                    f"{label}{name}{tile}: event element {coord} outside {shape}"
                return (v, coord)
            tiles.append((
                t_index, name, tile,
                [(b, clip_box(o, s, tile, buffer_shape[b])) for b, o, s in reads],
                [(b, clip_box(o, s, tile, buffer_shape[b])) for b, o, s in writes],
                {element(v, m) for v, m in waits},
                [element(v, m) for v, m in notifies]))

    # Balance: each waited element gets exactly its expected count.
    notifiers = {}
    for tid, (_, _, _, _, _, _, notifies) in enumerate(tiles):
        for el in notifies:
            notifiers.setdefault(el, []).append(tid)
    preds = []
    for tid, (t_index, name, tile, _, _, waits, _) in enumerate(tiles):
        pred = set()
        for el in waits:
            count = events[el[0]][1]
            got = len(notifiers.get(el, []))
            assert count is None or count == got, \
                f"{label}{name}{tile} waits on element {el[1]} whose count is {count} but " \
                f"{got} tiles notify it"
            for p in notifiers.get(el, []):
                assert tiles[p][0] < t_index, \
                    f"{label}{name}{tile} waits on {tiles[p][1]}{tiles[p][2]}, which is " \
                    f"not an earlier task"
                pred.add(p)
        preds.append(pred)

    # Read after write, directly, against the element-wise last writer.
    last_writer = {b: np.full(shape, -1, dtype=np.int64) for b, shape in buffer_shape.items()}
    by_task = {}
    for tid, t in enumerate(tiles):
        by_task.setdefault(t[0], []).append(tid)
    for t_index in sorted(by_task):
        for tid in by_task[t_index]:
            _, name, tile, reads, _, _, _ = tiles[tid]
            for b, box in reads:
                writers = np.unique(last_writer[b][box_slices(box)])
                for p in writers[writers >= 0]:
                    assert int(p) in preds[tid], \
                        f"{label}{name}{tile} reads {args[b].name}{list(box)} written by " \
                        f"{tiles[p][1]}{tiles[p][2]} but does not wait on it"
        for tid in by_task[t_index]:
            for b, box in tiles[tid][4]:
                last_writer[b][box_slices(box)] = tid

    # Every hazard between intersecting tiles is ordered (transitively).
    reach = []
    for tid in range(len(tiles)):
        bits = 0
        for p in preds[tid]:
            bits |= reach[p] | (1 << p)
        reach.append(bits)

    def hazard(a, b) -> bool:
        """Whether tile a (earlier task) and tile b conflict on some buffer."""
        _, _, _, ra, wa, _, _ = tiles[a]
        _, _, _, rb, wb, _, _ = tiles[b]
        for xs, ys in ((wa, rb), (wa, wb), (ra, wb)):
            for bx, boxx in xs:
                for by, boxy in ys:
                    if bx == by and boxes_meet(boxx, boxy):
                        return True
        return False

    for b_tid, tb in enumerate(tiles):
        for a_tid in range(b_tid):
            if tiles[a_tid][0] == tb[0] or not hazard(a_tid, b_tid):
                continue
            assert reach[b_tid] >> a_tid & 1, \
                f"{label}{tb[1]}{tb[2]} conflicts with {tiles[a_tid][1]}{tiles[a_tid][2]} " \
                f"but is not ordered after it"

    # Over-synchronisation.
    waited = sum(len(p) for p in preds)
    useless = sum(1 for tid, pred in enumerate(preds) for p in pred if not hazard(p, tid))
    return useless, waited


def report(label: str, useless: int, waited: int) -> None:
    OVERSYNC[0] += useless
    OVERSYNC[1] += waited
    ratio = useless / waited if waited else 0.0
    print(f"{label}: over-synchronisation {useless}/{waited} = {ratio:.3f} "
          f"(running total {OVERSYNC[0]}/{OVERSYNC[1]})")


# ----------------------------------------------------------------------
# Random graphs
# ----------------------------------------------------------------------

WIDTHS = st.sampled_from([1, 3, 8, 16, 24, 33, 40])
TILE = st.sampled_from([3, 4, 8, 16, 32, 64])


def random_graph(data) -> tuple:
    """Draws a random graph; returns (graph, {symbol: value})."""
    g = etc.Graph("rand")
    rows_value = data.draw(st.integers(1, 40), label="rows")
    symbolic = data.draw(st.booleans(), label="symbolic rows")
    rows = g.symbol("M") if symbolic else rows_value
    symbols = {"M": rows_value} if symbolic else {}
    counter = itertools.count()
    pool2 = [g.input("x", (rows, data.draw(WIDTHS, label="K0")))]
    pool1 = []
    scratch = []
    produced = []

    def maybe_tile(rank):
        if data.draw(st.booleans(), label="default tile"):
            return None
        return tuple(data.draw(TILE, label="tile") for _ in range(rank))

    def out_for(shape, operands):
        if not data.draw(st.integers(0, 3), label="reuse") == 0:
            return None
        for s in scratch:
            if s.shape == shape and all(s is not o for o in operands):
                return s
        s = g.tensor(f"s{next(counter)}", shape)
        scratch.append(s)
        return s

    for _ in range(data.draw(st.integers(1, 6), label="ops")):
        kind = data.draw(st.sampled_from(
            ["matmul", "unary", "binary", "bcast", "rmsnorm", "softmax", "sum", "unary1"]),
            label="kind")
        if kind == "unary1" and not pool1:
            kind = "sum"
        if kind == "matmul":
            a = data.draw(st.sampled_from(pool2), label="a")
            n = data.draw(WIDTHS, label="N")
            transpose = data.draw(st.booleans(), label="transpose_b")
            k = a.shape[1]
            w = g.input(f"w{next(counter)}", (n, k) if transpose else (k, n))
            shape, operands = (a.shape[0], n), [a, w]
            r = g.matmul(a, w, transpose_b=transpose, tile=maybe_tile(2),
                         out=out_for(shape, operands))
        elif kind in ("unary", "unary1"):
            x = data.draw(st.sampled_from(pool2 if kind == "unary" else pool1), label="x")
            op = data.draw(st.sampled_from(["silu", "gelu", "exp", "scale"]), label="op")
            out = out_for(x.shape, [x])
            if op == "scale":
                r = g.scale(x, 0.5, tile=maybe_tile(x.rank), out=out)
            else:
                r = getattr(g, op)(x, tile=maybe_tile(x.rank), out=out)
        elif kind == "binary":
            a = data.draw(st.sampled_from(pool2 + pool1), label="a")
            same = [t for t in pool2 + pool1 if t.shape == a.shape]
            b = data.draw(st.sampled_from(same), label="b")
            op = data.draw(st.sampled_from(["add", "mul"]), label="op")
            r = getattr(g, op)(a, b, tile=maybe_tile(a.rank), out=out_for(a.shape, [a, b]))
        elif kind == "bcast":
            a = data.draw(st.sampled_from(pool2), label="a")
            bias = g.input(f"b{next(counter)}", (a.shape[1],))
            first = data.draw(st.booleans(), label="bias first")
            operands = (bias, a) if first else (a, bias)
            r = g.add(*operands, tile=maybe_tile(2), out=out_for(a.shape, [a, bias]))
        else:
            x = data.draw(st.sampled_from(pool2), label="x")
            tile = None if data.draw(st.booleans()) else (data.draw(TILE, label="rows tile"),)
            if kind == "rmsnorm":
                w = g.input(f"g{next(counter)}", (x.shape[1],))
                r = g.rmsnorm(x, w, 1e-6, tile=tile, out=out_for(x.shape, [x, w]))
            elif kind == "softmax":
                r = g.softmax(x, tile=tile, out=out_for(x.shape, [x]))
            else:
                r = g.sum(x, tile=tile, out=out_for(x.shape[:1], [x]))
        (pool1 if r.rank == 1 else pool2).append(r)
        if all(r is not p for p in produced):
            produced.append(r)

    outputs = [produced[-1]] + [t for t in produced[:-1]
                                if data.draw(st.booleans(), label="output")]
    g.output(*outputs)
    return g, symbols


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_graphs_are_synchronised(data):
    g, symbols = random_graph(data)
    with ir.Context() as ctx:
        module = g.build(ctx)
        infer(module)
        useless, waited = check_l2(g, module, symbols)
    report(f"{g!r} at {symbols}", useless, waited)


def mlp(tile=None):
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 64))
    w1 = g.input("w1", (64, 96))
    w2 = g.input("w2", (96, 64))
    h = g.matmul(x, w1, tile=tile)
    y = g.add(g.matmul(g.silu(h), w2), x)
    g.output(g.rmsnorm(y, g.input("gain", (64,)), 1e-6))
    return g


@pytest.mark.parametrize("tile", [None, (16, 32)])
def test_mlp_one_inference_many_batch_sizes(tile):
    """One L2 graph with a symbolic batch is correct at every batch size."""
    g = mlp(tile)
    with ir.Context() as ctx:
        module = g.build(ctx)
        infer(module)
        for batch in (1, 31, 32, 33, 70):
            report(f"mlp tile={tile} B={batch}", *check_l2(g, module, {"B": batch}))


# ----------------------------------------------------------------------
# The checker itself, on hand-made L2 graphs (runs without the pass)
# ----------------------------------------------------------------------


def barrier_l2(g: etc.Graph, drop_wait_of: str = None, count_delta: int = 0) -> str:
    """L2 text for `g` (static shapes) with one single-element event per
    pair of tasks that share a buffer and one of which writes it: a full
    barrier between them. Optionally drops one task's waits, or miscounts."""
    text = g.to_mlir()
    lines = text.splitlines()
    headers = [i for i, l in enumerate(lines) if l.lstrip().startswith("event.task ")]
    info = []
    for i in headers:
        line = lines[i]
        grid = re.search(r"grid\(([^)]*)\)", line).group(1).split(", ")
        reads = set(re.findall(r"reads\((.*?)\) writes", line)[0].split(", %")) if "reads(" in line else set()
        reads = {r.split(" :")[0].lstrip("%") for r in reads}
        writes = {re.search(r"writes\(%(\w+) :", line).group(1)}
        info.append((i, grid, reads, writes))
    values = {}
    for l in lines:
        m = re.match(r"\s+(%\w+) = arith\.constant (\d+) : index", l)
        if m:
            values.setdefault(m.group(1), int(m.group(2)))
    allocs, waits, notifies = [], {i: [] for i in headers}, {i: [] for i in headers}
    for a, (ia, grid_a, ra, wa) in enumerate(info):
        for ib, grid_b, rb, wb in info[a + 1:]:
            if not (wa & (rb | wb) or ra & wb):
                continue
            e = f"%ev{len(allocs)}"
            count = int(np.prod([values[v] for v in grid_a])) + count_delta
            allocs.append(f"    {e}_n = arith.constant {count} : index")
            allocs.append(f"    {e} = event.alloc() count({e}_n) : !event.tensor<1>")
            dims_a = ", ".join(f"d{k}" for k in range(len(grid_a)))
            dims_b = ", ".join(f"d{k}" for k in range(len(grid_b)))
            notifies[ia].append(f"{e} : !event.tensor<1> ({dims_a}) -> (0)")
            if drop_wait_of is None or f'"{drop_wait_of}"' not in lines[ib]:
                waits[ib].append(f"{e} : !event.tensor<1> ({dims_b}) -> (0)")
    for i in headers:
        clauses = ""
        if waits[i]:
            clauses += f" waits({', '.join(waits[i])})"
        if notifies[i]:
            clauses += f" notifies({', '.join(notifies[i])})"
        assert lines[i].endswith(" {")
        lines[i] = lines[i][:-2] + clauses + " {"
    graph_line = [i for i, l in enumerate(lines) if "event.graph @" in l][0]
    lines[graph_line + 1:graph_line + 1] = allocs
    return "\n".join(lines)


def static_chain():
    g = etc.Graph("chain")
    x = g.input("x", (40, 24))
    w = g.input("w", (24, 33))
    t = g.tensor("t", (40, 33))
    h = g.matmul(x, w, tile=(16, 8))
    g.silu(h, out=t)
    s = g.sum(t, tile=(8,))
    g.exp(h, out=t)           # write after read of t
    g.output(g.add(s, g.sum(t)))
    return g


def test_checker_accepts_barriers_and_measures_oversync():
    g = static_chain()
    with ir.Context():
        module = ir.Module.parse(barrier_l2(g))
        assert module.operation.verify()
        useless, waited = check_l2(g, module, {})
    assert waited > 0 and 0 < useless < waited  # barriers wait on far-away tiles too
    report("barrier chain", useless, waited)


@pytest.mark.parametrize("drop", ["silu_0", "sum_0", "exp_0", "add_0"])
def test_checker_rejects_a_missing_wait(drop):
    g = static_chain()
    with ir.Context():
        module = ir.Module.parse(barrier_l2(g, drop_wait_of=drop))
        with pytest.raises(AssertionError, match=drop):
            check_l2(g, module, {})


def test_checker_rejects_a_wrong_count():
    g = static_chain()
    with ir.Context():
        module = ir.Module.parse(barrier_l2(g, count_delta=-1))
        with pytest.raises(AssertionError, match=r"count is \d+ but \d+ tiles notify it"):
            check_l2(g, module, {})
