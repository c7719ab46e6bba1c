"""Inputs of a MoE layer whose routing the tests choose: shared by the MoE
test files (test_moe_packed.py, test_moe_cpu_vector.py)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from etc.reference import round_bf16, topk


def routed_inputs(tokens: int, hidden: int, experts: int, top_k: int, unused: tuple = (),
                  always: Optional[int] = None, dtype: str = "f32",
                  margin: float = 1e-3) -> dict:
    """x (tokens, hidden) and router (hidden, experts) that never pick the
    `unused` experts and pick `always` for every token (x[:, 0] = 1
    against router row 0 at -1e4 and +50 for them), rounded to bf16 for
    dtype "bf16", with `margin` between each token's k-th and (k+1)-th
    logit so that float rounding routes as the reference does. Seeded by
    `tokens`."""
    rng = np.random.default_rng(tokens)
    while True:
        x = rng.standard_normal((tokens, hidden)).astype(np.float32)
        x[:, 0] = 1.0
        router = rng.standard_normal((hidden, experts)).astype(np.float32) / 4
        router[0, list(unused)] = -1e4
        if always is not None:
            router[0, always] = 50.0
        if dtype == "bf16":
            x, router = round_bf16(x), round_bf16(router)
        logits = x @ router
        ordered = -np.sort(-logits, axis=-1)
        if np.min(ordered[:, top_k - 1] - ordered[:, top_k]) > margin:
            chosen = topk(logits, top_k)[1]
            assert not np.isin(chosen, unused).any()
            assert always is None or np.all(np.any(chosen == always, axis=1))
            return dict(x=x, router=router)
