"""Goldens from Hugging Face transformers for DeepSeek-V2 and DeepSeek-V3
(test_deepseek.py): what `AutoModelForCausalLM` computes for their tiny
checkpoints (`etc.models.testing.deepseek`: V2-Lite's shape and V3's),
kept in test/python/goldens/ so that the tests compare ETC with an outside
implementation where torch is not installed.

    python test/python/hf_goldens_deepseek.py [--check]

(where torch and transformers import, with `python/` and test/python on
PYTHONPATH) regenerates the files (`--check` compares instead of
writing). Made with torch 2.13.0 (CPU) and transformers 5.24.0. The files,
their tolerances and checks are hf_goldens_families.py's (`Golden`): a
case is a family's tiny checkpoint, config.json as transformers 4 or 5
writes it, stored and computed in one dtype."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from etc.models.testing import as_transformers5, tiny_config

import hf_goldens_families
from hf_goldens_families import DIRECTORY, Golden

#: The tiny configs, as transformers 4 writes config.json: V2-Lite's shape,
#: V3's, and V2's group-limited routing (8 experts in 2 groups, the one
#: whose best expert scores highest kept, 2 experts a token from it).
FAMILIES = {"deepseek_v2": tiny_config("DeepseekV2ForCausalLM"),
            "deepseek_v3": tiny_config("DeepseekV3ForCausalLM"),
            "deepseek_v2_groups": tiny_config("DeepseekV2ForCausalLM", n_routed_experts=8,
                                              n_group=2, topk_group=1,
                                              topk_method="group_limited_greedy")}
SEEDS = {"deepseek_v2": 61, "deepseek_v3": 32, "deepseek_v2_groups": 33}
#: The config styles and dtypes of each family's goldens (default: both
#: styles in float32, transformers 4's in bfloat16 too): the group-limited
#: routing's in float32 (its layers are V2's).
STYLES = {"deepseek_v2_groups": (("transformers4", ("f32",)),)}


def cases() -> dict[str, dict]:
    """Every golden case by file name (`STYLES`)."""
    out = {}
    for name, config in FAMILIES.items():
        styles = STYLES.get(name, (("transformers4", ("f32", "bf16")),
                                   ("transformers5", ("f32",))))
        for style, dtypes in styles:
            raw = as_transformers5(config) if style == "transformers5" else config
            for dtype in dtypes:
                out[f"{name}-{style}-{dtype}"] = dict(config=raw, seed=SEEDS[name], dtype=dtype,
                                                      family=name)
    return out


def load(name: str, directory: Path = DIRECTORY) -> Golden:
    """The golden `name`, checked to be the case `cases()` names now."""
    return Golden.read(name, directory, cases(), "hf_goldens_deepseek.py")


def make(directory: Path = DIRECTORY, check: bool = False) -> list[str]:
    """Computes every golden; writes them, or with `check` compares them
    with the files. Returns what differs."""
    return hf_goldens_families.make(directory, check, every=cases(), load=load)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the files instead of writing them")
    problems = make(check=parser.parse_args(argv).check)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
