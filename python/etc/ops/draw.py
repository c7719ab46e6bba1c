"""The inverse-CDF walk of `sample`'s draw over 16-wide vectors (the CPU
kernel's `VectorRowPasses.draw`), choosing the same column as the scalar
walk `RowPasses.draw` on every row.

The draw is the first column of positive weight whose running sum of
weights, in index order, exceeds u times the row's total (the last column
of positive weight where rounding leaves none), as
`etc.reference_sampling.sample` defines it with a float32 cumulative sum:
the order of its additions is the index order, so no sum here is a vector
sum. What is vectorised is everything else: the weights of a block of
WIDTH columns are one vector (`exp` becomes the same polynomial per lane
as on a scalar, `ConvertMathToPolynomials`, so the weights have the same
bits), their running sums are added one by one from the vector's lanes
without a loop or a branch per column, and a block whose last running sum
does not exceed the target is skipped whole.

Why the column is the scalar walk's:

* the running sums are the scalar walk's, bit for bit: the same weights
  added in the same order from the same start (0 for the total and the
  walk alike, so the target u * total is the same float too);
* the kept weights are 0 or exp(...) >= 0 and never NaN, and rounding to
  nearest is monotone, so the running sum never decreases: when a block's
  last sum is at most the target, so is every sum in it, and the scalar
  walk chooses none of its columns;
* in the first block whose last sum exceeds the target, the first column
  whose sum exceeds it has a positive weight (its sum exceeds the sum
  before it, which is at most the target; for column 0 that sum is 0,
  and the target u * total is >= 0), so it is the scalar walk's column;
* a target equal to a block's last sum (the boundary) skips that block,
  as the scalar walk's `>` passes each of its columns;
* the tail (n mod WIDTH columns) runs the scalar walk from the blocks'
  running sum; where no sum exceeds the target, the last column of
  positive weight is searched from the row's end (the scalar walk's
  `last`).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, vector


def vector_draw(passes, weight_of, u: ir.Value) -> ir.Value:
    """The drawn column of `passes`' row (a `VectorRowPasses`: kernel k,
    logits x, row, n columns, WIDTH) for the weight function `weight_of`
    (scalars and vectors alike) and the uniform number `u`."""
    k, width = passes.k, passes.WIDTH
    i1 = ir.IntegerType.get_signless(1)
    vector_n = arith.muli(arith.divui(passes.n, k.cidx(width)), k.cidx(width))
    # The total, sequential in index order.
    blocks = scf.ForOp(k.cidx(0), vector_n, k.cidx(width), [k.cf32(0.0)])
    with ir.InsertionPoint(blocks.body):
        sums = _running_sums(passes, weight_of, blocks.induction_variable,
                             blocks.inner_iter_args[0])
        scf.yield_([sums[-1]])
    tail = scf.ForOp(vector_n, passes.n, k.cidx(1), list(blocks.results))
    with ir.InsertionPoint(tail.body):
        scf.yield_([arith.addf(tail.inner_iter_args[0],
                               weight_of(passes.load(tail.induction_variable)))])
    target = arith.mulf(u, tail.results[0])
    # The walk over whole blocks: [start, running sum before it, found, column].
    types = [k.index, k.f32, i1, k.index]
    walk = scf.WhileOp(types, [k.cidx(0), k.cf32(0.0), arith.constant(i1, 0), k.cidx(0)])
    before = walk.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        start, _, found = before.arguments[:3]
        going = arith.andi(arith.cmpi(arith.CmpIPredicate.slt, start, vector_n),
                           arith.xori(found, arith.constant(i1, 1)))
        scf.condition(going, list(before.arguments))
    after = walk.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        start, running, _, chosen = after.arguments
        sums = _running_sums(passes, weight_of, start, running)
        hit = arith.cmpf(arith.CmpFPredicate.OGT, sums[-1], target)
        inside = scf.IfOp(hit, [k.index], has_else=True)
        with ir.InsertionPoint(inside.then_block):
            first = k.cidx(width - 1)
            for i in reversed(range(width - 1)):
                over = arith.cmpf(arith.CmpFPredicate.OGT, sums[i], target)
                first = arith.select(over, k.cidx(i), first)
            scf.yield_([arith.addi(start, first)])
        with ir.InsertionPoint(inside.else_block):
            scf.yield_([chosen])
        scf.yield_([arith.addi(start, k.cidx(width)), sums[-1], hit, inside.results[0]])
    _, running, found, chosen = walk.results
    # The tail by the scalar walk, unless a block held the column.
    rest = scf.IfOp(found, [i1, k.index], has_else=True)
    with ir.InsertionPoint(rest.then_block):
        scf.yield_([found, chosen])
    with ir.InsertionPoint(rest.else_block):
        tail_found, tail_chosen, _ = passes.walk(weight_of, target, vector_n, running)
        scf.yield_([tail_found, tail_chosen])
    found, chosen = rest.results
    choice = scf.IfOp(found, [k.index], has_else=True)
    with ir.InsertionPoint(choice.then_block):
        scf.yield_([chosen])
    with ir.InsertionPoint(choice.else_block):
        scf.yield_([last_positive(passes, weight_of)])
    return choice.results[0]


def _running_sums(passes, weight_of, start: ir.Value, running: ir.Value) -> list:
    """The running sums after each of the WIDTH columns from `start`,
    from `running`: the weights as one vector, added one at a time in
    index order."""
    w = weight_of(passes.k.vload(passes.x, [passes.row, start], passes.WIDTH))
    sums = []
    for i in range(passes.WIDTH):
        running = arith.addf(running, vector.extract(w, [], [i]))
        sums.append(running)
    return sums


def last_positive(passes, weight_of) -> ir.Value:
    """The last column of positive weight of `passes`' row (0 if none),
    searched from the row's end."""
    k = passes.k
    i1 = ir.IntegerType.get_signless(1)
    search = scf.WhileOp([k.index], [passes.n])
    before = search.before.blocks.append(k.index)
    with ir.InsertionPoint(before):
        end = before.arguments[0]
        more = arith.cmpi(arith.CmpIPredicate.sgt, end, k.cidx(0))
        guarded = scf.IfOp(more, [i1], has_else=True)
        with ir.InsertionPoint(guarded.then_block):
            w = weight_of(passes.load(arith.subi(end, k.cidx(1))))
            scf.yield_([arith.cmpf(arith.CmpFPredicate.OLE, w, k.cf32(0.0))])
        with ir.InsertionPoint(guarded.else_block):
            scf.yield_([more])
        scf.condition(guarded.results[0], [end])
    after = search.after.blocks.append(k.index)
    with ir.InsertionPoint(after):
        scf.yield_([arith.subi(after.arguments[0], k.cidx(1))])
    end = search.results[0]
    return arith.select(arith.cmpi(arith.CmpIPredicate.sgt, end, k.cidx(0)),
                        arith.subi(end, k.cidx(1)), k.cidx(0))
