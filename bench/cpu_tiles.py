"""CPU tile kernels against NumPy on a decode-shaped SwiGLU MLP.

    y = (silu(x @ Wg) * (x @ Wu)) @ Wd      hidden 1024, FFN 2816, f32

compiled once for the CPU target (static schedule, `--workers` workers) and
run at B = 1, 2, 4, 8, 16, next to NumPy (OpenBLAS) computing the same
expression in the same process. The floor is the weights read once: 3 x
1024 x 2816 x 4 bytes = 34.6 MB per call, over the memory bandwidth a NumPy
`copy` of the weights reaches in the same run. Prints a Markdown table of
median times (after a warm-up) and the ETC / NumPy ratio.

`--after-numpy` also times each ETC run right after a NumPy product, while
OpenBLAS's threads still spin (the CPU runtime must not lose its speed to
them). They spin for about 0.1 s after each product; with
OPENBLAS_THREAD_TIMEOUT=4 in the environment (read when NumPy loads
OpenBLAS) they sleep at once, and the header line says which was measured.

Usage: .venv/bin/python bench/cpu_tiles.py [--workers 2] [--repeats 21] [--layout kn|nk]
       [--after-numpy]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

import etc

HIDDEN, FFN = 1024, 2816
#: Seconds of rest before timing ETC after NumPy ran, so that OpenBLAS's
#: threads have stopped spinning (they wait for work busily for a while).
QUIET_S = 1.0


def swiglu(hidden: int = HIDDEN, ffn: int = FFN, transposed: bool = False) -> etc.Graph:
    """The MLP; `transposed`: weights stored (out, in) as Hugging Face
    checkpoints store them, multiplied as x @ W^T."""
    g = etc.Graph("swiglu")
    B = g.symbol("B")
    x = g.input("x", (B, hidden), "f32")

    def weight(name, k, n):
        return g.input(name, (n, k) if transposed else (k, n), "f32")

    def mm(a, w):
        return g.matmul(a, w, transpose_b=transposed)
    wg, wu, wd = weight("wg", hidden, ffn), weight("wu", hidden, ffn), weight("wd", ffn, hidden)
    g.output(mm(g.mul(g.silu(mm(x, wg)), mm(x, wu)), wd))
    return g


def times(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    result = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        result.append(time.perf_counter() - start)
    return result


def median_time(fn, repeats: int) -> float:
    return statistics.median(times(fn, repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--layout", choices=("kn", "nk"), default="kn",
                        help="weights (K, N), x @ W; or (N, K), x @ W^T (Hugging Face)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternations of ETC and NumPy per batch (medians over all)")
    parser.add_argument("--after-numpy", action="store_true",
                        help="also time each ETC run right after a NumPy product, while "
                             "OpenBLAS's threads still spin")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
          f"Python {platform.python_version()}, NumPy {np.__version__}; "
          f"workers={args.workers}, repeats={args.repeats} x {args.rounds} rounds, "
          f"layout={args.layout}, OPENBLAS_THREAD_TIMEOUT="
          f"{os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset')}")
    transposed = args.layout == "nk"

    rng = np.random.default_rng(0)
    shapes = [("wg", (HIDDEN, FFN)), ("wu", (HIDDEN, FFN)), ("wd", (FFN, HIDDEN))]
    weights = {name: (rng.standard_normal(shape[::-1] if transposed else shape) * 0.03)
               .astype(np.float32) for name, shape in shapes}
    # NumPy multiplies by the transposed view (no copy), as PyTorch's
    # Linear does.
    used = {name: w.T if transposed else w for name, w in weights.items()}
    nbytes = sum(w.nbytes for w in weights.values())
    start = time.perf_counter()
    kernel = etc.compile(swiglu(transposed=transposed), target="cpu", schedule="static",
                         workers=args.workers)
    print(f"compile: {time.perf_counter() - start:.2f} s")

    copies = [np.empty_like(w) for w in weights.values()]

    def copy_weights():
        for w, c in zip(weights.values(), copies):
            np.copyto(c, w)
    copy_s = median_time(copy_weights, args.repeats)
    # A copy reads and writes every byte.
    bandwidth = 2 * nbytes / copy_s
    print(f"weights: {nbytes / 1e6:.1f} MB; NumPy copy of them: {copy_s * 1e3:.2f} ms "
          f"= {bandwidth / 1e9:.1f} GB/s read+write; floor (read once at that rate): "
          f"{nbytes / bandwidth * 1e3:.2f} ms\n")

    after = " ETC right after NumPy ms | that / NumPy |" if args.after_numpy else ""
    print(f"| B | ETC ms | NumPy ms | ETC / NumPy | ETC GB/s (weights) |{after}")
    print("|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.after_numpy else ""))
    for batch in args.batches:
        x = rng.standard_normal((batch, HIDDEN)).astype(np.float32)
        inputs = dict(x=x, **weights)

        def numpy_mlp():
            h = x @ used["wg"]
            return ((h / (1 + np.exp(-h))) * (x @ used["wu"])) @ used["wd"]
        (got,) = kernel.run(**inputs)
        np.testing.assert_allclose(got, numpy_mlp(), rtol=2e-3, atol=2e-3)
        # The machine's bandwidth varies from second to second: alternate
        # the two, and take the medians over all rounds.
        etc_times, numpy_times, after_times = [], [], []
        for _ in range(args.rounds):
            if args.after_numpy:
                for _ in range(args.repeats):
                    numpy_mlp()
                    start = time.perf_counter()
                    kernel.run(**inputs)
                    after_times.append(time.perf_counter() - start)
            # OpenBLAS's threads spin for a while after each call: on a
            # machine with as many cores as workers they would take the
            # workers' cores.
            time.sleep(QUIET_S)
            etc_times += times(lambda: kernel.run(**inputs), args.repeats)
            numpy_times += times(numpy_mlp, args.repeats)
        etc_s, numpy_s = statistics.median(etc_times), statistics.median(numpy_times)
        cells = ""
        if args.after_numpy:
            after_s = statistics.median(after_times)
            cells = f" {after_s * 1e3:.2f} | {after_s / numpy_s:.2f} |"
        print(f"| {batch} | {etc_s * 1e3:.2f} | {numpy_s * 1e3:.2f} | {etc_s / numpy_s:.2f} "
              f"| {nbytes / etc_s / 1e9:.1f} |{cells}", flush=True)


if __name__ == "__main__":
    main()
