"""Matrix multiplication: C = A @ B, or A @ B^T with `transpose_b`.

The operator family: its tasks (`build_tasks`), the choice of kernel
(`choose_kernel`) and the kernels that pair the tensor cores with a GEMV.
The kernels themselves live in a module per kind: `matmul_scalar`,
`matmul_cpu`, `matmul_gemv` and `matmul_mma`.

Tasks: one tile task per (row block, column block) of C; each reads the row
block of A (all of K) and the column block of B (all of K).

Kernels, by target:
* generic: one output element per lane iteration with a serial K loop
  (`matmul_scalar.Matmul`);
* cpu: register-blocked vector code (`matmul_cpu.MatmulCPU`) on tiles up to 256
  columns wide (as wide as still gives every worker two column tiles at
  one row block): micro-tiles of up to 4 rows by a chunk of columns
  accumulate in f32 vectors with fused multiply-adds while B streams
  through once per micro-tile: for B (K, N) each k loads contiguous
  vectors of B's row k (up to 1 KB for a decode row) and broadcasts
  A[r, k]; for B^T (N, K) both operands are contiguous along k and the
  dot products reduce at the end: groups of 4 rows of A take a stack
  panel of A in f32 and 4 x 2 dot products (`emit_panels`), the rows left
  (all at decode) dot groups of 4 columns a quarter of the tile apart
  (`emit_transposed`: 4 long streams of B^T per worker), summing in the
  panels' order (8-lane partial sums), so a row's result is the same bits
  whatever rows share its tile (batched requests, verified speculative
  tokens). Tile widths give
  every worker the same number of column tiles where one divides N so.
  Partial edge tiles (columns past N) take the scalar path.
  bf16 A @ B^T where the instruction set has AVX-512 BF16:
  `matmul_dpbf16.MatmulDPBF16` (`vdpbf16ps` dot products in blocks of
  2 x 8 outputs) for tiles of 2 rows or more, `MatmulCPU` below;
  a packed B (`etc.packed`): `matmul_packed.choose_packed` (int8 dot
  products for the GGML formats; `matmul_fp8` for fp8_e4m3);
* cuda, few rows (decode, `matmul_gemv`): `MatmulSkinny` for B (K, N) (lanes along N,
  split-K across lane groups, scratch reduction across warps) and
  `MatmulSkinnyT` for B^T (N, K), the layout of Hugging Face weights (a
  warp per group of 4 B^T rows, lanes along K with 512-byte warp loads,
  warp-shuffle reduction); both
  read each weight byte once per tile with 16-byte loads, and their column
  tiles are sized so that B = 1 gives every SM a tile;
* cuda, sm_80 and newer, f16 and bf16 with K a multiple of 16: tensor cores
  (`matmul_mma.MatmulMMA`: cp.async staging in shared memory, ldmatrix,
  mma.sync m16n8k16) for 16 rows or more; with symbolic rows (the batch) a
  kernel that also derives from the GEMV picks per tile at run time:
  `MatmulMMASkinny` and `MatmulMMASkinnyT` (tensor cores from 16 rows, the
  GEMV below), on the GEMV's column tiles; a packed B^T likewise
  (`matmul_packed_mma.MatmulPackedMMA`: its values dequantized into the
  shared tile, the packed GEMV below 16 rows);
* cuda, sm_90a, f16 and bf16 A @ B^T with K a multiple of 64: `wgmma`
  from 128-byte-swizzled shared memory behind an mbarrier ring
  (`matmul_wgmma.MatmulWGMMA`), `MatmulWGMMASkinnyT` for symbolic rows
  (the GEMV below 16 rows); `MatmulMMA` stays for sm_80 and for what it
  does not take (B (K, N), K not a multiple of 64).
"""

from __future__ import annotations

import dataclasses

from ..packed import is_packed
from .base import TaskBuilder, box, tile_offset
from .matmul_amx import MatmulAMX
from .matmul_cpu import MatmulCPU
from .matmul_dpbf16 import MatmulDPBF16
from .matmul_gemv import MatmulSkinny, MatmulSkinnyT
from .matmul_mma import MatmulMMA
from .matmul_packed import MatmulPackedCPU, choose_packed
from .matmul_packed_amx import MatmulPackedAMX
from .matmul_packed_mma import MatmulPackedMMA
from .matmul_scalar import Matmul
from .matmul_wgmma import MatmulWGMMA

KINDS = ("matmul",)


class MatmulMMASkinny(MatmulMMA, MatmulSkinny):
    """Symbolic rows, B (K, N): tensor cores for tiles of 16 rows or more,
    `MatmulSkinny`'s split-K GEMV for fewer."""

    @classmethod
    def name(cls, op) -> str:
        return "matmul_gemv_mma"

    def narrow(self) -> None:
        MatmulSkinny.emit(self)


class MatmulMMASkinnyT(MatmulMMA, MatmulSkinnyT):
    """Symbolic rows, B^T (N, K): tensor cores for tiles of 16 rows or more,
    `MatmulSkinnyT`'s GEMV for fewer."""

    @classmethod
    def name(cls, op) -> str:
        return "matmul_gemv_t_mma"

    def narrow(self) -> None:
        MatmulSkinnyT.emit(self)


class MatmulWGMMASkinnyT(MatmulWGMMA, MatmulSkinnyT):
    """Symbolic rows, B^T (N, K), sm_90a: wgmma for tiles of 16 rows or
    more, `MatmulSkinnyT`'s GEMV for fewer.

    Out of line on the GPU, as `MatmulMMA`: inlined with the GEMV in a
    model's worker, it made Qwen3-30B-A3B's static sm_90a worker spill 176
    bytes (2026-11-28); as a call, ptxas serialises its wgmma (C7510)."""

    out_of_line_on_gpu = True
    inline_on_gpu = False

    @classmethod
    def name(cls, op) -> str:
        return "matmul_gemv_t_wgmma"

    def narrow(self) -> None:
        MatmulSkinnyT.emit(self)


def choose_kernel(op, target) -> type:
    """The matmul kernel for `op` on `target`."""
    if is_packed(op.operands[1].dtype):
        if MatmulPackedMMA.applies(op, target):
            return MatmulPackedMMA
        kernel = choose_packed(op, target)
        if kernel is MatmulPackedCPU and MatmulPackedAMX.applies(op, target):
            return MatmulPackedAMX
        return kernel
    if target.kind == "cpu" and MatmulAMX.applies(op, target):
        return MatmulAMX
    if target.kind == "cpu" and MatmulDPBF16.applies(op, target):
        return MatmulDPBF16
    if target.kind == "cpu" and MatmulCPU.applies(op):
        return MatmulCPU
    if MatmulWGMMA.applies(op, target):
        if isinstance(op.operands[0].shape[0], int):
            return MatmulWGMMA
        if MatmulSkinnyT.applies(op, target):
            return MatmulWGMMASkinnyT
    if MatmulMMA.applies(op, target):
        if isinstance(op.operands[0].shape[0], int):
            return MatmulMMA
        # Symbolic rows: only with a GEMV for the tiles of few rows.
        if op.params["transpose_b"]:
            if MatmulSkinnyT.applies(op, target):
                return MatmulMMASkinnyT
        elif MatmulSkinny.applies(op, target):
            return MatmulMMASkinny
    if MatmulSkinny.applies(op, target):
        return MatmulSkinny
    if MatmulSkinnyT.applies(op, target):
        return MatmulSkinnyT
    return Matmul


def build_tasks(b: TaskBuilder, op) -> None:
    if b.target.kind == "cpu" and not op.user_tile:
        chooser = MatmulAMX if MatmulAMX.applies(op, b.target) else \
            MatmulPackedAMX if MatmulPackedAMX.applies(op, b.target) else \
            MatmulPackedCPU if MatmulPackedCPU.applies(op) else MatmulCPU
        op = dataclasses.replace(op, tile=chooser.tile_for(op, b.target))
    elif b.target.gpu_kernels and not op.user_tile and is_packed(op.operands[1].dtype):
        # A packed B^T: the packed GEMV's column tiles (MatmulSkinnyT's).
        op = dataclasses.replace(op, tile=MatmulSkinnyT.tile_for(op, b.target))
    elif b.target.gpu_kernels and not op.user_tile:
        # Known rows of 16 or more: tiles for the tensor cores. Otherwise
        # the GEMV's (decode first), which the tensor cores also take.
        wide = dataclasses.replace(op, tile=MatmulMMA.tile_for(op, b.target))
        hopper = dataclasses.replace(op, tile=MatmulWGMMA.tile_for(op, b.target))
        if isinstance(op.operands[0].shape[0], int) and MatmulWGMMA.applies(hopper, b.target):
            op = hopper
        elif isinstance(op.operands[0].shape[0], int) and MatmulMMA.applies(wide, b.target):
            op = wide
        else:
            chooser = MatmulSkinnyT if op.params["transpose_b"] else MatmulSkinny
            op = dataclasses.replace(op, tile=chooser.tile_for(op, b.target))
    a, w = op.operands[:2]
    res = op.result
    tm, tn = op.tile
    reads = [(a, box(2, [tile_offset(0, tm), "0"], [tm, None]))]
    if op.params["transpose_b"]:
        reads.append((w, box(2, [tile_offset(1, tn), "0"], [tn, None])))
    else:
        reads.append((w, box(2, ["0", tile_offset(1, tn)], [None, tn])))
    writes = [(res, box(2, [tile_offset(0, tm), tile_offset(1, tn)], [tm, tn]))]
    if len(op.operands) == 3:  # the residual: the tile's own elements
        reads.append((op.operands[2], writes[0][1]))
    grid = [b.grid_extent(res.shape[0], tm), b.grid_extent(res.shape[1], tn)]
    b.emit_task(op, op.name, grid, reads, writes, choose_kernel(op, b.target))
