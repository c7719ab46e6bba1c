"""Builds a two-layer MLP with a residual connection and prints its L1 IR.

    y = silu(x @ w1) @ w2 + x,   x: (B, 256), w1: (256, 512), w2: (512, 256)

B is a symbolic dimension: one compiled kernel serves every batch size.
Run: python examples/mlp.py | etc-opt
"""

import etc


def build_mlp() -> etc.Graph:
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 256), "f32")
    w1 = g.input("w1", (256, 512), "f32")
    w2 = g.input("w2", (512, 256), "f32")
    h = g.matmul(x, w1)
    a = g.silu(h)
    y = g.add(g.matmul(a, w2), x)
    g.output(y)
    return g


if __name__ == "__main__":
    print(build_mlp().to_mlir())
