"""MoE layers whose experts are f32, bf16 or fp8_e4m3 on the CPU: the
vector expert tiles (`MoeUpVectorCPU`, `MoeDownVectorCPU` in
ops/moe_experts.py) against the NumPy reference and against the scalar
tiles (`MoeUp`, `MoeDown`) they replace there.

Layers: experts given (E, H, F) (a widened checkpoint's (in, out), the
streamed rows) and transposed (E, F, H) (Hugging Face's and FP8
checkpoints' (out, in), the dot products along K); gated and not; H and F
that are not multiples of the 16-lane vectors (or of the 128-column chunks;
fp8's K is a multiple of its blocks of 32, its N need not be); f16 experts,
and an fp8 gate beside a bf16 up; gpt-oss's biases and clamped SwiGLU
(bf16 streamed, fp8 dots; the rest in test_moe_gptoss.py); routing skewed on purpose: expert 0 takes
every token (33 slots: four whole tiles of 8 and one of 1), two experts
none, the others a few; 1, 2, 7 and 33 tokens through one compile per
schedule. Tolerances: f32 sums in another order (1e-5 of the output's
largest value); bf16 and f16 outputs one rounding of their own (2^-8 and
2^-10 of it).

Models: a tiny one-layer Qwen3-MoE checkpoint in bf16 (experts (E, H, F) bf16) and
as an FP8 checkpoint (experts packed fp8_e4m3, bf16 activations): the
vector tiles' greedy tokens are the scalar tiles' (the same model loaded
with the vector tiles turned off), logits within bf16 rounding. (In f32
the MoE models of test_models.py and test_fp8_checkpoints.py take the
vector tiles against the NumPy forward pass.) Both broken tiles above
change the models' tokens too."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
import etc.models as models
from etc import packed
from etc.models.testing import tiny_config, write_checkpoint
from etc.ops import moe_experts
from etc.reference import evaluate, round_bf16

from moe_routing import routed_inputs

E, TOP_K, TILE = 8, 2, 8
TOKENS = (1, 2, 7, 33)
#: Experts the router never picks, and the one it picks for every token.
UNUSED, ALWAYS = (2, 6), 0

#: (experts' dtype, or (w1, w_up, w2) dtypes; x's dtype, transpose_w, H, F,
#: gated)
LAYERS = {
    "f32": ("f32", "f32", False, 37, 23, True),
    "f32_transposed": ("f32", "f32", True, 37, 23, True),
    "f32_ungated": ("f32", "f32", False, 150, 80, False),
    "bf16": ("bf16", "bf16", False, 37, 71, True),
    "bf16_transposed": ("bf16", "bf16", True, 71, 37, True),
    "fp8": ("fp8_e4m3", "bf16", True, 96, 64, True),
    "fp8_f32": ("fp8_e4m3", "f32", True, 64, 96, True),
    "fp8_ungated": ("fp8_e4m3", "f32", True, 64, 32, False),
    "f16": ("f16", "f16", False, 40, 24, True),
    # An fp8 gate beside a bf16 up: the up tile's per-16-values dots.
    "fp8_gate_bf16_up": (("fp8_e4m3", "bf16", "bf16"), "bf16", True, 64, 96, True),
    # gpt-oss's layer (GPTOSS): streamed bf16 rows and fp8 dots.
    "bf16_gptoss": ("bf16", "bf16", False, 37, 71, True),
    "fp8_gptoss": ("fp8_e4m3", "bf16", True, 96, 64, True),
}
#: Layers with gpt-oss's biases (router_b f32, b1 and b2 in x's dtype,
#: b_up f32) and clamped SwiGLU (limit 1: the sums, of experts scaled up
#: to 4.5x, pass it often).
GPTOSS = {"bf16_gptoss", "fp8_gptoss"}


def _dtypes(name: str) -> dict:
    """The layer's expert matrices' dtypes by input name."""
    dtype = LAYERS[name][0]
    w1, w_up, w2 = dtype if isinstance(dtype, tuple) else (dtype,) * 3
    return {"w1": w1, "w_up": w_up, "w2": w2}


def _graph(name: str) -> etc.Graph:
    _, xdtype, transpose, h, f, gated = LAYERS[name]
    dtypes = _dtypes(name)
    g = etc.Graph(f"moe_{name}")
    T = g.symbol("T")
    x = g.input("x", (T, h), xdtype)
    router = g.input("router", (h, E), xdtype)
    up_shape, down_shape = ((E, f, h), (E, h, f)) if transpose else ((E, h, f), (E, f, h))
    w_up = g.input("w_up", up_shape, dtypes["w_up"]) if gated else None
    gptoss = {}
    if name in GPTOSS:
        gptoss = dict(router_b=g.input("router_b", (E,), "f32"),
                      b1=g.input("b1", (E, f), xdtype), b_up=g.input("b_up", (E, f), "f32"),
                      b2=g.input("b2", (E, h), xdtype), activation="swiglu_oai",
                      swiglu_limit=1.0, swiglu_alpha=1.702)
    g.output(g.moe(x, router, g.input("w1", up_shape, dtypes["w1"]),
                   g.input("w2", down_shape, dtypes["w2"]), TOP_K, w_up=w_up,
                   transpose_w=transpose, tile=TILE, **gptoss))
    return g


def _experts(name: str) -> dict:
    _, _, transpose, h, f, gated = LAYERS[name]
    dtypes = _dtypes(name)
    rng = np.random.default_rng(len(name))
    up_shape, down_shape = ((E, f, h), (E, h, f)) if transpose else ((E, h, f), (E, f, h))
    shapes = {"w1": (up_shape, h), "w2": (down_shape, f)}
    if gated:
        shapes["w_up"] = (up_shape, h)
    out = {}
    for key, (shape, k) in shapes.items():
        values = (rng.standard_normal(shape) / np.sqrt(k)).astype(np.float32)
        # Each expert its own scale: an expert read at another's offset
        # gives other values, not nearly the same ones.
        values *= (1 + np.arange(E, dtype=np.float32) / 2)[:, None, None]
        dtype = dtypes[key]
        out[key] = packed.quantize(values, dtype) if dtype == "fp8_e4m3" else \
            round_bf16(values) if dtype == "bf16" else \
            values.astype(np.float16) if dtype == "f16" else values
    if name in GPTOSS:
        xdtype = LAYERS[name][1]
        for key, shape, dtype in (("router_b", (E,), "f32"), ("b1", (E, f), xdtype),
                                  ("b_up", (E, f), "f32"), ("b2", (E, h), xdtype)):
            values = rng.standard_normal(shape).astype(np.float32) / 2
            out[key] = round_bf16(values) if dtype == "bf16" else values
    return out


def _routed_inputs(name: str, tokens: int) -> dict:
    """x and a router that send every token to expert ALWAYS and none to
    UNUSED (`routed_inputs`)."""
    _, xdtype, _, h, _, _ = LAYERS[name]
    ins = routed_inputs(tokens, h, E, TOP_K, UNUSED, always=ALWAYS, dtype=xdtype, margin=1e-2)
    if xdtype == "f16":
        ins = {key: value.astype(np.float16) for key, value in ins.items()}
    return ins


def _tolerance(name: str, want: np.ndarray) -> float:
    """The output's rounding (bf16 2^-8, f16 2^-10 of its largest value),
    or f32 sums in another order (1e-5)."""
    step = {"bf16": 2.0**-8, "f16": 2.0**-10}.get(LAYERS[name][1], 1e-5)
    return step * float(np.abs(want).max())


def _kernels(kernel) -> set:
    return set(re.findall(r"_tile_(moe_\w+?)_\d+\(", kernel.ir("graph")))


def _scalar_tiles(monkeypatch) -> None:
    """The vector tiles turned off: the chooser falls back to the scalar
    `MoeUp` / `MoeDown` (for kernels compiled after this)."""
    for kernel in (moe_experts.MoeUpVectorCPU, moe_experts.MoeDownVectorCPU):
        monkeypatch.setattr(kernel, "applies", classmethod(lambda cls, op, target: False))


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_vector_tiles_against_the_reference(name, schedule):
    g = _graph(name)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
    assert {"moe_up_vector_cpu", "moe_down_vector_cpu"} <= _kernels(kernel)
    assert not {"moe_up", "moe_down"} & _kernels(kernel)
    weights = _experts(name)
    run = kernel.partial(**weights)
    for tokens in TOKENS:
        ins = _routed_inputs(name, tokens)
        (got,) = run.run(**ins)
        (want,) = evaluate(g, **ins, **weights)
        error = np.abs(np.asarray(got, np.float64) - want).max()
        assert error <= _tolerance(name, want), (tokens, error)


@pytest.mark.parametrize("name", ["f32", "bf16_transposed", "fp8", "fp8_gptoss"])
def test_vector_tiles_equal_the_scalar_tiles(name, monkeypatch):
    """The scalar tiles on the same inputs: the same sums in another order."""
    g = _graph(name)
    weights = _experts(name)
    vector_run = etc.compile(g, target="cpu", workers=2).partial(**weights)
    _scalar_tiles(monkeypatch)
    kernel = etc.compile(g, target="cpu", workers=2)
    assert {"moe_up", "moe_down"} <= _kernels(kernel)
    scalar_run = kernel.partial(**weights)
    for tokens in TOKENS:
        ins = _routed_inputs(name, tokens)
        (got,), (want,) = vector_run.run(**ins), scalar_run.run(**ins)
        want = np.asarray(want, np.float64)
        assert np.abs(np.asarray(got, np.float64) - want).max() <= _tolerance(name, want)


# ----------------------------------------------------------------------
# Whole models
# ----------------------------------------------------------------------

#: A tiny Qwen3-MoE of one sparse layer (4 experts, 2 per token), widths
#: off the vector width; FP8 wants K a multiple of 32. (One layer: what is
#: compared is the expert tiles, and each test compiles the model twice;
#: a dense layer before it doubled the compile time and tested nothing of
#: theirs.)
MODEL = tiny_config("Qwen3MoeForCausalLM", num_hidden_layers=1, hidden_size=64,
                    moe_intermediate_size=96, vocab_size=120)
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=8, dtype="bf16", cache=False)
PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(20, 31))]


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_models_take_the_vector_tiles_with_the_scalar_tiles_tokens(storage, tmp_path,
                                                                   monkeypatch):
    """A bf16 checkpoint (experts widened to (E, H, F) bf16) and an FP8 one
    (experts packed (E, F, H) fp8_e4m3), computed in bf16: the vector
    tiles' greedy tokens are the scalar tiles' and their logits within
    bf16 rounding of each other (the routing of the same bf16 values)."""
    options = dict(fp8_block=(32, 32)) if storage == "fp8" else {}
    path = write_checkpoint(tmp_path / storage, MODEL, dtype="BF16", seed=3, **options)
    fast = models.load(path, **LOAD)
    assert bool(fast.weight_formats) == (storage == "fp8")
    graph = fast.kernels[0].ir("graph")
    assert "moe_up_vector_cpu" in graph and "moe_down_vector_cpu" in graph
    got = fast.generate(PROMPTS, 6, return_logits=True)
    _scalar_tiles(monkeypatch)
    slow = models.load(path, **LOAD)
    assert "moe_up_vector_cpu" not in slow.kernels[0].ir("graph")
    want = slow.generate(PROMPTS, 6, return_logits=True)
    assert got.tokens == want.tokens
    for here, there in zip(got.logits, want.logits):
        here, there = np.asarray(here), np.asarray(there)
        assert np.abs(here - there).max() <= 2.0**-6 * np.abs(there).max()


def test_tiles_past_the_stack_budget_stay_scalar():
    """An up tile whose panel of rows would pass STACK_BYTES (64 slots of
    4096 f32 values: 1 MB) takes the scalar `MoeUp`, still correct; the
    down tile's (64 x 16) the vector one."""
    g = etc.Graph("wide")
    T = g.symbol("T")
    x = g.input("x", (T, 4096), "f32")
    g.output(g.moe(x, g.input("router", (4096, 4), "f32"), g.input("w1", (4, 4096, 16), "f32"),
                   g.input("w2", (4, 16, 4096), "f32"), 2, tile=64))
    assert 64 * 4096 * 4 > moe_experts.ExpertVectorCPU.STACK_BYTES
    kernel = etc.compile(g, target="cpu", workers=2)
    assert {"moe_up", "moe_down_vector_cpu"} <= _kernels(kernel)
    rng = np.random.default_rng(1)
    ins = dict(x=rng.standard_normal((3, 4096)).astype(np.float32),
               router=rng.standard_normal((4096, 4)).astype(np.float32) / 64,
               w1=rng.standard_normal((4, 4096, 16)).astype(np.float32) / 64,
               w2=rng.standard_normal((4, 16, 4096)).astype(np.float32) / 4)
    (got,), (want,) = kernel.run(**ins), evaluate(g, **ins)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
