"""Hopper's tensor memory accelerator (TMA) for the wgmma tile: the tensor
map of a row-major 2-D operand (what `cuTensorMapEncodeTiled` is given),
the copy `cp.async.bulk.tensor` makes with it, the directory through which a
kernel finds the map of its buffer, each on the GPU and emulated exactly
when lanes are simulated.

From the PTX ISA ("Tensor Memory Accelerator", "cp.async.bulk.tensor") and
the driver API (`cuTensorMapEncodeTiled`):

* A tiled 2-D map holds the global address, the dimensions innermost first
  (columns, rows), the row stride in bytes (a multiple of 16), the box
  (columns, rows; each at most 256, the inner one times the element size a
  multiple of 16 and, swizzled, at most the swizzle span), the element type
  and the swizzle mode (`TensorMap`; `check` applies the driver's rules).
* `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
  [dst], [map, {x, y}], [bar]` copies the box whose first element is column
  x, row y into shared memory at dst, row after row (each the box's inner
  bytes), elements outside the tensor filled with zeros; with a swizzle,
  each 16-byte chunk lands at its address with bits 4.. XORed by bits 7..
  (3 bits for 128-byte, 2 for 64, 1 for 32), so dst must be aligned to the
  swizzle's repeat (1024, 512, 256 bytes). When the whole box has landed,
  the copy completes its bytes (all of the box's, the zero-filled too) on
  the mbarrier's transaction count (`emulate_load`).
* The mbarrier's phase completes when both its pending arrivals and its
  transaction count reach zero: the producer arrives once with
  `mbarrier.arrive.expect_tx` (the stage's bytes), the copies complete them
  (`wgmma.Barriers`).

Where the maps live: the worker's kernel parameters are the symbols, the
buffer table and the counters (`etc.runtime.cuda`), and a tile function is
shared by every task of the same shape whatever its buffers, so a map is
found by the address of the buffer a tile reads. The runtime encodes a map
per swizzle mode for every 2-D f16/bf16 buffer a bound run passes
(`etc.runtime.cuda_tensor_maps`) into a hash table in device memory, copied
into the module's global `DIRECTORY` before each worker launch: SLOTS maps
of 128 bytes (64-byte aligned, as the driver requires), then SLOTS keys
(the buffer's address plus the swizzle's code; 0: empty). A key's first
slot is `probe_start`; a kernel looks from there until it finds its key
(linear probing; the runtime keeps the table at most half full).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm, scf

# The maps' fields and the directory's layout, shared with the runtime.
from ..runtime.tensor_maps import (BOX_ROWS, DATA_TYPE, DIRECTORY, DIRECTORY_BYTES,  # noqa: F401
                                   MAP_BYTES, SLOTS, SWIZZLE, TensorMap, check, key, matrix_map,
                                   operand_map, probe_start)
from . import wgmma
from .wgmma import Index


# ----------------------------------------------------------------------
# The hardware's side
# ----------------------------------------------------------------------


def destination(dst, row, chunk, row_bytes: int, swizzle: str):
    """The shared byte address where a box's 16-byte chunk `chunk` of row
    `row` lands: rows `row_bytes` apart from dst, then the swizzle's XOR of
    the chunk bits (4..) with the row bits (7..) of the address."""
    address = dst + row * row_bytes + chunk * 16
    bits = {"none": 0, "32B": 1, "64B": 3, "128B": 7}[swizzle]
    return address ^ (((address >> 7) & bits) << 4)


def emulate_load(k, source: ir.Value, tensor_map: TensorMap, x, y, smem: ir.Value, dst) -> None:
    """A simulated `cp.async.bulk.tensor` of the box at column x, row y of
    the row-major matrix behind `tensor_map` (read through `source`, the
    buffer as a 1-D memref of elements from its address), into `smem`
    (16-bit elements from shared address 0) at byte address `dst`: each
    element from its place by the map's stride and dims (zero outside
    them), each chunk where `destination` puts it. The caller completes
    the box's bytes on its barrier."""
    box_cols, box_rows = tensor_map.box
    element = tensor_map.element_bytes
    row_bytes = box_cols * element
    cols, rows = tensor_map.dims
    stride = tensor_map.stride
    elements_per_chunk = 16 // element
    element_type = ir.MemRefType(smem.type).element_type
    zero = arith.constant(element_type, ir.FloatAttr.get(element_type, 0.0))
    x, y = wgmma.as_index(k, x), wgmma.as_index(k, y)
    dst = wgmma.as_index(k, dst)
    box_row_loop = scf.ForOp(k.cidx(0), k.cidx(box_rows), k.cidx(1))
    with ir.InsertionPoint(box_row_loop.body):
        r = Index(k, box_row_loop.induction_variable)
        chunk_loop = scf.ForOp(k.cidx(0), k.cidx(row_bytes // 16), k.cidx(1))
        with ir.InsertionPoint(chunk_loop.body):
            c = Index(k, chunk_loop.induction_variable)
            row = y + r
            at = destination(dst, r, c, row_bytes, tensor_map.swizzle)
            for e in range(elements_per_chunk):
                col = x + c * elements_per_chunk + e
                inside = arith.andi(arith.cmpi(arith.CmpIPredicate.ult, row.value, rows.value
                                               if isinstance(rows, Index) else k.cidx(rows)),
                                    arith.cmpi(arith.CmpIPredicate.ult, col.value, cols.value
                                               if isinstance(cols, Index) else k.cidx(cols)))
                offset = (row * stride + col * element) // element
                safe = arith.select(inside, offset.value, k.cidx(0))
                value = arith.select(inside, memref.load(source, [safe]), zero)
                memref.store(value, smem, [((at + e * element) // 2).value])
            scf.yield_([])
        scf.yield_([])


# ----------------------------------------------------------------------
# The GPU instructions
# ----------------------------------------------------------------------


def directory(k) -> ir.Value:
    """The module's directory global (declared once), as a memref of i64."""
    module = k.block.owner.parent
    while module is not None and module.name != "builtin.module":
        module = module.parent
    i64 = ir.IntegerType.get_signless(64)
    memref_type = ir.MemRefType.get([DIRECTORY_BYTES // 8], i64)
    symbols = ir.SymbolTable(module)
    if DIRECTORY not in symbols:
        with ir.InsertionPoint.at_block_begin(module.regions[0].blocks[0]):
            memref.global_(DIRECTORY, ir.TypeAttr.get(memref_type), sym_visibility="public",
                           alignment=MAP_BYTES)
    return memref.get_global(memref_type, DIRECTORY)


def lookup(k, buffer_address: Index, swizzle: str) -> Index:
    """The generic address of the map over the buffer at `buffer_address`
    in `swizzle` mode: probes the directory's keys from `probe_start`
    (the runtime put every map of the run there; a missing one traps),
    then fences the tensor-map proxy's view of the map (the host wrote it
    through the generic proxy)."""
    i64 = ir.IntegerType.get_signless(64)
    table = directory(k)
    base = wgmma.Index(k, memref.extract_aligned_pointer_as_index(table))
    wanted = key(buffer_address, swizzle)
    start = probe_start(wanted)
    loop = scf.WhileOp([k.index, k.index], [start.value, k.cidx(0)])
    before = loop.before.blocks.append(k.index, k.index)
    with ir.InsertionPoint(before):
        slot, tries = before.arguments
        word = arith.index_cast(k.index, memref.load(
            table, [(Index(k, slot) + SLOTS * MAP_BYTES // 8).value]))
        other = arith.cmpi(arith.CmpIPredicate.ne, word, wanted.value)
        left = arith.cmpi(arith.CmpIPredicate.ult, tries, k.cidx(SLOTS))
        scf.condition(arith.andi(other, left), [slot, tries])
    after = loop.after.blocks.append(k.index, k.index)
    with ir.InsertionPoint(after):
        slot, tries = after.arguments
        scf.yield_([((Index(k, slot) + 1) & (SLOTS - 1)).value,
                    arith.addi(tries, k.cidx(1))])
    missing = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, loop.results[1], k.cidx(SLOTS)))
    with ir.InsertionPoint(missing.then_block):
        llvm.intr_trap()
        scf.yield_([])
    address = base + Index(k, loop.results[0]) * MAP_BYTES
    pointer = llvm.inttoptr(llvm.PointerType.get(), arith.index_cast(i64, address.value))
    nvvm.fence_proxy_acquire(ir.Attribute.parse("#nvvm.mem_scope<sys>"), pointer,
                             arith.constant(ir.IntegerType.get_signless(32), MAP_BYTES))
    return address


def load(k, dst: Index, tensor_map: Index, x, y, barrier: ir.Value) -> None:
    """`cp.async.bulk.tensor.2d` of the box at (column x, row y) into shared
    byte address `dst`, completing its bytes on the mbarrier `barrier`
    (a shared pointer)."""
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    # The CTA's own shared memory seen through the cluster's window (a
    # launch without clusters is a cluster of one CTA).
    shared = llvm.addrspacecast(llvm.PointerType.get(7), llvm.inttoptr(
        llvm.PointerType.get(3), arith.index_cast(i64, dst.value)))
    descriptor = llvm.inttoptr(llvm.PointerType.get(), arith.index_cast(i64, tensor_map.value))
    coordinates = [arith.index_cast(i32, wgmma.as_index(k, v).value) for v in (x, y)]
    nvvm.cp_async_bulk_tensor_shared_cluster_global(shared, descriptor, coordinates, barrier, [])
