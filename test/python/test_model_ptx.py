"""Step graphs at real widths (2 layers of Llama-3.2-1B, Qwen3-0.6B and
Qwen3-30B-A3B, paged or contiguous KV cache) compiled for sm_80 and sm_90a
on the schedule "auto" picks (dynamic: the caches are addressed through
runtime data) and on the static one, bf16 and f32: ptxas assembles them
with no spills; every function is in the module (libdevice linked: the one
`.extern` is the scratch arena, the kernel's dynamic shared memory); the
tile functions' scratch is one arena of dynamic shared memory small enough
for any CTA (the sum of per-function static arrays, 64,000 bytes for
Llama-3.2-1B, did not assemble for sm_80); every bf16 linear layer takes
the tensor-core kernel paired with the transposed GEMV.

These real-width graphs stand for the tiny ones too: a tiny model's step
graph has the same tile functions at smaller sizes."""

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

#: Shapes of SHAPES with other fields: Qwen3-30B-A3B with a dense first
#: layer (`mlp_only_layers`), so that one graph has both kinds of MLP.
VARIANTS = {"qwen3-30b-a3b-dense0": ("qwen3-30b-a3b", dict(mlp_only_layers=[0]))}

#: (shape, KV block size or None for a contiguous cache, chip, schedule,
#: dtype): every shape on both chips (paged, "auto"); the contiguous cache;
#: the static schedule on both chips and for each architecture; f32 on
#: both chips and both schedules.
GRAPHS = ([(name, 16, chip, "auto", "bf16") for name in SHAPES for chip in ("sm_80", "sm_90a")] +
          [("qwen3-0.6b", None, "sm_80", "auto", "bf16"),
           ("llama-3.2-1b", None, "sm_80", "static", "bf16"),
           ("qwen3-30b-a3b-dense0", 16, "sm_90a", "static", "bf16"),
           ("qwen3-0.6b", None, "sm_90a", "static", "f32"),
           ("llama-3.2-1b", 16, "sm_80", "auto", "f32")])


@needs_ptxas
@pytest.mark.parametrize("name, kv_block_size, chip, schedule, dtype", GRAPHS)
def test_real_width_step_graph_assembles_without_spills(name, kv_block_size, chip, schedule,
                                                        dtype, tmp_path):
    shape, overrides = VARIANTS.get(name, (name, {}))
    config = ModelConfig.from_dict(shaped_config(shape, layers=2, **overrides))
    if name in VARIANTS:
        assert not config.is_sparse(0) and config.is_sparse(1)
    graph = build_step_graph(config, dtype=dtype, max_seq_len=4096, chunk=256,
                             kv_block_size=kv_block_size)
    kernel = etc.compile(graph, target="cuda", chip=chip, schedule=schedule)
    assert kernel.abi.schedule == ("dynamic" if schedule == "auto" else schedule)
    ptx = kernel.ptx
    assert [line for line in ptx.splitlines() if ".extern" in line and ".shared" not in line] \
        == []
    assert "__etc_scratch" not in ptx  # no static scratch arrays
    # The linear layers' weights are (N, K): the transposed GEMV, with the
    # tensor-core kernel for tiles of many rows in bf16.
    kinds = set(re.findall(r"_tile_(matmul\w*?)_\d+\(", kernel.ir("graph")))
    assert kinds == {"matmul_gemv_t_mma" if dtype == "bf16" else "matmul_gemv_t"}, kinds
    report = assemble(ptx, chip, tmp_path, name)
    assert_no_spills(report)
    if dtype == "bf16":
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
        # The worker (where the other tile bodies are inlined) already uses
        # all 255 registers: the tensor-core tiles stay functions of their own.
        assert re.search(rf"Function properties for {graph.name}_tile_matmul_gemv_t_mma_\d+",
                         report), report
    worker = report.split(f"Compiling entry function '{graph.name}_worker'")[1]
    static = int(re.search(r"(\d+) bytes smem", worker).group(1))
    assert 0 < kernel.abi.shared_bytes and static + kernel.abi.shared_bytes <= STATIC_LIMIT, \
        (static, kernel.abi.shared_bytes)
