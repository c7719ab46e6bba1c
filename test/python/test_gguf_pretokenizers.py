"""GGUF byte-level BPE tokenizers encode as llama.cpp encodes them under every
`tokenizer.ggml.pre` split ETC builds: llama-cpp-python's ids of the same
files (one tokenizer trained without any split, so that the splits decide
the tokens), recorded by gguf_pretokenizer_goldens.py in
goldens/gguf-pretokenizers-llama-cpp.json."""

import json

import pytest

import gguf_pretokenizer_goldens as goldens
from etc.models.loading import gguf_pretokenizers
from etc.models.loading.gguf import PRE_TOKENIZERS, GGUFCheckpoint, GGUFError

GOLDEN = json.loads(goldens.GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def trained():
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(GOLDEN["tokenizer"]))


def test_goldens_are_current_and_tell_the_splits_apart():
    """The golden holds today's texts and every name; llama.cpp's ids of any
    two names ETC splits differently differ, so each split is exercised."""
    assert GOLDEN["texts"] == goldens.TEXTS
    assert set(GOLDEN["ids"]) == set(goldens.PRES)
    assert set(gguf_pretokenizers.PRE_TOKENIZERS) <= set(goldens.PRES) <= set(PRE_TOKENIZERS)
    for a in goldens.PRES:
        for b in goldens.PRES:
            if PRE_TOKENIZERS[a] != PRE_TOKENIZERS[b]:
                assert GOLDEN["ids"][a] != GOLDEN["ids"][b], (a, b)


@pytest.mark.parametrize("pre", goldens.PRES)
def test_tokenizer_encodes_as_llama_cpp(pre, trained, tmp_path):
    backend = GGUFCheckpoint(goldens.write(tmp_path / "t.gguf", trained, pre)).tokenizer_backend()
    for text, want in zip(GOLDEN["texts"], GOLDEN["ids"][pre]):
        assert backend.encode(text).ids == want, (pre, text)
        assert backend.decode(want, skip_special_tokens=False) == text


@pytest.mark.parametrize("pre", ["tekken", "chameleon", "kimi-k3"])
def test_a_split_etc_does_not_build_is_refused_by_name(pre, trained, tmp_path):
    path = goldens.write(tmp_path / "t.gguf", trained, pre)
    with pytest.raises(GGUFError, match=f"tokenizer.ggml.pre = '{pre}' is not supported; "
                                        f"supported: .*deepseek-v3.*kimi-k2"):
        GGUFCheckpoint(path).tokenizer_backend()
