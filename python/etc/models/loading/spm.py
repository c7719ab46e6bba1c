"""SentencePiece BPE tokenizers as GGUF files hold them (`tokenizer.ggml.model`
= "llama": Llama 2, Mistral, Gemma, Phi-3), built as `tokenizers.Tokenizer`s.

The file has the pieces, a score per piece and a type per piece (llama.cpp's
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE), not merges. SentencePiece's
BPE encodes by repeatedly joining the adjacent pair whose joined piece is in
the vocabulary with the highest score; a BPE model whose merge list is every
(left, right) split of every piece, ranked by the joined piece's score,
encodes the same (how transformers converts SentencePiece models too).
Spaces are "▁" (U+2581), with one put before the text when
`tokenizer.ggml.add_space_prefix` is true (the default; Gemma's converter
writes false); characters outside the vocabulary fall back to their UTF-8
bytes, the `<0xXX>` pieces.
"""

from __future__ import annotations

__all__ = ["SPACE", "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE",
           "merges_from_scores", "spm_backend", "add_typed_tokens"]

#: SentencePiece's space.
SPACE = "\u2581"
#: llama.cpp's token types (`tokenizer.ggml.token_type`).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def merges_from_scores(pieces: list, scores: list, types: list) -> list:
    """Every (left, right) split of every normal piece into two pieces of
    the vocabulary, ranked by the joined piece's score (highest first;
    then shorter left parts, then lower ids), as BPE merges."""
    ids = {}
    for index, piece in enumerate(pieces):
        ids.setdefault(piece, index)
    ranked = []
    for index, piece in enumerate(pieces):
        if types[index] != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[index], len(left), ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def spm_backend(pieces: list, scores: list, types: list, *, add_space_prefix: bool = True,
                unknown: str | None = None):
    """The `tokenizers.Tokenizer` of a SentencePiece BPE vocabulary:
    `pieces`, their `scores` and llama.cpp `types`; control pieces are
    special tokens, user-defined pieces added tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {}
    for index, piece in enumerate(pieces):
        vocab.setdefault(piece, index)
    if unknown is None:
        unknown = next((p for p, t in zip(pieces, types) if t == UNKNOWN), None)
    model = models.BPE(vocab, merges_from_scores(pieces, scores, types), unk_token=unknown,
                       byte_fallback=True, fuse_unk=True)
    backend = Tokenizer(model)
    steps = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend(SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(decode)
    add_typed_tokens(backend, pieces, types)
    return backend


def add_typed_tokens(backend, tokens: list, types: list) -> None:
    """Adds the control `tokens` to `backend` as special tokens and the
    user-defined ones as added tokens, as llama.cpp treats them."""
    from tokenizers import AddedToken

    special = [AddedToken(p, special=True, normalized=False)
               for p, t in zip(tokens, types) if t == CONTROL]
    added = [AddedToken(p, special=False, normalized=False)
             for p, t in zip(tokens, types) if t == USER_DEFINED]
    if special:
        backend.add_special_tokens(special)
    if added:
        backend.add_tokens(added)
