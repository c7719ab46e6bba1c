"""The graph families the GPU check kit and the artifact tests compile.

Each family is a graph (built with `etc.Graph`, so building needs MLIR) and a
recipe for its inputs that needs only NumPy (`Recipe`), so that the kit can
draw fresh inputs for every run on a machine without MLIR. Together they
cover every operator of the front end, the examples, the three dtypes, the
data-dependent MoE layer (softmax routing, with a selection bias and a
floor under the renormalising sum too, or with expert groups scored by
their best, and sigmoid-scored routing), the GEMV's
ragged last tile, the norm split over ranks (`sum_squares`,
`split_rmsnorm`) and the GGUF block formats of packed weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: The operators of `etc.Graph` with a one-operator family each.
OPERATORS = ("matmul", "matmul_t", "matmul_residual", "add", "mul", "silu_mul", "add_row",
             "mul_row", "silu", "gelu", "exp", "scale", "rmsnorm", "softmax", "sum", "topk",
             "sigmoid_mul", "gelu_mul", "layernorm")


@dataclass(frozen=True)
class Recipe:
    """How to draw inputs: N(0, 1) times `scales[name]` (default 1), bf16
    inputs rounded to bf16, f16 ones cast; `sizes` are the values of the
    symbol to check at; `tolerance` the largest relative error
    ‖out − ref‖ / ‖ref‖ per output; `routing` names (x, router_w, top_k)
    when the inputs must route tokens unambiguously (MoE), and for
    biased or grouped routing (x, router_w, top_k, scoring ("sigmoid" or
    "softmax"), selection_bias (None: none), n_group, topk_group[,
    group_score ("top2", the default, or "max")]): the chosen experts,
    and with groups the chosen groups, ahead of the next by a margin."""

    sizes: tuple = (1, 5, 33, 64)
    scales: dict = field(default_factory=dict)
    tolerance: float = 1e-4
    routing: tuple | None = None

    def to_json(self) -> dict:
        return {"sizes": list(self.sizes), "scales": dict(self.scales),
                "tolerance": self.tolerance,
                "routing": list(self.routing) if self.routing else None}


def recipe_from_json(data: dict) -> Recipe:
    return Recipe(tuple(data["sizes"]), dict(data["scales"]), float(data["tolerance"]),
                  tuple(data["routing"]) if data.get("routing") else None)


# ---------------------------------------------------------------------------
# Graphs (need MLIR)
# ---------------------------------------------------------------------------

def operator_graph(kind: str, dtype: str = "f32"):
    """The one-operator family of `kind` on 96 columns (a whole and a
    partial 64-column tile), its operands of `dtype`: `op_<kind>`, or
    `op_<kind>_<dtype>` beside f32."""
    import etc

    g = etc.Graph(f"op_{kind}" if dtype == "f32" else f"op_{kind}_{dtype}")
    B = g.symbol("B")
    x = g.input("x", (B, 96), dtype)
    if kind == "matmul":
        y = g.matmul(x, g.input("w", (96, 80), dtype))
    elif kind == "matmul_t":
        y = g.matmul(x, g.input("w", (80, 96), dtype), transpose_b=True)
    elif kind == "matmul_residual":
        y = g.matmul(x, g.input("w", (80, 96), dtype), transpose_b=True,
                     residual=g.input("z", (B, 80), dtype))
    elif kind in ("add", "mul", "silu_mul", "gelu_mul"):
        y = getattr(g, kind)(x, g.input("z", (B, 96), dtype))
    elif kind in ("add_row", "mul_row"):
        y = getattr(g, kind[:3])(x, g.input("r", (96,), dtype))
    elif kind in ("silu", "gelu", "exp", "softmax", "sum"):
        y = getattr(g, kind)(x)
    elif kind == "sigmoid_mul":
        # One gate per row, broadcast over 96 = 64 + 32 columns (a partial
        # column tile).
        y = g.sigmoid_mul(g.input("gate", (B, 1), dtype), x)
    elif kind == "scale":
        y = g.scale(x, -0.5)
    elif kind == "rmsnorm":
        y = g.rmsnorm(x, g.input("w", (96,), dtype), 1e-5)
    elif kind == "layernorm":
        # 96 columns: 16-byte slices streamed by a warp per row.
        y = g.layernorm(x, g.input("w", (96,), dtype), g.input("r", (96,), dtype), 1e-5)
    elif kind == "topk":
        values, indices = g.topk(x, 4)
        g.output(values, indices)
        return g
    else:
        raise ValueError(kind)
    g.output(y)
    return g


def mlp_block(name: str = "mlp_block", hidden: int = 128, ffn: int = 192, dtype: str = "f32"):
    """The 5-operator block of the benchmarks: rmsnorm, matmul, silu, matmul,
    residual add."""
    import etc

    g = etc.Graph(name)
    B = g.symbol("B")
    x = g.input("x", (B, hidden), dtype)
    nw = g.input("nw", (hidden,), dtype)
    w1 = g.input("w1", (hidden, ffn), dtype)
    w2 = g.input("w2", (ffn, hidden), dtype)
    h = g.rmsnorm(x, nw, 1e-6)
    y = g.add(g.matmul(g.silu(g.matmul(h, w1)), w2), x)
    g.output(y)
    return g


def dense_graph():
    """Several operators that feed each other, two outputs."""
    import etc

    g = etc.Graph("dense")
    B = g.symbol("B")
    x = g.input("x", (B, 128), "f32")
    nw = g.input("nw", (128,), "f32")
    w1 = g.input("w1", (128, 192), "f32")
    w2 = g.input("w2", (192, 128), "f32")
    h = g.rmsnorm(x, nw, 1e-6)
    a = g.gelu(g.matmul(h, w1))
    y = g.add(g.matmul(a, w2), x)
    g.output(y, g.softmax(y))
    return g


def packed_graph(formats=None):
    """x·Wᵀ with W in each block format of GGUF files (`etc.packed.FORMATS`,
    or those of `formats`): the decode GEMV tiles that dequantize packed
    blocks in registers, and from 16 rows the tensor cores on blocks
    dequantized into shared memory. 40 weight rows (a tile of 8 columns,
    and a partial one), K = 512 (two 256-value super-blocks, sixteen
    32-value blocks)."""
    import etc
    from etc import packed

    g = etc.Graph("packed")
    T = g.symbol("T")
    x = g.input("x", (T, 512), "bf16")
    g.output(*[g.matmul(x, g.input(f"w_{fmt}", (40, 512), fmt), transpose_b=True,
                        name=f"y_{fmt}") for fmt in (formats or packed.FORMATS)])
    return g


def _hopper_products(name: str, k: int, n: int, dtype: str):
    """The Hopper families' graph: x (B, k) times two weights transposed,
    (n, k) on the front end's tiles and (256, k) on 128 x 64 tiles."""
    import etc

    g = etc.Graph(name)
    B = g.symbol("B")
    x = g.input("x", (B, k), dtype)
    g.output(g.matmul(x, g.input("w", (n, k), dtype), transpose_b=True),
             g.matmul(x, g.input("w2", (256, k), dtype), transpose_b=True, tile=(128, 64)))
    return g


def hopper_graph(dtype: str = "bf16"):
    """x·Wᵀ at K = 320, the Hopper tile's family: on sm_90a `wgmma` from
    swizzled shared memory behind the mbarrier ring (five 64-wide K steps
    through three stages: every barrier completes both phases), with the
    transposed GEMV for tiles of fewer than 16 rows; on the GEMV's column
    tiles (192 columns) and on 128 x 64 tiles (two 64-row wgmma blocks);
    `mma.sync` on sm_80."""
    return _hopper_products(f"hopper_{dtype}", 320, 192, dtype)


def hopper_tma_graph(dtype: str = "bf16"):
    """The Hopper tile with TMA loads (`MatmulWGMMA.tma`; the kit compiles
    the families of TMA_FAMILIES inside `tma_loads()`): K = 328, past
    five 64-wide steps by 8 (the last box zero-filled), N = 200 past the
    GEMV's column tiles, and 128 x 64 tiles; sm_80 has no tile for K = 328
    but the GEMV."""
    return _hopper_products(f"hopper_tma_{dtype}", 328, 200, dtype)


def hopper_ws_graph(dtype: str = "bf16"):
    """The warp-specialised Hopper tile (`MatmulWGMMA.warp_specialised`:
    warpgroup 0 produces with TMA, warpgroup 1 runs wgmma; the kit
    compiles WS_FAMILIES inside `tma_loads()` and `warp_specialised()` at
    WS_BOUNDS, on sm_90a only): the TMA family's shapes."""
    return _hopper_products(f"hopper_ws_{dtype}", 328, 200, dtype)


#: Families compiled with TMA loads on sm_90a.
TMA_FAMILIES = ("hopper_tma_bf16", "hopper_tma_f16")
#: Families compiled warp-specialised (with TMA loads), on sm_90a only.
WS_FAMILIES = ("hopper_ws_bf16",)
#: What a warp-specialised program is compiled with (`etc.compile`): two
#: warpgroups per worker CTA and 2 CTAs per SM, so 128 registers a lane at
#: entry, which the tile's `setmaxnreg` counts are derived from.
WS_BOUNDS = {"lanes": 256, "min_ctas": 2}


def moe_graph(dtype: str = "f32", name: str = "moe_layer"):
    import etc

    g = etc.Graph(name)
    T = g.symbol("T")
    x = g.input("x", (T, 16), dtype)
    router_w = g.input("router_w", (16, 8), dtype)
    w1 = g.input("w1", (8, 16, 24), dtype)
    w2 = g.input("w2", (8, 24, 16), dtype)
    g.output(g.moe(x, router_w, w1, w2, 2, tile=8))
    return g


def moe_sigmoid_graph(dtype: str = "f32", name: str = "moe_sigmoid"):
    """Sigmoid-scored routing (DeepSeek-V3, GLM-4.5) of gated experts: 8
    experts in 4 groups of 2, the best 2 groups' experts candidates, top 2
    chosen by score + `bias`, weights renormalised and scaled by 2.5; plus
    a shared expert gated per token by sigmoid(x . gate_w) (Qwen2-MoE's
    `sigmoid_mul` on a one-row GEMV)."""
    import etc

    g = etc.Graph(name)
    T = g.symbol("T")
    x = g.input("x", (T, 16), dtype)
    routed = g.moe(x, g.input("router_w", (16, 8), dtype), g.input("w1", (8, 16, 24), dtype),
                   g.input("w2", (8, 24, 16), dtype), 2, w_up=g.input("w_up", (8, 16, 24), dtype),
                   scoring="sigmoid", selection_bias=g.input("bias", (8,), "f32"),
                   routed_scale=2.5, n_group=4, topk_group=2, tile=8)
    shared = g.matmul(g.silu(g.matmul(x, g.input("shared_w1", (16, 24), dtype))),
                      g.input("shared_w2", (24, 16), dtype))
    gate = g.matmul(x, g.input("gate_w", (1, 16), dtype), transpose_b=True)
    g.output(g.add(routed, g.sigmoid_mul(gate, shared)))
    return g


def moe_softmax_bias_graph(dtype: str = "f32", name: str = "moe_softmax_bias"):
    """ERNIE 4.5's routing of gated experts: softmax scores, the top 2 of
    8 chosen by score + `bias`, weighted by the unbiased scores divided by
    max(sum, 0.4) (a floor some tokens' sums fall below); plus an ungated
    shared expert whose down projection adds the routed output in its
    tiles."""
    import etc

    g = etc.Graph(name)
    T = g.symbol("T")
    x = g.input("x", (T, 16), dtype)
    routed = g.moe(x, g.input("router_w", (16, 8), dtype), g.input("w1", (8, 16, 24), dtype),
                   g.input("w2", (8, 24, 16), dtype), 2, w_up=g.input("w_up", (8, 16, 24), dtype),
                   selection_bias=g.input("bias", (8,), "f32"), norm_min=0.4, tile=8)
    shared = g.silu_mul(g.matmul(x, g.input("shared_gate", (16, 24), dtype)),
                        g.matmul(x, g.input("shared_up", (16, 24), dtype)))
    g.output(g.matmul(shared, g.input("shared_down", (24, 16), dtype), residual=routed))
    return g


def layernorm_graph(dtype: str = "bf16", name: str = "layernorm_rows"):
    """layernorm with a bias (and without) over rows held in a warp's
    registers (1024 values) and streamed (8192: Command R's hidden size):
    `RowwiseGPU`'s two layouts, each with its three passes (mean, centred
    squares, output)."""
    import etc

    g = etc.Graph(name)
    B = g.symbol("B")
    outs = []
    for width in (1024, 8192):
        x = g.input(f"x{width}", (B, width), dtype)
        w = g.input(f"w{width}", (width,), dtype)
        outs += [g.layernorm(x, w, g.input(f"b{width}", (width,), dtype), 1e-5),
                 g.layernorm(x, w, eps=1e-5)]
    g.output(*outs)
    return g


def moe_group_max_graph(dtype: str = "f32", name: str = "moe_group_max"):
    """DeepSeek-V2's routing (group_limited_greedy) of gated experts given
    transposed, as the models load them: softmax scores, 16 experts in 4
    groups of 4 scored by their best, the experts of the best 2 groups
    candidates, the top 3 chosen, their weights not renormalised and
    times 2."""
    import etc

    g = etc.Graph(name)
    T = g.symbol("T")
    x = g.input("x", (T, 16), dtype)
    g.output(g.moe(x, g.input("router_w", (16, 16), dtype), g.input("w1", (16, 24, 16), dtype),
                   g.input("w2", (16, 16, 24), dtype), 3,
                   w_up=g.input("w_up", (16, 24, 16), dtype), transpose_w=True,
                   normalize=False, routed_scale=2.0, n_group=4, topk_group=2,
                   group_score="max", tile=8))
    return g


#: Rows of Wᵀ for the ragged GEMV family: no GEMV tile width divides them.
RAGGED_N = (1, 7, 33, 260)


def gemv_ragged_graph(dtype: str = "f32", name: str = "gemv_ragged"):
    """x·Wᵀ at K = 96 for N in RAGGED_N (odd vocabularies as Granite's
    49,159, Qwen2-MoE's one-row gate): the transposed GEMV
    (`MatmulSkinnyT`) with a ragged last column tile, whose rows past N
    are read but not stored."""
    import etc

    g = etc.Graph(name)
    B = g.symbol("B")
    x = g.input("x", (B, 96), dtype)
    g.output(*[g.matmul(x, g.input(f"w{n}", (n, 96), dtype), transpose_b=True, name=f"y{n}")
               for n in RAGGED_N])
    return g


def split_norm_graph(dtype: str = "f32", name: str = "split_norm"):
    """A tensor-parallel rank's whole-projection q/k norms (OLMo 2, OLMo 3,
    OLMoE): `sum_squares` of q (B, 96) and k (B, 40), plus those of the
    other rank's shares (inputs `q1`, `k1`: the all-reduce's sum), and
    `split_rmsnorm` of q and k by their whole widths 192 and 80; widths of
    whole 16-byte slices in f32 and bf16 (the GPU kernels)."""
    import etc

    g = etc.Graph(name)
    B = g.symbol("B")
    q, k = g.input("q", (B, 96), dtype), g.input("k", (B, 40), dtype)
    totals = g.add(g.sum_squares(q, k),
                   g.sum_squares(g.input("q1", (B, 96), dtype), g.input("k1", (B, 40), dtype)))
    g.output(totals,
             g.split_rmsnorm(q, g.input("wq", (96,), dtype), totals, width=192, eps=1e-6),
             g.split_rmsnorm(k, g.input("wk", (40,), dtype), totals, width=80, column=1,
                             eps=1e-6, offset=1.0))
    return g


def example(name: str):
    """The graph of the repository's `examples/<name>.py` (its `build_<name>()`)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"etc_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, f"build_{name}")()


def families() -> dict:
    """Family name -> (graph builder, recipe)."""
    # Gates from -12 to 12: sigmoid near 0 and 1 as well as in between.
    small = {"w": 0.3, "z": 0.3, "r": 0.3, "gate": 4.0}
    table = {f"op_{kind}": ((lambda kind=kind: operator_graph(kind)), Recipe(scales=small))
             for kind in OPERATORS}
    # GeGLU's gate from about -9 to 9: gelu's tanh saturated at both ends
    # (0 and the identity) as well as its curve in between. bf16 (Gemma's
    # dtype) rounds gelu(x) before the product as the reference does: the
    # simulated CUDA lanes are within 1e-6 of it (2026-11-29); 5e-3 leaves
    # the GPU's ex2.approx room to flip a rounding here and there.
    geglu = {"x": 3.0, "z": 0.3}
    table["op_gelu_mul"] = (table["op_gelu_mul"][0], Recipe(scales=geglu))
    table["op_gelu_mul_bf16"] = (lambda: operator_graph("gelu_mul", "bf16"),
                                 Recipe(scales=geglu, tolerance=5e-3))
    weights = {"w1": 0.1, "w2": 0.1}
    table["dense"] = (dense_graph, Recipe(scales=weights))
    table["mlp_block"] = (mlp_block, Recipe(scales=weights))
    table["mlp_f16"] = (lambda: mlp_block("mlp_f16", dtype="f16"),
                        Recipe(scales=weights, tolerance=2e-3))
    table["mlp_bf16"] = (lambda: mlp_block("mlp_bf16", dtype="bf16"),
                         Recipe(scales=weights, tolerance=2e-2))
    # Rows: the GEMV (1, 5), partial wgmma tiles (33, 130), whole ones.
    hopper = dict(sizes=(1, 5, 33, 64, 130), scales={"w": 0.1, "w2": 0.1})
    table["hopper_bf16"] = (hopper_graph, Recipe(tolerance=2e-2, **hopper))
    table["hopper_f16"] = (lambda: hopper_graph("f16"), Recipe(tolerance=3e-3, **hopper))
    table["hopper_tma_bf16"] = (hopper_tma_graph, Recipe(tolerance=2e-2, **hopper))
    table["hopper_tma_f16"] = (lambda: hopper_tma_graph("f16"),
                               Recipe(tolerance=3e-3, **hopper))
    table["hopper_ws_bf16"] = (hopper_ws_graph, Recipe(tolerance=2e-2, **hopper))
    moe_scales = {"w1": 0.25, "w2": 0.2}
    table["moe"] = (moe_graph, Recipe(sizes=(1, 7, 40, 100), scales=moe_scales,
                                      routing=("x", "router_w", 2)))
    table["moe_f16"] = (lambda: moe_graph("f16", "moe_f16"),
                        Recipe(sizes=(3, 40), scales=moe_scales, tolerance=3e-3,
                               routing=("x", "router_w", 2)))
    # Router logits about N(0, 1) and a bias as large as the scores'
    # spread, so that the bias and the groups change the choice.
    sigmoid = dict(scales={"router_w": 0.25, "bias": 0.2, "w1": 0.25, "w_up": 0.25, "w2": 0.2,
                           "shared_w1": 0.25, "shared_w2": 0.2, "gate_w": 0.5},
                   routing=("x", "router_w", 2, "sigmoid", "bias", 4, 2))
    table["moe_sigmoid"] = (moe_sigmoid_graph, Recipe(sizes=(1, 7, 40, 100), **sigmoid))
    table["moe_sigmoid_bf16"] = (lambda: moe_sigmoid_graph("bf16", "moe_sigmoid_bf16"),
                                 Recipe(sizes=(3, 40), tolerance=2e-2, **sigmoid))
    # Softmax scores of logits about N(0, 1) (0.1 to 0.3 each) and a bias of
    # about their spread: the bias changes the choice, and some chosen sums
    # fall below the floor.
    biased = dict(scales={"router_w": 0.25, "bias": 0.1, "w1": 0.25, "w_up": 0.25, "w2": 0.2,
                          "shared_gate": 0.25, "shared_up": 0.25, "shared_down": 0.2},
                  routing=("x", "router_w", 2, "softmax", "bias", 1, 1))
    table["moe_softmax_bias"] = (moe_softmax_bias_graph, Recipe(sizes=(1, 7, 40, 100), **biased))
    table["moe_softmax_bias_bf16"] = (
        lambda: moe_softmax_bias_graph("bf16", "moe_softmax_bias_bf16"),
        Recipe(sizes=(3, 40), tolerance=2e-2, **biased))
    # Softmax scores of logits about N(0, 2) over 16 experts: the groups
    # (scored by their best) change the choice of some tokens.
    grouped = dict(scales={"router_w": 0.5, "w1": 0.25, "w_up": 0.25, "w2": 0.2},
                   routing=("x", "router_w", 3, "softmax", None, 4, 2, "max"))
    table["moe_group_max"] = (moe_group_max_graph, Recipe(sizes=(1, 7, 40, 100), **grouped))
    table["moe_group_max_bf16"] = (lambda: moe_group_max_graph("bf16", "moe_group_max_bf16"),
                                   Recipe(sizes=(3, 40), tolerance=2e-2, **grouped))
    # Decode batches: one row, a pass of 4 and one row, 17 (GEMV tiles).
    ragged = {f"w{n}": 0.1 for n in RAGGED_N}
    table["gemv_ragged"] = (gemv_ragged_graph, Recipe(sizes=(1, 5, 17), scales=ragged))
    table["gemv_ragged_bf16"] = (lambda: gemv_ragged_graph("bf16", "gemv_ragged_bf16"),
                                 Recipe(sizes=(1, 5, 17), scales=ragged, tolerance=2e-2))
    table["split_norm"] = (split_norm_graph, Recipe(sizes=(1, 5, 33)))
    table["split_norm_bf16"] = (lambda: split_norm_graph("bf16", "split_norm_bf16"),
                                Recipe(sizes=(1, 5, 33), tolerance=2e-2))
    # Rows 1 (one warp busy), 5 (rows per round not a multiple), 33.
    table["layernorm_rows"] = (layernorm_graph, Recipe(sizes=(1, 5, 33), tolerance=2e-2))
    table["layernorm_rows_f32"] = (lambda: layernorm_graph("f32", "layernorm_rows_f32"),
                                   Recipe(sizes=(1, 5, 33)))
    table["example_mlp"] = (lambda: example("mlp"),
                            Recipe(sizes=(1, 7, 64), scales={"w1": 0.06, "w2": 0.05}))
    # Routes rmsnorm(x), so the margin check on x does not apply; ties
    # closer than rounding are improbable at these sizes.
    table["example_moe"] = (lambda: example("moe"),
                            Recipe(sizes=(1, 9, 70), scales={"w1": 0.1, "w2": 0.1}))
    # The GPU tiles dequantize in registers: bf16 products (2^-9 relative)
    # of f32 sums in another order; from 16 rows (tensor cores) the weights
    # are rounded to bf16 too. The CPU kernels quantize the
    # activations to int8 blocks first, as llama.cpp does: up to 0.9 % in
    # 270 draws (2026-11-27).
    table["packed"] = (packed_graph, Recipe(sizes=(1, 2, 5, 9, 16, 40), tolerance=2e-2))
    return table


# ---------------------------------------------------------------------------
# The watchdog's broken program
# ---------------------------------------------------------------------------

#: An event graph whose "produce" notifies each element of %e once while its
#: count says 2: every tile of "consume" waits for a notify that never comes.
#: The schedule check rejects it; compiled with the check skipped, a run must
#: end in the watchdog's error, not hang (test_watchdog.py, the GPU kit).
HANG = """
event.graph @hang(%n: index, %x: memref<?xf32>, %y: memref<?xf32>,
                  %t: memref<?xf32> {event.intermediate}) {
  %c2 = arith.constant 2 : index
  %e = event.alloc(%n) count(%c2) : !event.tensor<?>
  event.task "produce" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%t : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %t[%i] : memref<?xf32>
  }
  event.task "consume" grid(%n)
      reads(%t : memref<?xf32> (d0) -> (d0) [1])
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = memref.load %t[%i] : memref<?xf32>
    memref.store %v, %y[%i] : memref<?xf32>
  }
}
"""


def hang_signature():
    """The kernel signature of `HANG` (for `etc.compiler.compile_module`)."""
    from types import SimpleNamespace

    from etc.runtime.abi import Argument

    return SimpleNamespace(
        name="hang",
        arguments=[Argument("symbol", "n", (), "index"), Argument("input", "x", ("n",), "f32"),
                   Argument("output", "y", ("n",), "f32"),
                   Argument("intermediate", "t", ("n",), "f32")],
        outputs=["y"])


# ---------------------------------------------------------------------------
# Inputs (NumPy only)
# ---------------------------------------------------------------------------

def _gap(scores, chosen: int):
    """Per row, the last chosen score's lead over the first one left."""
    ordered = -np.sort(-scores, axis=-1)
    return ordered[:, chosen - 1] - ordered[:, chosen]


def _routing_margin(x, router_w, top_k: int, bias=None, n_group: int = 0,
                    topk_group: int = 1, scoring: str = "sigmoid",
                    group_score: str = "top2") -> float:
    """The smallest lead, over tokens, of the chosen experts (softmax
    scores; with `n_group`, `scoring`'s scores plus `bias` (if any) and,
    past one group, also of the chosen groups' scores: the sum of their
    two best, or with `group_score` "max" their best, as
    `etc.reference.moe_route`)."""
    logits = x.astype(np.float32) @ router_w.astype(np.float32)
    if not len(logits) or top_k >= logits.shape[1]:
        return 1.0
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    if not n_group:
        return float(np.min(_gap(p, top_k)))
    scores = p if scoring == "softmax" else np.float32(1) / (np.float32(1) + np.exp(-logits))
    ranked = scores if bias is None else scores + bias.astype(np.float32)
    gaps = []
    if n_group > 1:
        size = ranked.shape[1] // n_group
        best = -np.sort(-ranked.reshape(len(ranked), n_group, size), axis=-1)
        group_scores = best[..., 0] if group_score == "max" else best[..., :2].sum(-1)
        if topk_group < n_group:
            gaps.append(_gap(group_scores, topk_group))
        # Stable: equal group scores keep the lower group, as the routing.
        kept = np.argsort(-group_scores, axis=-1, kind="stable")[:, :topk_group]
        inside = np.zeros(group_scores.shape, bool)
        np.put_along_axis(inside, kept, True, axis=1)
        ranked = np.where(np.repeat(inside, size, axis=1), ranked, -np.inf)
    gaps.append(_gap(ranked, top_k))
    return float(min(np.min(g) for g in gaps))


def make_inputs(arguments, symbols: dict, recipe: Recipe, rng) -> dict:
    """Fresh inputs for `arguments` (a kernel's, in order) with the symbols
    bound to `symbols`: see `Recipe`."""
    from etc import packed
    from etc.reference import round_bf16

    for _ in range(100):
        inputs = {}
        for arg in arguments:
            if arg.kind != "input":
                continue
            shape = tuple(symbols[d] if isinstance(d, str) else d for d in arg.shape)
            values = rng.standard_normal(shape).astype(np.float32) * np.float32(
                recipe.scales.get(arg.name, 1.0))
            if packed.is_packed(arg.dtype):
                values = packed.quantize(values, arg.dtype)
            elif arg.dtype == "bf16":
                values = round_bf16(values)
            elif arg.dtype == "f16":
                values = values.astype(np.float16)
            inputs[arg.name] = values
        if recipe.routing is None:
            return inputs
        x, router_w, top_k, *biased = recipe.routing
        if biased:
            scoring, bias, n_group, topk_group, *group_score = biased
            margin = _routing_margin(inputs[x], inputs[router_w], top_k,
                                     inputs[bias] if bias else None, n_group, topk_group,
                                     scoring, *group_score)
        else:
            margin = _routing_margin(inputs[x], inputs[router_w], top_k)
        if margin > 1e-4:
            return inputs
    raise RuntimeError("could not draw inputs with an unambiguous routing")


def relative_error(got, want) -> float:
    """‖got − want‖ / ‖want‖ in float64 (exact 0 for two empty arrays); NaN
    anywhere counts as an infinite error."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
        return float("inf")
    norm = np.linalg.norm(want)
    diff = np.linalg.norm(got - want)
    return float(diff / norm) if norm > 0 else float(diff)
