"""The megakernel against one kernel per operator, on a GPU (needs an
NVIDIA GPU, its driver, cuda-python and ETC with MLIR; without a GPU it says
so and exits 0).

A 5-operator MLP block (rmsnorm, matmul, silu, matmul, residual add) at
batch 1..16: one megakernel (static and dynamic schedule), versus the same
operators compiled one per kernel and launched one by one on a stream, and
the same launches captured once as a CUDA graph (the honest baseline).

The notify->wake latency, the per-task overhead, the MLP block and a decode
step against PyTorch are measured by the GPU kit (`make gpu-kit`, then
`python3 build/gpu-kit/run.py`; docs/gpu.md), which needs no MLIR on the
GPU machine.

Times are medians of CUDA-event measurements after warm-up. Usage:
  .venv/bin/python bench/gpu_megakernel.py [--repeats N] [--lanes 128]
Prints Markdown tables (paste into docs/benchmarks.md with date and GPU).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import etc
from etc.runtime.cuda import EventTimer as Timer
from etc.runtime.cuda import _driver, cuda_available


def device_chip(driver) -> tuple[str, str]:
    _, device = driver.cuDeviceGet(0)
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    _, name = driver.cuDeviceGetName(256, device)
    chip = f"sm_{major}{minor}"
    return ("sm_90a" if chip == "sm_90" else chip), name.split(b"\0")[0].decode()


def compile_cuda(g, chip, schedule, lanes):
    # The tiles are written for `lanes` (the worker's .maxntid): compiled so.
    return etc.compile(g, target="cuda", chip=chip, schedule=schedule, lanes=lanes)


# -- MLP: megakernel vs kernel-per-operator vs CUDA graph ----------------

HIDDEN, FFN = 512, 1024


def mlp_block() -> etc.Graph:
    g = etc.Graph("block")
    B = g.symbol("B")
    x = g.input("x", (B, HIDDEN), "f32")
    nw = g.input("nw", (HIDDEN,), "f32")
    w1 = g.input("w1", (HIDDEN, FFN), "f32")
    w2 = g.input("w2", (FFN, HIDDEN), "f32")
    g.output(g.add(g.matmul(g.silu(g.matmul(g.rmsnorm(x, nw, 1e-6), w1)), w2), x))
    return g


def single_ops():
    """The block's operators, one graph each, with the names of their inputs."""
    def graph(name, build):
        g = etc.Graph(name)
        B = g.symbol("B")
        build(g, B)
        return g

    return [
        graph("op_norm", lambda g, B: g.output(g.rmsnorm(g.input("x", (B, HIDDEN), "f32"),
                                                          g.input("nw", (HIDDEN,), "f32"), 1e-6))),
        graph("op_up", lambda g, B: g.output(g.matmul(g.input("h", (B, HIDDEN), "f32"),
                                                      g.input("w1", (HIDDEN, FFN), "f32")))),
        graph("op_act", lambda g, B: g.output(g.silu(g.input("a", (B, FFN), "f32")))),
        graph("op_down", lambda g, B: g.output(g.matmul(g.input("s", (B, FFN), "f32"),
                                                        g.input("w2", (FFN, HIDDEN), "f32")))),
        graph("op_res", lambda g, B: g.output(g.add(g.input("d", (B, HIDDEN), "f32"),
                                                    g.input("x", (B, HIDDEN), "f32")))),
    ]


def bench_mlp(driver, timer, chip, lanes, batches=(1, 4, 16)) -> str:
    rng = np.random.default_rng(0)
    weights = {"nw": rng.standard_normal(HIDDEN).astype(np.float32),
               "w1": (rng.standard_normal((HIDDEN, FFN)) * 0.05).astype(np.float32),
               "w2": (rng.standard_normal((FFN, HIDDEN)) * 0.05).astype(np.float32)}
    mega = {s: compile_cuda(mlp_block(), chip, s, lanes) for s in ("static", "dynamic")}
    ops = [compile_cuda(g, chip, "static", lanes) for g in single_ops()]
    rows = ["| batch | megakernel static µs | megakernel dynamic µs | per-op launches µs | "
            "per-op CUDA graph µs | megakernel static vs graph |",
            "|---:|---:|---:|---:|---:|---:|"]
    for batch in batches:
        x = rng.standard_normal((batch, HIDDEN)).astype(np.float32)
        reference = etc.reference.evaluate(mlp_block(), x=x, **weights)[0]
        cells = [str(batch)]
        for schedule in ("static", "dynamic"):
            launch = mega[schedule].runtime.bind({"x": x, **weights})
            ms = timer(launch.enqueue)
            np.testing.assert_allclose(launch.outputs()[0], reference, rtol=2e-3, atol=2e-3)
            cells.append(f"{ms * 1000:.1f}")
        static_ms = float(cells[1]) / 1000
        # One kernel per operator, chained through device buffers (no copies).
        norm = ops[0].runtime.bind({"x": x, "nw": weights["nw"]})
        up = ops[1].runtime.bind({"h": norm.buffers[ops[0].graph.outputs[0]], "w1": weights["w1"]})
        act = ops[2].runtime.bind({"a": up.buffers[ops[1].graph.outputs[0]]})
        down = ops[3].runtime.bind({"s": act.buffers[ops[2].graph.outputs[0]], "w2": weights["w2"]})
        res = ops[4].runtime.bind({"d": down.buffers[ops[3].graph.outputs[0]],
                                   "x": norm.buffers["x"]})
        launches = [norm, up, act, down, res]

        def one_by_one(stream):
            for launch in launches:
                launch.enqueue(stream)

        ms = timer(one_by_one)
        np.testing.assert_allclose(res.outputs()[0], reference, rtol=2e-3, atol=2e-3)
        cells.append(f"{ms * 1000:.1f}")
        graph_ms = timer(timer.graph(one_by_one))
        cells.append(f"{graph_ms * 1000:.1f}")
        cells.append(f"{static_ms / graph_ms:.2f}x")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--lanes", type=int, default=128, help="threads per worker CTA")
    args = parser.parse_args()
    if not cuda_available():
        print("bench/gpu_megakernel.py needs an NVIDIA GPU, its driver and cuda-python "
              "(pip install 'cuda-bindings>=12.9,<14'); none is available here, nothing to measure.")
        return 0
    driver = _driver()
    chip, name = device_chip(driver)
    timer = Timer(driver, args.repeats)
    print(f"GPU: {name} ({chip}), {args.lanes} threads per worker CTA, "
          f"median of {args.repeats} runs after warm-up\n")
    print(f"### MLP block ({HIDDEN}->{FFN}->{HIDDEN}, 5 operators): megakernel vs kernel per operator\n")
    print(bench_mlp(driver, timer, chip, args.lanes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
