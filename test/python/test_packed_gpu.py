"""The GPU kernels for packed weights, without a GPU: `MatmulPackedGPU` for
every block format under the CPU lane simulation (`kernels="cuda"`),
against the widened reference, at ragged shapes; a packed model through
the simulated GPU kernels; and the PTX of real-width packed step graphs
(Llama-3.2-1B, Qwen3-0.6B, Qwen3-30B-A3B shapes, their matrices in the
packed formats in turn) assembled by ptxas for sm_80 and sm_90a with no
spills."""

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


def _weight_names(config: ModelConfig) -> list:
    names = ["embed"]
    for i in range(config.num_layers):
        names += [f"l{i}_wq", f"l{i}_wk", f"l{i}_wv", f"l{i}_wo"]
        if not config.is_sparse(i):
            names += [f"l{i}_w_gate", f"l{i}_w_up", f"l{i}_w_down"]
    if not config.tie_word_embeddings:
        names.append("lm_head")
    return names


@needs_ptxas
@pytest.mark.parametrize("name, chip", [(name, chip) for name in SHAPES
                                        for chip in ("sm_80", "sm_90a")])
def test_real_width_packed_step_graphs_assemble_without_spills(name, chip, tmp_path):
    config = ModelConfig.from_dict(shaped_config(name, layers=2))
    formats = {key: FORMATS[i % len(FORMATS)] for i, key in enumerate(_weight_names(config))}
    graph = build_step_graph(config, dtype="bf16", max_seq_len=4096, chunk=256,
                             kv_block_size=16, weight_formats=formats)
    kernel = etc.compile(graph, target="cuda", chip=chip, schedule="auto")
    assert_no_spills(assemble(kernel.ptx, chip, tmp_path, name))
    assert len(set(formats.values())) == len(FORMATS)
