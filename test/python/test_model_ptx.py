"""Step graphs at real widths (2 layers of Llama-3.2-1B, Qwen3-0.6B and
Qwen3-30B-A3B, bf16 weights and paged KV cache) compiled for sm_80 and sm_90a:
ptxas assembles them with no spills, and the tile functions' scratch is one
arena of dynamic shared memory small enough for any CTA (the sum of
per-function static arrays, 64,000 bytes for Llama-3.2-1B, did not
assemble for sm_80)."""

from __future__ import annotations

import re

import pytest

import etc
from etc.models.step.graph import build_step_graph
from etc.models.loading.config import ModelConfig
from etc.models.testing import SHAPES, shaped_config
from ptxas_check import assemble, assert_no_spills, needs_ptxas

#: What a CTA may use without opting in (sm_80 and sm_90a).
STATIC_LIMIT = 48 << 10


@needs_ptxas
@pytest.mark.parametrize("name, kv_block_size, chip",
                         [(name, 16, chip) for name in SHAPES for chip in ("sm_80", "sm_90a")] +
                         [("qwen3-0.6b", None, "sm_80")])
def test_real_width_step_graph_assembles_without_spills(name, kv_block_size, chip, tmp_path):
    """Paged KV caches (the models' default: blocks of 16, the GPU kernels
    read keys and values through the block table) for every shape and
    chip, and one contiguous cache."""
    config = ModelConfig.from_dict(shaped_config(name, layers=2))
    graph = build_step_graph(config, dtype="bf16", max_seq_len=4096, chunk=256,
                             kv_block_size=kv_block_size)
    kernel = etc.compile(graph, target="cuda", chip=chip, schedule="auto")
    report = assemble(kernel.ptx, chip, tmp_path, name)
    assert_no_spills(report)
    assert "__etc_scratch" not in kernel.ptx  # no static scratch arrays
    worker = report.split(f"Compiling entry function '{graph.name}_worker'")[1]
    static = int(re.search(r"(\d+) bytes smem", worker).group(1))
    assert 0 < kernel.abi.shared_bytes and static + kernel.abi.shared_bytes <= STATIC_LIMIT, \
        (static, kernel.abi.shared_bytes)
