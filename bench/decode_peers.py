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
checkpoint directory's model.gguf), which bench/llm_decode_cpu.py writes
there (unless it is there already) with `etc.models.testing.write_gguf`,
llama.cpp's converter's layout (Q and K rows permuted for Llama-style
RoPE): the same bf16 numbers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

def gguf_path(directory: Path) -> Path:
    return directory / "model.gguf"


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
        if gguf is None:
            gguf = gguf_path(directory)
            if not gguf.exists():
                raise SystemExit(f"llama.cpp reads {gguf}, which is not there: "
                                 "bench/llm_decode_cpu.py writes it from the checkpoint")
        self.path = str(gguf)
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
