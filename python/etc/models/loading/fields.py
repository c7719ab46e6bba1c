"""The error of a config ETC does not take, and the checks of its fields'
values shared by `config`, `rope` and the families' readers."""

from __future__ import annotations

import math

__all__ = ["UnsupportedConfigError", "positive_int", "positive_number",
           "head_dim_from_heads"]


class UnsupportedConfigError(ValueError):
    """A config.json that names an architecture or sets a field ETC's models
    do not implement, or a field whose value is not valid."""


def positive_int(where: str, name: str, value) -> int:
    """`value` of field `name`, which must be a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a positive "
                                     f"integer")
    return value


def positive_number(where: str, name: str, value) -> float:
    """`value` of field `name`, which must be a finite positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not value > 0:
        raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a finite "
                                     f"positive number")
    return float(value)


def head_dim_from_heads(config: dict, where: str, architecture: str, why: str) -> None:
    """Refuses a `head_dim` other than hidden_size / num_attention_heads in
    a config of `architecture`, whose transformers class takes its heads'
    width from those (`why`, with `{}` where that width goes, says where);
    malformed sizes are left to the generic checks, which name them."""
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    head_dim = config.get("head_dim")
    if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and \
            heads > 0 and head_dim != hidden // heads:
        raise UnsupportedConfigError(
            f"{where}: field 'head_dim' = {head_dim!r} is not supported for {architecture}: "
            f"{why.format(hidden // heads)}")
