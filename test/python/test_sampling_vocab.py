"""Sampling at a real vocabulary size: the step kernel of a small model with
32,003 tokens (Llama 2's 32,000 and more: a row that is no whole number of
the kernels' 16-wide vectors or 128 lanes) draws with temperature, top-k,
top-p and min-p exactly the tokens of `etc.reference_sampling`, and so do
`Graph.sample`'s CPU kernel and its CUDA kernel (simulated lanes) on rows of
that length. test_sampling.py checks the kernels on rows of 37 and 200,
where a bisection over the logits' bits needs few passes and every partial
sum is short."""

import numpy as np
import pytest

import etc
from etc import reference_sampling
from etc.models.step.sampling import SamplingParams, sampling_inputs
from test_sampling import _graph, _inputs, _run

VOCAB = 32003

#: Each request's sampling (None: greedy). The reference's top-p costs a
#: pass over the row per distinct logit it keeps before the cut: top-p
#: alone (all 32,003 of them) is one row, top-p after a top-k the others.
PARAMS = [
    None,
    SamplingParams(1.0, seed=1),
    SamplingParams(0.6, seed=2),
    SamplingParams(1.0, top_k=50, seed=3),
    SamplingParams(2.0, top_k=1000, seed=4),
    SamplingParams(1.0, top_k=VOCAB - 1, seed=5),
    SamplingParams(0.8, top_k=40, top_p=0.9, seed=6),
    SamplingParams(1.2, top_k=1000, top_p=0.8, min_p=0.01, seed=7),
    SamplingParams(1.5, min_p=0.05, seed=8),
    SamplingParams(1.0, min_p=0.9, seed=9),
    SamplingParams(1.0, top_k=1, seed=10),
    SamplingParams(1.0, min_p=1.0, seed=11),
    SamplingParams(0.9, top_p=0.9, seed=12),
]
#: The rows drawn from the argmax only: greedy, top-k 1, min-p 1.
ARGMAX = (0, 10, 11)
TOP_P_ALONE = 12


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import etc.models as models
    from etc.models.testing import tiny_config, write_checkpoint

    path = write_checkpoint(tmp_path_factory.mktemp("vocab") / "qwen3",
                            tiny_config("Qwen3ForCausalLM", vocab_size=VOCAB), seed=3)
    return models.load(path, workers=2, max_seq_len=16, attention_chunk=4)


def _reference(logits, requests):
    inputs = sampling_inputs([q.sampling for q in requests])
    position = np.array([q.start + len(q.tokens) for q in requests], np.int32)
    return reference_sampling.sample(logits, inputs["temperature"], inputs["top_k"],
                                     inputs["top_p"], inputs["min_p"], inputs["seed"], position)


def test_the_step_kernel_samples_a_32k_vocabulary_as_the_reference(model):
    """A prefill and two decoding steps of 13 requests, one for each way of
    sampling: every token is the reference's draw from the step's logits
    at the request's position (the top-p-alone request in the first step
    only: the reference takes seconds for it)."""
    from etc.models import Request

    assert model.config.vocab_size == VOCAB
    rng = np.random.default_rng(0)
    requests = [Request(i, 0, [int(t) for t in rng.integers(0, VOCAB, 3 + i % 4)], sampling)
                for i, sampling in enumerate(PARAMS)]
    cache = model.new_cache(len(requests), 16)
    sampled_off_the_argmax = set()
    for step in range(3):
        logits, ids = model.step(cache, requests, return_logits=True)
        assert logits.shape == (len(requests), VOCAB)
        np.testing.assert_array_equal(ids, _reference(logits, requests), err_msg=f"step {step}")
        argmax = np.argmax(logits, axis=1)
        assert all(ids[i] == argmax[i] for i in ARGMAX if i < len(requests))
        sampled_off_the_argmax |= {q.slot for i, q in enumerate(requests) if ids[i] != argmax[i]}
        requests = [Request(q.slot, q.start + len(q.tokens), [int(ids[i])], q.sampling)
                    for i, q in enumerate(requests) if q.slot != TOP_P_ALONE]
    # The logits are nearly flat over 32k tokens (a random model): every
    # request that samples from more than one token left the argmax.
    assert sampled_off_the_argmax >= set(range(len(PARAMS))) - set(ARGMAX) - {9}


@pytest.mark.parametrize("kernels", ["native", "cuda"])
def test_sample_kernels_on_32k_rows(kernels):
    """`Graph.sample` on 48 rows of 32,003 Gaussian logits with every
    filter but top-p alone on some rows: the CPU kernel and the CUDA one
    (simulated lanes) draw the reference's tokens."""
    rng = np.random.default_rng(1)
    rows = 48
    logits = (rng.standard_normal((rows, VOCAB)) * rng.choice([0.3, 2.0, 8.0], (rows, 1)))
    top_k = rng.choice([0, 1, 20, 1000, VOCAB - 3, VOCAB + 1], rows)
    inputs = _inputs(logits.astype(np.float32), temperature=rng.choice([0.0, 0.5, 1.0, 1.7], rows),
                     top_k=top_k, top_p=np.where((top_k > 0) & (top_k <= 1000),
                                                 rng.choice([1.0, 0.9, 0.3], rows), 1.0),
                     min_p=rng.choice([0.0, 0.02, 0.5], rows),
                     seeds=rng.integers(0, 2 ** 63, rows), position=rng.integers(0, 4096, rows))
    want = reference_sampling.sample(**{name: inputs[name] for name in (
        "logits", "temperature", "top_k", "top_p", "min_p", "seed", "position")})
    kernel = etc.compile(_graph(VOCAB), target="cpu", workers=2, kernels=kernels)
    np.testing.assert_array_equal(_run(kernel, inputs), want)
