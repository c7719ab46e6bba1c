"""The tensor shapes of gated MLPs (gate, up and down projections) under
Hugging Face's names, as the tiny checkpoints of several families hold
them (`checkpoints`, `deepseek`, `ernie`): a dense layer's, a shared
expert's, or each routed expert's."""

from __future__ import annotations

__all__ = ["gated_mlp", "routed_experts"]


def gated_mlp(prefix: str, width: int, hidden: int) -> dict:
    """`prefix` + gate_proj, up_proj (both (width, hidden)) and down_proj
    ((hidden, width)) weights, in that writing order."""
    return {prefix + "gate_proj.weight": (width, hidden),
            prefix + "up_proj.weight": (width, hidden),
            prefix + "down_proj.weight": (hidden, width)}


def routed_experts(prefix: str, count: int, width: int, hidden: int) -> dict:
    """`gated_mlp` of each of `count` experts, named `prefix` + its index."""
    out = {}
    for j in range(count):
        out.update(gated_mlp(f"{prefix}{j}.", width, hidden))
    return out
