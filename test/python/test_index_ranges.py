"""Index inputs checked before they reach a kernel: the ranges operators
declare (`Graph.index_range`) and the consistency of ragged batches travel
in the ABI, and the CPU runtime (compiled or loaded from an artifact)
refuses values out of range with an error naming the input, the index and
the bound, instead of reading out of bounds (a crash, NaNs, or a watchdog
error blaming the program). A model's `step` also refuses a cache longer
than the length it is compiled for."""

from __future__ import annotations

import numpy as np
import pytest

import etc
import etc.models as models
from etc.models.testing import tiny_config, write_checkpoint
from etc.runtime.ranges import IndexRange, IndexRangeError
from test_llm_ops import _batch

HEADS, KV_HEADS, D = 2, 1, 8


def _graph():
    g = etc.Graph("att")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    q = g.input("q", (T, HEADS * D))
    k = g.input("k", (T, KV_HEADS * D))
    v = g.input("v", (T, KV_HEADS * D))
    batch = g.ragged_batch(T, R)
    kc = g.kv_append(g.state("kc", (S, L, KV_HEADS * D)), k, batch)
    vc = g.kv_append(g.state("vc", (S, L, KV_HEADS * D)), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=D, chunk=4, max_length=16))
    return g


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    kernel = etc.compile(_graph(), target="cpu", schedule="dynamic", workers=2)
    path = tmp_path_factory.mktemp("ranges") / "att.etc"
    kernel.save(path)
    return {"compiled": kernel, "loaded": etc.runtime.load(path)}


def _inputs(lengths_before=(3, 0), new=(2, 3), slots=(1, 0), cache_length=12):
    rng = np.random.default_rng(0)
    tokens = sum(new)
    return dict(q=rng.standard_normal((tokens, HEADS * D)).astype(np.float32),
                k=rng.standard_normal((tokens, KV_HEADS * D)).astype(np.float32),
                v=rng.standard_normal((tokens, KV_HEADS * D)).astype(np.float32),
                kc=np.zeros((2, cache_length, KV_HEADS * D), np.float32),
                vc=np.zeros((2, cache_length, KV_HEADS * D), np.float32),
                **_batch(list(lengths_before), list(new), list(slots)))


def test_the_graph_records_the_ranges():
    ranges = _graph().index_ranges
    assert ranges["positions"] == IndexRange(0, (("L", -1), (15, 0)))
    assert ranges["request_length"] == IndexRange(1, (("L", 0), (16, 0)))
    assert ranges["request_slot"] == IndexRange(0, (("S", -1),))
    assert ranges["token_request"] == IndexRange(0, (("R", -1),))
    assert ranges["request_first"] == ranges["request_last"] == IndexRange(0, (("T", -1),))
    assert set(_graph().ragged_batches[0].values()) == set(ranges)


# Each: a change to valid inputs and the error it must give.
BAD = [
    ("negative position", lambda x: x["positions"].__setitem__(0, -1),
     r"input 'positions'\[0\] = -1 is outside its valid range \[0, 11\] \(L - 1 = 11\)"),
    ("request past the cache", dict(lengths_before=(10, 0), new=(3, 3)),
     r"input 'positions'\[2\] = 12 is outside its valid range \[0, 11\] \(L - 1 = 11\)"),
    ("request past the compiled length", dict(lengths_before=(14, 0), new=(3, 3),
                                              cache_length=20),
     r"input 'positions'\[2\] = 16 is outside its valid range \[0, 15\]"),
    ("token of no request", lambda x: x["token_request"].__setitem__(4, 2),
     r"input 'token_request'\[4\] = 2 is outside its valid range \[0, 1\] \(R - 1 = 1\)"),
    ("slot outside the cache", lambda x: x["request_slot"].__setitem__(1, 2),
     r"input 'request_slot'\[1\] = 2 is outside its valid range \[0, 1\] \(S - 1 = 1\)"),
    ("first token outside the step", lambda x: x["request_first"].__setitem__(1, 9),
     r"input 'request_first'\[1\] = 9 is outside its valid range \[0, 4\] \(T - 1 = 4\)"),
    ("zero length", lambda x: x["request_length"].__setitem__(1, 0),
     r"input 'request_length'\[1\] = 0 is outside its valid range \[1, 12\]"),
    ("length beyond the positions", lambda x: x["request_length"].__setitem__(0, 9),
     r"ragged batch: input 'positions'\[0\] = 3, but token 0 is token 0 of the 2 new tokens "
     r"of request 0, whose 'request_length' is 9: its position must be 7"),
    ("span longer than the step", lambda x: x["request_last"].__setitem__(0, 3),
     r"ragged batch: request 0 spans tokens 0 .. 3 \('request_first', 'request_last'\), but "
     r"2 tokens have 'token_request' = 0"),
]


@pytest.mark.parametrize("which", ["compiled", "loaded"])
@pytest.mark.parametrize("what, change, match", BAD, ids=[b[0] for b in BAD])
def test_index_inputs_out_of_range_are_refused(kernels, which, what, change, match):
    kernel = kernels[which]
    if callable(change):
        inputs = _inputs()
        change(inputs)
    else:
        inputs = _inputs(**change)
    before = {name: inputs[name].copy() for name in ("kc", "vc")}
    with pytest.raises(IndexRangeError, match=match):
        kernel.run(**inputs)
    for name, array in before.items():  # refused before the kernel ran
        np.testing.assert_array_equal(inputs[name], array)


def _paged_graph():
    g = etc.Graph("paged")
    T, R, N, M = (g.symbol(n) for n in "TRNM")
    q = g.input("q", (T, HEADS * D))
    k = g.input("k", (T, KV_HEADS * D))
    v = g.input("v", (T, KV_HEADS * D))
    batch = g.ragged_batch(T, R, blocks_per_request=M)
    kc = g.kv_append(g.state("kc", (N, 4, KV_HEADS * D)), k, batch)
    vc = g.kv_append(g.state("vc", (N, 4, KV_HEADS * D)), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=D, chunk=4, max_length=16))
    return g


def test_block_tables_are_checked():
    """A paged batch's block table holds blocks of the pool: an entry past
    it is refused (N - 1), as are positions past what the tables hold (M x
    P) or the compiled length."""
    ranges = _paged_graph().index_ranges
    assert ranges["block_table"] == IndexRange(0, (("N", -1),))
    assert ranges["positions"] == IndexRange(0, (("M*4", -1), (15, 0)))
    assert ranges["request_length"] == IndexRange(1, (("M*4", 0), (16, 0)))
    assert "request_slot" not in ranges
    kernel = etc.compile(_paged_graph(), target="cpu", schedule="dynamic", workers=2)
    inputs = _inputs(lengths_before=(6, 0))
    del inputs["request_slot"]
    inputs.update(kc=np.zeros((5, 4, KV_HEADS * D), np.float32),
                  vc=np.zeros((5, 4, KV_HEADS * D), np.float32),
                  block_table=np.array([[4, 2], [0, 3]], np.int32))
    (got,) = kernel.run(**inputs)
    assert np.isfinite(got).all()
    inputs["block_table"][1, 1] = 5
    with pytest.raises(IndexRangeError, match=r"input 'block_table'\[\(1, 1\)\] = 5 is outside "
                                              r"its valid range \[0, 4\] \(N - 1 = 4\)"):
        kernel.run(**inputs)
    inputs["block_table"] = np.array([[4], [0]], np.int32)  # 4 positions, request 0 has 8
    with pytest.raises(IndexRangeError, match=r"input 'positions'\[0\] = 6 is outside its valid "
                                              r"range \[0, 3\] \(M\*4 - 1 = 3\)"):
        kernel.run(**inputs)


@pytest.mark.parametrize("which", ["compiled", "loaded"])
def test_valid_inputs_run(kernels, which):
    inputs = _inputs()
    (got,) = kernels[which].run(**inputs)
    (want,) = etc.reference.evaluate(_graph(), **_inputs())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_ranges_travel_in_the_abi(kernels):
    assert kernels["loaded"].abi.index_ranges == kernels["compiled"].abi.index_ranges
    assert kernels["loaded"].abi.ragged_batches == kernels["compiled"].abi.ragged_batches
    assert kernels["loaded"].abi.index_ranges["positions"].highs == (("L", -1), (15, 0))


def test_declaration_errors():
    g = etc.Graph("g")
    T = g.symbol("T")
    x = g.input("x", (T, 4))
    with pytest.raises(ValueError, match=r"index_range: 'index' must be an i32 input"):
        g.index_range(x, below=T)
    ids = g.input("ids", (T,), "i32")
    with pytest.raises(ValueError, match=r"'below' must be an int, a symbol"):
        g.index_range(ids, below="T")
    g.index_range(ids, below=10)
    g.index_range(ids, low=2, at_most=T)
    assert g.index_ranges["ids"] == IndexRange(2, ((9, 0), ("T", 0)))


# ----------------------------------------------------------------------
# A model's step
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model with contiguous caches (the paged ones: test_paged_models)."""
    path = write_checkpoint(tmp_path_factory.mktemp("m") / "q", tiny_config("Qwen3ForCausalLM"))
    return models.load(path, workers=2, max_seq_len=16, attention_chunk=4, kv_block_size=None)


def test_step_refuses_a_cache_longer_than_the_compiled_length(model):
    cache = models.KVCache(model.config, 1, 40)  # made directly, past max_seq_len = 16
    with pytest.raises(ValueError, match=r"the cache holds 40 positions, more than the "
                                         r"max_seq_len=16 the model is compiled for"):
        model.step(cache, [models.Request(0, 0, [1, 2, 3])])
    other = models.KVCache(tiny_config_model(model, num_key_value_heads=4), 1, 8)
    with pytest.raises(ValueError, match=r"cache 'l0_k_cache' has shape \(1, 8, 64\), "
                                         r"expected \(1, 8, 32\)"):
        model.step(other, [models.Request(0, 0, [1])])


def tiny_config_model(model, **change):
    return models.ModelConfig.from_dict(tiny_config("Qwen3ForCausalLM", **change))


def test_step_kernel_refuses_bad_indices_from_any_caller(model):
    """What `step_inputs` checks, the kernel's runtime checks too: inputs
    made by hand (or by an engine) are covered."""
    cache = model.new_cache(2, 16)
    inputs = model.step_inputs(cache, [models.Request(0, 0, [1, 2]), models.Request(1, 0, [3])])
    inputs["request_slot"] = np.array([0, 5], np.int32)
    with pytest.raises(IndexRangeError, match=r"'request_slot'\[1\] = 5 is outside its valid "
                                              r"range \[0, 1\] \(S - 1 = 1\)"):
        model.kernels[0].run(**inputs)


def test_generate_keeps_every_step_within_max_step_tokens(model, monkeypatch):
    """Five prompts and a budget of 3 tokens a step: each step takes at
    most 3 (each prompt used to take at least one)."""
    steps = []
    step = model.step

    def recording(cache, requests):
        steps.append(sum(len(r.tokens) for r in requests))
        return step(cache, requests)
    monkeypatch.setattr(model, "step", recording)
    monkeypatch.setattr(model, "max_step_tokens", 3)
    prompts = [[1, 2], [3], [4, 5, 6, 7], [8], [9, 10]]
    out = model.generate(prompts, 2)
    assert max(steps) <= 3 and all(len(t) == 2 for t in out.tokens)
    monkeypatch.undo()
    assert model.generate(prompts, 2).tokens == out.tokens  # the same greedy tokens


def test_generate_takes_numpy_prompts(model):
    want = model.generate([[1, 2, 3], [4]], 2).tokens
    assert model.generate([np.array([1, 2, 3]), np.array([4], np.int64)],
                          np.int64(2)).tokens == want
    assert model.generate(np.array([[1, 2, 3]], np.int32), 2).tokens == want[:1]
    with pytest.raises(ValueError, match=r"prompt 0, position 0: .*1\.0.* is not an int token"):
        model.generate([np.array([1, 2.5])], 2)
    with pytest.raises(ValueError, match=r"prompt 0 must be a non-empty list"):
        model.generate([np.array([], np.int32)], 2)


@pytest.mark.skipif(__import__("etc.runtime.cuda", fromlist=["x"]).cuda_available(),
                    reason="a CUDA device is here")
def test_cuda_load_without_a_device_fails_before_compiling(tmp_path, monkeypatch):
    import etc.models.step.model as model_module
    from etc.runtime.cuda import CUDAUnavailableError

    path = write_checkpoint(tmp_path / "q", tiny_config("Qwen3ForCausalLM"))
    monkeypatch.setattr(model_module, "step_kernel",
                        lambda *a, **k: pytest.fail("compiled without a device"))
    with pytest.raises(CUDAUnavailableError, match=r"load\(target='cuda'\) needs a CUDA "
                                                   r"device") as error:
        models.load(path, target="cuda")
    assert "kernel.ptx" not in str(error.value) and "etc-compiler" not in str(error.value)


def test_small_batches_are_checked_in_python_as_numpy_does(monkeypatch):
    """Index arrays of at most `ranges.SMALL` elements are checked in Python
    (a decode step's): random batches, valid and broken in each field, get
    the same verdict and message as the NumPy path of larger arrays."""
    from etc.runtime import ranges

    batch = {role: role for role in ("positions", "token_request", "request_first",
                                     "request_last", "request_length")}
    rng = np.random.default_rng(7)

    def verdict(arrays, small: int):
        monkeypatch.setattr(ranges, "SMALL", small)
        try:
            ranges.check_ragged("g", batch, arrays)
            ranges.check("g", {"positions": IndexRange(0, ((12, 0),))}, arrays, {})
        except (IndexRangeError, IndexError, ValueError) as error:
            return f"{type(error).__name__}: {error}"
        return None

    faults = 0
    for trial in range(300):
        new = rng.integers(1, 4, rng.integers(1, 5)).tolist()
        arrays = {k: v for k, v in _batch(rng.integers(0, 8, len(new)).tolist(), new,
                                          list(range(len(new)))).items() if k in batch}
        if trial % 3:  # break one value of one field
            role = sorted(batch)[rng.integers(len(batch))]
            field = arrays[role].copy()
            field[rng.integers(field.size)] += int(rng.choice([-2, -1, 1, 2]))
            arrays[role] = field
        small, large = verdict(arrays, 64), verdict(arrays, 0)
        assert small == large, arrays
        faults += small is not None
    assert faults > 100  # the broken batches were refused
