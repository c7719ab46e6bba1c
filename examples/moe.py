"""Builds a small Mixture-of-Experts layer, compiles it for the CPU and checks
it against the NumPy reference for several token counts from one compile.

    y = moe(rmsnorm(x), router_w, w1, w2, top_k=2) + x
    x: (T, 64), router_w: (64, 8), w1: (8, 64, 128), w2: (8, 128, 64)

T is symbolic and the routing is data: one kernel serves every T and every
routing. Run: python examples/moe.py [--workers N] [--ir event]
"""

import argparse

import numpy as np

import etc

HIDDEN, FFN, EXPERTS, TOP_K = 64, 128, 8, 2


def build_moe() -> etc.Graph:
    g = etc.Graph("moe_block")
    T = g.symbol("T")
    x = g.input("x", (T, HIDDEN))
    norm_w = g.input("norm_w", (HIDDEN,))
    router_w = g.input("router_w", (HIDDEN, EXPERTS))
    w1 = g.input("w1", (EXPERTS, HIDDEN, FFN))
    w2 = g.input("w2", (EXPERTS, FFN, HIDDEN))
    h = g.rmsnorm(x, norm_w)
    g.output(g.add(g.moe(h, router_w, w1, w2, TOP_K, tile=16), x))
    return g


def random_inputs(rng: np.random.Generator, tokens: int) -> dict:
    return {
        "x": rng.standard_normal((tokens, HIDDEN)).astype(np.float32),
        "norm_w": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
        "router_w": rng.standard_normal((HIDDEN, EXPERTS)).astype(np.float32),
        "w1": (rng.standard_normal((EXPERTS, HIDDEN, FFN)) / np.sqrt(HIDDEN)).astype(np.float32),
        "w2": (rng.standard_normal((EXPERTS, FFN, HIDDEN)) / np.sqrt(FFN)).astype(np.float32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ir", choices=("graph", "event", "scheduled", "lowered"),
                        help="print the IR after this stage")
    args = parser.parse_args()

    g = build_moe()
    kernel = etc.compile(g, schedule="static", workers=args.workers)
    if args.ir:
        print(kernel.ir(args.ir))
    rng = np.random.default_rng(0)
    for tokens in (1, 7, 64, 100):
        inputs = random_inputs(rng, tokens)
        (y,) = kernel.run(**inputs)
        (want,) = etc.reference.evaluate(g, **inputs)
        error = float(np.max(np.abs(y - want)))
        x = inputs["x"]
        normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * inputs["norm_w"]
        routed = etc.reference.topk(normed @ inputs["router_w"], TOP_K)[1]
        experts = np.bincount(routed.ravel(), minlength=EXPERTS)
        print(f"T={tokens:4d}  max |y - reference| = {error:.2e}  "
              f"tokens per expert {experts.tolist()}")
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    print("ok")


if __name__ == "__main__":
    main()
