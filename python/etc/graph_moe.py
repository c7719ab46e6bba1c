"""The Mixture-of-Experts operator, as a method of `etc.Graph`.

`Graph` inherits `moe` from `MoeOperators`, beside the LLM operators of
`etc.graph_llm` and the collectives of `etc.graph_collective`. The method
checks the layer's operands (experts, biases, routing options) and records
one `Operation` with the internal buffers its five tasks share; the tasks
and the tile kernels are in `etc.ops.moe` and `etc.ops.moe_experts`, the
design in docs/moe.md.
"""

from __future__ import annotations

import math
from typing import Optional

from . import packed
from .graph_values import Tensor, describe, format_shape, same_dim
from .ops.base import DEFAULT_ROWS, INDEX_DTYPE

#: How the router turns logits into the scores it ranks experts by.
SCORINGS = ("softmax", "sigmoid")
#: How an expert group is scored (`n_group` > 1): "top2", the sum of its
#: two best (DeepSeek-V3, GLM-4.5); "max", its best (DeepSeek-V2's
#: group_limited_greedy).
GROUP_SCORES = ("top2", "max")


class MoeOperators:
    """`moe` (mixed into `etc.Graph`)."""

    def moe(self, x: Tensor, router_w: Tensor, w1: Tensor, w2: Tensor, top_k: int, *,
            w_up: Optional[Tensor] = None, normalize: bool = True, transpose_w: bool = False,
            router_b: Optional[Tensor] = None, b1: Optional[Tensor] = None,
            b_up: Optional[Tensor] = None, b2: Optional[Tensor] = None,
            activation: str = "silu", swiglu_limit: Optional[float] = None,
            swiglu_alpha: Optional[float] = None, scoring: str = "softmax",
            selection_bias: Optional[Tensor] = None, routed_scale: float = 1.0,
            n_group: int = 1, topk_group: int = 1, group_score: str = "top2",
            norm_min: float = 0.0,
            tile=None, out: Optional[Tensor] = None, name: Optional[str] = None) -> Tensor:
        """A Mixture-of-Experts layer with SiLU (or, with `w_up`, SwiGLU) experts.

        x is (T, H), router_w (H, E), w1 (E, H, F), w2 (E, F, H), E static.
        Per token: p = softmax(x @ router_w); the `top_k` experts with the
        largest p (equal p: lower expert index first); their p, renormalised
        to sum 1 unless `normalize=False`, as weights;
        y = sum_j weight_j * (act_j @ w2[e_j]) with act_j = silu(x @ w1[e_j]),
        or silu(x @ w1[e_j]) * (x @ w_up[e_j]) with `w_up` (E, H, F) (the
        gated experts of Qwen3-MoE and Mixtral). Result (T, H). `tile=m`
        sets the routed (token, expert) slots per expert tile (default 32).

        With `transpose_w` each expert's matrices are given transposed, as
        rows of their inputs' values (llama.cpp's layout): w1 and w_up
        (E, F, H), w2 (E, H, F). Experts may then be packed weights
        (`input` of a format of `etc.packed`, each its own), read by the
        tiles in their blocks (see docs/operators.md, "Packed weights").

        Biases (gpt-oss), each f32 or x's dtype, never packed: `router_b`
        (E,) is added to the router's logits before the scoring (softmax
        or sigmoid) and top-k;
        `b1` and `b_up` (E, F) to x @ w1[e] and x @ w_up[e] before the
        activation; `b2` (E, H) to act @ w2[e] before the routing weight
        multiplies it. `activation="swiglu_oai"` (gpt-oss's clamped SwiGLU;
        needs `w_up`, `swiglu_limit` > 0 and `swiglu_alpha` > 0): with
        g = min(gate, limit) and u = clamp(up, -limit, limit),
        act = (u + 1) * g * sigmoid(alpha * g).

        Routing options (docs/moe.md): with `scoring="sigmoid"`
        (DeepSeek-V3, GLM-4.5) the scores are p = sigmoid(logits) instead
        of their softmax, renormalised by sum + 1e-20. A `selection_bias`
        ((E,), f32 or x's dtype; either scoring: ERNIE 4.5's with softmax)
        chooses the top_k experts by p + bias; their weights stay the
        unbiased p. With `n_group` > 1 the E experts form n_group groups
        of E / n_group and only the experts of the best `topk_group`
        groups (ties: lower group first) are candidates; a group's score
        is the sum of its two largest biased scores (`group_score="top2"`,
        groups of at least 2, sigmoid scoring only) or its largest
        (`group_score="max"`, DeepSeek-V2's group_limited_greedy, either
        scoring). `norm_min` (>= 0, ERNIE 4.5's `moe_norm_min`; needs
        `normalize`) is the least the sum is divided by when
        renormalising: w_j = p_j / max(sum, norm_min). Every routing weight
        is then multiplied by `routed_scale` (either scoring).
        See docs/moe.md for the lowering.
        """
        kind = "moe"
        self._check_operand(kind, "x", x, ranks=(2,))
        self._check_operand(kind, "router_w", router_w, ranks=(2,))
        self._check_operand(kind, "w1", w1, ranks=(3,), packed_ok=True)
        self._check_operand(kind, "w2", w2, ranks=(3,), packed_ok=True)
        operands = [("x", x), ("router_w", router_w), ("w1", w1), ("w2", w2)]
        if w_up is not None:
            self._check_operand(kind, "w_up", w_up, ranks=(3,), packed_ok=True)
            operands.append(("w_up", w_up))
        for role, t in operands[2:]:
            if packed.is_packed(t.dtype) and not transpose_w:
                raise ValueError(f"{kind}: {describe(role, t)} is a packed weight, stored by "
                                 f"rows of its input's values: packed experts are read "
                                 f"transposed (transpose_w=True: w1 and w_up (E, F, H), "
                                 f"w2 (E, H, F))")
        dtype = self._same_dtype(kind, [(role, t) for role, t in operands
                                        if not packed.is_packed(t.dtype)])
        tokens, hidden = x.shape
        experts = router_w.shape[1]

        def layout(rows, columns) -> tuple:
            return (experts, columns, rows) if transpose_w else (experts, rows, columns)

        def expect(role: str, t: Tensor, expected: tuple, why: str) -> None:
            if len(expected) != t.rank or not all(
                    same_dim(a, b) for a, b in zip(t.shape, expected)):
                raise ValueError(f"{kind}: {describe(role, t)} must have shape "
                                 f"{format_shape(expected)} ({why})")

        expect("router_w", router_w, (hidden, experts),
               f"(H, E) with H = {hidden} from {describe('x', x)}")
        if not isinstance(experts, int):
            raise ValueError(f"{kind}: the expert count E (dimension 1 of "
                             f"{describe('router_w', router_w)}) must be static")
        ffn = w1.shape[1 if transpose_w else 2]
        h_f, f_h = ("(E, F, H)", "(E, H, F)") if transpose_w else ("(E, H, F)", "(E, F, H)")
        expect("w1", w1, layout(hidden, ffn),
               f"{h_f} with E = {experts} from {describe('router_w', router_w)} and "
               f"H = {hidden} from {describe('x', x)}")
        expect("w2", w2, layout(ffn, hidden),
               f"{f_h} with F = {ffn} from {describe('w1', w1)} and H = {hidden}")
        if w_up is not None:
            expect("w_up", w_up, layout(hidden, ffn), f"{h_f}, as {describe('w1', w1)}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
            raise ValueError(f"{kind}: top_k = {top_k!r} is out of range: "
                             f"{describe('router_w', router_w)} has E = {experts} experts; "
                             f"expected an int with 1 <= top_k <= {experts}")
        params = {"top_k": top_k, "experts": experts, "gated": w_up is not None,
                  "normalize": bool(normalize), "transpose_w": bool(transpose_w),
                  **_routing(experts, top_k, normalize, scoring, routed_scale, n_group,
                             topk_group, group_score, norm_min)}
        biases = {"router_b": (router_b, (experts,), "(E,)"), "b1": (b1, (experts, ffn), "(E, F)"),
                  "b_up": (b_up, (experts, ffn), "(E, F)"), "b2": (b2, (experts, hidden), "(E, H)"),
                  "selection_bias": (selection_bias, (experts,), "(E,)")}
        for role, (t, shape, text) in biases.items():
            if t is None:
                continue
            self._check_operand(kind, role, t, ranks=(len(shape),))
            if t.dtype not in ("f32", dtype):
                raise ValueError(f"{kind}: {describe(role, t)} must be f32 or x's dtype {dtype}")
            expect(role, t, shape, f"{text} with E = {experts}, F = {ffn}, H = {hidden}")
            if role == "b_up" and w_up is None:
                raise ValueError(f"{kind}: {describe(role, t)} is the bias of w_up, but no w_up "
                                 f"is given")
            operands.append((role, t))
            params["biases"] = (*params.get("biases", ()), role)
        if activation == "swiglu_oai":
            if w_up is None:
                raise ValueError(f"{kind}: activation='swiglu_oai' is gated: it needs w_up")
            for role, value in (("swiglu_limit", swiglu_limit), ("swiglu_alpha", swiglu_alpha)):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                        not 0 < value < float("inf"):
                    raise ValueError(f"{kind}: activation='swiglu_oai' needs {role} a finite "
                                     f"number > 0, got {value!r}")
            params.update(activation=activation, swiglu_limit=float(swiglu_limit),
                          swiglu_alpha=float(swiglu_alpha))
        elif activation == "silu":
            for role, value in (("swiglu_limit", swiglu_limit), ("swiglu_alpha", swiglu_alpha)):
                if value is not None:
                    raise ValueError(f"{kind}: {role} = {value!r} is given, but it is a parameter "
                                     f"of activation='swiglu_oai', not of {activation!r}")
        else:
            raise ValueError(f"{kind}: activation {activation!r} is not one ETC knows; expected "
                             f"'silu' or 'swiglu_oai'")
        if tile is None:
            tile = DEFAULT_ROWS
        if isinstance(tile, (tuple, list)) and len(tile) == 1:
            tile = tile[0]
        if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
            raise ValueError(f"{kind}: tile {tile!r} must be a positive int (slots per "
                             f"expert tile)")
        result = self._finish(kind, operands, (tokens, hidden), dtype, (tile,), params, out, name)

        def internal(role: str, shape: tuple, internal_dtype: str) -> Tensor:
            return self._new_tensor(self._fresh_name(f"{result.name}_{role}"), shape,
                                    internal_dtype, "value")

        op = self._ops[-1]
        op.buffers = {
            "probs": internal("probs", (tokens, experts), "f32"),
            "experts": tuple(internal(f"expert{j}", (tokens,), INDEX_DTYPE)
                             for j in range(top_k)),
            "weights": internal("weights", (tokens, top_k), "f32"),
            "offsets": internal("offsets", (experts + 1,), INDEX_DTYPE),
            "slots": internal("slots", (tokens, top_k), INDEX_DTYPE),
            "hidden": internal("hidden", (tokens, top_k, ffn), "f32"),
            "partial": internal("partial", (tokens, top_k, hidden), "f32"),
        }
        return result


def _routing(experts: int, top_k: int, normalize: bool, scoring: str, routed_scale: float,
             n_group: int, topk_group: int, group_score: str, norm_min: float) -> dict:
    """The moe op's routing parameters, checked; only those that differ from
    plain softmax routing, so that softmax layers record what they did."""
    kind = "moe"
    if scoring not in SCORINGS:
        raise ValueError(f"{kind}: scoring {scoring!r} is not one ETC knows; expected one of "
                         f"{', '.join(map(repr, SCORINGS))}")
    if isinstance(routed_scale, bool) or not isinstance(routed_scale, (int, float)) or \
            not 0 < routed_scale < math.inf:
        raise ValueError(f"{kind}: routed_scale must be a finite number > 0, got "
                         f"{routed_scale!r}")
    for role, value in (("n_group", n_group), ("topk_group", topk_group)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{kind}: {role} must be a positive int, got {value!r}")
    if group_score not in GROUP_SCORES:
        raise ValueError(f"{kind}: group_score {group_score!r} is not one ETC knows; expected "
                         f"one of {', '.join(map(repr, GROUP_SCORES))}")
    if isinstance(norm_min, bool) or not isinstance(norm_min, (int, float)) or \
            not 0 <= norm_min < math.inf:
        raise ValueError(f"{kind}: norm_min must be a finite number >= 0, got {norm_min!r}")
    if norm_min and not normalize:
        raise ValueError(f"{kind}: norm_min = {norm_min!r} floors the renormalising sum, but "
                         f"normalize=False renormalises nothing")
    params = {}
    if scoring == "sigmoid":
        params["scoring"] = scoring
    elif n_group > 1 and group_score != "max":
        # Softmax group routing (DeepSeek-V2's) ranks groups by their best.
        raise ValueError(f"{kind}: n_group = {n_group} is a parameter of scoring='sigmoid' "
                         f"routing (DeepSeek-V3, GLM-4.5), not of softmax routing (whose groups, "
                         f"DeepSeek-V2's, take group_score='max')")
    if routed_scale != 1.0:
        params["routed_scale"] = float(routed_scale)
    if norm_min:
        params["norm_min"] = float(norm_min)
    if n_group == 1:
        if topk_group != 1:
            raise ValueError(f"{kind}: topk_group = {topk_group} needs experts in groups "
                             f"(n_group > 1); with n_group = 1 it must be 1")
        if group_score != "top2":
            raise ValueError(f"{kind}: group_score = {group_score!r} scores expert groups, but "
                             f"n_group = 1 forms none")
        return params
    least = 2 if group_score == "top2" else 1
    if experts % n_group or experts // n_group < least:
        raise ValueError(f"{kind}: n_group = {n_group} must divide the E = {experts} experts "
                         f"into groups of at least {least} (group_score={group_score!r})")
    if topk_group > n_group:
        raise ValueError(f"{kind}: topk_group = {topk_group} is more than n_group = {n_group}")
    candidates = topk_group * (experts // n_group)
    if top_k > candidates:
        raise ValueError(f"{kind}: top_k = {top_k} is more than the {candidates} experts of "
                         f"the topk_group = {topk_group} best groups")
    params.update(n_group=n_group, topk_group=topk_group)
    if group_score != "top2":
        params["group_score"] = group_score
    return params
