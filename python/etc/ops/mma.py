"""The warp-level tensor-core multiply of tile kernels: `mma.sync` m16n8k16
with f16 or bf16 operands and f32 accumulators, on the GPU and simulated.

A warp multiplies a 16 x 16 tile of A by a 16 x 8 tile of B into a 16 x 8
tile of C. Each of its 32 lanes holds fixed elements of the three tiles, as
the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16" with .f16 and
.bf16), with groupID = lane >> 2 and threadID_in_group = lane % 4:

* A: four registers of two elements; register i holds row
  groupID + 8 (i % 2), columns 2 threadID_in_group + 8 (i / 2) + {0, 1};
* B: two registers of two elements; register i holds rows (k)
  2 threadID_in_group + 8 i + {0, 1} of column groupID;
* C and D: four f32; element i is row groupID + 8 (i / 2), column
  2 threadID_in_group + i % 2.

Fragments come from shared memory with `ldmatrix` (8 x 8 matrices of
16-bit elements, each lane giving the address of one row and receiving two
elements of each matrix, optionally transposed), which a kernel arranges so
that the registers it returns are the fragments above. `fragment_c` gives a
lane's coordinates in C (what a kernel stores); `owner_a` / `owner_b` give,
the other way round, which lane, register and half hold an element of A or
B.

On the GPU the loads are `nvgpu.ldmatrix` and the multiply one
`nvvm.mma.sync`. Under simulation (`Target.simulate_lanes`) the lanes run
one after another, so both collective instructions are emulated exactly
through arrays of every lane's values: `emulate_ldmatrix` fills a lane's
registers from the rows whose addresses the other lanes of its warp gave,
and `emulate` computes a lane's D from the registers of the lanes of its
warp through the `owner_*` maps. A kernel that gives `ldmatrix` the wrong
rows, or arranges its matrices in the wrong order, computes the wrong
product on the CPU too.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvgpu, nvvm, scf, vector

#: The m, n and k of one warp multiply.
M, N, K = 16, 8, 16
#: Lanes of a warp taking part.
WARP = 32
#: Registers (pairs of elements) per lane of A and B, f32 values of C.
A_REGS, B_REGS, C_VALUES = 4, 2, 4


def lane_in_warp(k, lane: ir.Value) -> tuple:
    """(warp, groupID, threadID_in_group) of a lane of the CTA."""
    warp = arith.divui(lane, k.cidx(WARP))
    within = arith.remui(lane, k.cidx(WARP))
    return warp, arith.divui(within, k.cidx(4)), arith.remui(within, k.cidx(4))


def fragment_c(k, group: ir.Value, thread: ir.Value, pair: int) -> tuple:
    """(row, first column) in the 16 x 8 C tile of elements 2 pair, 2 pair + 1."""
    row = arith.addi(group, k.cidx(8 * pair))
    return row, arith.muli(thread, k.cidx(2))


def owner_a(k, row: ir.Value, col: ir.Value) -> tuple:
    """(lane in the warp, register, half) holding A[row][col]."""
    lane = arith.addi(arith.muli(arith.remui(row, k.cidx(8)), k.cidx(4)),
                      arith.divui(arith.remui(col, k.cidx(8)), k.cidx(2)))
    register = arith.addi(arith.divui(row, k.cidx(8)),
                          arith.muli(arith.divui(col, k.cidx(8)), k.cidx(2)))
    return lane, register, arith.remui(col, k.cidx(2))


def owner_b(k, row: ir.Value, col: ir.Value) -> tuple:
    """(lane in the warp, register, half) holding B[row][col] (row is k)."""
    lane = arith.addi(arith.muli(col, k.cidx(4)),
                      arith.divui(arith.remui(row, k.cidx(8)), k.cidx(2)))
    return lane, arith.divui(row, k.cidx(8)), arith.remui(row, k.cidx(2))


def ldmatrix_lane(k, lane: ir.Value) -> tuple:
    """(matrix, row) whose shared-memory address a lane gives `ldmatrix`:
    lanes 8 j to 8 j + 7 give the rows of 8 x 8 matrix j."""
    within = arith.remui(lane, k.cidx(WARP))
    return arith.divui(within, k.cidx(8)), arith.remui(within, k.cidx(8))


def ldmatrix(shared: ir.Value, indices: list, count: int, transpose: bool) -> list:
    """`count` 8 x 8 matrices of 16-bit elements from shared memory, on the
    GPU: one register (vector<2xT>) per matrix. Without `transpose` a lane
    gets row lane / 4, columns 2 (lane % 4) + {0, 1} of each; with it, the
    same of the transposed matrix."""
    element = ir.MemRefType(shared.type).element_type
    result = nvgpu.ldmatrix(ir.VectorType.get([count, 2], element), shared, indices,
                            transpose, count)
    return [vector.extract(result, [], [j]) for j in range(count)]


def emulate_ldmatrix(k, lane: ir.Value, tile: ir.Value, buffer: ir.Value,
                     addresses: ir.Value, load: int, count: int, transpose: bool,
                     registers: ir.Value, slots: list) -> None:
    """One simulated lane's registers of an `ldmatrix` (widened to f32, into
    `registers[lane, slots[j] + half]`), read from `tile[buffer, row,
    column]` through the row addresses that every lane of the warp stored
    in `addresses[lane, load]`."""
    warp, group, thread = lane_in_warp(k, lane)
    first = arith.muli(warp, k.cidx(WARP))
    for j in range(count):
        for half in range(2):
            if transpose:
                source = arith.addi(arith.muli(thread, k.cidx(2)), k.cidx(8 * j + half))
                offset = group
            else:
                source = arith.addi(group, k.cidx(8 * j))
                offset = arith.addi(arith.muli(thread, k.cidx(2)), k.cidx(half))
            source = arith.addi(first, source)
            row = memref.load(addresses, [source, k.cidx(load), k.cidx(0)])
            col = memref.load(addresses, [source, k.cidx(load), k.cidx(1)])
            value = memref.load(tile, [buffer, row, arith.addi(col, offset)])
            memref.store(arith.extf(ir.F32Type.get(), value), registers,
                         [lane, k.cidx(slots[j] + half)])


def mma(a_registers: list, b_registers: list, acc: list) -> list:
    """D = A B + C on the GPU (`nvvm.mma.sync`): registers as vector<2xT>,
    C and D as four f32. bf16 registers go as i32, as PTX takes them
    (`nvgpu.mma.sync` cannot type bf16)."""
    element = ir.VectorType(a_registers[0].type).element_type
    bf16 = isinstance(element, ir.BF16Type)
    kind = "bf16" if bf16 else "f16"
    if bf16:
        a_registers = [_as_i32(r) for r in a_registers]
        b_registers = [_as_i32(r) for r in b_registers]
    f32 = ir.F32Type.get()
    result = llvm.StructType.get_literal([f32] * C_VALUES)
    d = nvvm.mma_sync(result, ir.Attribute.parse(f"#nvvm.shape<m = {M}, n = {N}, k = {K}>"),
                      ir.Attribute.parse("#nvvm.mma_layout<row>"),
                      ir.Attribute.parse("#nvvm.mma_layout<col>"),
                      a_registers, b_registers, acc,
                      multiplicand_a_ptx_type=ir.Attribute.parse(f"#nvvm.mma_type<{kind}>"),
                      multiplicand_b_ptx_type=ir.Attribute.parse(f"#nvvm.mma_type<{kind}>"))
    return [llvm.extractvalue(f32, d, [i]) for i in range(C_VALUES)]


def _as_i32(register: ir.Value) -> ir.Value:
    i32 = ir.IntegerType.get_signless(32)
    return vector.extract(vector.bitcast(ir.VectorType.get([1], i32), register), [], [0])


def emulate(k, lane: ir.Value, registers: ir.Value, a_slot: int, b_slot: int,
            acc: ir.Value, c_slot: int) -> None:
    """One simulated lane's D = A B + C, exactly as the warp computes it.

    `registers[lane, slot + 2 r + h]` holds half h of register r of every
    lane's fragments (widened to f32): A's from `a_slot`, B's from `b_slot`.
    The lane's four accumulators are `acc[lane, c_slot + i]`, updated in
    place. Each product of two f16 or bf16 values is exact in f32; the sums
    run over k in order."""
    warp, group, thread = lane_in_warp(k, lane)
    first = arith.muli(warp, k.cidx(WARP))
    for i in range(C_VALUES):
        row = arith.addi(group, k.cidx(8 * (i // 2)))
        col = arith.addi(arith.muli(thread, k.cidx(2)), k.cidx(i % 2))
        at = [lane, k.cidx(c_slot + i)]
        loop = scf.ForOp(k.cidx(0), k.cidx(K), k.cidx(1), [memref.load(acc, at)])
        with ir.InsertionPoint(loop.body):
            kk = loop.induction_variable
            a = _register(k, registers, first, a_slot, owner_a(k, row, kk))
            b = _register(k, registers, first, b_slot, owner_b(k, kk, col))
            scf.yield_([arith.addf(loop.inner_iter_args[0], arith.mulf(a, b))])
        memref.store(loop.results[0], acc, at)


def _register(k, registers: ir.Value, first: ir.Value, slot: int, owner: tuple) -> ir.Value:
    lane, register, half = owner
    column = arith.addi(arith.addi(k.cidx(slot), arith.muli(register, k.cidx(2))), half)
    return memref.load(registers, [arith.addi(first, lane), column])
