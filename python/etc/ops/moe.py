"""Mixture-of-Experts with SiLU experts: five tasks and two explicit events.

    router   tile i: tokens [32 i, 32 i + 32): softmax or sigmoid of x @ router_w
             (+ router_b), the top-k experts (by score + selection_bias, among
             the best groups) and their renormalised (by at least norm_min),
             scaled weights
    route    one tile: counts tokens per expert, prefix-sums them into
             `offsets` and lists the (token, choice) pairs by expert in `slots`
    up       tile (e, j): hidden = silu(x @ w1[e]) for the j-th block of
             expert e's slots
    down     tile (e, j): partial = weight * (hidden @ w2[e]) for the same
             slots
    combine  tile t: y[t] = sum over token t's k choices of partial[t, c]

Footprints that tiles can state (row blocks, whole buffers, one expert's
weights) are left to event-infer-dependencies. The slots an expert tile
handles, and so the rows of `hidden` and `partial` it touches, depend on the
routing; those two buffers get no footprints, and their ordering is declared
with two events: `ready[e, j]` (up tile (e, j) -> down tile (e, j), count 1)
and `done[e]` (every down tile of expert e -> each token routed to e,
through an indirect wait per routing choice reading `expert<j>`). Every tile
of the padded (E, ceil(T / m)) grid notifies, empty ones included, so both
counts are known without reading routing data. See docs/moe.md. The up
and down tiles' kernels (packed experts among them) are in moe_experts.py.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, memref, scf

from ..dialects import event
from .base import DEFAULT_ROWS, TaskBuilder, box, index_map, row_block, whole
from .moe_experts import choose_down, choose_up, operand
from .topk import first_pick, select_next
from .variants import PartKernel

KINDS = ("moe",)


class MoeRouter(PartKernel):
    """Scores, top-k experts and their weights of a row block of tokens,
    one token per lane iteration: softmax or sigmoid scores, chosen by
    score (+ selection_bias) among the experts of the best groups
    (n_group, each scored by its two best or its best), weighted by the
    unbiased scores, renormalised (by at least norm_min) and scaled."""

    grid_rank = 1
    part = "router"

    @classmethod
    def tensors(cls, op) -> list:
        x, router_w = op.operands[:2]
        buffers = op.buffers
        given = [t for t in (operand(op, "router_b"), operand(op, "selection_bias"))
                 if t is not None]
        return [x, router_w, buffers["probs"], *buffers["experts"], buffers["weights"], *given]

    def emit(self) -> None:
        op, buffers = self.op, self.op.buffers
        params = op.params
        x, router_w = op.operands[:2]
        router_b = operand(op, "router_b")
        biased = operand(op, "selection_bias") is not None
        sigmoid = params.get("scoring", "softmax") == "sigmoid"
        probs, weights = buffers["probs"], buffers["weights"]
        experts = self.cidx(params["experts"])
        row0, rows = self.row_block(x, DEFAULT_ROWS)
        hidden = self.dim(x, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            t = arith.addi(row0, loop.induction_variable)

            def logit(e):
                total = self.reduce_row(hidden, self.cf32(0.0), lambda acc, h: arith.addf(
                    acc, arith.mulf(self.load(x, [t, h]), self.load(router_w, [h, e]))))
                if router_b is not None:
                    total = arith.addf(total, self.load(router_b, [e]))
                self.store(self.unary("sigmoid", total) if sigmoid else total, probs, [t, e])
            self.for_each_col(experts, logit)
            if not sigmoid:
                mx = self.reduce_row(experts, self.cf32(float("-inf")),
                                     lambda acc, e: arith.maxnumf(acc, self.load(probs, [t, e])))
                denom = self.reduce_row(experts, self.cf32(0.0), lambda acc, e: arith.addf(
                    acc, math.exp(arith.subf(self.load(probs, [t, e]), mx))))
                self.for_each_col(experts, lambda e: self.store(
                    arith.divf(math.exp(arith.subf(self.load(probs, [t, e]), mx)), denom),
                    probs, [t, e]))
            score = self.candidate_score(t)
            previous = first_pick(self)
            chosen = []
            for choice in buffers["experts"]:
                previous = select_next(self, experts, score, previous)[:2]
                self.store_index(previous[1], choice, [t])
                # The weight is the unbiased score, whatever chose the expert
                # (the picked value is it without a selection bias: a chosen
                # expert is never one that the groups masked).
                chosen.append(self.load(probs, [t, previous[1]]) if biased else previous[0])
            total = chosen[0]
            for value in chosen[1:]:
                total = arith.addf(total, value)
            if sigmoid:  # transformers' guard against a zero sum of sigmoids
                total = arith.addf(total, self.cf32(1e-20))
            if "norm_min" in params:  # ERNIE 4.5: divided by at least norm_min
                total = arith.maximumf(total, self.cf32(params["norm_min"]))
            for j, value in enumerate(chosen):
                weight = arith.divf(value, total) if params.get("normalize", True) else value
                if "routed_scale" in params:
                    weight = arith.mulf(weight, self.cf32(params["routed_scale"]))
                self.store(weight, weights, [t, self.cidx(j)])
            scf.yield_([])

    def candidate_score(self, t: ir.Value):
        """The function e -> what token t's experts are ranked by: the score
        probs[t, e] plus selection_bias[e]; with n_group > 1, -inf outside
        the topk_group groups whose two best such values sum highest (or,
        group_score "max", whose best is highest; ranked as experts are:
        ties to the lower group)."""
        op = self.op
        probs = op.buffers["probs"]
        selection_bias = operand(op, "selection_bias")

        def biased(e):
            value = self.load(probs, [t, e])
            return value if selection_bias is None else arith.addf(
                value, self.load(selection_bias, [e]))
        groups = op.params.get("n_group", 1)
        if groups == 1:
            return biased
        size = self.cidx(op.params["experts"] // groups)

        def group_score(g):
            start = arith.muli(g, size)
            end = arith.addi(start, size)
            best = select_next(self, end, biased, first_pick(self), start=start)[:2]
            if op.params.get("group_score") == "max":
                return best[0]
            second = select_next(self, end, biased, best, start=start)[0]
            return arith.addf(best[0], second)
        previous, kept = first_pick(self), []
        for _ in range(op.params["topk_group"]):
            previous = select_next(self, self.cidx(groups), group_score, previous)[:2]
            kept.append(previous[1])

        def masked(e):
            group = arith.divui(e, size)
            inside = arith.cmpi(arith.CmpIPredicate.eq, group, kept[0])
            for g in kept[1:]:
                inside = arith.ori(inside, arith.cmpi(arith.CmpIPredicate.eq, group, g))
            return arith.select(inside, biased(e), self.cf32(float("-inf")))
        return masked


class MoeRoute(PartKernel):
    """One tile (run by lane 0): counts tokens per expert into
    offsets[e + 1], prefix-sums them, then lists every (token, choice) pair
    t * k + j in slots[] grouped by expert, in token order, using offsets[e]
    as the fill cursor and shifting it back afterwards."""

    grid_rank = 1
    part = "route"

    @classmethod
    def tensors(cls, op) -> list:
        buffers = op.buffers
        return [op.operands[0], buffers["offsets"], buffers["slots"], *buffers["experts"]]

    def emit(self) -> None:
        op, buffers = self.op, self.op.buffers
        offsets, slots, choices = buffers["offsets"], buffers["slots"], buffers["experts"]
        k = len(choices)
        experts = op.params["experts"]
        i32 = ir.IntegerType.get_signless(32)
        tokens = self.dim(op.operands[0], 0)
        loop = self.lane_loop(self.cidx(1))
        with ir.InsertionPoint(loop.body):
            self.for_each_col(self.cidx(experts + 1), lambda e: memref.store(
                arith.constant(i32, 0), self.buf(offsets), [e]))

            def count(t):
                for choice in choices:
                    slot = arith.addi(self.load_index(choice, [t]), self.cidx(1))
                    memref.store(arith.addi(self.load(offsets, [slot]), arith.constant(i32, 1)),
                                 self.buf(offsets), [slot])
            self.for_each_col(tokens, count)

            def prefix(e):
                after = arith.addi(e, self.cidx(1))
                memref.store(arith.addi(self.load(offsets, [after]), self.load(offsets, [e])),
                             self.buf(offsets), [after])
            self.for_each_col(self.cidx(experts), prefix)

            def fill(t):
                for j, choice in enumerate(choices):
                    e = self.load_index(choice, [t])
                    position = self.load_index(offsets, [e])
                    pair = arith.addi(arith.muli(t, self.cidx(k)), self.cidx(j))
                    self.store_index(pair, slots, [arith.divui(position, self.cidx(k)),
                                                   arith.remui(position, self.cidx(k))])
                    self.store_index(arith.addi(position, self.cidx(1)), offsets, [e])
            self.for_each_col(tokens, fill)

            def shift(r):
                e = arith.subi(self.cidx(experts), r)
                memref.store(self.load(offsets, [arith.subi(e, self.cidx(1))]),
                             self.buf(offsets), [e])
            self.for_each_col(self.cidx(experts), shift)
            memref.store(arith.constant(i32, 0), self.buf(offsets), [self.cidx(0)])
            scf.yield_([])


class MoeCombine(PartKernel):
    """y[t, :] = sum over the token's k choices of partial[t, c, :]."""

    grid_rank = 1
    part = "combine"

    @classmethod
    def tensors(cls, op) -> list:
        return [op.operands[0], op.buffers["partial"], op.result]

    def emit(self) -> None:
        op = self.op
        partial = op.buffers["partial"]
        t = self.ti[0]
        k = op.params["top_k"]
        loop = self.lane_loop(self.dim(op.operands[0], 1))
        with ir.InsertionPoint(loop.body):
            col = loop.induction_variable
            total = self.reduce_row(self.cidx(k), self.cf32(0.0), lambda acc, c: arith.addf(
                acc, self.load(partial, [t, c, col])))
            self.store(total, op.result, [t, col])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x, router_w, w1, w2 = op.operands[:4]
    buffers = op.buffers
    tokens = x.shape[0]
    experts = op.params["experts"]
    (slots_per_tile,) = op.tile
    choices = buffers["experts"]
    one_expert = box(2, ["d0", "0", "0"], [1, None, None])

    routed = [buffers["probs"], *choices, buffers["weights"]]
    router_biases = [t for t in (operand(op, "router_b"), operand(op, "selection_bias"))
                     if t is not None]
    b.emit_task(op, f"{op.name}_router", [b.grid_extent(tokens, DEFAULT_ROWS)],
                [(x, row_block(1, x)), (router_w, whole(1, router_w)),
                 *[(t, whole(1, t)) for t in router_biases]],
                [(t, row_block(1, t)) for t in routed], MoeRouter)
    b.emit_task(op, f"{op.name}_route", [b.grid_extent(1, 1)],
                [(t, whole(1, t)) for t in choices],
                [(buffers["offsets"], whole(1, buffers["offsets"])),
                 (buffers["slots"], whole(1, buffers["slots"]))], MoeRoute)

    grid = [b.grid_extent(experts, 1), b.grid_extent(tokens, slots_per_tile)]
    one = b.grid_extent(1, 1)
    if isinstance(tokens, int):
        tiles = -(-tokens // slots_per_tile)
        tiles_type, dynamic = ir.Type.parse(f"!event.tensor<{experts}x{tiles}>"), []
    else:
        tiles_type, dynamic = ir.Type.parse(f"!event.tensor<{experts}x?>"), [grid[1]]
    ready = event.AllocOp(tiles_type, dynamic, count=one).result
    routing = [(t, whole(2, t)) for t in (buffers["offsets"], buffers["slots"])]
    tile_map = index_map("(d0, d1) -> (d0, d1)")
    # x rows are read wherever routing sends them: the whole of x, so that a
    # later writer of x still waits for every expert tile.
    one_bias = box(2, ["d0", "0"], [1, None])
    given = lambda roles: [t for t in (operand(op, r) for r in roles) if t is not None]
    b.emit_task(op, f"{op.name}_up", grid,
                [(x, whole(2, x)), (w1, one_expert), *[(w, one_expert) for w in given(["w_up"])],
                 *[(t, one_bias) for t in given(["b1", "b_up"])], *routing], [],
                choose_up(op, b.target),
                notifies=[(ready, tile_map)])
    done = event.AllocOp(ir.Type.parse(f"!event.tensor<{experts}>"), [], count=grid[1]).result
    b.emit_task(op, f"{op.name}_down", grid,
                [(w2, one_expert), *[(t, one_bias) for t in given(["b2"])], *routing,
                 (buffers["weights"], whole(2, buffers["weights"]))],
                [], choose_down(op, b.target), waits=[(ready, tile_map)],
                notifies=[(done, index_map("(d0, d1) -> (d0)"))])
    b.emit_task(op, f"{op.name}_combine", [b.grid_extent(tokens, 1)], [],
                [(op.result, box(1, ["d0", "0"], [1, None]))], MoeCombine,
                waits=[(done, index_map(f"(d0) -> (d0) indirect [{j}]"))
                       for j in range(len(choices))],
                indices=choices)
