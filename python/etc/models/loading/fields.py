"""The error of a config ETC does not take, and the checks of its fields'
values shared by `config` and `rope`."""

from __future__ import annotations

import math

__all__ = ["UnsupportedConfigError", "positive_int", "positive_number"]


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
