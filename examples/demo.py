"""The README's main job: compile a small MLP into one persistent program and
run it on the default target, checking every output against NumPy.

    make demo        (or: .venv/bin/python examples/demo.py)
"""

from __future__ import annotations

import sys
import time

import numpy as np

import etc


def build_mlp() -> etc.Graph:
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 256), "f32")
    norm_w = g.input("norm_w", (256,), "f32")
    w1 = g.input("w1", (256, 512), "f32")
    w2 = g.input("w2", (512, 256), "f32")
    h = g.rmsnorm(x, norm_w, 1e-6)
    a = g.silu(g.matmul(h, w1))
    y = g.add(g.matmul(a, w2), x)
    g.output(y)
    return g


def summarize(stage: str, text: str) -> None:
    """Prints the structural lines of one stage's IR (not the tile bodies)."""
    keys = {
        "graph": ("event.graph", "event.task"),
        "event": ("event.alloc", "event.task"),
        "scheduled": ("func.func", "event.view"),
        "lowered": ("llvm.func @mlp", "gpu.binary", "gpu.module"),
    }[stage]
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(keys)
             or any(f" {k}" in line and "=" in line for k in keys if k.startswith("event.a"))]
    print(f"--- {stage}: {len(text.splitlines())} lines of IR")
    for line in lines[:12]:
        print("   ", line if len(line) < 150 else line[:147] + "...")


def main() -> int:
    g = build_mlp()
    from etc.runtime.cuda import cuda_available

    if cuda_available():
        target = "cuda"
        print("target: cuda (a CUDA device is present: one persistent CTA per worker)")
    else:
        target = "cpu"
        print("target: cpu (no CUDA device here; the CPU runs the same persistent program "
              "on 4 host worker threads)")
    start = time.perf_counter()
    kernel = etc.compile(g, target=target, schedule="static", workers=4)
    compile_s = time.perf_counter() - start
    for stage in etc.pipeline.STAGES:
        summarize(stage, kernel.ir(stage))
    print("compile stages: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in kernel.timings.items())
          + f"; total {compile_s * 1e3:.1f} ms")

    rng = np.random.default_rng(0)
    weights = {
        "norm_w": rng.standard_normal(256).astype(np.float32),
        "w1": (rng.standard_normal((256, 512)) / 16).astype(np.float32),
        "w2": (rng.standard_normal((512, 256)) / 22).astype(np.float32),
    }
    ok = True
    for batch in (1, 7, 64):  # one compile serves every batch size
        inputs = {"x": rng.standard_normal((batch, 256)).astype(np.float32), **weights}
        start = time.perf_counter()
        (y,) = kernel.run(**inputs)
        run_ms = (time.perf_counter() - start) * 1e3
        (expected,) = etc.reference.evaluate(g, **inputs)
        error = float(np.max(np.abs(y - expected) / (np.abs(expected) + 1e-3)))
        match = np.allclose(y, expected, rtol=1e-4, atol=1e-4)
        ok &= match
        print(f"B={batch:3d}: ran in {run_ms:7.2f} ms, max rel. error {error:.2e} "
              f"-> {'matches NumPy' if match else 'MISMATCH'}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
