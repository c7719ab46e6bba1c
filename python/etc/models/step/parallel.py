"""Tensor parallelism of a model over ranks, Megatron-style: which share of
the heads and MLP columns each rank keeps, and its slices of the weights.

Needs only NumPy (a model loads from the compile cache without MLIR); the
step graph of a shard, with its all-reduces, is `builder.build_step_graph`'s
with `ranks`."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..loading.config import ModelConfig

__all__ = ["shard_config", "shard_weights"]


def shard_config(config: ModelConfig, ranks: int) -> ModelConfig:
    """One rank's share of `config` under Megatron-style tensor parallelism
    over `ranks`: `num_heads / ranks` query heads and `num_kv_heads / ranks`
    KV heads (rank r takes the r-th contiguous group, so its query heads
    use its KV heads), `intermediate_size / ranks` columns of the dense
    MLPs and `moe_intermediate_size / ranks` of every expert's (the experts,
    their router and the norms are on every rank). Raises ValueError
    naming the field that `ranks` does not divide."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"tensor_parallel={ranks!r} must be a positive int")
    fields = ["num_heads", "num_kv_heads"]
    layers = range(config.num_layers)
    if any(not config.is_sparse(i) for i in layers):
        fields.append("intermediate_size")
    if any(config.is_sparse(i) for i in layers):
        fields.append("moe_intermediate_size")
    for field in fields:
        value = getattr(config, field)
        if value % ranks:
            raise ValueError(f"tensor_parallel={ranks}: the model's {field} = {value} is not "
                             f"divisible by {ranks}; each rank needs a whole share")
    return dataclasses.replace(config, num_heads=config.num_heads // ranks,
                               num_kv_heads=config.num_kv_heads // ranks,
                               intermediate_size=config.intermediate_size // ranks,
                               moe_intermediate_size=config.moe_intermediate_size // ranks)


def shard_weights(config: ModelConfig, weights: dict, ranks: int, rank: int) -> dict:
    """Rank `rank`'s slices of the checkpoint's `weights` (Hugging Face's
    (out, in) layout): the rows of the Q, K, V, gate and up projections
    (and of the Q, K and V biases) of its heads and MLP columns, the matching columns of the output and down
    projections; of every expert (stacked as `g.moe` takes them: gate and
    up (E, H, F), down (E, F, H)) its F columns of gate and up and the
    matching rows of down; everything else (the router too) whole."""
    if ranks == 1:
        return weights
    d = config.head_dim
    q = config.num_heads // ranks * d
    kv = config.num_kv_heads // ranks * d
    f = config.intermediate_size // ranks
    rows = {"wq": q, "wk": kv, "wv": kv, "bq": q, "bk": kv, "bv": kv, "w_gate": f, "w_up": f}
    columns = {"wo": q, "w_down": f}
    e = config.moe_intermediate_size // ranks
    # The stacked experts: the axis of their F.
    experts = {"experts_gate": 2, "experts_up": 2, "experts_down": 1}
    shard = {}
    for name, array in weights.items():
        kind = name.split("_", 1)[1] if name.startswith("l") and "_" in name else None
        if kind in rows:
            size = rows[kind]
            shard[name] = np.ascontiguousarray(array[rank * size:(rank + 1) * size])
        elif kind in columns:
            size = columns[kind]
            shard[name] = np.ascontiguousarray(array[:, rank * size:(rank + 1) * size])
        elif kind in experts:
            where = [slice(None)] * array.ndim
            where[experts[kind]] = slice(rank * e, (rank + 1) * e)
            shard[name] = np.ascontiguousarray(array[tuple(where)])
        else:
            shard[name] = array
    return shard
