"""The text model of multimodal checkpoints (`Gemma3ForConditionalGeneration`,
`Mistral3ForConditionalGeneration`): config.json's `text_config` read with
its class's defaults, the language model's weights read from either prefix
transformers writes (never the vision tower's or the projector's), the LM
head's tying where the config's two levels do not say one thing, the
refusals; end to end on the CPU target, the same logits bit for bit as the
same weights saved as the causal LM, teacher-forced against the NumPy
forward pass. Against transformers' Gemma3ForConditionalGeneration on
text-only input: test_families.py's goldens `gemma3_mm-*` (made by
hf_goldens_families.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import etc.models as models
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.safetensors import SafetensorsFile, save_file
from etc.models.loading.tokenizer import TokenizerError
from etc.models.testing import (MULTIMODAL, as_multimodal, as_transformers5, tiny_config,
                                write_checkpoint)
from test_families import teacher_forcing

PROMPTS = [[5], [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
NEW = 4
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=4, kv_block_size=4)
#: The causal LMs that ship inside a multimodal model: Gemma 3 (a sliding
#: layer and a full one, tied head) and Mistral (every layer sliding,
#: untied head).
CAUSAL = {"gemma3": tiny_config("Gemma3ForCausalLM"), "mistral": tiny_config("MistralForCausalLM")}
#: The names of the language model's tensors, by the transformers that
#: wrote the checkpoint.
STYLES = ("transformers4", "transformers4.52")


def record_reads(monkeypatch) -> list:
    """The tensor names every safetensors file appends to as it reads their
    data, from now on."""
    read = []
    real = SafetensorsFile._read_to

    def recording(self, name, *args):
        read.append(name)
        return real(self, name, *args)

    monkeypatch.setattr(SafetensorsFile, "_read_to", recording)
    return read


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


@pytest.mark.parametrize("family", list(CAUSAL))
def test_text_config_is_the_causal_lms(family):
    """A multimodal config.json (either transformers' style of text_config)
    reads as the causal LM's config."""
    config = CAUSAL[family]
    want = ModelConfig.from_dict(config)
    assert ModelConfig.from_dict(as_multimodal(config)) == want
    assert ModelConfig.from_dict(as_multimodal(as_transformers5(config))) == want


def test_gemma3_text_config_takes_its_class_defaults():
    """gemma-3-4b-it's config.json states few text fields: the others are
    Gemma3TextConfig's defaults (8 heads, 4 KV heads of 256, a vocabulary of
    262,208, RoPE bases 1e6 and 1e4, every 6th layer full, a window of
    4096 unless stated), and the head is tied."""
    raw = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "eos_token_id": [1, 106], "torch_dtype": "bfloat16",
           "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                           "model_type": "gemma3_text", "num_hidden_layers": 34,
                           "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                           "sliding_window": 1024},
           "vision_config": {"model_type": "siglip_vision_model"}}
    c = ModelConfig.from_dict(raw)
    assert (c.architecture, c.vocab_size, c.num_heads, c.num_kv_heads, c.head_dim) == \
        ("Gemma3ForCausalLM", 262208, 8, 4, 256)
    assert (c.max_position_embeddings, c.rms_norm_eps, c.query_pre_attn_scalar) == \
        (131072, 1e-6, 256.0)
    assert (c.rope_theta, c.local_rope_theta, c.rope_scaling["factor"]) == (1e6, 1e4, 8.0)
    assert c.sliding_window == 1024 and len(c.sliding_layers) == 34 - 34 // 6
    assert c.tie_word_embeddings and c.hidden_act == "gelu_pytorch_tanh"
    # Without text_config's model_type (Gemma3Config takes it as Gemma 3's).
    del raw["text_config"]["model_type"]
    assert ModelConfig.from_dict(raw) == c


def test_mistral_small_text_config():
    """Mistral Small 3.1's text_config: no window (null), RoPE base 1e9, an
    untied head (MistralConfig's default, and its checkpoint has one)."""
    text = dict(head_dim=128, hidden_act="silu", hidden_size=5120, intermediate_size=32768,
                max_position_embeddings=131072, model_type="mistral", num_attention_heads=32,
                num_hidden_layers=40, num_key_value_heads=8, rms_norm_eps=1e-5,
                rope_theta=1e9, sliding_window=None, vocab_size=131072)
    c = ModelConfig.from_dict({"architectures": ["Mistral3ForConditionalGeneration"],
                               "model_type": "mistral3", "text_config": text})
    assert (c.architecture, c.hidden_size, c.num_layers, c.rope_theta) == \
        ("MistralForCausalLM", 5120, 40, 1e9)
    assert c.sliding_window is None and c.sliding_layers == () and not c.tie_word_embeddings


def test_refusals_name_the_field():
    gemma = as_multimodal(CAUSAL["gemma3"])
    mistral = as_multimodal(CAUSAL["mistral"])
    cases = [
        ({k: v for k, v in gemma.items() if k != "text_config"},
         r"config.json: field 'text_config' is missing: a Gemma3ForConditionalGeneration"),
        ({**gemma, "text_config": [1]}, r"field 'text_config' = \[1\] must be an object"),
        ({**mistral, "text_config": {**mistral["text_config"], "model_type": "ministral3"}},
         r"field 'text_config.model_type' = 'ministral3' is not supported for "
         r"Mistral3ForConditionalGeneration; supported: 'mistral'"),
        ({**gemma, "text_config": {**gemma["text_config"], "model_type": "gemma2"}},
         r"'text_config.model_type' = 'gemma2' .* supported: 'gemma3_text'"),
        ({**gemma, "tie_word_embeddings": "yes"},
         r"field 'tie_word_embeddings' = 'yes' must be true or false"),
        ({**gemma, "text_config": {**gemma["text_config"], "tie_word_embeddings": 1}},
         r"field 'text_config.tie_word_embeddings' = 1 must be true or false"),
        # A field of the text model: its error says where it is.
        ({**mistral, "text_config": {**mistral["text_config"], "attention_bias": True}},
         r"config.json \(text_config\): field 'attention_bias' = True is not supported"),
        ({**gemma, "text_config": {**gemma["text_config"], "hidden_size": 0}},
         r"config.json \(text_config\): field 'hidden_size' = 0 must be a positive"),
    ]
    for raw, message in cases:
        with pytest.raises(UnsupportedConfigError, match=message):
            ModelConfig.from_dict(raw)
    # An architecture ETC does not run lists the multimodal ones it does.
    with pytest.raises(UnsupportedConfigError, match=r"'LlavaForConditionalGeneration' is not "
                                                     r"supported; supported: .*ForCausalLM, "
                                                     r"Gemma3ForConditionalGeneration, "
                                                     r"Mistral3ForConditionalGeneration"):
        ModelConfig.from_dict({**gemma, "architectures": ["LlavaForConditionalGeneration"]})


# ----------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("family", list(CAUSAL))
def test_weights_are_the_causal_lms_and_vision_is_never_read(tmp_path, monkeypatch, family,
                                                             style):
    """Either prefix: the weights are the causal LM's (same draws), read
    from the language model's tensors only; the vision tower and projector
    are never read."""
    config = CAUSAL[family]
    causal = Checkpoint(write_checkpoint(tmp_path / "causal", config)).weights()
    path = write_checkpoint(tmp_path / "mm", config, multimodal=style)
    read = record_reads(monkeypatch)
    checkpoint = Checkpoint(path)
    assert checkpoint.config == ModelConfig.from_dict(config)
    vision = set(MULTIMODAL[config["architectures"][0]]["vision_tensors"])
    assert vision <= set(checkpoint.names())
    checkpoint.default_dtype(), checkpoint.eos_token_ids()
    weights = checkpoint.weights()
    assert weights.keys() == causal.keys()
    for key in causal:
        np.testing.assert_array_equal(weights[key], causal[key], err_msg=key)
    prefix = "language_model." if style == "transformers4" else "model.language_model."
    assert read and not vision & set(read)
    assert all(name.startswith(prefix) or name == "lm_head.weight" for name in read), read
    assert checkpoint.not_loaded.startswith(
        f"{MULTIMODAL[config['architectures'][0]]['architecture']}: its text model only; "
        f"not loaded: multi_modal_projector (")
    assert "vision_tower (2 tensors)" in checkpoint.not_loaded


def test_fp8_text_model(tmp_path):
    """An FP8 checkpoint's text model (quantization_config at the top level,
    each projection's scales under the prefix too): the causal LM's
    packed weights and formats."""
    config = CAUSAL["mistral"]
    causal = Checkpoint(write_checkpoint(tmp_path / "causal", config, fp8_block=(16, 32)))
    checkpoint = Checkpoint(write_checkpoint(tmp_path / "mm", config, fp8_block=(16, 32),
                                             multimodal="transformers4.52"))
    formats = checkpoint.weight_formats()
    assert formats == causal.weight_formats() and formats
    want, got = causal.weights(formats=formats), checkpoint.weights(formats=formats)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_tying_where_the_config_does_not_say(tmp_path):
    """The two levels of tie_word_embeddings: one stated value is taken;
    none, or two that disagree (as transformers 5 writes Mistral 3's: true
    above, false in text_config), leave it to the checkpoint: an LM head of
    its own is untied, none is tied."""
    mistral = CAUSAL["mistral"]  # untied: lm_head written
    path = write_checkpoint(tmp_path / "m", mistral, multimodal="transformers4")
    raw = json.loads((path / "config.json").read_text())

    def tied(top=None, text=None, directory=path):
        config = {**raw, "text_config": dict(raw["text_config"])}
        config["text_config"].pop("tie_word_embeddings", None)
        for level, value in ((config, top), (config["text_config"], text)):
            if value is not None:
                level["tie_word_embeddings"] = value
        (directory / "config.json").write_text(json.dumps(config))
        return Checkpoint(directory).config.tie_word_embeddings

    assert not tied() and not tied(top=True, text=False) and not tied(top=False, text=True)
    assert not tied(text=False) and not tied(top=False)
    assert tied(top=True) and tied(text=True) and tied(top=True, text=True)
    # Without a head of its own: tied where nothing says otherwise ...
    headless = write_checkpoint(tmp_path / "h", mistral, multimodal="transformers4",
                                drop=("lm_head.weight",))
    assert tied(directory=headless) and tied(top=True, text=False, directory=headless)
    # ... and where the config unties it, the head is missing.
    tied(text=False, directory=headless)
    with pytest.raises(models.MissingTensorError, match=r"'language_model.lm_head.weight' "
                                                        r"\(LM head\) is missing"):
        Checkpoint(headless).weights()


def test_checkpoint_errors(tmp_path):
    gemma = CAUSAL["gemma3"]
    path = write_checkpoint(tmp_path / "none", gemma, multimodal="transformers4",
                            drop=("model.embed_tokens.weight",))
    with pytest.raises(models.MissingTensorError,
                       match=r"tensor 'language_model.model.embed_tokens.weight' \(the text "
                             r"model's token embeddings; 'model.language_model.embed_tokens."
                             r"weight' as transformers 4.52 to 4.57 name it\) is missing"):
        Checkpoint(path)
    path = write_checkpoint(tmp_path / "twice", gemma, multimodal="transformers4")
    save_file(path / "model-2.safetensors",
              {"model.language_model.embed_tokens.weight": np.zeros((96, 32), np.float32)})
    with pytest.raises(models.CheckpointError, match=r"holds the text model twice, under "
                                                     r"'language_model.model.' and "
                                                     r"'model.language_model.'"):
        Checkpoint(path)
    # A tensor of the text model: the error names it as the file does.
    path = write_checkpoint(tmp_path / "layer", gemma, multimodal="transformers4.52",
                            drop=("model.layers.1.mlp.up_proj.weight",))
    with pytest.raises(models.MissingTensorError,
                       match=r"'model.language_model.layers.1.mlp.up_proj.weight' \(layer 1 "
                             r"MLP up\) is missing"):
        Checkpoint(path).weights()


def test_ids_and_dtype_from_either_level(tmp_path):
    """EOS ids from the top level (Gemma 3's [1, 106]) and text_config's
    (transformers 5 writes them there); the dtype config.json names, from
    either level."""
    path = write_checkpoint(tmp_path / "g", CAUSAL["gemma3"], multimodal="transformers4")
    raw = json.loads((path / "config.json").read_text())
    raw["eos_token_id"] = [1, 7]
    raw["text_config"]["eos_token_id"] = 9
    (path / "config.json").write_text(json.dumps(raw))
    assert Checkpoint(path).eos_token_ids() == (1, 7, 9)


# ----------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Per family: the causal LM and its multimodal checkpoints (both
    prefixes), loaded."""
    root = tmp_path_factory.mktemp("multimodal")
    out = {}
    for family, config in CAUSAL.items():
        out[family, "causal"] = models.load(write_checkpoint(root / family, config, seed=3),
                                            **LOAD)
        for style in STYLES:
            path = write_checkpoint(root / f"{family}-{style}", config, seed=3,
                                    multimodal=style)
            out[family, style] = models.load(path, **LOAD)
    return out


@pytest.mark.parametrize("family", list(CAUSAL))
def test_same_logits_as_the_causal_lm(loaded, family):
    """The text model computes what the causal LM of the same weights
    computes, bit for bit (the same compiled kernel), and what the NumPy
    forward pass computes; the model says what it did not load."""
    want = loaded[family, "causal"].generate(PROMPTS, NEW, return_logits=True)
    assert loaded[family, "causal"].not_loaded is None
    for style in STYLES:
        model = loaded[family, style]
        out = model.generate(PROMPTS, NEW, return_logits=True)
        assert out.tokens == want.tokens
        for ours, theirs in zip(out.logits, want.logits):
            np.testing.assert_array_equal(ours, theirs)
        teacher_forcing(model.checkpoint, PROMPTS, out)
        # The causal LM's kernel, from the compile cache: the same model.
        assert model.kernel_source == "cache"
        assert "its text model only; not loaded: multi_modal_projector" in repr(model)


# ----------------------------------------------------------------------
# The chat template
# ----------------------------------------------------------------------

#: A chat template as Gemma 3's handles content (ETC's own, tiny): the
#: system message folded into the first user turn, text trimmed, content
#: either a string or a list of parts of which images become placeholders.
IMAGE_AWARE_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first = messages[0]['content'] if messages[0]['content'] is string "
    "else messages[0]['content'][0]['text'] -%}"
    "{%- set prefix = first + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' "
    "+ (prefix if loop.first else '') }}"
    "{%- if m['content'] is string -%}{{ m['content'] | trim }}"
    "{%- else -%}{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")
CHAT = [{"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "  Hello there!\n"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": [{"type": "text", "text": "Café crème? "}]}]
#: What transformers 5.24's `apply_chat_template(CHAT, tokenize=False,
#: add_generation_prompt=True)` renders with that template.
RENDERED = ("<start_of_turn>user\nAnswer briefly.\n\nHello there!<end_of_turn>\n"
            "<start_of_turn>model\nHi.<end_of_turn>\n<start_of_turn>user\nCafé crème?"
            "<end_of_turn>\n<start_of_turn>model\n")


def test_text_only_chat_renders_as_transformers_does(tmp_path):
    """Text-only messages through a template that handles images: as
    transformers renders them, given as they are (a string, or a list of
    text parts) and as the server gives them to the template."""
    from etc.models.testing import write_tokenizer
    from etc.serve.protocol import ChatMessage

    tokenizer = models.Tokenizer.from_directory(
        write_tokenizer(tmp_path, 320, chat_template=IMAGE_AWARE_TEMPLATE))
    assert tokenizer.apply_chat_template(CHAT) == RENDERED
    served = [ChatMessage.model_validate(message).for_template() for message in CHAT]
    assert tokenizer.apply_chat_template(served) == RENDERED


def test_the_processors_chat_template(tmp_path):
    """A checkpoint whose chat template is only in the processor's
    chat_template.json: ETC takes it (the tokenizer's own wins)."""
    from etc.models.testing import write_tokenizer

    write_tokenizer(tmp_path, 320, chat_template=None)
    assert models.Tokenizer.from_directory(tmp_path).chat_template is None
    (tmp_path / "chat_template.json").write_text(
        json.dumps({"chat_template": IMAGE_AWARE_TEMPLATE}))
    assert models.Tokenizer.from_directory(tmp_path).apply_chat_template(CHAT) == RENDERED
    (tmp_path / "chat_template.jinja").write_text("{{ 'own' }}")
    assert models.Tokenizer.from_directory(tmp_path).apply_chat_template(CHAT) == "own"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": 5}))
    with pytest.raises(TokenizerError, match=r"chat_template.json: 'chat_template' must be a "
                                             r"string, got 5"):
        models.Tokenizer.from_directory(tmp_path)


def test_verbose_load_says_what_is_not_loaded(tmp_path, capsys):
    """`etc generate --verbose` on a multimodal checkpoint says, after its
    load line, that only the text model runs and what it did not load."""
    from etc.cli import main

    config = tiny_config("Gemma3ForCausalLM", vocab_size=320)
    path = write_checkpoint(tmp_path / "gemma3-mm", config, multimodal="transformers4",
                            tokenizer=True)
    assert main(["generate", str(path), "the quick", "--max-new-tokens", "2", "--verbose",
                 "--workers", "2", "--max-model-len", "32", "--attention-chunk", "8"]) == 0
    lines = capsys.readouterr().err.splitlines()
    loaded = next(i for i, line in enumerate(lines) if line.startswith("etc: loaded "))
    assert lines[loaded + 1] == (
        "etc: Gemma3ForConditionalGeneration: its text model only; not loaded: "
        "multi_modal_projector (1 tensor), vision_tower (2 tensors)")
