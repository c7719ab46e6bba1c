"""Tensor parallelism of a model over ranks, Megatron-style: which share of
the heads and MLP columns each rank keeps, and its slices of the weights.

Needs only NumPy (a model loads from the compile cache without MLIR); the
step graph of a shard, with its all-reduces, is `graph.build_step_graph`'s
with `ranks`."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from ..loading.config import ModelConfig

__all__ = ["shard_config", "shard_weights", "shard_weight", "unaligned_packed", "padded_blocks"]

#: The MLP widths a split shares out, and the weight kinds split along
#: each: column-parallel ones (rows of the width), then the row-parallel
#: down projection (K the width).
_WIDTHS = {
    "intermediate_size": ("w_gate", "w_up", "w_down"),
    "moe_intermediate_size": ("experts_gate", "experts_up", "experts_gate_b", "experts_up_b",
                              "experts_down"),
    "shared_expert_intermediate_size": ("shexp_gate", "shexp_up", "shexp_down"),
}


def padded_blocks(config: ModelConfig, formats: dict, ranks: int) -> dict:
    """The MLP widths of `config` whose split over `ranks` goes by whole
    blocks, field -> block: those whose down projection (a dense MLP's, the
    experts', a shared expert's) is packed in `formats` (name -> format of
    `etc.packed`) with blocks along the width that `width / ranks` does not
    fill. Each rank then takes `ceil(width / (ranks * block))` blocks of
    columns (the last ranks fewer, or none) and pads them up with zero
    columns: zero gate and up rows (and biases) give an activation of 0
    (SiLU, GELU, gpt-oss's clamped SwiGLU), and the matching zero K blocks
    of the down projection add nothing, so the ranks' partial sums still
    add up to the whole layer while every packed block stays whole."""
    from ... import packed

    out = {}
    if ranks == 1:
        return out
    for field, kinds in _WIDTHS.items():
        width = getattr(config, field)
        blocks = {packed.FORMATS[fmt].block for name, fmt in formats.items()
                  if _kind(name) == kinds[-1]}
        block = math.lcm(*blocks) if blocks else 1
        if width and width % ranks == 0 and width % block == 0 and (width // ranks) % block:
            out[field] = block
    return out


def _share(config: ModelConfig, field: str, ranks: int, padding: Optional[dict]) -> int:
    """A rank's columns of the MLP width `field`: width / ranks, or whole
    blocks of `padding[field]` (`padded_blocks`)."""
    width = getattr(config, field)
    block = (padding or {}).get(field)
    if block is None:
        return width // ranks
    return -(-width // (ranks * block)) * block


def shard_config(config: ModelConfig, ranks: int, padding: Optional[dict] = None) -> ModelConfig:
    """One rank's share of `config` under Megatron-style tensor parallelism
    over `ranks`: `num_heads / ranks` query heads and `num_kv_heads / ranks`
    KV heads (rank r takes the r-th contiguous group, so its query heads
    use its KV heads), `intermediate_size / ranks` columns of the dense
    MLPs and `moe_intermediate_size / ranks` of every expert's (the experts,
    their router and the norms are on every rank, but for OLMo's q/k
    norms over the whole projections and Command R+'s q/k LayerNorms of a
    weight per head, split with the heads), and
    `shared_expert_intermediate_size / ranks` of a shared expert's (its
    gate vector whole); a width in `padding` (`padded_blocks`: field ->
    block) is shared in whole blocks, padded: its share is rounded up to
    whole blocks. Raises ValueError naming the field that `ranks` does not
    divide."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"tensor_parallel={ranks!r} must be a positive int")
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
        **{field: _share(config, field, ranks, padding) for field in _WIDTHS})


def _splits(config: ModelConfig, ranks: int, padding: Optional[dict] = None) -> dict:
    """Each split weight kind -> (its axis unpacked, its axis packed, the
    values per rank along it, whether that axis is the K of the product
    (row-parallel: blocks of a packed row split there), the whole length
    along it: shorter than ranks x the share where `padding` pads it)."""
    d = config.head_dim
    q = config.num_heads // ranks * d
    kv = config.num_kv_heads // ranks * d
    heads = config.num_heads // ranks
    splits = {kind: (0, 0, size, False, size * ranks) for kind, size in (
        ("wq", q), ("wk", kv), ("wv", kv), ("bq", q), ("bk", kv), ("bv", kv),
        ("sinks", heads),  # gpt-oss: the attention sinks go with their heads
        # DeepSeek's MLA (`mla_layout`): q's up-projection and kv_b's k and v
        # parts by heads; q's down-projection, the latent's and the pe
        # key's projections and norms whole on every rank.
        ("wq_b", q), ("wk_b", q), ("wv_b", q))}
    if config.qk_norm_projection or (config.qk_norm and config.layer_norm):
        # OLMo's q/k norms span the projections, Command R+'s have a weight
        # per head: their weights go with the heads (Qwen3's per-head
        # (head_dim,) norms stay whole).
        splits.update({kind: (0, 0, size, False, size * ranks)
                       for kind, size in (("q_norm", q), ("k_norm", kv))})
    splits.update(wo=(1, 1, q, True, q * ranks))
    for field, kinds in _WIDTHS.items():
        share, width = _share(config, field, ranks, padding), getattr(config, field)
        for kind in kinds:
            # The stacked experts, widened or packed, in (E, out, in): gate
            # and up (E, F, H), down (E, H, F); gpt-oss's gate and up
            # biases (E, F) go with their rows.
            axis = (2 if kind == "experts_down" else 1) if kind.startswith("experts_") else \
                (1 if kind.endswith("_down") else 0)
            splits[kind] = (axis, axis, share, kind.endswith("_down"), width)
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
    blocks of every row): an output projection, whose K splits by heads;
    an MLP width is split in whole blocks instead, padded
    (`padded_blocks`), unless its down projections' blocks do not divide
    it. The gate and up experts of a layer whose down
    experts cannot stay packed go with them (`g.moe` takes a layer's three
    stacks in one layout). Column-parallel weights split by whole rows and
    always stay packed; replicated ones are not split."""
    from ... import packed

    if ranks == 1:
        return {}
    splits = _splits(config, ranks, padded_blocks(config, formats, ranks))
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
                 fmt: Optional[str] = None, padding: Optional[dict] = None) -> np.ndarray:
    """Rank `rank`'s slice of weight `name` (see `shard_weights`); `fmt`,
    the `etc.packed` format it is stored in (uint8 blocks, (..., bytes)),
    or None; `padding`, the MLP widths split in whole blocks
    (`padded_blocks`), whose slices are padded with zeros (zero values, or
    zero bytes: a packed block of zero bytes is zero) up to the share of
    `shard_config`. A slice of a private array is copied (the whole one can
    be freed); a slice of a read-only file map stays a view where it is
    contiguous and not padded (its rows: only their pages become
    resident)."""
    if ranks == 1:
        return array
    if _kind(name) in _RANK_ZERO_ONLY:
        return array if rank == 0 else np.zeros(array.shape, array.dtype)
    split = _splits(config, ranks, padding).get(_kind(name))
    if split is None:
        return array
    axis, packed_axis, size, _, width = split
    start, stop = min(rank * size, width), min((rank + 1) * size, width)
    if fmt is not None:
        from ... import packed

        axis = packed_axis
        if axis == array.ndim - 1:  # along K: in whole blocks of bytes
            f = packed.FORMATS[fmt]
            if size % f.block:
                raise ValueError(f"{name!r} ({fmt}): {size} values per rank are not whole "
                                 f"blocks of {f.block}")
            start, stop, size = (v // f.block * f.nbytes for v in (start, stop, size))
    where = [slice(None)] * array.ndim
    where[axis] = slice(start, stop)
    part = array[tuple(where)]
    if stop - start < size:  # a padded share: its blocks, then zeros
        shape = list(array.shape)
        shape[axis] = size
        out = np.zeros(shape, array.dtype)
        where[axis] = slice(0, stop - start)
        out[tuple(where)] = part
        return out
    if array.flags.writeable:
        return np.array(part, order="C")
    return np.ascontiguousarray(part)


def shard_weights(config: ModelConfig, weights: dict, ranks: int, rank: int,
                  formats: Optional[dict] = None, padding: Optional[dict] = None) -> dict:
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
    `unaligned_packed` for the weights that cannot be); the MLP widths
    named in `padding` (`padded_blocks`) split in whole blocks, each
    rank's share padded with zeros.

    OLMo 2's, 3's and OLMoE's q/k norms (over the whole projections), and
    Command R+'s (a LayerNorm weight per head): the slices of their
    weights that its heads' share of q and k takes.

    DeepSeek's MLA (`mla_layout`): its heads' rows of q (or q_b), k_b and
    v_b, columns of o; q_a, kv_a and their norms whole.

    gpt-oss's: each rank's heads' attention sinks, its rows of the
    experts' gate and up biases; the experts' down biases on rank 0 and
    zeros on the others (`_RANK_ZERO_ONLY`); the router's and the o_proj
    biases whole."""
    formats = formats or {}
    return {name: shard_weight(config, name, array, ranks, rank, formats.get(name), padding)
            for name, array in weights.items()}
