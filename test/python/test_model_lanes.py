"""A model's step worker at other lane counts (`etc.models.load(...,
lanes=, min_ctas=)`, issue #38): under the lane simulation a 256-lane step
kernel generates what the 128-lane one does, greedy and sampled; the
lanes and min_ctas are part of the compile cache's key (and of `etc cache
list`'s line), a draft model takes its model's; the CPU's own kernels and
values `etc.compile` refuses are refused by name. The command line's
--lanes / --min-ctas and their PTX: test_cli.py."""

from __future__ import annotations

import numpy as np
import pytest

import etc.models as models
from etc.models import SamplingParams
from etc.models.step import kernel_cache as model_cache
from etc.models.testing import tiny_config, write_checkpoint

#: Qwen3-MoE with a dense first layer (both kinds of MLP in one worker) and
#: a vocabulary of 2,048: the sampling tiles spread a row's 512 16-byte
#: slices over the CTA, so all 256 lanes take part (at 96 most would idle).
CONFIG = tiny_config("Qwen3MoeForCausalLM", vocab_size=2048, mlp_only_layers=[0])
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=8, kernels="cuda")
PROMPTS = [[5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


@pytest.fixture(scope="module")
def lanes(tmp_path_factory):
    """The checkpoint, a cache directory, and the model loaded at the
    default lanes (128) and at 256, both compiled into that cache."""
    root = tmp_path_factory.mktemp("lanes")
    checkpoint = write_checkpoint(root / "ckpt", CONFIG)
    cache = root / "cache"
    loaded = {n: models.load(checkpoint, cache=cache, lanes=n, **LOAD) for n in (None, 256)}
    return checkpoint, cache, loaded


def test_a_256_lane_step_worker_generates_what_128_lanes_do(lanes):
    _, _, loaded = lanes
    narrow, wide = loaded[None], loaded[256]
    assert narrow.kernels[0].abi.lanes == 128 and wide.kernels[0].abi.lanes == 256
    want = narrow.generate(PROMPTS, 4, return_logits=True)
    got = wide.generate(PROMPTS, 4, return_logits=True)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # Sampled (top-k, top-p: the sampling tiles over the whole CTA).
    sampling = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=3)
    assert wide.generate(PROMPTS, 6, sampling=sampling).tokens == \
        narrow.generate(PROMPTS, 6, sampling=sampling).tokens


def test_the_lanes_are_part_of_the_cache_key(lanes):
    checkpoint, cache, loaded = lanes
    entries = models.KernelCache(cache).entries()
    assert len(entries) == 2
    summaries = sorted(entry.summary for entry in entries)
    assert summaries[0].endswith("kernels=cuda") and summaries[1].endswith("kernels=cuda lanes=256")
    # Each load finds its own kernel again: no 128-lane kernel for 256.
    again = models.load(checkpoint, cache=cache, lanes=256, **LOAD)
    assert again.kernel_source == "cache" and again.kernels[0].abi.lanes == 256
    assert models.load(checkpoint, cache=cache, lanes=128, **LOAD).kernels[0].abi.lanes == 128
    # A kernel file is checked against the lanes asked for.
    (wide,) = [entry.path for entry in entries if entry.description["compile"]["lanes"] == 256]
    with pytest.raises(ValueError, match="compile.lanes: 256 in the kernel, 128 wanted"):
        models.load(checkpoint, kernel=wide, **LOAD)
    assert models.load(checkpoint, kernel=wide, lanes=256, **LOAD).kernel_source == "file"
    config = models.ModelConfig.from_dict(CONFIG)

    def key(**options):
        graph, compile = models.step_options(config, **dict(LOAD, **options))
        return model_cache.key_of(model_cache.describe(config, graph, compile))

    # 128 is the default; lanes and min_ctas each change the key, on the
    # simulation and on CUDA.
    assert key(lanes=128) == key()
    assert len({key(), key(lanes=256), key(lanes=256, min_ctas=1), key(min_ctas=2)}) == 4
    cuda = dict(target="cuda", kernels="native")
    assert key(lanes=128, **cuda) == key(**cuda)
    assert len({key(**cuda), key(lanes=256, **cuda), key(lanes=256, min_ctas=1, **cuda)}) == 3
    graph, compile = models.step_options(config, **dict(LOAD, lanes=256, min_ctas=1))
    described = model_cache.describe(config, graph, compile)["compile"]
    assert (described["lanes"], described["min_ctas"]) == (256, 1)
    assert model_cache.CacheEntry(entries[0].path, "k", 0, 0.0,
                                  {"compile": described}).summary.endswith(" lanes=256 min_ctas=1")


def test_a_draft_model_takes_the_models_lanes(lanes):
    """One CTA size per model: the draft (here the same checkpoint, so the
    same kernel, from the cache) is compiled for the model's lanes."""
    checkpoint, _, loaded = lanes
    draft = loaded[256].draft_model(checkpoint)
    assert draft.kernel_source == "cache" and draft.kernels[0].abi.lanes == 256


@pytest.mark.parametrize("options, message", [
    (dict(lanes=256), "load: lanes=256 applies to CUDA kernels"),
    (dict(min_ctas=2), "load: min_ctas=2 applies to CUDA kernels"),
    (dict(lanes=256, kernels="amx"), "load: lanes=256 applies to CUDA kernels"),
    (dict(lanes=100, kernels="cuda"), "load: lanes=100 must be a multiple of 32"),
    (dict(lanes=2048, kernels="cuda"), "load: lanes=2048 must be a multiple of 32 .* at most 1024"),
    (dict(lanes=0, kernels="cuda"), "load: lanes=0 must be a positive integer"),
    (dict(lanes=True, kernels="cuda"), "load: lanes=True must be a positive integer"),
    (dict(min_ctas=0, kernels="cuda"), "load: min_ctas=0 must be a positive integer"),
    (dict(min_ctas=1.0, kernels="cuda"), r"load: min_ctas=1.0 must be a positive integer"),
    (dict(lanes=1024, min_ctas=3, kernels="cuda"),
     "load: min_ctas=3 CTAs of 1024 lanes exceed the 2,048 threads an SM holds"),
    (dict(min_ctas=17, kernels="cuda"), "min_ctas=17 CTAs of 128 lanes exceed"),
    # Before the device is looked for (a machine without a GPU says why the
    # value is wrong, not that it has no GPU).
    (dict(lanes=100, target="cuda"), "load: lanes=100 must be a multiple of 32"),
])
def test_bad_lanes_are_refused_by_name(lanes, options, message):
    checkpoint, cache, _ = lanes
    load = dict(LOAD, kernels="native", cache=cache)
    load.update(options)
    with pytest.raises(ValueError, match=message):
        models.load(checkpoint, **load)
    with pytest.raises(ValueError, match=message):
        models.compile_checkpoint(checkpoint, **{k: v for k, v in load.items()
                                                 if k != "cache"}, cache=False)
