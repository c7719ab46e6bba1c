"""llama.cpp's own encodings of GGUF tokenizers under each `tokenizer.ggml.pre`
split ETC builds, for test_gguf_pretokenizers.py.

    PYTHONPATH=python:test/python /path/to/python test/python/gguf_pretokenizer_goldens.py

(a Python with llama-cpp-python) writes
test/python/goldens/gguf-pretokenizers-llama-cpp.json. The committed file
was made with llama-cpp-python 0.3.36 (the llama.cpp it vendors, commit
0c1e57098bba43ac29e6e3b677cdceebdd22334f) and tokenizers 0.23.3.

How:
1. `trained()`: a byte-level BPE tokenizer trained on TEXTS with no split
   at all (only the byte mapping), so that its merges join across the
   places where the splits cut (spaces, digits, scripts, punctuation, line
   ends), and any split that cuts elsewhere encodes differently.
2. For each name of PRES, `write_gguf` writes a tiny Qwen3 file with that
   tokenizer and `tokenizer.ggml.pre` = the name.
3. `llama_cpp.Llama(file, vocab_only=True).tokenize(text, add_bos=False,
   special=True)` for each of TEXTS: llama.cpp's ids.

The JSON holds the tokenizer (tokenizers' own JSON), TEXTS, and the ids per
name and text.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "goldens" / "gguf-pretokenizers-llama-cpp.json"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: Texts on which the splits differ: digit runs (ASCII, full-width, other
#: numbers), contractions in both cases, CJK, kana, Hangul, accented and
#: Greek letters, case runs, combining marks, other scripts, emoji, ASCII
#: and full-width punctuation, spaces, tabs, line ends, other spaces.
TEXTS = [
    "It's 2026; we're testing 1234567 tokens: 3.14159, 1,000,000 and ０１２３ ½ ² Ⅻ 12a34",
    "I'VE been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you? We'Ve a'lL",
    "中文分词测试：我想在apple工作1314151天～ 人々〇 日本語のテキストとカタカナ、ひらがな。한국어 텍스트입니다.",
    "naïve café Straße ÉCOLE HelloÉcole ΑΒΓ αβγ Ωmega ﬁne ＡＢＣ ａｂｃ µs Ⅷ "
    "\u2126hm 5\u212a \u1f7d\u1fd3\u1fdb\u1fbe Ⴀ Ꭰ Բարեւ",
    "  leading\n\n\ttabs\r\n  trailing   \n \n\n   x  ",
    "emoji 🙂🚀 😶‍🌫️ 🦙🦙 ✅ !!! ??? ...... ``` \"\"\" ''' ---=== ／＼ «quotes» “curly” $5 +3 <a>",
    "Yes!\nNo!\nOK.\n\nWait...\r\nGo!!\n  Done;\n",
    "def f(x):\n    return x**2 + 1  # comment\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "e\u0301 a\u0300b\u0301c क्षत्रिय ภาษาไทย Привет, мир! שלום עולם مرحبا",
    "a\u00a0b\u3000c\u2003d\u200be \u3000\u3000中\u3000 x\u00a0\u00a0y",
    "<|im_start|>user\nHello, 世界 123!<|im_end|>\n<|im_start|>assistant\n",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ ✅ 🦙🦙 3 33 333 3333 "
    "33333 333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= "
    "нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there",
]
#: The `tokenizer.ggml.pre` names recorded: the ones `gguf_pretokenizers`
#: adds, and the ones `gguf.PRE_TOKENIZERS` had before, for comparison.
PRES = ["deepseek-llm", "deepseek-coder", "deepseek-v3", "hunyuan-dense", "kimi-k2",
        "seed-coder", "hunyuan", "deepseek-r1-qwen", "exaone4", "exaone",
        "gpt-2", "qwen2", "llama-bpe", "smollm", "command-r", "glm4", "gpt-4o"]


def trained():
    """Step 1: the tokenizer (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(TEXTS * 3, trainer)
    return tokenizer


def write(path: Path, tokenizer, pre: str) -> Path:
    """Step 2: the GGUF file of `tokenizer` under pre-tokenizer `pre`."""
    from etc.models.testing import tiny_config
    from etc.models.testing.gguf_writer import write_gguf

    config = tiny_config("Qwen3ForCausalLM", vocab_size=tokenizer.get_vocab_size())
    return write_gguf(path, config, tokenizer=tokenizer, pre=pre, eos_token="<|im_end|>",
                      bos_token="<|endoftext|>")


def main() -> None:
    import llama_cpp
    import tokenizers

    tokenizer = trained()
    ids = {}
    with tempfile.TemporaryDirectory() as scratch:
        for pre in PRES:
            path = write(Path(scratch) / f"{pre}.gguf", tokenizer, pre)
            llama = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            ids[pre] = [llama.tokenize(text.encode(), add_bos=False, special=True)
                        for text in TEXTS]
            del llama
    GOLDEN.write_text(json.dumps({
        "llama_cpp_python": llama_cpp.__version__, "tokenizers": tokenizers.__version__,
        "tokenizer": json.loads(tokenizer.to_str()), "texts": TEXTS, "ids": ids},
        ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    main()
