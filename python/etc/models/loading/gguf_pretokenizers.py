"""The splits llama.cpp applies before byte-level BPE for `tokenizer.ggml.pre`
values beyond GPT-2's and Llama 3's (DeepSeek, Kimi K2, EXAONE, Seed,
Hunyuan, the DeepSeek-R1 Qwen distills; Qwen2's and GPT-4o's, which
`gguf.PRE_TOKENIZERS` also names), and how a split becomes a `tokenizers`
pre-tokenizer.

llama.cpp (src/llama-vocab.cpp) maps each `pre` name to a list of regular
expressions and applies them in turn: each one cuts every piece the previous
ones left into its matches and the text between them (`tokenizers`' Split
with behavior "isolated"), and the pieces then go through GPT-2's byte
mapping. A split here is one regex, a tuple of regexes in llama.cpp's order,
or "gpt2" / "smollm" (`gguf.PRE_TOKENIZERS`). None of these names sets
llama.cpp's `ignore_merges`.

Where llama.cpp departs from the model's own tokenizer, these follow
llama.cpp (a GGUF file is encoded as llama.cpp encodes it): GPT-4o's case
runs (`GPT4O`); Kimi K2's split, llama.cpp's hand-written one (any letters
but Han in one word, no upper/lower-case runs, marks not letters, Han as
llama.cpp's ranges); DeepSeek LLM's end-of-piece whitespace, `\\z`
(ECMAScript's `$`, which llama.cpp's std::regex has).
"""

from __future__ import annotations

__all__ = ["PRE_TOKENIZERS", "QWEN2", "GPT4O", "regex_splits"]

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#: Qwen2's split: contractions, words with one leading non-letter, single
#: digits, punctuation runs with their line ends, line ends, spaces.
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
#: GPT-4o's (o200k: Phi-4-mini, gpt-oss) as llama.cpp has it: words with
#: their case runs and contractions, numbers of up to 3 digits, punctuation
#: runs with their line ends and "/". Its case runs tell upper from lower
#: case in ASCII only (any other letter is both), and marks are not letters,
#: where o200k's own pattern uses Lu/Ll and takes marks into words.
GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS +
         r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS +
         r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The cased letters of DeepSeek LLM's tokenizer (its list, a part of
# Lu/Ll/Lt), as code points: several of them are canonical singletons
# that text normalisation would change (Kelvin, Ohm, Greek oxia letters).
_CASED = (
    r"\x{41}-\x{5A}\x{61}-\x{7A}\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}"
    r"\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}"
    r"\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}"
    r"\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}"
    r"\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}"
    r"\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}"
    r"\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}"
    r"\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}"
    r"\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}"
    r"\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}"
    r"\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}"
    r"\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}"
    r"\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}"
    r"\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}"
    r"\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}"
    r"\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}"
    r"\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}")
# DeepSeek's CJK (and some of the scripts before it) and Hangul runs.
_CJK_HANGUL = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"
# DeepSeek LLM's (V2): line ends alone, then cased-letter words (the
# tokenizer's own list of cased-letter ranges), ASCII and full-width
# punctuation runs, trailing spaces, CJK runs, digit runs.
_DEEPSEEK_LLM = (
    r"[\r\n]",
    r"\s?[" + _CASED + r"]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+\z",
    _CJK_HANGUL,
    r"\p{N}+")
# DeepSeek Coder's: line ends alone, letter words, punctuation runs, CJK
# runs, single digits.
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")
# DeepSeek-V3's (and Hunyuan dense's): numbers of up to 3 digits, CJK and
# kana runs, then words (an ASCII word may take one leading ASCII
# punctuation mark; other words one leading non-punctuation, non-symbol
# character; marks belong to words), punctuation-and-symbol runs with their
# line ends, line ends, spaces.
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
    r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Seed-Coder's (Seed-OSS): Qwen2's, but a punctuation run takes no line end.
_SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Kimi K2's (llama.cpp's hand-written version of its tiktoken pattern): Han
# runs (llama.cpp's CJK ideograph blocks), words of other letters with one
# leading non-letter and a contraction, numbers of up to 3 digits, then
# Llama 3's punctuation and spaces.
_HAN = (r"\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}"
        r"\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}")
_KIMI_K2 = (r"[" + _HAN + r"]+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^" + _HAN + r"]]+" + _CONTRACTIONS +
            r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: The `tokenizer.ggml.pre` values of this module and their splits (the
#: names as llama.cpp's converter writes them: DeepSeek-V2 "deepseek-llm",
#: V3 and R1 "deepseek-v3", Kimi K2 and Moonlight "kimi-k2", EXAONE 4
#: "exaone4" (GPT-2's split in llama.cpp), Seed-OSS "seed-coder", Hunyuan
#: dense "hunyuan-dense", Hunyuan MoE "hunyuan" (Qwen2's), the R1 Qwen
#: distills "deepseek-r1-qwen").
PRE_TOKENIZERS = {"deepseek-llm": _DEEPSEEK_LLM, "deepseek-coder": _DEEPSEEK_CODER,
                  "deepseek-v3": _DEEPSEEK_V3, "hunyuan-dense": _DEEPSEEK_V3,
                  "kimi-k2": _KIMI_K2, "seed-coder": _SEED_CODER, "hunyuan": QWEN2,
                  "deepseek-r1-qwen": QWEN2, "exaone4": "gpt2", "exaone": "smollm"}


def regex_splits(split):
    """The `tokenizers` pre-tokenizer of a regex split (one regex or a tuple
    applied in turn, each keeping its matches and the text between them),
    then GPT-2's byte mapping."""
    from tokenizers import Regex, pre_tokenizers

    regexes = (split,) if isinstance(split, str) else split
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
