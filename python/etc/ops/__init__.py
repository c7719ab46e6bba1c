"""Operator families: what each operator's tasks touch and how a tile computes.

Each module of this package is one family of operators. It lists the
operator kinds it implements (`KINDS`), emits their tasks with footprints
and explicit events (`build_tasks(builder, op)`), and defines their tile
kernels (`base.TileKernel` subclasses). `etc.Graph` records operator calls
and checks their shapes; building the IR asks `family(kind)` for the tasks.

To add an operator, see docs/operators.md: a module here, one line in
`_FAMILIES` below, a `Graph` method and a NumPy reference.
"""

from __future__ import annotations

from types import ModuleType

from . import (attention, collective, elementwise, embedding, headnorm, kvcache, logits,
               matmul, moe, rope, rowwise, sampling, splitnorm, topk)
from .base import GENERIC, Target

__all__ = ["GENERIC", "Target", "family", "kinds"]

#: The registered families, in no particular order.
_FAMILIES: tuple[ModuleType, ...] = (elementwise, matmul, rowwise, topk, moe, embedding, rope,
                                     headnorm, kvcache, attention, sampling, logits, collective,
                                     splitnorm)

_BY_KIND: dict[str, ModuleType] = {}
for _family in _FAMILIES:
    for _kind in _family.KINDS:
        if _kind in _BY_KIND:
            raise ImportError(f"operator kind {_kind!r} is registered by both "
                              f"{_BY_KIND[_kind].__name__} and {_family.__name__}")
        _BY_KIND[_kind] = _family


def family(kind: str) -> ModuleType:
    """The family module implementing operator `kind`."""
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise ValueError(f"no operator family implements {kind!r}; registered: "
                         f"{sorted(_BY_KIND)}") from None


def kinds() -> list[str]:
    """Every registered operator kind."""
    return sorted(_BY_KIND)
