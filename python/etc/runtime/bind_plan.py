"""Bind plans: what a CPU run learnt about its caller's arrays, reused by
the next run that is given the same arrays (`CPURuntime.run`).

A run binds its arrays: it checks each input's type, dtype and shape,
binds the symbols, pairs and checks the `out=` arrays, decides which of
them the program writes in place, and writes their addresses into the
workspace's buffer table. On the 2-core AMX VM that Python took about
25 us a run, a fifth of a 486 x 576 x 192 bf16 GEMM's run. A loop that
calls a kernel again and again (a decode step, a benchmark) mostly passes
the very arrays of its last call, so the first run with them records a
`BindPlan` and a later run whose arrays are *the same objects, with the
same shape, strides, dtype and data address* (and, for state buffers and
`out=` arrays, still writeable) skips all of that: its symbols, the
workspace's table words and which outputs are copied are those of the
plan's run. Anything else (another array of the same shape, a view, an
array resized in place or given another dtype, another `out=` container
kind) misses and is bound, checked and refused exactly as without plans.

Only arrays the program reads as they are make a plan: an input converted
for the program (float32 given for bf16) is converted at every run, since
its caller may change it in between. Index inputs are range-checked at
every run (their values change; a plan checks only their identity).

The plan refers to the arrays weakly: an array the caller drops is freed,
and its identity cannot then be matched by a new array at the same
address.

This module needs only NumPy and ctypes.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

#: Where a NumPy array object keeps its data pointer: right after the
#: object header (`PyArrayObject_fields.data`, NumPy's public C struct).
_DATA_OFFSET = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)


def _read_by_header(array: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p.from_address(id(array) + _DATA_OFFSET)


class _Interface:
    """The fallback where the header word is not the data pointer: the
    address from NumPy's ctypes interface, read at every match."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray):
        self._array = weakref.ref(array)

    @property
    def value(self) -> int | None:
        array = self._array()
        return None if array is None else array.ctypes.data


def _header_is_data_pointer() -> bool:
    probe = np.arange(7, dtype=np.int64)
    views = [probe, probe[2:], probe[::3]]
    return all(_read_by_header(v).value == v.ctypes.data for v in views)


#: `data_word(array)`: an object whose `.value` is `array`'s data address
#: now, valid while `array` lives (a plan reads it only after seeing its
#: array alive): a view of the array object's own data pointer (about 60
#: ns to read, where `array.ctypes.data` builds an object, 1-2 us), or
#: NumPy's interface where the header does not hold it (another NumPy or
#: Python build).
data_word = _read_by_header if _header_is_data_pointer() else _Interface


class _Array:
    """What a plan knows of one array: the object (weakly), its shape,
    strides, dtype and data address, and the word to read that address
    from; `writeable`: whether it must still be writeable (state buffers
    and `out=` arrays, which the program writes)."""

    __slots__ = ("ref", "shape", "strides", "dtype", "word", "address", "writeable")

    def __init__(self, array: np.ndarray, writeable: bool):
        self.ref = weakref.ref(array)
        self.shape, self.strides, self.dtype = array.shape, array.strides, array.dtype
        self.word = data_word(array)
        self.address = self.word.value
        self.writeable = writeable

    def matches(self, array) -> bool:
        return (self.ref() is array and array.shape == self.shape
                and array.strides == self.strides and array.dtype is self.dtype
                and self.word.value == self.address
                and (not self.writeable or array.flags.writeable))


class BindPlan:
    """The binding of one run (see the module docstring): `match(inputs,
    out, constants)` says whether a run's arguments are the same arrays,
    and `symbols` are what they bind."""

    __slots__ = ("constants", "names", "inputs", "out_names", "outs", "symbols")

    def __init__(self, constants, inputs: dict, states: set, symbols: dict,
                 out, out_names: tuple | None):
        self.constants = constants
        #: The inputs' names, in the order of the caller's dict.
        self.names = tuple(inputs)
        self.inputs = tuple(_Array(inputs[name], name in states) for name in self.names)
        #: None: no `out=`; else the names the `out=` arrays pair with, in
        #: order (a list/tuple: the outputs'; a dict: its keys').
        self.out_names = out_names
        self.outs = None if out is None else tuple(
            _Array(array, True) for array in (out.values() if isinstance(out, dict) else out))
        self.symbols = symbols

    @classmethod
    def make(cls, constants, inputs: dict, supplied: dict, states: set, symbols: dict,
             out, outputs) -> "BindPlan | None":
        """The plan of a run that bound `inputs` (the caller's) as
        `supplied` (the program's) with `out`, or None where a later run
        may not reuse it: an input converted for the program, an `out=`
        that is not a list, tuple or dict (an iterator is used up), or
        arrays of other types."""
        if any(supplied[name] is not array for name, array in inputs.items()):
            return None
        if out is None:
            out_names = None
        elif isinstance(out, dict):
            out_names = tuple(out)
        elif isinstance(out, (list, tuple)):
            out_names = tuple(outputs)
        else:
            return None
        arrays = [*inputs.values(), *(() if out is None else
                                      out.values() if isinstance(out, dict) else out)]
        if not all(type(array) is np.ndarray for array in arrays):
            return None
        return cls(constants, inputs, states, symbols, out, out_names)

    def match(self, inputs: dict, out, constants) -> bool:
        """Whether a run of `inputs`, `out` and `constants` is given the
        plan's arrays, unchanged."""
        if constants is not self.constants or len(inputs) != len(self.names):
            return False
        try:
            for name, known in zip(self.names, self.inputs):
                if not known.matches(inputs[name]):
                    return False
        except KeyError:
            return False
        if out is None or self.outs is None:
            return out is None and self.outs is None
        if isinstance(out, dict):
            if tuple(out) != self.out_names:
                return False
            out = out.values()
        elif not isinstance(out, (list, tuple)) or len(out) != len(self.outs):
            return False
        return all(known.matches(array) for known, array in zip(self.outs, out))

    def items(self, out) -> list | None:
        """The (output name, array) pairs of a matching run's `out`."""
        if out is None:
            return None
        return list(zip(self.out_names, out.values() if isinstance(out, dict) else out))


def given_ids(inputs: dict, out) -> tuple:
    """The ids of a run's arrays (inputs, then `out=` ones): a run makes a
    plan only when they are those of the run before, since making one for
    arrays that are new at every run (a decode step's) costs more than
    comparing their ids. (An id may be reused by a new array: a plan
    matches by more than ids.)"""
    if isinstance(out, dict):
        out = out.values()
    elif not isinstance(out, (list, tuple)):
        out = ()
    return (*map(id, inputs.values()), *map(id, out))


def copy_plan(items: list, copies: list) -> list:
    """The copies a run makes after the program, (the caller's `out=`
    array, the kept storage, the dtype), as a plan keeps them: with the
    index of that array in `items` ((output name, array) pairs) in place
    of the array, for the next run's arrays."""
    where = {id(array): index for index, (_, array) in enumerate(items)}
    return [(where[id(array)], storage, dtype) for array, storage, dtype in copies]
