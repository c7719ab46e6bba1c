"""Step graphs at real widths (2 layers of Llama-3.2-1B, Qwen3-0.6B,
Qwen3-30B-A3B, Granite 3.3 8B, ..., paged or contiguous KV cache) compiled for sm_80 and sm_90a
on the schedule "auto" picks (dynamic: the caches are addressed through
runtime data) and on the static one, bf16 and f32: ptxas assembles them
with no spills; every function is in the module (libdevice linked: the one
`.extern` is the scratch arena, the kernel's dynamic shared memory); the
tile functions' scratch is one arena of dynamic shared memory small enough
for any CTA (the sum of per-function static arrays, 64,000 bytes for
Llama-3.2-1B, did not assemble for sm_80); every bf16 linear layer takes
the tensor-core kernel paired with the transposed GEMV.

The paged "auto" bf16 graph of every shape is also the packed-weight and
the sliding-window graph (issue #31: one assembly where three were): its
weights take every block format of `etc.packed` in turn, some staying bf16
(the packed tiles, GEMV and tensor cores, beside the bf16 ones in one worker), and
Qwen2.5-0.5B and Gemma 3 1B have a sliding and a full layer (the windowed
and the full attention chunk kernels, and Gemma's). The packed tiles'
numerics: test_packed_gpu.py and test_moe_packed.py under the lane
simulation.

These real-width graphs stand for the tiny ones too: a tiny model's step
graph has the same tile functions at smaller sizes."""

from __future__ import annotations

import re

import pytest

import etc
from etc import packed
from etc.models.step.graph import build_step_graph
from etc.models.loading.config import ModelConfig
from etc.models.testing import SHAPES, shaped_config
from ptxas_check import assemble, assert_no_spills, needs_ptxas

#: What a CTA may use without opting in (sm_80 and sm_90a).
STATIC_LIMIT = 48 << 10

#: Shapes of SHAPES with other fields: Qwen3-30B-A3B with a dense first
#: layer (`mlp_only_layers`), so that one graph has both kinds of MLP; and
#: shapes as they are under another name, so that their paged "auto" bf16
#: graph is the plain one (every weight bf16, what a Hugging Face bf16
#: checkpoint compiles to) instead of the mixed one.
VARIANTS = {"qwen3-30b-a3b-dense0": ("qwen3-30b-a3b", dict(mlp_only_layers=[0])),
            "llama-3.2-1b-plain": ("llama-3.2-1b", {}),
            "qwen3-30b-a3b-plain": ("qwen3-30b-a3b", {}),
            "qwen1.5-moe-a2.7b-plain": ("qwen1.5-moe-a2.7b", {})}

#: Shapes whose graphs are tiles of the others' kinds and widths, left out
#: (10 s a graph): Phi-4-mini (partial rotary is a permutation of q/k rows
#: at load and zeros in the RoPE table: the rope tiles are unchanged; head
#: size 128 and 8 KV heads as Qwen3's; every layer sliding as Phi-3-mini's)
#: and SmolLM3-3B (Llama's layers; a NoPE layer lacks a rope tile, and its
#: first is layer 3).
SAME_KERNELS = ("phi-4-mini", "smollm3-3b")

#: Shapes with a sliding and a full layer among their first ones: Qwen2.5-0.5B
#: with its window on for its second layer, Gemma 3 1B with every second
#: layer full (head_dim 256: a whole warp per cache row; q/k norms of 1 + w,
#: GeGLU, the sliding layers' own RoPE). The mixed graphs take these fields.
WINDOWED = {
    "qwen2.5-0.5b": dict(use_sliding_window=True, sliding_window=4096, max_window_layers=1),
    "gemma-3-1b": dict(sliding_window_pattern=2),
}

def _weight_widths(config: ModelConfig) -> dict:
    """Each linear weight's (and stack of experts') name -> its K (the
    values a row holds)."""
    h, q = config.hidden_size, config.num_heads * config.head_dim
    widths = {"embed": h}
    for i in range(config.num_layers):
        if config.mla is not None:
            # DeepSeek's MLA: the projections that may stay packed (k_b, v_b
            # and o gain zero rows or columns at load: always widened).
            widths.update({f"l{i}_wkv_a": h, f"l{i}_wk_pe": h})
            widths.update({f"l{i}_wq": h} if config.mla.q_lora_rank is None else
                          {f"l{i}_wq_a": h, f"l{i}_wq_b": config.mla.q_lora_rank})
        else:
            widths.update({f"l{i}_wq": h, f"l{i}_wk": h, f"l{i}_wv": h, f"l{i}_wo": q})
        if config.is_sparse(i):
            widths.update({f"l{i}_experts_gate": h, f"l{i}_experts_up": h,
                           f"l{i}_experts_down": config.moe_intermediate_size})
            if config.shared_expert_intermediate_size:  # a dense MLP beside them
                widths.update({f"l{i}_shexp_gate": h, f"l{i}_shexp_up": h,
                               f"l{i}_shexp_down": config.shared_expert_intermediate_size})
        else:
            widths.update({f"l{i}_w_gate": h, f"l{i}_w_up": h,
                           f"l{i}_w_down": config.intermediate_size})
    if not config.tie_word_embeddings:
        widths["lm_head"] = h
    return widths


def _formats(config: ModelConfig) -> dict:
    """A block format (or bf16: None) per weight, each as often as the rows
    allow: each weight takes the least used of those whose block divides
    its K (a 256-value K-quant block does not divide Gemma 3 1B's 1152 or
    Qwen2.5-0.5B's 896, where llama.cpp's files use 32-value blocks)."""
    used = dict.fromkeys(WANTED, 0)
    chosen = {}
    for name, k in _weight_widths(config).items():
        fits = [f for f in used if f is None or k % packed.FORMATS[f].block == 0]
        chosen[name] = min(fits, key=lambda f: used[f])
        used[chosen[name]] += 1
    return chosen


#: The formats a mixed graph gives its weights: every block format, and bf16
#: (a MoE model's worker with bf16 and packed tiles spilled 4 bytes on
#: sm_90a while the packed GEMVs were inlined in it: Qwen3-30B-A3B,
#: 2026-11-28; with MXFP4, Qwen2.5-0.5B's and gpt-oss-20b's workers spilled
#: 8 and 4 bytes on sm_90a while the packed GEMVs dequantized every column
#: before their products and looked up IQ4_NL's and MXFP4's tables through
#: four words: `MatmulPackedGPU.chunk_sums`, `PackedVectors.table`).
WANTED = [*packed.FORMATS, None]


def _called_by_worker(ptx: str, name: str) -> set:
    """The tile kernels (stems, without the number) that the worker entry
    calls instead of having them inlined."""
    worker = ptx.split(f".entry {name}_worker(")[1].split("\n}\n")[0]
    return set(re.findall(rf"call(?:\.uni)?\s+(?:\([^)]*\),\s*)?{name}_tile_(\w+?)_\d+,",
                          worker))


#: (shape, KV block size or None for a contiguous cache, chip, schedule,
#: dtype): every shape on both chips (paged, "auto", packed and windowed
#: as above); the contiguous cache; the static schedule on both chips and
#: for each architecture; bf16 experts on both chips; f32 on both chips
#: and both schedules; plain bf16 dense and MoE graphs on sm_90a (their
#: workers spilled 8 and 36 bytes at 255 registers while the mixed graphs
#: of the same shapes assembled clean: `AttentionChunkWarps.MAX_HEADS`).
GRAPHS = ([(name, 16, chip, "auto", "bf16") for name in SHAPES for chip in ("sm_80", "sm_90a")
           # Mixtral's tiles are Qwen3-30B-A3B's kinds (its experts 19x as
           # wide), Granite 3.3 8B's Llama's with its multipliers' scale
           # tasks (Gemma's kind) and unfused residual adds: sm_90a only,
           # 10 s each; gpt-oss-20b's (4 layers: biases, sinks, clamped
           # SwiGLU experts) too, 30-50 s; DeepSeek-V2-Lite's (MLA's heads of
           # 192, softmax experts) 60 s on sm_90a, 88 s on sm_80 (its plain
           # bf16 graph assembled there without spills too, 2026-11-29).
           if (name, chip) not in (("mixtral-8x7b", "sm_80"), ("granite-3.3-8b", "sm_80"),
                                   ("gpt-oss-20b", "sm_80"), ("deepseek-v2-lite", "sm_80"))
           and name not in SAME_KERNELS] +
          [("llama-3.2-1b-plain", 16, "sm_90a", "auto", "bf16"),
           ("qwen3-30b-a3b-plain", 16, "sm_90a", "auto", "bf16"),
           ("qwen1.5-moe-a2.7b-plain", 16, "sm_90a", "auto", "bf16")] +
          # Contiguous caches under both schedules, static ones for bf16 (the
          # schedule shapes the worker program, the dtype the tiles), f32 on
          # both chips.
          [("llama-3.2-1b", None, "sm_80", "static", "bf16"),
           ("qwen3-30b-a3b-dense0", 16, "sm_90a", "static", "bf16"),
           ("qwen3-30b-a3b-dense0", 16, "sm_80", "auto", "bf16"),
           ("qwen3-0.6b", None, "sm_90a", "auto", "f32"),
           ("llama-3.2-1b", 16, "sm_80", "auto", "f32")])


@needs_ptxas
@pytest.mark.parametrize("name, kv_block_size, chip, schedule, dtype", GRAPHS)
def test_real_width_step_graph_assembles_without_spills(name, kv_block_size, chip, schedule,
                                                        dtype, tmp_path):
    shape, overrides = VARIANTS.get(name, (name, {}))
    mixed = (kv_block_size, schedule, dtype) == (16, "auto", "bf16") and name in SHAPES
    chosen = {}
    if mixed:
        # Two layers, or as many as give every format (and bf16) a weight
        # (Qwen2.5-0.5B's only K that a 256-value block divides is its
        # MLP's down projection).
        overrides = WINDOWED.get(name, {})
        for layers in (2, 3, 4):
            config = ModelConfig.from_dict(shaped_config(shape, layers=layers, **overrides))
            chosen = _formats(config)
            if set(chosen.values()) == set(WANTED):
                break
        assert set(chosen.values()) == set(WANTED), chosen
        if name in WINDOWED:
            assert 0 < len(config.sliding_layers) < config.num_layers, config.sliding_layers
    else:
        config = ModelConfig.from_dict(shaped_config(shape, layers=2, **overrides))
    formats = {weight: fmt for weight, fmt in chosen.items() if fmt is not None}
    if "mlp_only_layers" in overrides:
        assert not config.is_sparse(0) and config.is_sparse(1)
    graph = build_step_graph(config, dtype=dtype, max_seq_len=8192 if name in WINDOWED else 4096,
                             chunk=256, kv_block_size=kv_block_size, weight_formats=formats)
    kernel = etc.compile(graph, target="cuda", chip=chip, schedule=schedule)
    assert kernel.abi.schedule == ("dynamic" if schedule == "auto" else schedule)
    ptx = kernel.ptx
    assert [line for line in ptx.splitlines() if ".extern" in line and ".shared" not in line] \
        == []
    assert "__etc_scratch" not in ptx  # no static scratch arrays
    # The linear layers' weights are (N, K): the transposed GEMV, with the
    # tensor-core kernel for tiles of many rows in bf16.
    kinds = set(re.findall(r"_tile_(matmul\w*?)_\d+\(", kernel.ir("graph")))
    # (sm_90a: wgmma; sm_80: mma.sync.)
    tensor_cores = "wgmma" if chip == "sm_90a" else "mma"
    unpacked = f"matmul_gemv_t_{tensor_cores}" if dtype == "bf16" else "matmul_gemv_t"
    # (An untied embedding is only gathered; experts take the MoE tiles.)
    # Packed weights: their GEMV, with the tensor cores from 16 rows in bf16
    # (the values dequantized into the shared tile).
    packed_suffix = "_gemv_mma" if dtype == "bf16" else "_gemv"
    # A weight whose rows no GEMV tile width divides (Granite 3.x's LM head
    # of 49,159 tokens; Qwen2-MoE's shared expert gate, one row) takes the
    # GEMV alone, its last column tile ragged (the tensor cores need whole
    # column tiles): float `matmul_gemv_t`, packed `matmul_<format>_gemv`.
    head = "embed" if config.tie_word_embeddings else "lm_head"
    ragged = {head} if config.vocab_size % 8 != 0 else set()
    if config.shared_expert_gate:
        ragged |= {f"l{i}_shexp_gate_inp" for i in range(config.num_layers)
                   if config.is_sparse(i)}
    ragged_kinds = {f"matmul_{formats[weight]}_gemv" if weight in formats else "matmul_gemv_t"
                    for weight in ragged}
    packed_kinds = {f"matmul_{fmt}{packed_suffix}" for weight, fmt in formats.items()
                    if "experts" not in weight
                    and (weight != "embed" or config.tie_word_embeddings)
                    and weight not in ragged}
    has_unpacked = not mixed or config.mla is not None or any(
        fmt is None for weight, fmt in chosen.items() if weight not in ragged)
    assert kinds == ({unpacked} if has_unpacked else set()) | packed_kinds | ragged_kinds, kinds
    if mixed and config.num_experts:
        # The MoE tiles read stacks of experts' blocks, (E, N, bytes of K).
        assert re.search(r"tile_moe_up_\d+\(%arg0: memref<\?x\d+xbf16>, "
                         r"%arg1: memref<\d+x\d+x\d+xi8>", kernel.ir("graph"))
    if mixed and name in WINDOWED:
        # The windowed and the full chunk kernels.
        assert len(set(re.findall(r"step_tile_attention_chunk_warps_\d+", ptx))) == 2
    report = assemble(ptx, chip, tmp_path, name)
    assert_no_spills(report)
    # The tensor-core and the packed GEMV tiles are calls in the worker
    # (`out_of_line_on_gpu`): inlined, their registers add to the worker's.
    called = _called_by_worker(ptx, graph.name)
    assert packed_kinds <= called, (packed_kinds, called)
    ragged_packed = ragged_kinds - {"matmul_gemv_t"}
    assert ragged_packed <= called, (ragged_packed, called)
    # (Packed weights take mma.sync on both chips.)
    if dtype == "bf16" and (packed_kinds or has_unpacked and chip != "sm_90a"):
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    if dtype == "bf16" and has_unpacked and chip == "sm_90a":
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx)
    if dtype == "bf16" and has_unpacked:
        assert unpacked in called, called
    worker = report.split(f"Compiling entry function '{graph.name}_worker'")[1]
    static = int(re.search(r"(\d+) bytes smem", worker).group(1))
    assert 0 < kernel.abi.shared_bytes and static + kernel.abi.shared_bytes <= STATIC_LIMIT, \
        (static, kernel.abi.shared_bytes)
