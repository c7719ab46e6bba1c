"""Sampling on the device (`Graph.sample`, `SamplingParams`): the random
generator against Philox's known answers, the kernels (the CPU one and the
CUDA one with simulated lanes) against `etc.reference_sampling` token for
token, the distribution of many draws against the softmax (chi-square),
top-k/top-p/min-p never choosing an excluded token, seeds that reproduce
whatever the batch, schedule and worker count, and the errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from etc import reference_sampling
from etc.models.step.sampling import SamplingParams, fresh_seeds, sampling_inputs
from ptxas_check import assemble, assert_no_spills, needs_ptxas

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)

VOCAB = 37  # not a multiple of the 128 lanes, nor of 32


def _graph(vocab: int = VOCAB, dtype: str = "f32", tile=None,
           max_logprobs: int | None = None) -> etc.Graph:
    g = etc.Graph("sampler")
    R = g.symbol("R")
    logits = g.input("logits", (R, vocab), dtype)
    params = [g.input("temperature", (R,), "f32"), g.input("top_k", (R,), "i32"),
              g.input("top_p", (R,), "f32"), g.input("min_p", (R,), "f32"),
              g.input("seed", (R, 2), "i32"), g.input("position", (R,), "i32")]
    if max_logprobs is None:
        g.output(g.sample(logits, *params, tile=tile))
    else:
        g.output(*g.sample(logits, *params, tile=tile, logprobs=g.input("logprobs", (R,), "i32"),
                           max_logprobs=max_logprobs))
    return g


GRAPH = _graph()


@pytest.fixture(scope="module")
def kernels():
    """The CPU kernel and the CUDA kernel with simulated lanes."""
    return {"cpu": etc.compile(GRAPH, target="cpu", workers=2),
            "cuda": etc.compile(GRAPH, target="cpu", kernels="cuda", workers=2)}


def _inputs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seeds=None, position=7):
    """The op's inputs for rows of `logits`; scalars apply to every row;
    seeds default to 0, 1, 2, ..."""
    rows = logits.shape[0]
    full = lambda v, dtype: np.broadcast_to(np.asarray(v, dtype), (rows,)).copy()
    if seeds is None:
        seeds = np.arange(rows)
    seeds = np.asarray(seeds, np.uint64)
    words = np.stack([seeds & np.uint64(0xFFFFFFFF), seeds >> np.uint64(32)], axis=1)
    return dict(logits=np.ascontiguousarray(logits, np.float32),
                temperature=full(temperature, np.float32), top_k=full(top_k, np.int32),
                top_p=full(top_p, np.float32), min_p=full(min_p, np.float32),
                seed=words.astype(np.uint32).view(np.int32), position=full(position, np.int32))


def _run(kernel, inputs) -> np.ndarray:
    (tokens,) = kernel.run(**inputs)
    assert tokens.dtype == np.int32
    return tokens


def _draws(kernel, logits_row, count, **params):
    """`count` draws from one row of logits (padded to VOCAB with -inf,
    which is never drawn) with seeds 0 .. count - 1."""
    row = np.full(VOCAB, -np.inf, np.float32)
    row[:len(logits_row)] = logits_row
    return _run(kernel, _inputs(np.tile(row, (count, 1)), **params))


# ----------------------------------------------------------------------
# The random numbers
# ----------------------------------------------------------------------


def test_philox_matches_the_known_answers():
    # Random123's kat_vectors for philox4x32-10: counter, key -> output.
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2,
              (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, want in cases:
        assert tuple(int(w) for w in reference_sampling.philox4x32(counter, key)) == want


def test_the_kernels_draw_exactly_the_reference_tokens(kernels):
    """Random logits and parameters, every filter on some rows: the same
    token as the NumPy reference, row for row."""
    rng = np.random.default_rng(0)
    rows = 300
    logits = (rng.standard_normal((rows, VOCAB)) * 2).astype(np.float32)
    inputs = _inputs(logits, temperature=rng.choice([0.0, 0.3, 1.0, 2.5], rows),
                     top_k=rng.choice([0, 1, 3, 10, VOCAB, 100], rows),
                     top_p=rng.choice([1.0, 0.9, 0.5, 0.05], rows),
                     min_p=rng.choice([0.0, 0.05, 0.3], rows),
                     seeds=rng.integers(0, 2 ** 63, rows), position=rng.integers(0, 4096, rows))
    want = etc.reference.evaluate(GRAPH, **inputs)[0]
    for name, kernel in kernels.items():
        np.testing.assert_array_equal(_run(kernel, inputs), want, err_msg=name)


# ----------------------------------------------------------------------
# The distribution
# ----------------------------------------------------------------------

#: The 0.999 quantile of the chi-square distribution with 15 degrees of
#: freedom: a right sampler exceeds it once in a thousand seed sets.
CHI2_15_999 = 37.697
LOGITS16 = np.array([2.0, 1.5, 1.0, 0.9, 0.5, 0.3, 0.0, -0.2, -0.5, -0.7, -1.0, -1.2, -1.5,
                     -2.0, -2.5, -3.0], np.float32)


def _softmax(x, temperature):
    z = np.asarray(x, np.float64) / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def _chi2_quantile(df: int) -> float:
    """The 0.999 quantile of the chi-square distribution with `df` degrees
    of freedom (Wilson-Hilferty: within 1% from df = 3 on, a little above
    the true value below)."""
    z = 3.0902  # the standard normal's 0.999 quantile
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _chi2(tokens, p):
    """Pearson's statistic of the token counts against probabilities `p`."""
    counts = np.bincount(tokens, minlength=len(p))
    expected = p * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_draws_follow_the_softmax_at_the_temperature(kind, kernels):
    """4,000 draws (seeds 0 .. 3,999) from 16 logits at temperature 0.7 pass
    a chi-square test against softmax(x / 0.7), and fail it against what a
    wrong sampler would follow: the temperature ignored, or every draw
    shifted one token along the CDF."""
    p = _softmax(LOGITS16, 0.7)
    tokens = _draws(kernels[kind], LOGITS16, 4000, temperature=0.7)
    assert _chi2(tokens, p) < CHI2_15_999
    assert _chi2(tokens, _softmax(LOGITS16, 1.0)) > 3 * CHI2_15_999
    assert _chi2(np.minimum(tokens + 1, 15), p) > 3 * CHI2_15_999
    assert _chi2(np.maximum(tokens - 1, 0), p) > 3 * CHI2_15_999


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_filtered_draws_follow_the_renormalised_softmax(kind, kernels):
    """Top-k, top-p and min-p: draws never leave the kept set and, within
    it, follow the softmax renormalised over it."""
    p = _softmax(LOGITS16, 1.3)
    order = np.argsort(-p, kind="stable")
    cases = [
        (dict(top_k=5), order[:5]),
        # Mass before each token in order: keep while it is below 0.8.
        (dict(top_p=0.8), order[:int(np.searchsorted(np.cumsum(p[order]), 0.8) + 1)]),
        (dict(min_p=0.2), np.nonzero(p >= 0.2 * p.max())[0]),
        # Top-p over what top-k keeps.
        (dict(top_k=6, top_p=0.7),
         order[:int(np.searchsorted(np.cumsum(p[order[:6]] / p[order[:6]].sum()), 0.7) + 1)]),
    ]
    for params, kept in cases:
        tokens = _draws(kernels[kind], LOGITS16, 3000, temperature=1.3, **params)
        assert set(np.unique(tokens)) <= set(kept.tolist()), params
        q = np.zeros_like(p)
        q[kept] = p[kept] / p[kept].sum()
        counts = np.bincount(tokens, minlength=16)[kept]
        expected = q[kept] * len(tokens)
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < _chi2_quantile(len(kept) - 1), (params, chi2)


# ----------------------------------------------------------------------
# What is never chosen
# ----------------------------------------------------------------------


def _excluded_never_chosen(kernel, logits_row, allowed, count=400, **params):
    tokens = _draws(kernel, logits_row, count, **params)
    assert set(np.unique(tokens).tolist()) <= set(allowed), (params, np.unique(tokens))
    return tokens


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_filters_never_choose_an_excluded_token(kind, kernels):
    kernel = kernels[kind]
    rng = np.random.default_rng(1)
    x = rng.standard_normal(VOCAB).astype(np.float32)
    order = np.argsort(-x, kind="stable")
    everything = range(VOCAB)
    # Top-k at its edges: 1 (the argmax), k >= vocab, 0 (off).
    _excluded_never_chosen(kernel, x, [order[0]], top_k=1)
    for k in (VOCAB, VOCAB + 5, 0):
        tokens = _excluded_never_chosen(kernel, x, everything, top_k=k, temperature=50.0)
        assert len(np.unique(tokens)) > VOCAB // 2  # nothing cut
    _excluded_never_chosen(kernel, x, order[:4], top_k=4, temperature=10.0)
    # top_p = 1 and min_p = 0 keep all; a tiny top_p keeps the top token.
    tokens = _excluded_never_chosen(kernel, x, everything, top_p=1.0, min_p=0.0,
                                    temperature=50.0)
    assert len(np.unique(tokens)) > VOCAB // 2
    _excluded_never_chosen(kernel, x, [order[0]], top_p=1e-6, temperature=10.0)
    _excluded_never_chosen(kernel, x, [order[0]], min_p=1.0, temperature=10.0)
    # Ties at the k-th value are all kept, and nothing below them.
    ties = np.full(VOCAB, -1.0, np.float32)
    ties[[3, 9, 20, 30]] = 2.0
    ties[[5, 6]] = 1.0
    tokens = _excluded_never_chosen(kernel, ties, [3, 9, 20, 30, 5, 6], top_k=5)
    assert {5, 6} <= set(tokens.tolist())
    tokens = _excluded_never_chosen(kernel, ties, [3, 9, 20, 30], top_k=2)
    assert set(tokens.tolist()) == {3, 9, 20, 30}
    # Equal logits: uniform over all (and over the ties top-p keeps).
    equal = np.zeros(VOCAB, np.float32)
    tokens = _excluded_never_chosen(kernel, equal, everything, count=3700)
    assert _chi2(tokens, np.full(VOCAB, 1 / VOCAB)) < _chi2_quantile(VOCAB - 1)
    _excluded_never_chosen(kernel, equal, everything, top_p=0.1)
    # -inf logits are never drawn; a row with only one number draws it.
    masked = x.copy()
    masked[::2] = -np.inf
    tokens = _excluded_never_chosen(kernel, masked, range(1, VOCAB, 2), temperature=20.0)
    assert len(np.unique(tokens)) > VOCAB // 4
    single = np.full(VOCAB, -np.inf, np.float32)
    single[17] = -3.0
    _excluded_never_chosen(kernel, single, [17], top_k=3, top_p=0.5)
    # NaN is never drawn; +inf logits share all the mass.
    odd = x.copy()
    odd[[2, 11]] = np.nan
    odd[[4, 30]] = np.inf
    tokens = _excluded_never_chosen(kernel, odd, [4, 30])
    assert set(tokens.tolist()) == {4, 30}


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_temperature_zero_is_argmax(kind, kernels):
    """Greedy rows (temperature 0, also negative or NaN) give `argmax`,
    whatever the other parameters: first of equal values, NaN first, and
    rows with no number above -inf are greedy at any temperature."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, VOCAB)).astype(np.float32)
    x[1, [3, 20]] = 50.0
    x[2, :] = -np.inf
    x[3, 30] = np.nan
    x[4, 5] = np.inf
    x[5, :] = np.nan
    inputs = _inputs(x, temperature=[0.0, 0.0, 1.0, 0.0, 0.0, 1.0, -1.0, np.nan, 0.0],
                     top_k=3, top_p=0.5, min_p=0.2)
    got = _run(kernels[kind], inputs)
    np.testing.assert_array_equal(got, etc.reference_llm.argmax(x))
    assert list(got[:6]) == [int(np.argmax(x[0])), 3, 0, 30, 5, 0]


WIDE = 16 * 12 + 11  # whole 16-wide vectors and a tail


def _greedy_rows() -> tuple[np.ndarray, list]:
    """Rows of WIDE columns that place the argmax where the CPU kernels'
    vector searches could miss it, and the column each row wants."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, WIDE)).astype(np.float32)
    want = []

    def row(r, column, **set_to):
        for value, columns in set_to.values():
            x[r, columns] = value
        want.append(column)
    row(0, 0, top=(9.0, [0]))
    row(1, WIDE - 1, top=(9.0, [WIDE - 1]))                     # in the tail
    row(2, 15, ties=(9.0, [15, 16, 40]))                        # a vector's last lane first
    row(3, 21, ties=(9.0, [21, 19 + 16 * 11]))                  # the first of equal values
    row(4, 70, top=(9.0, [3]), nan=(np.nan, [70]))              # NaN after the maximum
    row(5, WIDE - 2, top=(9.0, [5]), nan=(np.nan, [WIDE - 2]))  # NaN in the tail after it
    row(6, 8, nan=(np.nan, [8, 100]), top=(9.0, [50]))          # NaN before it
    row(7, 0, all=(-np.inf, slice(None)))
    row(8, 33, all=(-np.inf, slice(None)), nan=(np.nan, [33]))  # -inf, then NaN
    row(9, 0, all=(np.nan, slice(None)))
    row(10, 17, all=(-1.0, slice(None)), zeros=(-0.0, [17, 90]), plus=(0.0, [18]))
    row(11, 64, top=(np.inf, [64, 65]), big=(3e38, [2]))
    row(12, WIDE - 11, top=(9.0, [WIDE - 11]))                  # the tail's first column
    row(13, 16 * 12 - 1, top=(9.0, [16 * 12 - 1]))              # the last whole vector's end
    row(14, 5, all=(-3e38, slice(None)), top=(-2e38, [5, 6]))
    row(15, int(np.argmax(x[15])))
    return x, want


@pytest.mark.parametrize("kind", ["sample", "argmax", "sample cuda"])
def test_greedy_rows_of_whole_vectors_and_a_tail_are_argmax(kind):
    """The greedy pick of the CPU kernels (a maximum, then vector searches
    for the first NaN or maximum and for a NaN after it) is `argmax` on
    rows of whole vectors and a tail: the first of equal values, in a
    vector's last lane, in the tail, NaN before or after the maximum, rows
    of -inf or NaN, -0 before +0, infinities."""
    x, want = _greedy_rows()
    if kind == "argmax":
        g = etc.Graph("argmax")
        g.output(g.argmax(g.input("logits", (g.symbol("R"), WIDE), "f32"), tile=(3,)))
        (got,) = etc.compile(g, target="cpu", workers=2).run(logits=x)
    else:
        kernel = etc.compile(_graph(WIDE), target="cpu", workers=2,
                             kernels="cuda" if kind == "sample cuda" else "native")
        got = _run(kernel, _inputs(x, temperature=0.0, top_k=3, top_p=0.5))
    np.testing.assert_array_equal(got, etc.reference_llm.argmax(x))
    assert got.tolist() == want


def test_the_cpu_kernels_pick_greedy_tokens_with_vector_searches():
    """The CPU `sample` and `argmax` kernels find a greedy row's token by
    vector searches (an "or" over a vector's comparisons), not by a scalar
    scan of the row: a scalar scan of a 128k vocabulary cost 0.6 ms a row,
    the vector passes 0.02 (docs/benchmarks.md, "Sampling on the device")."""
    g = etc.Graph("argmax")
    g.output(g.argmax(g.input("logits", (g.symbol("R"), WIDE), "f32")))
    for graph in (_graph(WIDE), g):
        text = etc.compile(graph, target="cpu", workers=1).ir("event")
        assert "vector.reduction <or>" in text, graph.name


def _draw_rows() -> np.ndarray:
    """Rows of WIDE columns where a blocked inverse-CDF walk could leave
    the scalar walk's column: ties, -inf and NaN, mass at block
    boundaries and in the tail, running sums that stop growing."""
    rng = np.random.default_rng(7)
    x = np.full((7, WIDE), -np.inf, np.float32)
    x[0] = 0.0                                             # all tied
    x[1] = rng.standard_normal(WIDE)                       # -inf in whole blocks, NaN
    x[1, :48] = -np.inf
    x[1, rng.choice(WIDE, 40)] = -np.inf
    x[1, [50, 130]] = np.nan
    x[2, [15, 16]] = 1.0                                   # a block's last, the next's first
    x[3, [16 * 12 - 1, 16 * 12, WIDE - 1]] = 2.0           # the last block's end, the tail
    x[4, 0], x[4, 1:] = 0.0, -20.0                         # sums flat after column 0
    x[5, :] = -20.0                                        # ... and across the blocks
    x[5, [31, 100]] = 0.0
    x[6, :20] = 0.0                                        # see the boundary test
    return x


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.8, top_p=0.9),
                                    dict(temperature=2.0, top_k=30, min_p=0.01)])
def test_sampled_rows_of_whole_vectors_and_a_tail_draw_the_reference_tokens(params):
    """The CPU kernel's draw (weights 16 at a time, blocks skipped whole,
    `etc.ops.draw`) picks the reference's token on every row of
    `_draw_rows`, over 64 seeds each."""
    x = np.repeat(_draw_rows(), 64, axis=0)
    inputs = _inputs(x, **params, seeds=np.arange(len(x)), position=np.arange(len(x)) * 3)
    want = etc.reference.evaluate(_graph(WIDE), **inputs)[0]
    kernel = etc.compile(_graph(WIDE), target="cpu", workers=2)
    np.testing.assert_array_equal(_run(kernel, inputs), want)


def test_a_target_equal_to_a_blocks_last_running_sum_passes_the_block():
    """Seed 0 at position 1485375 draws u = 13421773 / 2**24, and u * 20
    rounds to 16.0: on 20 tied columns (the rest -inf) the target equals
    the running sum after column 15, the last of the first block. The
    running sum must exceed the target, so the token is column 16 (the
    reference's), not 15."""
    x = _draw_rows()[6:]
    inputs = _inputs(x, seeds=np.array([0]), position=1485375)
    u = reference_sampling.uniform(inputs["seed"], inputs["position"])[0]
    assert u * np.float32(20.0) == np.float32(16.0)
    kernel = etc.compile(_graph(WIDE), target="cpu", workers=1)
    assert _run(kernel, inputs).tolist() == [16] == etc.reference.evaluate(
        _graph(WIDE), **inputs)[0].tolist()


def test_the_cpu_kernel_draws_with_vector_weights():
    """The CPU `sample` kernel's draw computes the weights 16 at a time
    and adds them from the vector's lanes (16 extracts, for the total and
    for the walk), not one scalar exp per column in a loop: the scalar
    draw cost 0.4 ms a row of 128k logits (docs/benchmarks.md)."""
    text = etc.compile(_graph(WIDE), target="cpu", workers=1).ir("event")
    assert text.count("vector.extract ") >= 2 * 16


# ----------------------------------------------------------------------
# Seeds
# ----------------------------------------------------------------------


def test_a_seed_reproduces_its_tokens_alone_and_in_any_batch():
    """A row's token depends on its logits, seed and position only: alone,
    in batches of other rows at other indices, under both schedules and
    several worker counts, on both kernels."""
    rng = np.random.default_rng(3)
    rows = 40
    logits = rng.standard_normal((rows, VOCAB)).astype(np.float32)
    inputs = _inputs(logits, temperature=1.0, top_k=rng.choice([0, 8], rows),
                     top_p=rng.choice([1.0, 0.9], rows), seeds=rng.integers(0, 2 ** 64 - 1, rows,
                                                                           dtype=np.uint64),
                     position=rng.integers(0, 100, rows))
    want = etc.reference.evaluate(GRAPH, **inputs)[0]
    perm = rng.permutation(rows)
    for schedule, workers, kernels in (("static", 1, "native"), ("static", 3, "native"),
                                       ("dynamic", 2, "native"), ("dynamic", 3, "cuda")):
        kernel = etc.compile(GRAPH, target="cpu", schedule=schedule, workers=workers,
                             kernels=kernels)
        np.testing.assert_array_equal(_run(kernel, inputs), want)
        shuffled = {k: v[perm] for k, v in inputs.items()}
        np.testing.assert_array_equal(_run(kernel, shuffled), want[perm])
        for r in (0, 17, 39):
            alone = {k: v[r:r + 1] for k, v in inputs.items()}
            assert _run(kernel, alone)[0] == want[r]
    # Another seed or position draws differently.
    other = dict(inputs, position=inputs["position"] + 1)
    assert np.any(etc.reference.evaluate(GRAPH, **other)[0] != want)


def test_a_seed_keys_all_64_bits():
    """Seeds that differ only in their high word draw different numbers."""
    low = _inputs(np.zeros((1, 4), np.float32), seeds=[5])
    high = _inputs(np.zeros((1, 4), np.float32), seeds=[5 + (1 << 40)])
    u = [reference_sampling.uniform(i["seed"], i["position"])[0] for i in (low, high)]
    assert u[0] != u[1]


# ----------------------------------------------------------------------
# Dtypes, tiles and the GPU code
# ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tile", [("f16", None), ("bf16", (3,))])
def test_half_precision_logits_and_tiles_of_several_rows(dtype, tile):
    g = _graph(200, dtype, tile)
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((11, 200)).astype(np.float32)
    inputs = _inputs(logits, temperature=[0.0, 0.8] * 5 + [2.0], top_k=[0, 20] * 5 + [0],
                     top_p=0.9)
    if dtype == "f16":
        inputs["logits"] = logits.astype(np.float16)
    want = etc.reference.evaluate(g, **inputs)[0]
    for kernels in ("native", "cuda"):
        kernel = etc.compile(g, target="cpu", workers=2, kernels=kernels)
        np.testing.assert_array_equal(_run(kernel, inputs), want, err_msg=kernels)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("logprobs", [None, 20])
def test_sample_ptx(chip, logprobs, tmp_path):
    ptx = etc.compile(_graph(1000, "bf16", max_logprobs=logprobs), target="cuda",
                      chip=chip).ptx
    body = re.search(r"\.func \w*sample_gpu\w*\(.*?\n\}", ptx, re.S).group(0)
    assert "shfl.sync.bfly" in body and "bar.sync" in body and "mul.hi.u32" in body
    if logprobs:
        assert "lg2.approx" in body or "ex2.approx" in body
    assert_no_spills(assemble(ptx, chip, tmp_path, "sample"))


# ----------------------------------------------------------------------
# Log-probabilities
# ----------------------------------------------------------------------

LOGPROB_GRAPH = _graph(200, max_logprobs=6)


@pytest.fixture(scope="module")
def logprob_kernels():
    return {kind: etc.compile(LOGPROB_GRAPH, target="cpu", workers=2, kernels=kind)
            for kind in ("native", "cuda")}


@pytest.mark.parametrize("kind", ["native", "cuda"])
def test_logprobs_are_the_log_softmax_the_token_was_drawn_from(kind, logprob_kernels):
    """Computed on the device with the draw: at temperature 1 without
    filters they equal NumPy's log-softmax of the logits within 1e-4; with
    a temperature and filters, the renormalised log-softmax of what the
    filters kept (-inf for the rest); greedy rows get the logits'
    log-softmax. The top ones are the most likely, ties by lower id; rows
    that ask for none are left alone."""
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal((9, 200)) * 4).astype(np.float32)
    logits[5, 7:11] = logits[5].max() + 1  # four equal largest values
    inputs = _inputs(logits, temperature=[1.0, 1.0, 0.0, 0.7, 1.3, 1.0, 2.0, 1.0, 0.0],
                     top_k=[0, 0, 0, 5, 0, 0, 3, 0, 0], top_p=[1, 1, 1, 1, 0.8, 1, 1, 1, 1],
                     min_p=[0, 0, 0, 0, 0, 0, 0, 0.3, 0])
    inputs["logprobs"] = np.array([6, 0, 3, 6, 2, 6, 6, 4, -1], np.int32)
    tokens, values, ids = logprob_kernels[kind].run(**inputs)
    want_values, want_ids = reference_sampling.logprobs(
        logits, inputs["temperature"], inputs["top_k"], inputs["top_p"], inputs["min_p"],
        tokens, inputs["logprobs"], 6)
    np.testing.assert_array_equal(tokens, etc.reference.evaluate(LOGPROB_GRAPH, **inputs)[0])
    for r, count in enumerate(inputs["logprobs"]):
        if count < 0:
            continue
        np.testing.assert_allclose(values[r, :1 + count], want_values[r, :1 + count],
                                   atol=1e-5, rtol=1e-6, err_msg=f"row {r}")
        np.testing.assert_array_equal(ids[r, :count], want_ids[r, :count], err_msg=f"row {r}")
    log_softmax = lambda x: x - x.max() - np.log(np.sum(np.exp(x - x.max())))
    for r in (0, 1, 2):  # temperature 1 unfiltered, and greedy
        np.testing.assert_allclose(values[r, 0], log_softmax(logits[r].astype(np.float64))
                                   [tokens[r]], atol=1e-4)
    np.testing.assert_array_equal(ids[0], np.argsort(-logits[0], kind="stable")[:6])
    np.testing.assert_array_equal(ids[5, :4], [7, 8, 9, 10])
    # Top-k 5: the sixth most likely is filtered out.
    assert np.isfinite(values[3, 1:6]).all() and values[3, 6] == -np.inf
    kept = np.exp(values[3, 1:6].astype(np.float64))
    assert abs(kept.sum() - 1) < 1e-4  # the kept tokens' probabilities sum to 1


# ----------------------------------------------------------------------
# Errors and parameters
# ----------------------------------------------------------------------


def test_sample_names_the_operand_at_fault():
    g = etc.Graph("bad")
    R = g.symbol("R")
    logits = g.input("logits", (R, 8), "f32")
    good = dict(temperature=g.input("t", (R,), "f32"), top_k=g.input("k", (R,), "i32"),
                top_p=g.input("p", (R,), "f32"), min_p=g.input("q", (R,), "f32"),
                seed=g.input("s", (R, 2), "i32"), position=g.input("pos", (R,), "i32"))
    g.sample(logits, **good)
    bad = {"temperature": g.input("t16", (R,), "f16"), "top_k": g.input("kf", (R,), "f32"),
           "top_p": g.input("p3", (3,), "f32"), "seed": g.input("s1", (R,), "i32"),
           "position": g.input("pos2", (R, 2), "i32")}
    for role, tensor in bad.items():
        with pytest.raises(ValueError, match=f"sample: .*'{role}'"):
            g.sample(logits, **dict(good, **{role: tensor}))
    with pytest.raises(ValueError, match="sample: .*'logits'"):
        g.sample(g.input("flat", (R,), "f32"), **good)


def test_sampling_params_are_checked_by_field():
    assert SamplingParams().greedy and not SamplingParams(temperature=0.5).greedy
    for field, value in (("temperature", -0.1), ("temperature", float("inf")),
                         ("temperature", "hot"), ("top_k", -2), ("top_k", 2.5),
                         ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.01), ("min_p", 2.0),
                         ("seed", 1.5), ("seed", True), ("logprobs", -1), ("logprobs", 21),
                         ("logprobs", True)):
        with pytest.raises(ValueError, match=f"SamplingParams: {field}="):
            SamplingParams(**{field: value})
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 1.0  # frozen
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's "disabled"


def test_sampling_inputs_carry_each_request_and_split_seeds():
    params = [None, SamplingParams(0.7, 40, 0.9, 0.05, seed=(7 << 32) + 3),
              SamplingParams(1.0, seed=-1), SamplingParams(1.0)]
    inputs = sampling_inputs(params)
    np.testing.assert_array_equal(inputs["temperature"], np.float32([0.0, 0.7, 1.0, 1.0]))
    np.testing.assert_array_equal(inputs["top_k"], [0, 40, 0, 0])
    np.testing.assert_array_equal(inputs["top_p"], np.float32([1.0, 0.9, 1.0, 1.0]))
    np.testing.assert_array_equal(inputs["min_p"], np.float32([0.0, 0.05, 0.0, 0.0]))
    assert inputs["seed"].dtype == np.int32 and inputs["seed"].shape == (4, 2)
    assert list(inputs["seed"][1]) == [3, 7] and list(inputs["seed"][2]) == [-1, -1]
    # A seed of None is a fresh random one each time.
    assert list(sampling_inputs(params)["seed"][3]) != list(inputs["seed"][3])
    with pytest.raises(ValueError, match="request 1: sampling="):
        sampling_inputs([None, {"temperature": 1.0}])


def test_sampling_inputs_follow_replaced_params_and_draw_64_bit_seeds():
    """Each request's row comes from its parameters as they are now (a
    `dataclasses.replace`d copy makes its own), the largest ints are
    clipped as documented, and fresh seeds are 64-bit ones, one each."""
    import dataclasses

    base = SamplingParams(0.7, top_k=1 << 40, seed=(1 << 64) + 5, logprobs=3)
    changed = dataclasses.replace(base, temperature=1.5, top_k=2, top_p=0.5, logprobs=None)
    inputs = sampling_inputs([base, changed, None])
    np.testing.assert_array_equal(inputs["temperature"], np.float32([0.7, 1.5, 0.0]))
    np.testing.assert_array_equal(inputs["top_k"], [(1 << 31) - 1, 2, 0])
    np.testing.assert_array_equal(inputs["top_p"], np.float32([1.0, 0.5, 1.0]))
    np.testing.assert_array_equal(inputs["logprobs"], [3, -1, -1])
    assert list(inputs["seed"][0]) == [5, 0] and list(inputs["seed"][1]) == [5, 0]
    for name, array in inputs.items():
        assert array.flags.c_contiguous and len(array) == 3, name
    seeds = fresh_seeds(64)
    assert len(seeds) == 64 == len(set(seeds)) and fresh_seeds(0) == []
    assert all(isinstance(s, int) and 0 <= s < 1 << 64 for s in seeds)
    assert max(seeds) >= 1 << 62  # 64 draws under 2**62: once in 2**128


# ----------------------------------------------------------------------
# In the step kernel of a model
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import etc.models as models
    from etc.models.testing import tiny_config, write_checkpoint

    path = write_checkpoint(tmp_path_factory.mktemp("sampling") / "qwen3",
                            tiny_config("Qwen3ForCausalLM"), seed=11)
    return models.load(path, workers=2, max_seq_len=32, attention_chunk=4)


def _decode(model, requests, steps):
    """`steps` steps from the requests' prompts (Request objects whose
    tokens are the prompt); the new ids per request, and each step's logits
    and ids."""
    from etc.models import Request

    cache = model.new_cache(max(q.slot for q in requests) + 1, 32)
    new = [[] for _ in requests]
    history = []
    current = list(requests)
    for _ in range(steps):
        logits, ids = model.step(cache, current, return_logits=True)
        history.append((current, logits, ids))
        for i, q in enumerate(current):
            new[i].append(int(ids[i]))
        current = [Request(q.slot, q.start + len(q.tokens), [int(ids[i])], q.sampling)
                   for i, q in enumerate(current)]
    return new, history


def test_the_step_kernel_samples_each_request_with_its_parameters(model):
    """A batch mixing greedy and sampled requests: every id is what the
    reference draws from the step's logits at the request's position, the
    greedy ones the argmax."""
    from etc.models import Request

    requests = [Request(0, 0, [3, 1, 4], None),
                Request(1, 0, [1, 5], SamplingParams(temperature=0.9, seed=1)),
                Request(2, 0, [9, 2, 6, 5], SamplingParams(1.5, top_k=20, top_p=0.9, seed=2)),
                Request(3, 0, [3], SamplingParams(0.7, min_p=0.1, seed=3))]
    new, history = _decode(model, requests, 4)
    for current, logits, ids in history:
        inputs = sampling_inputs([q.sampling for q in current])
        position = np.array([q.start + len(q.tokens) for q in current], np.int32)
        want = reference_sampling.sample(logits, inputs["temperature"], inputs["top_k"],
                                         inputs["top_p"], inputs["min_p"], inputs["seed"],
                                         position)
        np.testing.assert_array_equal(ids, want)
        assert ids[0] == np.argmax(logits[0])
    # The sampled requests did not all follow the argmax.
    assert any(ids[r] != np.argmax(logits[r]) for _, logits, ids in history for r in (1, 2))


def test_a_seeded_request_gets_its_tokens_alone_or_batched(model):
    from etc.models import Request

    seeded = SamplingParams(temperature=1.2, top_p=0.95, seed=1234)
    alone, _ = _decode(model, [Request(0, 0, [7, 8, 9], seeded)], 5)
    others = [Request(0, 0, [1, 2], SamplingParams(1.0, seed=5)),
              Request(1, 0, [4], None),
              Request(3, 0, [7, 8, 9], seeded),
              Request(2, 0, [7, 8, 9], SamplingParams(1.2, top_p=0.95))]
    batched, _ = _decode(model, others, 5)
    assert batched[2] == alone[0]
    # Without the logits: the same ids, and None for the logits.
    logits, ids = model.step(model.new_cache(1, 32), [Request(0, 0, [7, 8, 9], seeded)])
    assert logits is None and int(ids[0]) == alone[0][0]


def test_generate_stays_greedy(model):
    out = model.generate([[1, 2, 3]], 3, return_logits=True)
    assert out.tokens[0] == [int(np.argmax(row)) for row in out.logits[0]]


# ----------------------------------------------------------------------
# Penalties and biases: adjust_logits
# ----------------------------------------------------------------------


def _adjust_graph(vocab: int = VOCAB, dtype: str = "f32") -> etc.Graph:
    g = etc.Graph("adjust")
    R, A = g.symbol("R"), g.symbol("A")
    g.output(g.adjust_logits(g.input("logits", (R, vocab), dtype),
                             g.input("tokens", (R, A), "i32"), g.input("add", (R, A), "f32"),
                             g.input("scale", (R, A), "f32")))
    return g


@pytest.mark.parametrize("kind", ["native", "cuda"])
def test_adjust_logits_changes_only_its_entries(kind):
    """Each row's entries (repetition scale, then the addition; -inf
    forbids) and nothing else; padding (-1) and ids past the vocabulary
    do nothing; rows of no entries are copied."""
    g = _adjust_graph(300)
    kernel = etc.compile(g, target="cpu", workers=2, kernels=kind)
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((4, 300)) * 3).astype(np.float32)
    tokens = np.array([[3, 5, -1, 299], [-1, -1, -1, -1], [0, 7, 300, -1], [9, 10, 11, 12]],
                      np.int32)
    add = rng.standard_normal((4, 4)).astype(np.float32)
    add[3, 1] = -np.inf
    scale = np.array([[1.5, 2, 1, 1], [1, 1, 1, 1], [1.2, 0.5, 3, 1], [1, 1, 1, 1.3]],
                     np.float32)
    inputs = dict(logits=logits, tokens=tokens, add=add, scale=scale)
    (got,) = kernel.run(**inputs)
    want = reference_sampling.adjust_logits(logits, tokens, add, scale)
    np.testing.assert_array_equal(got, want)
    changed = {(0, 3), (0, 5), (0, 299), (2, 0), (2, 7), (3, 9), (3, 10), (3, 11), (3, 12)}
    mask = np.zeros_like(logits, bool)
    mask[tuple(zip(*changed))] = True
    np.testing.assert_array_equal(got[~mask], logits[~mask])
    x = logits[0, 3]
    assert got[0, 3] == np.float32((x / 1.5 if x > 0 else x * 1.5) + add[0, 0])
    assert got[3, 10] == -np.inf


@needs_ptxas
def test_adjust_logits_ptx(tmp_path):
    ptx = etc.compile(_adjust_graph(1000, "bf16"), target="cuda", chip="sm_90a").ptx
    assert_no_spills(assemble(ptx, "sm_90a", tmp_path, "adjust"))


# ----------------------------------------------------------------------
# Structured output: a token bitmask on the device
# ----------------------------------------------------------------------


def _masked_graph(vocab: int = 300, dtype: str = "f32") -> etc.Graph:
    g = etc.Graph("masked")
    R, A = g.symbol("R"), g.symbol("A")
    logits = g.input("logits", (R, vocab), dtype)
    adjusted = g.adjust_logits(logits, g.input("tokens", (R, A), "i32"),
                               g.input("add", (R, A), "f32"), g.input("scale", (R, A), "f32"),
                               mask=g.input("mask", (R, -(-vocab // 32)), "i32"),
                               masked=g.input("masked", (R,), "i32"))
    params = [g.input("temperature", (R,), "f32"), g.input("top_k", (R,), "i32"),
              g.input("top_p", (R,), "f32"), g.input("min_p", (R,), "f32"),
              g.input("seed", (R, 2), "i32"), g.input("position", (R,), "i32")]
    g.output(adjusted, g.sample(adjusted, *params))
    return g


def _bits(allowed: np.ndarray) -> np.ndarray:
    """Rows of booleans (R, V) as the mask's words (R, ceil(V / 32))."""
    rows, vocab = allowed.shape
    padded = np.zeros((rows, -(-vocab // 32) * 32), bool)
    padded[:, :vocab] = allowed
    weights = (1 << np.arange(32, dtype=np.uint64))
    return (padded.reshape(rows, -1, 32) * weights).sum(axis=2).astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("kind", ["native", "cuda"])
def test_a_masked_token_is_never_chosen(kind):
    """Masked rows: whatever the sampling parameters (greedy, temperature,
    top-k, top-p, min-p), the logits (the masked tokens the most likely,
    a bias on them, every allowed token at -inf) and the seed, the token
    is one the mask allows; unmasked rows in the same run are untouched."""
    g = _masked_graph()
    kernel = etc.compile(g, target="cpu", workers=2, kernels=kind)
    rng = np.random.default_rng(8)
    rows, vocab = 64, 300
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    allowed = rng.random((rows, vocab)) < rng.choice([0.003, 0.05, 0.5], (rows, 1))
    allowed[np.arange(rows), rng.integers(0, vocab, rows)] = True  # at least one
    logits[~allowed] += 8  # the masked tokens are the most likely
    logits[5, allowed[5]] = -np.inf  # every allowed token at -inf
    masked = np.ones(rows, np.int32)
    masked[-4:] = 0  # unconstrained rows beside them
    tokens = np.where(rng.random((rows, 2)) < 0.5, rng.integers(0, vocab, (rows, 2)), -1)
    tokens[:, 1] = np.where(tokens[:, 0] == tokens[:, 1], -1, tokens[:, 1])
    add = np.where(tokens >= 0, 20.0, 0.0).astype(np.float32)  # biases toward any token
    inputs = _inputs(logits, temperature=rng.choice([0.0, 0.5, 1.0, 3.0], rows),
                     top_k=rng.choice([0, 1, 5], rows), top_p=rng.choice([1.0, 0.5], rows),
                     min_p=rng.choice([0.0, 0.3], rows))
    inputs.update(tokens=tokens.astype(np.int32), add=add, scale=np.ones((rows, 2), np.float32),
                  mask=_bits(allowed), masked=masked)
    for seed in range(3):
        inputs["seed"] = (inputs["seed"] + rows).astype(np.int32)
        adjusted, chosen = kernel.run(**inputs)
        assert allowed[np.arange(rows - 4), chosen[:-4]].all(), seed
        want = reference_sampling.adjust_logits(logits, inputs["tokens"], add, inputs["scale"],
                                                inputs["mask"], masked)
        np.testing.assert_array_equal(adjusted, want)
        np.testing.assert_array_equal(chosen, etc.reference.evaluate(g, **inputs)[1])
    assert not allowed[np.arange(rows - 4, rows), chosen[-4:]].all()  # those were free


@needs_ptxas
def test_masked_adjust_logits_ptx(tmp_path):
    ptx = etc.compile(_masked_graph(151936, "bf16"), target="cuda", chip="sm_90a").ptx
    assert_no_spills(assemble(ptx, "sm_90a", tmp_path, "masked"))
