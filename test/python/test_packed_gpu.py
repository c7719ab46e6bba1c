"""The GPU kernels for packed weights, without a GPU: `MatmulPackedGPU` for
every block format under the CPU lane simulation (`kernels="cuda"`),
against the widened reference, at ragged shapes; a packed model through
the simulated GPU kernels; and the PTX of real-width packed step graphs
(Llama-3.2-1B, Qwen3-0.6B, Qwen3-30B-A3B shapes, their matrices and
stacks of experts in the packed formats in turn) assembled by ptxas for
sm_80 and sm_90a with no spills (the packed MoE tiles' numerics under
the lane simulation: test_moe_packed.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from etc import packed
from etc.models.loading.config import ModelConfig
from etc.models.step.graph import build_step_graph
from etc.models.testing import SHAPES, shaped_config
from etc.reference import evaluate
from ptxas_check import assemble, assert_no_spills, needs_ptxas

FORMATS = list(packed.FORMATS)


def test_every_format_under_the_lane_simulation():
    """Each value is dequantized in registers and accumulated in f32, as
    the widened product is: only the order of the sums differs (relative
    1e-5 of sum |a||w|). 40 weight rows (a tile of 8 columns: 4 warps,
    two rows of B^T each), 1 to 9 rows of A (passes of 4 and the
    one-row pass)."""
    k, n = 512, 40
    g = etc.Graph("gpu")
    T = g.symbol("T")
    x = g.input("x", (T, k), "bf16")
    outs = [g.matmul(x, g.input(f"w_{fmt}", (n, k), fmt), transpose_b=True, name=f"y_{fmt}")
            for fmt in FORMATS]
    g.output(*outs)
    module = str(g.build(target=etc.ops.Target(kind="cuda", chip="sm_90a")))
    assert set(re.findall(r"@gpu_tile_(matmul_\w+?)_\d+\(", module)) == \
        {f"matmul_{fmt}_gemv" for fmt in FORMATS}
    rng = np.random.default_rng(0)
    weights = {f"w_{fmt}": packed.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
               for fmt in FORMATS}
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    for rows in (1, 2, 5, 9):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        got = kernel.run(x=a, **weights)
        want = evaluate(g, x=a, **weights)
        for fmt, out, ref in zip(FORMATS, got, want):
            w = packed.dequantize(weights[f"w_{fmt}"], fmt)
            scale = np.abs(a) @ np.abs(w).T
            # C is bf16: half a unit of it, plus the order of the sums.
            assert np.all(np.abs(out - ref) <= np.abs(ref) * 2**-8 + 1e-5 * scale), fmt


def _weight_widths(config: ModelConfig) -> dict:
    """Each linear weight's (and stack of experts') name -> its K (the
    values a row holds)."""
    h, q = config.hidden_size, config.num_heads * config.head_dim
    widths = {"embed": h}
    for i in range(config.num_layers):
        widths.update({f"l{i}_wq": h, f"l{i}_wk": h, f"l{i}_wv": h, f"l{i}_wo": q})
        if config.is_sparse(i):
            widths.update({f"l{i}_experts_gate": h, f"l{i}_experts_up": h,
                           f"l{i}_experts_down": config.moe_intermediate_size})
        else:
            widths.update({f"l{i}_w_gate": h, f"l{i}_w_up": h,
                           f"l{i}_w_down": config.intermediate_size})
    if not config.tie_word_embeddings:
        widths["lm_head"] = h
    return widths


def _formats(config: ModelConfig) -> dict:
    """A block format per weight, every format as often as the rows allow:
    each weight takes the least used of the formats whose block divides its
    K (a 256-value K-quant block does not divide Gemma 3 1B's 1152 or
    Qwen2.5-0.5B's 896, where llama.cpp's files use 32-value blocks)."""
    used = dict.fromkeys(FORMATS, 0)
    chosen = {}
    for name, k in _weight_widths(config).items():
        fits = [f for f in FORMATS if k % packed.FORMATS[f].block == 0]
        chosen[name] = min(fits, key=lambda f: used[f])
        used[chosen[name]] += 1
    return chosen


@needs_ptxas
@pytest.mark.parametrize("name, chip", [(name, chip) for name in SHAPES
                                        for chip in ("sm_80", "sm_90a")])
def test_real_width_packed_step_graphs_assemble_without_spills(name, chip, tmp_path):
    # Two layers, or as many as give every format a weight (Qwen2.5-0.5B's
    # only K that a 256-value block divides is its MLP's down projection).
    for layers in (2, 3):
        config = ModelConfig.from_dict(shaped_config(name, layers=layers))
        formats = _formats(config)
        if set(formats.values()) == set(FORMATS):
            break
    graph = build_step_graph(config, dtype="bf16", max_seq_len=4096, chunk=256,
                             kv_block_size=16, weight_formats=formats)
    kernel = etc.compile(graph, target="cuda", chip=chip, schedule="auto")
    if config.num_experts:
        # The MoE tiles read stacks of experts' blocks, (E, N, bytes of K).
        assert re.search(r"tile_moe_up_\d+\(%arg0: memref<\?x\d+xbf16>, "
                         r"%arg1: memref<\d+x\d+x\d+xi8>", kernel.ir("graph"))
    assert_no_spills(assemble(kernel.ptx, chip, tmp_path, name))
    assert set(formats.values()) == set(FORMATS), sorted(set(FORMATS) - set(formats.values()))
