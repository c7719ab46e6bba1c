"""FP8 checkpoints: config.json's `quantization_config` with `quant_method:
"fp8"` (the official Qwen3-*-FP8 releases; transformers'
`FineGrainedFP8Config`), checked, and their weights read.

Each quantized linear weight `X.weight` is stored as F8_E4M3 (float8_e4m3fn
bytes), shape (out, in), with a float32 companion `X.weight_scale_inv` of
shape (ceil(out / bn), ceil(in / bk)) for `weight_block_size` [bn, bk]:
value (r, c) is e4m3(X.weight[r, c]) x scale_inv[r // bn, c // bk] (the
edge blocks partial), as transformers' FP8 integration dequantizes.
Norms, embeddings and the LM head stay in bf16 (their stored dtype says
so; `modules_to_not_convert` lists such modules, and every tensor is read
by its own dtype).

`pack` repacks such a weight into `etc.packed`'s fp8_e4m3 format (blocks
of 32 values of a row, each with its float32 scale), which the step
kernel reads in place, dequantizing in registers; `dequantize` widens it
to float32 (the reference, and weights that cannot stay packed).
`activation_scheme: "dynamic"` quantizes activations to FP8 per group of
a token at run time on the GPUs that multiply in FP8; ETC multiplies the
dequantized weights with its compute dtype's activations instead (f32 or
bf16), so its results are the dequantized model's. Everything else is
refused, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ... import packed
from .fields import UnsupportedConfigError

__all__ = ["Fp8Quantization", "read_quantization", "scale_name", "dequantize", "pack"]

#: The fields of `quantization_config` an FP8 checkpoint may have.
FIELDS = ("quant_method", "fmt", "activation_scheme", "weight_block_size",
          "modules_to_not_convert")


@dataclass(frozen=True)
class Fp8Quantization:
    """An FP8 checkpoint's block scaling: `block` = (bn, bk), the rows and
    columns of a weight that share one scale."""

    block: tuple


def read_quantization(config: dict, where: str) -> Optional[Fp8Quantization]:
    """The FP8 quantization config.json's `quantization_config` describes,
    None without one; `UnsupportedConfigError` naming the field for any
    other method or any setting ETC does not compute as written."""
    q = config.get("quantization_config")
    if q is None:
        return None

    def field(name: str) -> str:
        return f"{where}: field 'quantization_config.{name}'"

    if not isinstance(q, dict):
        raise UnsupportedConfigError(f"{where}: field 'quantization_config' = {q!r} must be a "
                                     f"JSON object")
    method = q.get("quant_method")
    if method != "fp8":
        raise UnsupportedConfigError(
            f"{field('quant_method')} = {method!r} is not supported; ETC loads FP8 checkpoints "
            f"('fp8', float8_e4m3fn weights with block scales) and GGUF files")
    unknown = sorted(set(q) - set(FIELDS))
    if unknown:
        raise UnsupportedConfigError(
            f"{field(unknown[0])} is not supported (an FP8 quantization_config has "
            f"{', '.join(FIELDS)})")
    if q.get("fmt", "e4m3") != "e4m3":
        raise UnsupportedConfigError(f"{field('fmt')} = {q['fmt']!r} is not supported; ETC "
                                     f"reads 'e4m3' (float8_e4m3fn) weights")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise UnsupportedConfigError(
            f"{field('activation_scheme')} = {q['activation_scheme']!r} is not supported; ETC "
            f"takes 'dynamic' (it computes with its own dtype's activations; static activation "
            f"scales would be ignored)")
    block = q.get("weight_block_size")
    if not isinstance(block, list) or len(block) != 2 or \
            not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
        raise UnsupportedConfigError(
            f"{field('weight_block_size')} = {block!r} is not supported; ETC reads block "
            f"scales: two positive integers [rows, columns] (e.g. [128, 128])")
    if block[1] % packed.FORMATS["fp8_e4m3"].block:
        raise UnsupportedConfigError(
            f"{field('weight_block_size')} = {block!r} is not supported: its columns must be a "
            f"multiple of {packed.FORMATS['fp8_e4m3'].block} (ETC's blocks of a row share one "
            f"scale)")
    skip = q.get("modules_to_not_convert")
    if skip is not None and (not isinstance(skip, list) or
                             not all(isinstance(m, str) for m in skip)):
        raise UnsupportedConfigError(f"{field('modules_to_not_convert')} = {skip!r} must be a "
                                     f"list of module names")
    return Fp8Quantization(block=tuple(block))


def scale_name(name: str) -> str:
    """The scale tensor of FP8 weight `name` (`X.weight` ->
    `X.weight_scale_inv`)."""
    return name + "_scale_inv"


def scale_shape(shape: tuple, block: tuple) -> tuple:
    """The shape of the scales of a weight of `shape` (out, in)."""
    return tuple(-(-n // b) for n, b in zip(shape, block))


def dequantize(values: np.ndarray, row_scales: np.ndarray, block: tuple) -> np.ndarray:
    """The float32 values of e4m3 bytes `values` (rows, in) whose rows'
    block scales are `row_scales` (rows, ceil(in / bk)): each row's scales
    (`scales[r // bn]`)."""
    cols = values.shape[1]
    return packed.e4m3_values(values) * np.repeat(row_scales, block[1], axis=1)[:, :cols]


def pack(values: np.ndarray, row_scales: np.ndarray, block: tuple, out: np.ndarray) -> None:
    """Writes e4m3 bytes `values` (rows, in), `in` a multiple of 32, with
    their rows' block scales `row_scales` (as `dequantize` takes them) as
    fp8_e4m3 storage into `out` (rows, in / 32 x 36 bytes): each block of
    32 values of a row with the scale of the checkpoint block it lies in."""
    fmt = packed.FORMATS["fp8_e4m3"]
    rows, cols = values.shape
    groups = cols // fmt.block
    blocks = out.reshape(rows, groups, fmt.nbytes)
    per_group = np.repeat(row_scales.astype("<f4"), block[1] // fmt.block, axis=1)[:, :groups]
    blocks[:, :, :4] = np.ascontiguousarray(per_group).view(np.uint8).reshape(rows, groups, 4)
    blocks[:, :, 4:] = values.reshape(rows, groups, fmt.block)
