"""etc.models.loading.tokenizer: a trained byte-level BPE tokenizer, its chat
template rendered as transformers renders it, streaming detokenization,
and the checkpoint's end-of-sequence ids. No model is compiled here."""

import json

import pytest

from etc.models import Checkpoint, CheckpointError
from etc.models.testing import CHAT_TEMPLATE, TEXT, tiny_config, write_checkpoint, write_tokenizer
from etc.models.loading.tokenizer import ChatTemplateError, Tokenizer

VOCAB = 320


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.from_directory(write_tokenizer(tmp_path_factory.mktemp("tok"), VOCAB))


def test_round_trip_and_special_tokens(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert len(ids) < len(TEXT.encode())  # merges were learned
    assert max(ids) < VOCAB and tokenizer.vocab_size <= VOCAB
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    marked = tokenizer.encode("<|im_start|>user\nHi<|im_end|>", add_special_tokens=False)
    assert marked[0] == 1 and marked[-1] == 2
    assert tokenizer.decode(marked) == "user\nHi"
    assert tokenizer.decode(marked, skip_special_tokens=False) == "<|im_start|>user\nHi<|im_end|>"


def test_add_bos_token_puts_the_bos_id_first(tmp_path, tokenizer):
    tok = Tokenizer(tokenizer.backend, bos_token="<|endoftext|>", add_bos_token=True)
    assert tok.encode("Hello")[0] == 0 and tok.encode("Hello")[1:] == tokenizer.encode("Hello")
    assert tok.encode("Hello", add_special_tokens=False) == tokenizer.encode("Hello")


@pytest.mark.parametrize("text", [TEXT, "€€ ÿ 漢字 🙂🙃 naïve", "a" * 40 + "€"])
def test_streaming_detokenization_never_splits_a_character(tokenizer, text):
    ids = tokenizer.encode(text)
    # The case this is about: some ids hold only part of a character.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    stream = tokenizer.detokenizer()
    pieces = [stream.push(i) for i in ids]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces  # held back until the character was complete
    assert "".join(pieces) + stream.flush() == text == stream.text


def test_flush_gives_an_incomplete_character_as_decode_does(tokenizer):
    ids = tokenizer.encode("€")
    assert len(ids) > 1
    stream = tokenizer.detokenizer()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.flush() == tokenizer.decode(ids[:-1]) == "\ufffd"


def test_special_tokens_are_skipped_in_streams(tokenizer):
    ids = tokenizer.encode("Hi<|im_end|>there", add_special_tokens=False)
    stream = tokenizer.detokenizer()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "Hithere"


def test_chat_template_renders_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    assert tokenizer.apply_chat_template(messages) == expected + "<|im_start|>assistant\n"
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == expected


def test_chat_template_refusals_are_chat_template_errors(tokenizer):
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}])
    # The sandbox: no attribute walks to Python internals, no mutation.
    for source in ("{{ ''.__class__.__mro__ }}", "{{ messages.append(1) }}"):
        with pytest.raises(ChatTemplateError):
            Tokenizer(tokenizer.backend, chat_template=source).apply_chat_template([])
    with pytest.raises(ChatTemplateError, match="line 1"):
        Tokenizer(tokenizer.backend, chat_template="{% for %}").apply_chat_template([])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer(tokenizer.backend).apply_chat_template([])


def test_chat_template_helpers_are_those_of_transformers(tokenizer):
    source = ("{{ bos_token }}|{{ eos_token }}|{{ messages | tojson }}|{{ tools is none }}|"
              "{{ {'b': 1, 'a': [1, 2]} | tojson(indent=1, sort_keys=True) }}|"
              "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
              "{{ m.content }}{% endfor %}|"
              "{% generation %}{{ 'kept' }}{% endgeneration %}|"
              "{{ strftime_now('%Y') | length }}|{{ extra }}\n"
              "  {% if true %}\n"
              "x\n"
              "  {% endif %}\n")
    tok = Tokenizer(tokenizer.backend, chat_template=source, bos_token="<s>",
                    eos_token="</s>")
    messages = [{"role": "user", "content": "ça"}, {"role": "user", "content": "no"}]
    text = tok.apply_chat_template(messages, extra="E")
    assert text == ('<s>|</s>|[{"role": "user", "content": "ça"}, {"role": "user", '
                    '"content": "no"}]|True|{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}|ça|kept|4|E\n'
                    "x\n")  # trim_blocks and lstrip_blocks drop the block lines


def test_from_directory(tmp_path, tokenizer):
    assert Tokenizer.from_directory(tmp_path) is None
    write_tokenizer(tmp_path / "file", VOCAB, chat_template="FROM FILE", template_file=True)
    config = json.loads((tmp_path / "file" / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
    assert Tokenizer.from_directory(tmp_path / "file").apply_chat_template([]) == "FROM FILE"
    # tokenizer_config.json may write special tokens as AddedToken dicts.
    config.update(eos_token={"content": "<|endoftext|>", "special": True},
                  chat_template=[{"name": "default", "template": "DEFAULT"},
                                 {"name": "tool_use", "template": "TOOLS"}])
    (tmp_path / "file" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "file" / "chat_template.jinja").unlink()
    tok = Tokenizer.from_directory(tmp_path / "file")
    assert tok.eos_token_id == 0 and tok.apply_chat_template([]) == "DEFAULT"


def test_checkpoint_eos_ids_and_tokenizer(tmp_path):
    path = write_checkpoint(tmp_path / "a", tiny_config(vocab_size=VOCAB), tokenizer=True)
    checkpoint = Checkpoint(path)
    assert checkpoint.eos_token_ids() == (2, 0)  # config.json, then generation_config.json
    assert checkpoint.tokenizer().apply_chat_template([{"role": "user", "content": "x"}]) == \
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert Checkpoint(write_checkpoint(tmp_path / "b")).tokenizer() is None
    assert Checkpoint(tmp_path / "b").eos_token_ids() == ()
    # A list in config.json; none anywhere but the tokenizer's EOS token.
    path = write_checkpoint(tmp_path / "c", tiny_config(vocab_size=VOCAB, eos_token_id=[5, 2]),
                            tokenizer=True)
    assert Checkpoint(path).eos_token_ids() == (5, 2, 0)
    (path / "generation_config.json").unlink()
    config = json.loads((path / "config.json").read_text())
    del config["eos_token_id"]
    (path / "config.json").write_text(json.dumps(config))
    assert Checkpoint(path).eos_token_ids() == (2,)
    config["eos_token_id"] = "2"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="eos_token_id '2'"):
        Checkpoint(path).eos_token_ids()


def test_write_tokenizer_refuses_a_vocabulary_too_small(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=96"):
        write_tokenizer(tmp_path, 96)
    assert "{% for message in messages %}" in CHAT_TEMPLATE
