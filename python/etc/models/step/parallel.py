"""Tensor parallelism of a model over ranks, Megatron-style: which share of
the heads and MLP columns each rank keeps, and its slices of the weights.

Needs only NumPy (a model loads from the compile cache without MLIR); the
step graph of a shard, with its all-reduces, is `builder.build_step_graph`'s
with `ranks`."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from ..loading.config import ModelConfig

__all__ = ["shard_config", "shard_weights", "shard_weight", "unaligned_packed"]


def shard_config(config: ModelConfig, ranks: int) -> ModelConfig:
    """One rank's share of `config` under Megatron-style tensor parallelism
    over `ranks`: `num_heads / ranks` query heads and `num_kv_heads / ranks`
    KV heads (rank r takes the r-th contiguous group, so its query heads
    use its KV heads), `intermediate_size / ranks` columns of the dense
    MLPs and `moe_intermediate_size / ranks` of every expert's (the experts,
    their router and the norms are on every rank), and
    `shared_expert_intermediate_size / ranks` of a shared expert's (its
    gate vector whole). Raises ValueError
    naming the field that `ranks` does not divide."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"tensor_parallel={ranks!r} must be a positive int")
    if ranks > 1 and config.qk_norm_projection:
        # A rank would norm its own heads' share of q and k: another rms.
        raise NotImplementedError(
            f"tensor_parallel={ranks}: {config.architecture}'s q/k norms span the whole q and "
            f"k projections (every head), which the ranks split by heads; tensor-parallel "
            f"{config.architecture} is not implemented: run it on one rank")
    fields = ["num_heads", "num_kv_heads"]
    layers = range(config.num_layers)
    if any(not config.is_sparse(i) for i in layers):
        fields.append("intermediate_size")
    if any(config.is_sparse(i) for i in layers):
        fields.append("moe_intermediate_size")
        if config.shared_expert_intermediate_size:
            fields.append("shared_expert_intermediate_size")
    for field in fields:
        value = getattr(config, field)
        if value % ranks:
            raise ValueError(f"tensor_parallel={ranks}: the model's {field} = {value} is not "
                             f"divisible by {ranks}; each rank needs a whole share")
    return dataclasses.replace(
        config, num_heads=config.num_heads // ranks, num_kv_heads=config.num_kv_heads // ranks,
        intermediate_size=config.intermediate_size // ranks,
        moe_intermediate_size=config.moe_intermediate_size // ranks,
        shared_expert_intermediate_size=config.shared_expert_intermediate_size // ranks)


def _splits(config: ModelConfig, ranks: int) -> dict:
    """Each split weight kind -> (its axis unpacked, its axis packed, the
    values per rank along it, whether that axis is the K of the product
    (row-parallel: blocks of a packed row split there))."""
    d = config.head_dim
    q = config.num_heads // ranks * d
    kv = config.num_kv_heads // ranks * d
    f = config.intermediate_size // ranks
    e = config.moe_intermediate_size // ranks
    s = config.shared_expert_intermediate_size // ranks
    splits = {kind: (0, 0, size, False) for kind, size in (
        ("wq", q), ("wk", kv), ("wv", kv), ("bq", q), ("bk", kv), ("bv", kv), ("w_gate", f),
        ("w_up", f), ("shexp_gate", s), ("shexp_up", s))}
    splits.update(wo=(1, 1, q, True), w_down=(1, 1, f, True), shexp_down=(1, 1, s, True))
    # The stacked experts, widened or packed, in (E, out, in): gate and
    # up (E, F, H), down (E, H, F).
    splits.update(experts_gate=(1, 1, e, False), experts_up=(1, 1, e, False),
                  experts_down=(2, 2, e, True))
    # gpt-oss: the attention sinks go with their heads, the experts' gate
    # and up biases (E, F) with their rows.
    splits.update(sinks=(0, 0, config.num_heads // ranks, False),
                  experts_gate_b=(1, 1, e, False), experts_up_b=(1, 1, e, False))
    return splits


#: The weights added inside a partial sum that the all-reduce adds over the
#: ranks, which must count once: rank 0 keeps them, the others hold zeros.
#: gpt-oss's down-projection bias b2 (E, H) is added to each chosen
#: expert's output before its routing weight multiplies it, inside `g.moe`,
#: so it cannot move after the reduce; rank 0's partial sum carries
#: weight * (down + b2), the others' weight * down, and their sum is the
#: whole layer's. (The o_proj bias, added to the attention output as a
#: whole, is added after the reduce instead: `build_step_graph`.)
_RANK_ZERO_ONLY = ("experts_down_b",)


def _kind(name: str):
    return name.split("_", 1)[1] if name.startswith("l") and "_" in name else None


def unaligned_packed(config: ModelConfig, formats: dict, ranks: int) -> dict:
    """The packed weights of `formats` (name -> format of `etc.packed`)
    that cannot stay packed when split over `ranks`, name -> why: a
    row-parallel weight (an output or down projection, a layer's down
    experts) whose share of K per rank is not whole blocks of its format
    (a block's scales cover its values, so a rank's share must be whole
    blocks of every row). The gate and up experts of a layer whose down
    experts cannot stay packed go with them (`g.moe` takes a layer's three
    stacks in one layout). Column-parallel weights split by whole rows and
    always stay packed; replicated ones are not split."""
    from ... import packed

    if ranks == 1:
        return {}
    splits = _splits(config, ranks)
    out = {}
    for name, fmt in formats.items():
        split = splits.get(_kind(name))
        if split is None or not split[3]:
            continue
        block = packed.FORMATS[fmt].block
        if split[2] % block:
            out[name] = (f"{name!r} ({fmt}, blocks of {block} values) splits along K into "
                         f"{split[2]} values per rank over tensor_parallel={ranks}, not whole "
                         f"blocks")
    for name in [n for n in out if _kind(n) == "experts_down"]:
        layer = name.split("_experts_")[0]
        for other in (f"{layer}_experts_gate", f"{layer}_experts_up"):
            if other in formats:
                out[other] = (f"{other!r} ({formats[other]}) goes with {name!r}, which is "
                              f"widened: a layer's experts are in one layout")
    return out


def shard_weight(config: ModelConfig, name: str, array: np.ndarray, ranks: int, rank: int,
                 fmt: Optional[str] = None) -> np.ndarray:
    """Rank `rank`'s slice of weight `name` (see `shard_weights`); `fmt`,
    the `etc.packed` format it is stored in (uint8 blocks, (..., bytes)),
    or None. A slice of a private array is copied (the whole one can be
    freed); a slice of a read-only file map stays a view where it is
    contiguous (its rows: only their pages become resident)."""
    if ranks == 1:
        return array
    if _kind(name) in _RANK_ZERO_ONLY:
        return array if rank == 0 else np.zeros(array.shape, array.dtype)
    split = _splits(config, ranks).get(_kind(name))
    if split is None:
        return array
    axis, packed_axis, size, _ = split
    start, stop = rank * size, (rank + 1) * size
    if fmt is not None:
        from ... import packed

        axis = packed_axis
        if axis == array.ndim - 1:  # along K: in whole blocks of bytes
            f = packed.FORMATS[fmt]
            if size % f.block:
                raise ValueError(f"{name!r} ({fmt}): {size} values per rank are not whole "
                                 f"blocks of {f.block}")
            start, stop = start // f.block * f.nbytes, stop // f.block * f.nbytes
    where = [slice(None)] * array.ndim
    where[axis] = slice(start, stop)
    part = array[tuple(where)]
    if array.flags.writeable:
        return np.array(part, order="C")
    return np.ascontiguousarray(part)


def shard_weights(config: ModelConfig, weights: dict, ranks: int, rank: int,
                  formats: Optional[dict] = None) -> dict:
    """Rank `rank`'s slices of the checkpoint's `weights` (Hugging Face's
    (out, in) layout): the rows of the Q, K, V, gate and up projections
    (and of the Q, K and V biases) of its heads and MLP columns, the
    matching columns of the output and down projections; of every expert
    (stacked (E, out, in) as `g.moe` takes them with transpose_w: gate
    and up (E, F, H), down (E, H, F)) its F rows of gate and up and the
    matching columns of down; a shared expert's like a dense MLP's;
    everything else (the router, a shared expert's gate vector, the
    embeddings, the LM head) whole. The weights named in `formats` are packed storage of
    that format: split by whole rows, or along K by whole blocks (see
    `unaligned_packed` for the weights that cannot be).

    gpt-oss's: each rank's heads' attention sinks, its rows of the
    experts' gate and up biases; the experts' down biases on rank 0 and
    zeros on the others (`_RANK_ZERO_ONLY`); the router's and the o_proj
    biases whole."""
    formats = formats or {}
    return {name: shard_weight(config, name, array, ranks, rank, formats.get(name))
            for name, array in weights.items()}
