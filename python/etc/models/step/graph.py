"""The step graph of a decoder-only model: one graph that runs a ragged
batch (each request brings 1 ... n new tokens), so one compiled kernel
serves prefill, decode and any mix of them.

Symbols: T (new tokens in the step), R (requests in the step), and for a
contiguous cache S (cache slots) and L (cache length), for a paged one N
(blocks in the pool) and M (entries per block table), and NW (blocks in
the sliding layers' pool of a model with full layers too). Inputs: the
token ids (T,), the ragged batch's index inputs
(`etc.graph_llm.RaggedBatch`; `block_table` (R, M) in place of
`request_slot` when paged, and `window_block_table` (R, M) for those
sliding layers: `etc.models.step.kv_cache.layer_tables`), the weights
(named as `Checkpoint.weights` names them; those in `weight_formats`
packed, in a block format of `etc.packed`) and the RoPE frequencies
`inv_freq` (and `inv_freq_local` for the sliding layers' own RoPE,
Gemma 3; with partial rotary, 0 for the pairs left alone, and the q and k
weights' rows permuted: `etc.models.loading.partial_rotary`; DeepSeek's
multi-head latent attention: its weights in `mla_layout`'s layout and the
pe key's placement `mla_k_pe_place`, `etc.models.step.mla`). State: each
layer's K and V caches, `l<i>_k_cache` / `l<i>_v_cache`, (S, L, H_kv *
head_dim) or (N or NW, P, H_kv * head_dim), in the KV dtype (by default
the compute dtype). The step chooses a token after C
of its tokens (a symbol): `sample_rows` (C,) i32 are their indices (each
request's last new token, and the verified rows of a speculating
request), `sample_position` (C,) the positions of the chosen tokens (the
counters of their random numbers). Sampling inputs, one per choice:
`temperature`, `top_p`, `min_p` f32 (C,), `top_k`, `logprobs` i32 (C,) and
`seed` i32 (C, 2) (see `etc.Graph.sample`), and the entries that change
the logits before (penalties, biases: `adjust_tokens` i32, `adjust_add`,
`adjust_scale` f32 (C, A), `etc.Graph.adjust_logits`) and the tokens each
choice may take (`token_mask` i32 (C, ceil(V / 32)), a bit per token,
where `token_masked` (C,) is not 0: structured output). Outputs: `logits`
(C, V), before those changes, of those rows, `next_ids` (C,), the tokens
sampled from them (the argmax where the temperature is 0), and for the
choices whose `logprobs` is >= 0 the log-probabilities of that token and
of their `logprobs` most likely ones: `next_ids_logprobs` (C, 1 +
MAX_LOGPROBS) f32 and `next_ids_logprob_ids` (C, MAX_LOGPROBS).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from ...graph import Graph
from ..loading.config import ModelConfig
from . import mla
from .kv_cache import WINDOW_TABLE, layer_tables

__all__ = ["build_step_graph", "SAMPLING_INPUTS", "MAX_LOGPROBS"]

#: The per-request (R,) sampling inputs and their dtypes (the seed, (R, 2)
#: i32, comes with them).
SAMPLING_INPUTS = (("temperature", "f32"), ("top_k", "i32"), ("top_p", "f32"),
                   ("min_p", "f32"), ("logprobs", "i32"))

#: The most top log-probabilities a request may ask for (OpenAI's bound).
MAX_LOGPROBS = 20


def round_to_dtype(value: float, dtype: str) -> float:
    """`value` as a buffer of `dtype` holds it (bf16 and f16 rounded)."""
    if dtype == "f16":
        return float(np.float16(value))
    if dtype == "bf16":
        from ... import bfloat16

        array = np.array([value], np.float32)
        return float(bfloat16.from_bits(bfloat16.to_bits(array))[0])
    return float(np.float32(value))


def build_step_graph(config: ModelConfig, *, dtype: str = "f32", max_seq_len: int,
                     chunk: int, name: str = "step", ranks: int = 1,
                     kv_dtype: str | None = None,
                     kv_block_size: Optional[int] = None,
                     weight_formats: Optional[dict] = None) -> Graph:
    """The step graph of `config`, weights and activations in `dtype`,
    attention chunks of `chunk` positions over caches of at most
    `max_seq_len` positions, in `kv_dtype` (default: `dtype`).

    With `kv_block_size` P the KV caches are paged: pools (N, P, H_kv *
    head_dim) of N blocks (a symbol) addressed through the `block_table`
    (R, M) input (M a symbol), in place of slots (S, L, H_kv * head_dim)
    addressed through `request_slot`; the sliding layers of a model with
    full layers too have a pool of their own (NW blocks) and table
    (`window_block_table`, R x M), whose blocks leave as the windows move.

    With `ranks` > 1, `config` is one rank's shard of a tensor-parallel
    model (`shard_config`: its share of the heads and of the MLP and expert
    columns), and the partial sums of the attention output, MLP down
    projections and expert layers are added over the ranks by an
    `all_reduce` fused into the step (`etc.models.step.parallel`); each
    rank's attention has its heads' sinks, the o_proj bias is added after
    the reduce, and an expert's down bias is in rank 0's partial sum only
    (its weight is zero on the others: `parallel.shard_weight`). q/k norms
    over the whole projections (OLMo) all-reduce each rank's sums of
    squares of its shares of q and k, (T, 2) f32, and norm the shares by
    the whole widths (`split_rmsnorm`).

    `weight_formats` (weight name -> a format of `etc.packed`) names the
    weights that stay packed: matrices read by rows (the projections, the
    LM head, a MoE layer's experts, then (E, out, in) as llama.cpp stacks
    them) and the embeddings (gathered into `dtype` rows); the others are
    in `dtype`."""
    formats = weight_formats or {}
    if config.parallel_block and (config.is_moe or config.sandwich_norms or config.o_bias or
                                  config.residual_multiplier is not None or
                                  not config.input_norms):
        raise NotImplementedError(
            f"build_step_graph: {config.architecture}: a parallel attention and MLP block "
            f"(Cohere's) with experts, sandwich norms, an o_proj bias, a residual multiplier "
            f"or without input norms is not implemented")
    if config.layer_norm and config.qk_norm_projection:
        raise NotImplementedError(
            f"build_step_graph: {config.architecture}: LayerNorms (Cohere's) with q/k norms "
            f"over the whole projections (OLMo's RMSNorms) are not implemented")
    cache_dtype = dtype if kv_dtype is None else kv_dtype
    c = config
    g = Graph(name, ranks=ranks)

    def reduced(partial):
        return g.all_reduce(partial) if ranks > 1 else partial

    eps, offset = c.rms_norm_eps, c.norm_offset

    def norm(x, w):
        """RMSNorm, or Cohere's LayerNorm (no bias)."""
        if c.layer_norm:
            return g.layernorm(x, w, eps=eps)
        return g.rmsnorm(x, w, eps, offset=offset)

    def residual_add(x, block):
        """x + block, the block's output times Granite's residual multiplier
        first (rounded to the dtype, as transformers rounds it)."""
        if c.residual_multiplier is not None:
            block = g.scale(block, c.residual_multiplier)
        return g.add(x, block)

    def residual_matmul(a, w, x, post_norm=None):
        """x + a Wᵀ: on one rank the residual is added in the matmul's tiles
        (no add task, no synchronisation of its own); on several, after
        the all-reduce of the ranks' partial products. With `post_norm`
        (Gemma, GLM-4, OLMo 2 and 3), x + norm(a Wᵀ); with Granite's residual multiplier m,
        x + m (a Wᵀ)."""
        if c.residual_multiplier is not None:
            block = reduced(g.matmul(a, w, transpose_b=True))
            return residual_add(x, block if post_norm is None else norm(block, post_norm))
        if post_norm is not None:
            return g.add(x, norm(reduced(g.matmul(a, w, transpose_b=True)), post_norm))
        if ranks > 1:
            return g.add(x, g.all_reduce(g.matmul(a, w, transpose_b=True)))
        return g.matmul(a, w, transpose_b=True, residual=x)

    T, R = g.symbol("T"), g.symbol("R")
    h, d = c.hidden_size, c.head_dim
    ids = g.input("ids", (T,), "i32")
    # Each table input's batch and cache shape.
    if kv_block_size is None:
        S, L = g.symbol("S"), g.symbol("L")
        tables = ["request_slot"] * c.num_layers
        addressed = {"request_slot": (g.ragged_batch(T, R), (S, L, c.num_kv_heads * d))}
    else:
        N, M = g.symbol("N"), g.symbol("M")
        tables = layer_tables(c)
        batch = g.ragged_batch(T, R, blocks_per_request=M)
        addressed = {"block_table": (batch, (N, kv_block_size, c.num_kv_heads * d))}
        if WINDOW_TABLE in tables:
            # The same width M: the attentions' chunk grids, and so the
            # scratch they share, are the same for both tables.
            window_table = g.input(WINDOW_TABLE, (R, M), "i32")
            g.index_range(window_table, low=0)
            addressed[WINDOW_TABLE] = (replace(batch, block_table=window_table),
                                       (g.symbol("NW"), kv_block_size, c.num_kv_heads * d))

    def weight(key: str, shape: tuple):
        return g.input(key, shape, formats.get(key, dtype))

    def post_norm(key: str):
        return weight(key, (h,)) if c.sandwich_norms else None

    def shared_expert(i: int, normed, routed):
        """routed + layer i's shared expert (this rank's share of its
        columns: its partial sum joins the experts' before the all-reduce):
        a SwiGLU MLP of ordinary matmuls that the experts' tasks need not
        wait for, whose down projection adds the routed output in its tiles
        (Granite: moe + shared, one rounding as transformers'); Qwen2-MoE's
        output scaled per token by sigmoid(normed . w) first (its (1, H) w
        whole on every rank), then added."""
        f = c.shared_expert_intermediate_size
        gated = g.silu_mul(g.matmul(normed, weight(f"l{i}_shexp_gate", (f, h)), transpose_b=True),
                           g.matmul(normed, weight(f"l{i}_shexp_up", (f, h)), transpose_b=True))
        down = weight(f"l{i}_shexp_down", (h, f))
        if not c.shared_expert_gate:
            return g.matmul(gated, down, transpose_b=True, residual=routed)
        logit = g.matmul(normed, weight(f"l{i}_shexp_gate_inp", (1, h)), transpose_b=True)
        return g.add(routed, g.sigmoid_mul(logit, g.matmul(gated, down, transpose_b=True)))

    def head_norms(i: int, q, k):
        """q and k of layer i, each head normed: Qwen3's RMSNorms of one
        (head_dim,) weight, or Command R+'s LayerNorms of a weight per head."""
        if c.layer_norm:
            return tuple(g.head_layernorm(x, weight(f"l{i}_{n}_norm", (heads * d,)), head_dim=d,
                                          eps=eps)
                         for x, n, heads in ((q, "q", c.num_heads), (k, "k", c.num_kv_heads)))
        return tuple(g.head_rmsnorm(x, weight(f"l{i}_{n}_norm", (d,)), head_dim=d, eps=eps,
                                    offset=offset) for x, n in ((q, "q"), (k, "k")))

    def input_norm(x, key: str):
        """x normed before a block (not in OLMo 2 and 3, which norm outputs only)."""
        return norm(x, weight(key, (h,))) if c.input_norms else x

    embed = weight("embed", (c.vocab_size, h))
    # The RoPE frequencies: `inv_freq`, and the sliding layers' own.
    rope_tables = {name: g.input(name, (d // 2,), "f32") for name in c.rope_tables()}
    x = g.embedding(embed, ids, dtype=dtype)
    if c.embedding_scale is not None:
        # Gemma: sqrt(hidden) in the compute dtype, as transformers casts
        # it before multiplying.
        x = g.scale(x, round_to_dtype(c.embedding_scale, dtype))
    if c.embedding_multiplier is not None:
        # Granite: a Python float multiplies the embeddings (transformers
        # computes the product in float32 and rounds it once).
        x = g.scale(x, c.embedding_multiplier)
    # DeepSeek's MLA: the shared pe key's placement into every head.
    place = mla.place_input(c, weight) if c.mla is not None else None
    previous_attention = None
    for i in range(c.num_layers):
        # Attention block, over the caches of the layer's table.
        batch, cache_shape = addressed[tables[i]]
        normed = input_norm(x, f"l{i}_attn_norm")
        if c.mla is not None:  # DeepSeek: q, k (rotated) and v of the latent attention
            q, k, v = mla.project(g, c, i, normed, weight, place, batch.positions,
                                  rope_tables["inv_freq"])
        else:
            q = g.matmul(normed, weight(f"l{i}_wq", (c.num_heads * d, h)), transpose_b=True)
            k = g.matmul(normed, weight(f"l{i}_wk", (c.num_kv_heads * d, h)), transpose_b=True)
            v = g.matmul(normed, weight(f"l{i}_wv", (c.num_kv_heads * d, h)), transpose_b=True)
        if c.qkv_bias:
            q = g.add(q, weight(f"l{i}_bq", (c.num_heads * d,)))
            k = g.add(k, weight(f"l{i}_bk", (c.num_kv_heads * d,)))
            v = g.add(v, weight(f"l{i}_bv", (c.num_kv_heads * d,)))
        if c.qk_norm_projection and ranks > 1:
            # OLMo 2, OLMo 3, OLMoE split by heads: the norm's statistic
            # spans every rank's heads, so each rank sums its share's
            # squares and one all-reduce adds q's and k's together.
            totals = g.all_reduce(g.sum_squares(q, k))
            q = g.split_rmsnorm(q, weight(f"l{i}_q_norm", (c.num_heads * d,)), totals,
                                width=c.num_heads * d * ranks, column=0, eps=eps, offset=offset)
            k = g.split_rmsnorm(k, weight(f"l{i}_k_norm", (c.num_kv_heads * d,)), totals,
                                width=c.num_kv_heads * d * ranks, column=1, eps=eps,
                                offset=offset)
        elif c.qk_norm_projection:
            # OLMo 2, OLMo 3, OLMoE: one norm over all of q's (k's) heads.
            q = g.rmsnorm(q, weight(f"l{i}_q_norm", (c.num_heads * d,)), eps, offset=offset)
            k = g.rmsnorm(k, weight(f"l{i}_k_norm", (c.num_kv_heads * d,)), eps, offset=offset)
        elif c.qk_norm and not c.qk_norm_after_rope:
            q, k = head_norms(i, q, k)
        if c.uses_rope(i) and c.mla is None:  # not SmolLM3's NoPE layers (MLA: rotated)
            inv_freq = rope_tables["inv_freq_local" if c.local_rope(i) else "inv_freq"]
            q = g.rope(q, batch.positions, head_dim=d, inv_freq=inv_freq)
            k = g.rope(k, batch.positions, head_dim=d, inv_freq=inv_freq)
        if c.qk_norm_after_rope:  # Hunyuan dense: the rotated q and k normed
            q, k = head_norms(i, q, k)
        k_cache = g.kv_append(g.state(f"l{i}_k_cache", cache_shape, cache_dtype), k, batch)
        v_cache = g.kv_append(g.state(f"l{i}_v_cache", cache_shape, cache_dtype), v, batch)
        # gpt-oss: one learnt logit per head joins each softmax (float32).
        sinks = {"sinks": g.input(f"l{i}_sinks", (c.num_heads,), "f32")} \
            if c.attention_sinks else {}
        attended = g.attention(q, k_cache, v_cache, batch, head_dim=d, chunk=chunk,
                               max_length=max_seq_len, scale=c.attention_scale_of(i),
                               window=c.window(i), softcap=c.attn_logit_softcapping,
                               scratch_from=previous_attention, **sinks)
        previous_attention = attended
        wo = weight(f"l{i}_wo", (h, c.num_heads * d))
        if c.parallel_block:
            # Cohere: the MLP reads the attention's input norm, and x +
            # attn + mlp is summed below (on several ranks the two partial
            # products are added first: one all-reduce per layer).
            attention_out = g.matmul(attended, wo, transpose_b=True,
                                     residual=x if ranks == 1 else None)
        elif c.o_bias:
            # gpt-oss: x + (a Woᵀ + bo), the bias added to the projection
            # before the residual, as transformers rounds it; on several
            # ranks to the reduced sum, so that it counts once.
            x = g.add(x, g.add(reduced(g.matmul(attended, wo, transpose_b=True)),
                               weight(f"l{i}_bo", (h,))))
        else:
            x = residual_matmul(attended, wo, x, post_norm(f"l{i}_post_attn_norm"))
        # MLP block: dense SwiGLU (GeGLU), or experts.
        if not c.parallel_block:
            normed = input_norm(x, f"l{i}_mlp_norm")
        if c.is_sparse(i):
            # Every rank routes the same (the router and its input are
            # whole) and adds its share of each chosen expert's columns.
            # Experts, float or packed, stay in the checkpoint's layout,
            # each a Linear's (out, in): stacks (E, F, H) and (E, H, F).
            e, f = c.num_experts, c.moe_intermediate_size
            extra = {}
            if c.router_bias:
                extra["router_b"] = weight(f"l{i}_router_b", (e,))
            if c.expert_bias:
                # gpt-oss: biases of each expert's gate, up and down.
                extra.update(b1=weight(f"l{i}_experts_gate_b", (e, f)),
                             b_up=weight(f"l{i}_experts_up_b", (e, f)),
                             b2=weight(f"l{i}_experts_down_b", (e, h)))
            # The routing options (their defaults: plain softmax routing).
            # GLM-4.5, DeepSeek-V3: sigmoid scores; DeepSeek-V2: softmax
            # scores times a routed scale, groups scored by their best.
            extra.update(scoring=c.moe_scoring, routed_scale=c.routed_scaling_factor,
                         n_group=c.n_group, topk_group=c.topk_group,
                         group_score=c.moe_group_score, norm_min=c.moe_norm_min)
            if c.selection_bias:  # GLM-4.5's, DeepSeek-V3's, ERNIE 4.5's (softmax scores)
                extra["selection_bias"] = g.input(f"l{i}_selection_bias", (e,), "f32")
            if c.expert_activation != "silu":
                extra.update(activation=c.expert_activation, swiglu_limit=c.swiglu_limit,
                             swiglu_alpha=c.swiglu_alpha)
            block = g.moe(normed, weight(f"l{i}_router", (h, e)),
                          weight(f"l{i}_experts_gate", (e, f, h)),
                          weight(f"l{i}_experts_down", (e, h, f)), c.num_experts_per_tok,
                          w_up=weight(f"l{i}_experts_up", (e, f, h)),
                          normalize=c.norm_topk_prob, transpose_w=True, **extra)
            if c.shared_expert_intermediate_size:
                block = shared_expert(i, normed, block)
            x = residual_add(x, reduced(block))
        else:
            f = c.intermediate_size
            gate = g.matmul(normed, weight(f"l{i}_w_gate", (f, h)), transpose_b=True)
            up = g.matmul(normed, weight(f"l{i}_w_up", (f, h)), transpose_b=True)
            gated = g.gelu_mul(gate, up) if c.hidden_act == "gelu_pytorch_tanh" else \
                g.silu_mul(gate, up)
            down = weight(f"l{i}_w_down", (h, f))
            if not c.parallel_block:
                x = residual_matmul(gated, down, x, post_norm(f"l{i}_post_mlp_norm"))
            elif ranks == 1:
                # (x + attn) + mlp, each sum rounded, as transformers adds them.
                x = g.matmul(gated, down, transpose_b=True, residual=attention_out)
            else:
                x = g.add(x, g.all_reduce(g.matmul(gated, down, transpose_b=True,
                                                   residual=attention_out)))
    # The rows a token is chosen after (`sample_rows`, C of them): each
    # request's last new token, and every row of a speculating request
    # (its proposed tokens are verified against these choices).
    C = g.symbol("C")
    rows = g.input("sample_rows", (C,), "i32")
    g.index_range(rows, below=T)
    last = g.embedding(x, rows)
    normed = norm(last, weight("final_norm", (h,)))
    head = embed if c.tie_word_embeddings else weight("lm_head", (c.vocab_size, h))
    cap, multiplier = c.final_logit_softcapping, c.logits_multiplier
    last_step = "softcap" if cap else "scale" if multiplier else "matmul"
    logits = g.matmul(normed, head, transpose_b=True,
                      name="logits" if last_step == "matmul" else None)
    if multiplier:
        # Granite's logits / logits_scaling, Cohere's logits * logit_scale,
        # before sampling, penalties and log-probabilities (they all read
        # `logits`).
        logits = g.scale(logits, multiplier, name="logits" if last_step == "scale" else None)
    if cap:
        logits = g.softcap(logits, cap, name="logits")
    # A chosen token's position (the counter of its random number) is its
    # row's position + 1.
    sampling = {name: g.input(name, (C,), dtype) for name, dtype in SAMPLING_INPUTS}
    # Penalties and biases: A entries per choice change its logits first.
    A = g.symbol("A")
    # And a choice's token bitmask (structured output) keeps only the
    # tokens it allows.
    adjusted = g.adjust_logits(logits, g.input("adjust_tokens", (C, A), "i32"),
                               g.input("adjust_add", (C, A), "f32"),
                               g.input("adjust_scale", (C, A), "f32"),
                               mask=g.input("token_mask", (C, -(-c.vocab_size // 32)), "i32"),
                               masked=g.input("token_masked", (C,), "i32"))
    next_ids, logprobs, logprob_ids = g.sample(
        adjusted, seed=g.input("seed", (C, 2), "i32"),
        position=g.input("sample_position", (C,), "i32"), name="next_ids",
        max_logprobs=MAX_LOGPROBS, **sampling)
    g.output(logits, next_ids, logprobs, logprob_ids)
    return g

