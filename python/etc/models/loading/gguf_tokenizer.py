"""The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`),
as a `tokenizers.Tokenizer`: byte-level BPE with the split that
`tokenizer.ggml.pre` names, or SentencePiece BPE (`spm`), as llama.cpp
reads them; `GGUFCheckpoint.tokenizer` wraps it with the chat template."""

from __future__ import annotations

from typing import Optional

from . import gguf_pretokenizers
from .gguf_file import GGUFError

__all__ = ["PRE_TOKENIZERS", "backend", "eos_token_ids", "tokenizer"]

#: `tokenizer.ggml.pre` values of byte-level BPE ("gpt2") tokenizers, and the
#: split llama.cpp applies before byte-level BPE for each (a regex, regexes
#: applied in turn (`gguf_pretokenizers`), or "gpt2": GPT-2's own regex, or
#: "smollm": digits apart, then GPT-2's).
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                 r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = gguf_pretokenizers.QWEN2
_GPT4O_SPLIT = gguf_pretokenizers.GPT4O
PRE_TOKENIZERS = {"default": "gpt2", "gpt-2": "gpt2", "gpt2": "gpt2", "smollm": "smollm",
                  "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
                  "llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "gpt-4o": _GPT4O_SPLIT,
                  # GLM-4's (llama.cpp's CHATGLM4: llama3's split, merges kept).
                  "glm4": _LLAMA3_SPLIT, "command-r": "smollm",
                  **gguf_pretokenizers.PRE_TOKENIZERS}
#: The pre-tokenizers whose BPE takes a word found whole in the vocabulary
#: as one token without merging (llama.cpp's `ignore_merges`: llama3's).
_IGNORE_MERGES = ("llama3", "llama-v3", "llama-bpe")


def _token(metadata: dict, key: str) -> Optional[str]:
    """The text of the token whose id metadata `key` holds, or None."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    index = metadata.get(key)
    if index is None or not 0 <= index < len(tokens):
        return None
    return tokens[index]


def eos_token_ids(metadata: dict) -> list[int]:
    """The ids that end a sequence: `tokenizer.ggml.eos_token_id`, and
    the end-of-turn and end-of-message ids where the file names them."""
    ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        value = metadata.get(key)
        if value is not None and value not in ids:
            ids.append(int(value))
    return ids


def tokenizer(metadata: dict, path):
    """The tokenizer and chat template of the file at `path` (its
    `metadata`) as an `etc.models.loading.tokenizer.Tokenizer` (see
    `backend`), or None when the file has no tokenizer."""
    if "tokenizer.ggml.model" not in metadata:
        return None
    from .tokenizer import Tokenizer

    return Tokenizer(backend(metadata, path),
                     chat_template=metadata.get("tokenizer.chat_template"),
                     bos_token=_token(metadata, "tokenizer.ggml.bos_token_id"),
                     eos_token=_token(metadata, "tokenizer.ggml.eos_token_id"),
                     add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
                     add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)))


def _sentencepiece(metadata: dict, path):
    """The file's SentencePiece BPE tokenizer (`spm.spm_backend`)."""
    from .spm import spm_backend

    pieces, scores, types = _sentencepiece_tokens(metadata, path)
    unknown = _token(metadata, "tokenizer.ggml.unknown_token_id")
    return spm_backend(pieces, scores, types, unknown=unknown, add_space_prefix=bool(
        metadata.get("tokenizer.ggml.add_space_prefix", True)))


def backend(metadata: dict, path):
    """The tokenizer of the file at `path` (its `metadata`) as a
    `tokenizers.Tokenizer`: byte-level BPE (`tokenizer.ggml.model` =
    "gpt2") with the split that `tokenizer.ggml.pre` names, or
    SentencePiece BPE ("llama": Gemma, Phi-3, Mistral; `spm`); control
    tokens are special tokens and user-defined tokens added tokens, as
    llama.cpp treats them. Other tokenizer models raise `GGUFError` naming
    them."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise GGUFError(f"{path}: the GGUF file has no tokenizer "
                        f"(tokenizer.ggml.model is missing)")
    if model == "llama":
        return _sentencepiece(metadata, path)
    if model != "gpt2":
        raise GGUFError(f"{path}: tokenizer.ggml.model = {model!r} is not supported; "
                        f"supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE)")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{path}: tokenizer.ggml.pre = {pre!r} is not supported; "
                        f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from .spm import add_typed_tokens

    tokens = metadata.get("tokenizer.ggml.tokens") or []
    merges = metadata.get("tokenizer.ggml.merges") or []
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries "
                        f"for {len(tokens)} tokens")
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise GGUFError(f"{path}: tokenizer.ggml.merges entry {merge!r} is not two "
                            f"tokens separated by a space")
        pairs.append((parts[0], parts[1]))
    split = PRE_TOKENIZERS[pre]
    backend = Tokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _IGNORE_MERGES))
    if split == "gpt2":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                         use_regex=True)
    elif split == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        backend.pre_tokenizer = gguf_pretokenizers.regex_splits(split)
    backend.decoder = decoders.ByteLevel()
    add_typed_tokens(backend, tokens, types)
    return backend


def _sentencepiece_tokens(metadata: dict, path) -> tuple[list, list, list]:
    """The pieces, scores and token types of a "llama" tokenizer, checked."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    scores = metadata.get("tokenizer.ggml.scores")
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if scores is None:
        raise GGUFError(f"{path}: tokenizer.ggml.scores is missing (a SentencePiece "
                        f"tokenizer's merges follow its pieces' scores)")
    for key, values in (("scores", scores), ("token_type", types)):
        if len(values) != len(tokens):
            raise GGUFError(f"{path}: tokenizer.ggml.{key} has {len(values)} entries for "
                            f"{len(tokens)} tokens")
    return tokens, [float(x) for x in scores], [int(t) for t in types]
