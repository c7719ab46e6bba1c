"""What sampling on the device costs: `Graph.sample` against `Graph.argmax`
on the CPU target, on R rows of a real vocabulary's width.

One kernel per operator (logits (R, V) float32 as an input), compiled once;
each row of the table runs it with one parameter set on every row and
prints the median ms per run and the ratio to the argmax kernel measured in
the same round (rounds alternate the kernels, so load changes hit both),
beside NumPy's `argmax(axis=1)` of the same logits (one thread; it does not
rank NaN first, which these logits do not hold).
The floor of a pass is V x 4 bytes read per row (L2-resident after the
first pass); a pass of `sample` is a maximum, a count or a sum, and a row
makes 3 passes with temperature alone, up to 35 with top-k, up to 68 with
top-k and top-p (see etc/ops/sampling.py).

A second table: `Graph.adjust_logits` (the penalties' and biases' copy of
the logits before sampling) without a structured-output mask input, with
one and no row masked (what an unconstrained request pays for the feature),
and with every row masked; median ms per run, rounds alternating.

Usage: .venv/bin/python bench/sampling.py [--vocab 49152] [--rows 1 8] [--workers 2]
    [--rounds 9] [--no-masks]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

import etc

MODES = {
    "greedy (T = 0)": dict(temperature=0.0),
    "T = 0.8": dict(temperature=0.8),
    "T = 0.8, top-k 50": dict(temperature=0.8, top_k=50),
    "T = 0.8, top-p 0.9": dict(temperature=0.8, top_p=0.9),
    "T = 0.8, top-k 50, top-p 0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
    "T = 0.8, min-p 0.05": dict(temperature=0.8, min_p=0.05),
}


def graphs(vocab: int) -> tuple[etc.Graph, etc.Graph]:
    g = etc.Graph("sample")
    R = g.symbol("R")
    logits = g.input("logits", (R, vocab), "f32")
    params = [g.input("temperature", (R,), "f32"), g.input("top_k", (R,), "i32"),
              g.input("top_p", (R,), "f32"), g.input("min_p", (R,), "f32"),
              g.input("seed", (R, 2), "i32"), g.input("position", (R,), "i32")]
    g.output(g.sample(logits, *params))
    a = etc.Graph("argmax")
    a.output(a.argmax(a.input("logits", (a.symbol("R"), vocab), "f32"), tile=(1,)))
    return g, a


def adjust_graph(vocab: int, mask: bool) -> etc.Graph:
    """`adjust_logits` of (R, vocab) logits with 4 entries per row, and a
    structured-output mask if `mask`."""
    g = etc.Graph("adjust")
    R, A = g.symbol("R"), g.symbol("A")
    entries = [g.input("tokens", (R, A), "i32"), g.input("add", (R, A), "f32"),
               g.input("scale", (R, A), "f32")]
    masks = dict(mask=g.input("mask", (R, -(-vocab // 32)), "i32"),
                 masked=g.input("masked", (R,), "i32")) if mask else {}
    g.output(g.adjust_logits(g.input("logits", (R, vocab), "f32"), *entries, **masks))
    return g


def compare_masks(args, rng) -> None:
    """The second table (module docstring)."""
    plain = etc.compile(adjust_graph(args.vocab, False), target="cpu", workers=args.workers)
    masked = etc.compile(adjust_graph(args.vocab, True), target="cpu", workers=args.workers)
    print()
    print("| rows | adjust_logits ms, no mask input | mask input, no row masked | ratio | "
          "every row masked | ratio |")
    print("|---|---|---|---|---|---|")
    for rows in args.rows:
        feed = dict(logits=(rng.standard_normal((rows, args.vocab))).astype(np.float32),
                    tokens=np.full((rows, 4), -1, np.int32), add=np.zeros((rows, 4), np.float32),
                    scale=np.ones((rows, 4), np.float32))
        bits = np.full((rows, -(-args.vocab // 32)), -1, np.int32)
        runs = {"plain": lambda: plain.run(**feed),
                "free": lambda: masked.run(**feed, mask=bits, masked=np.zeros(rows, np.int32)),
                "masked": lambda: masked.run(**feed, mask=bits, masked=np.ones(rows, np.int32))}
        times: dict[str, list] = {name: [] for name in runs}
        for _ in range(args.rounds + 1):  # the first round warms up
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        p, f, m = (statistics.median(times[k][1:]) * 1e3 for k in ("plain", "free", "masked"))
        print(f"| {rows} | {p:.3f} | {f:.3f} | {f / p:.2f} | {m:.3f} | {m / p:.2f} |")


def inputs(logits: np.ndarray, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0) -> dict:
    rows = logits.shape[0]
    full = lambda v, dtype: np.full(rows, v, dtype)
    return dict(logits=logits, temperature=full(temperature, np.float32),
                top_k=full(top_k, np.int32), top_p=full(top_p, np.float32),
                min_p=full(min_p, np.float32), seed=np.zeros((rows, 2), np.int32),
                position=np.arange(rows, dtype=np.int32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-masks", action="store_true",
                        help="skip the second table (adjust_logits and its mask)")
    args = parser.parse_args()
    g, a = graphs(args.vocab)
    sample = etc.compile(g, target="cpu", workers=args.workers)
    argmax = etc.compile(a, target="cpu", workers=args.workers)
    rng = np.random.default_rng(0)
    print(f"vocab {args.vocab}, {args.workers} workers, {platform.processor() or platform.machine()}, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| rows | parameters | sample ms | argmax ms | sample / argmax | numpy argmax ms |")
    print("|---|---|---|---|---|---|")
    for rows in args.rows:
        # Logits shaped like a model's: a few large values over a broad mass.
        logits = (rng.standard_normal((rows, args.vocab)) * 2.5).astype(np.float32)
        for label, params in MODES.items():
            feed = inputs(logits, **params)
            sample.run(**feed)
            argmax.run(logits=logits)
            times: dict[str, list] = {"sample": [], "argmax": [], "numpy": []}
            for _ in range(args.rounds):
                for name, run in (("sample", lambda: sample.run(**feed)),
                                  ("argmax", lambda: argmax.run(logits=logits)),
                                  ("numpy", lambda: logits.argmax(axis=1))):
                    start = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - start)
            s, m, n = (statistics.median(times[k]) * 1e3 for k in ("sample", "argmax", "numpy"))
            print(f"| {rows} | {label} | {s:.3f} | {m:.3f} | {s / m:.2f} | {n:.3f} |")
    if not args.no_masks:
        compare_masks(args, rng)


if __name__ == "__main__":
    main()
