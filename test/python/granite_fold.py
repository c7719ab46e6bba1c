"""Folding Granite's residual multiplier and logits scaling into the
weights, against carrying them in the step graph: how far each way's bf16
logits are from transformers' (the bf16 goldens of hf_goldens_families.py),
as fractions of the golden tolerance (docs/models.md, GraniteForCausalLM).

    python test/python/granite_fold.py

Folded weights are multiplied in float32 and rounded to bf16, as a
load-time fold of a bf16 checkpoint would be: residual_multiplier into each
layer's o_proj and down_proj (Granite MoE: output_linear), 1 /
logits_scaling into the final norm; the folded config sets those
multipliers to 1."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import etc.models as models
from etc.models.loading.safetensors import SafetensorsFile, save_file

import hf_goldens_families as goldens

LOAD = dict(workers=2, max_seq_len=32, attention_chunk=4, kv_block_size=4)
VARIANTS = (("carried", False, False), ("residual folded", True, False),
            ("logits folded", False, True), ("both folded", True, True))
RESIDUAL_WEIGHTS = ("o_proj.weight", "down_proj.weight", "output_linear.weight")


def errors(golden, path) -> np.ndarray:
    """Per golden position, ETC's bf16 error as a fraction of the tolerance."""
    return golden.errors(golden.prefix_logits(models.load(path, dtype="bf16", **LOAD)))


def folded(source: Path, config: dict, out: Path, residual: bool, logits: bool) -> Path:
    file = SafetensorsFile(source / "model.safetensors")
    tensors = {name: file.read(name, "f32") for name in file}
    for name in tensors:
        if residual and name.endswith(RESIDUAL_WEIGHTS):
            tensors[name] = tensors[name] * np.float32(config["residual_multiplier"])
        if logits and name == "model.norm.weight":
            tensors[name] = tensors[name] / np.float32(config["logits_scaling"])
    out.mkdir()
    save_file(out / "model.safetensors", tensors, "BF16", metadata={"format": "pt"})
    changed = {**config, **({"residual_multiplier": 1.0} if residual else {}),
               **({"logits_scaling": 1.0} if logits else {})}
    (out / "config.json").write_text(json.dumps(changed))
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for name in ("granite-transformers4-bf16", "granite_moe-transformers4-bf16"):
            golden = goldens.Golden.load(name)
            source = golden.write_checkpoint(scratch / name)
            for label, residual, logits in VARIANTS:
                path = source if not (residual or logits) else folded(
                    source, golden.config, scratch / f"{name}-{label.replace(' ', '-')}",
                    residual, logits)
                e = errors(golden, path)
                print(f"{name}: {label}: largest {e.max():.3f}, mean {e.mean():.4f} of the "
                      f"tolerance", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
