"""The other engines of `bench/llm_decode_cpu.py`: llama.cpp (through
llama-cpp-python) and Hugging Face transformers (PyTorch, CPU), run in their
own process, commanded over stdin/stdout so that the benchmark can alternate
rounds between ETC and them.

It imports neither ETC nor MLIR: it runs under the Python that has the
engines (`--peer-python`; see docs/benchmarks.md for the optional venv).

    python bench/decode_peers.py ENGINE CHECKPOINT_DIR THREADS

then, on stdin, one command a line:
    decode B PROMPT STEPS  ->  "ms <t1> <t2> ..."  (ms per decode step of B
                               requests after prompts of PROMPT tokens)
    prefill B PROMPT RUNS  ->  "ms <t1> <t2> ..."  (ms per prefill of B
                               prompts of PROMPT tokens, the last token's
                               logits included; a new context each run)
    logits PATH FIRST T1 ... Tn  ->  "ok" (llama.cpp: the logits of
                               tokens T1..Tn in a new context at positions
                               FIRST..n-1, saved as a (n - FIRST, vocab)
                               float32 .npy file at PATH)
    quit
For llama.cpp the checkpoint's weights are read from `gguf_path` (the
checkpoint directory's model.gguf) if that file is there:
bench/llm_decode_cpu.py writes it there (unless it is there already) for
every family but Llama, with `etc.models.testing.write_gguf`. Otherwise a
Llama checkpoint's safetensors weights are written there once
(`write_gguf`, with `gguf.GGUFWriter`): the same bf16 numbers, with Q and K
rows in the order llama.cpp's rotary embedding takes them (as llama.cpp's
own converter writes Llama checkpoints).
"""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import numpy as np

_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path: Path) -> dict:
    """The tensors of a safetensors file, as NumPy arrays (BF16 as uint16 bit
    patterns)."""
    data = path.read_bytes()
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + length])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        tensors[name] = np.frombuffer(data, dtype, (end - start) // np.dtype(dtype).itemsize,
                                      8 + length + start).reshape(info["shape"])
    return tensors


def _checkpoint(directory: Path) -> tuple[dict, dict]:
    config = json.loads((directory / "config.json").read_text())
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(read_safetensors(file))
    return config, tensors


def _rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Q/K projection rows from Hugging Face's rotary layout (the two halves
    of each head rotate together) to llama.cpp's (adjacent pairs rotate
    together)."""
    rows = weight.shape[0]
    return (weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def gguf_path(directory: Path) -> Path:
    return directory / "model.gguf"


def write_gguf(directory: Path) -> Path:
    """Writes the Llama checkpoint in `directory` as GGUF (bf16 matrices,
    f32 norms, a placeholder vocabulary of the right size) unless it is
    there; returns its path."""
    import gguf

    path = gguf_path(directory)
    if path.exists():
        return path
    config, tensors = _checkpoint(directory)
    if config["architectures"] != ["LlamaForCausalLM"]:
        raise SystemExit(f"llama.cpp peer: {config['architectures']} has no {path} (this "
                         f"script writes only LlamaForCausalLM checkpoints; "
                         f"bench/llm_decode_cpu.py writes the other families')")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("etc-bench")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    # Token ids go in directly: the vocabulary only has to exist.
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>".encode() for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def add(name: str, array: np.ndarray) -> None:
        if array.ndim == 1:  # norms: f32, as llama.cpp keeps them
            values = array.astype(np.float32) if array.dtype != np.uint16 else \
                (array.astype(np.uint32) << 16).view(np.float32)
            writer.add_tensor(name, np.ascontiguousarray(values))
            return
        if array.dtype != np.uint16:
            raise SystemExit(f"llama.cpp peer: {name} is {array.dtype}; write the checkpoint "
                             f"as BF16")
        writer.add_tensor(name, np.ascontiguousarray(array),
                          raw_dtype=gguf.GGMLQuantizationType.BF16)

    add("token_embd.weight", tensors["model.embed_tokens.weight"])
    add("output_norm.weight", tensors["model.norm.weight"])
    if "lm_head.weight" in tensors:
        add("output.weight", tensors["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for layer in range(config["num_hidden_layers"]):
        for hf, ours in names.items():
            weight = tensors[f"model.layers.{layer}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                weight = _rotary_rows(weight, heads)
            elif hf == "self_attn.k_proj":
                weight = _rotary_rows(weight, kv_heads)
            add(f"blk.{layer}.{ours}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class LlamaCpp:
    """llama.cpp through llama-cpp-python's C API: one context with a
    sequence per request, a batch of one token per sequence per step.
    `gguf` names a GGUF file to load as it is instead of the checkpoint
    directory's weights (bench/quant_peer.py); `repack=False` turns off
    llama.cpp's extra buffer types (weight repacking, AMX)."""

    def __init__(self, directory: Path, threads: int, gguf: Path | None = None,
                 repack: bool = True):
        import llama_cpp

        self.cpp = llama_cpp
        self.threads = threads
        self.path = str(gguf if gguf is not None else write_gguf(directory))
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = repack
        self.model = llama_cpp.llama_model_load_from_file(self.path.encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {self.path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.version = f"llama-cpp-python {llama_cpp.__version__}"

    def decode_ms(self, batch: int, prompt: int, steps: int) -> list[float]:
        return self._run(batch, prompt, steps, prefill_runs=0)

    def prefill_ms(self, batch: int, prompt: int, runs: int) -> list[float]:
        times = []
        for _ in range(runs):
            times += self._run(batch, prompt, 0, prefill_runs=1)
        return times

    def _context(self, batch: int, tokens: int, positions: int):
        """A new context of `batch` sequences of `positions` each, taking
        up to `tokens` tokens a batch, and a batch of that many."""
        cpp = self.cpp
        params = cpp.llama_context_default_params()
        params.n_ctx = batch * positions
        params.n_batch = max(tokens, 32)
        params.n_ubatch = params.n_batch
        params.n_seq_max = batch
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        context = cpp.llama_init_from_model(self.model, params)
        if not context:
            raise SystemExit("llama.cpp could not create a context")
        return context, cpp.llama_batch_init(max(tokens, batch), 0, batch)

    def _submit(self, context, tokens, entries) -> None:
        """One llama_decode of `entries`: (token, position, sequence,
        wants_logits)."""
        tokens.n_tokens = len(entries)
        for i, (token, position, sequence, logits) in enumerate(entries):
            tokens.token[i] = int(token)
            tokens.pos[i] = position
            tokens.n_seq_id[i] = 1
            tokens.seq_id[i][0] = sequence
            tokens.logits[i] = logits
        if self.cpp.llama_decode(context, tokens) != 0:
            raise SystemExit("llama_decode failed")

    def logits(self, ids: list, first: int) -> np.ndarray:
        """The logits after each of `ids` from position `first` on, of one
        sequence decoded in one batch in a new context: (len(ids) - first,
        vocab) float32."""
        cpp = self.cpp
        context, tokens = self._context(1, len(ids), len(ids) + 2)
        try:
            self._submit(context, tokens, [(t, p, 0, p >= first) for p, t in enumerate(ids)])
            return np.stack([np.ctypeslib.as_array(cpp.llama_get_logits_ith(context, p),
                                                   (self.n_vocab,)).copy()
                             for p in range(first, len(ids))])
        finally:
            cpp.llama_batch_free(tokens)
            cpp.llama_free(context)

    def _run(self, batch: int, prompt: int, steps: int, prefill_runs: int) -> list[float]:
        """Prefills B prompts in one batch, then `steps` decode steps: their
        times, or (`prefill_runs`) the prefill's."""
        cpp = self.cpp
        context, tokens = self._context(batch, batch * prompt, prompt + steps + 2)
        rng = np.random.default_rng(batch)
        try:
            def submit(entries):  # (token, position, sequence, wants_logits)
                self._submit(context, tokens, entries)

            ids = rng.integers(0, self.n_vocab, (batch, prompt))
            start = time.perf_counter()
            submit([(ids[s, p], p, s, p == prompt - 1) for s in range(batch)
                    for p in range(prompt)])
            if prefill_runs:
                return [(time.perf_counter() - start) * 1e3]
            # The batch entries whose logits were asked for, per sequence.
            rows = [s * prompt + prompt - 1 for s in range(batch)]
            times = []
            for step in range(steps):
                start = time.perf_counter()
                # Greedy ids from the logits, as ETC's step returns them.
                last = [int(np.argmax(np.ctypeslib.as_array(
                    cpp.llama_get_logits_ith(context, row), (self.n_vocab,))))
                    for row in rows]
                submit([(last[s], prompt + step, s, True) for s in range(batch)])
                times.append((time.perf_counter() - start) * 1e3)
                rows = list(range(batch))
            return times
        finally:
            cpp.llama_batch_free(tokens)
            cpp.llama_free(context)


class Transformers:
    """Hugging Face transformers on PyTorch's CPU build, in the checkpoint's
    bf16 (as ETC runs it), one forward pass of B tokens with its KV cache
    per step."""

    def __init__(self, directory: Path, threads: int):
        import torch
        import transformers

        torch.set_num_threads(threads)
        transformers.logging.set_verbosity_error()
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(directory,
                                                                       dtype=torch.bfloat16)
        self.model.eval()
        self.version = f"transformers {transformers.__version__}, torch {torch.__version__}"

    def prefill_ms(self, batch: int, prompt: int, runs: int) -> list[float]:
        torch = self.torch
        rng = np.random.default_rng(batch)
        ids = torch.tensor(rng.integers(0, self.model.config.vocab_size, (batch, prompt)))
        times = []
        with torch.no_grad():
            for _ in range(runs):
                start = time.perf_counter()
                self.model(ids, use_cache=True, logits_to_keep=1)
                times.append((time.perf_counter() - start) * 1e3)
        return times

    def decode_ms(self, batch: int, prompt: int, steps: int) -> list[float]:
        torch = self.torch
        rng = np.random.default_rng(batch)
        ids = torch.tensor(rng.integers(0, self.model.config.vocab_size, (batch, prompt)))
        times = []
        with torch.no_grad():
            out = self.model(ids, use_cache=True)
            past, next_ids = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(steps):
                start = time.perf_counter()
                out = self.model(next_ids, past_key_values=past, use_cache=True)
                past, next_ids = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                times.append((time.perf_counter() - start) * 1e3)
        return times


ENGINES = {"llama.cpp": LlamaCpp, "transformers": Transformers}


def main() -> None:
    engine_name, directory, threads = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    engine = ENGINES[engine_name](directory, threads)
    print(f"ready {engine.version}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] in ("decode", "prefill"):
            batch, prompt, count = map(int, words[1:4])
            measure = engine.decode_ms if words[0] == "decode" else engine.prefill_ms
            times = measure(batch, prompt, count)
            print("ms " + " ".join(f"{t:.4f}" for t in times), flush=True)
        elif words[0] == "logits" and hasattr(engine, "logits"):
            first, ids = int(words[2]), [int(w) for w in words[3:]]
            np.save(words[1], engine.logits(ids, first))
            print("ok", flush=True)
        else:
            print(f"error: {engine_name} does not take {line.strip()!r}", flush=True)


if __name__ == "__main__":
    main()
