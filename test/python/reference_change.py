"""How far a change of a model's config or weights moves the NumPy forward
pass's logits: the family tests' check (test_ernie.py, test_glm4_moe.py,
test_deepseek.py, test_shared_moe.py) that a part the loader reads, or a
field it honours, matters."""

from __future__ import annotations

import numpy as np

from etc.models.step import reference

#: The prompt the changes are measured on.
PROMPT = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]


def rms_change(config, weights: dict, changed_config=None, changed_weights=None,
               prompt=PROMPT) -> float:
    """The largest difference of `reference.forward`'s logits of `prompt`
    with `changed_config` and/or `changed_weights` in place of `config` and
    `weights` from those without, as a fraction of the latter's rms."""
    want = reference.forward(config, weights, prompt)
    got = reference.forward(changed_config or config, changed_weights or weights, prompt)
    return float(np.abs(got - want).max() / np.sqrt(np.mean(want ** 2)))
