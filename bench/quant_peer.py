"""llama.cpp's side of `bench/quant_race.py`: quantizing a GGUF file with
llama.cpp's own quantizer, and serving decode timings, peak memory and a
timed first token over stdin/stdout, through llama-cpp-python.

It imports neither ETC nor MLIR: it runs under the Python that has
llama-cpp-python (`--peer-python`, see docs/benchmarks.md).

    python bench/quant_peer.py quantize F32.gguf OUT.gguf TYPE   (Q4_K_M, Q8_0, Q4_0)
    python bench/quant_peer.py first FILE.gguf THREADS PROMPT    ("first", then "rss N")
    python bench/quant_peer.py serve FILE.gguf THREADS

`serve` then takes, one a line: `decode B PROMPT STEPS` (answers "ms <t1>
..." per decode step of B sequences), `rss` (answers "rss <peak bytes>"),
`quit`. Models load with `use_extra_bufts = False` (llama.cpp's
--no-repack): the weight repacking and AMX buffer types of the
llama-cpp-python 0.3.36 build segfault on quantized files on this VM.
"""

from __future__ import annotations

import sys
import time

import numpy as np

FTYPES = {"Q4_K_M": 15, "Q8_0": 7, "Q4_0": 2}


def peak_rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def quantize(source: str, target: str, kind: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = 2
    if llama_cpp.llama_model_quantize(source.encode(), target.encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not quantize {source} to {kind}")


class Model:
    """A GGUF file loaded by llama.cpp, with a context per measurement."""

    def __init__(self, path: str, threads: int):
        import llama_cpp

        self.cpp = llama_cpp
        self.threads = threads
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = False
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))

    def context(self, batch: int, length: int, prompt_tokens: int):
        params = self.cpp.llama_context_default_params()
        params.n_ctx = batch * (length + 2)
        params.n_batch = params.n_ubatch = max(prompt_tokens, 32)
        params.n_seq_max = batch
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        context = self.cpp.llama_init_from_model(self.model, params)
        if not context:
            raise SystemExit("llama.cpp could not create a context")
        return context

    def decode_ms(self, batch: int, prompt: int, steps: int, first_only: bool = False):
        cpp = self.cpp
        context = self.context(batch, prompt + steps, batch * prompt)
        tokens = cpp.llama_batch_init(max(batch * prompt, batch), 0, batch)
        rng = np.random.default_rng(batch)
        try:
            def submit(entries):  # (token, position, sequence, wants_logits)
                tokens.n_tokens = len(entries)
                for i, (token, position, sequence, logits) in enumerate(entries):
                    tokens.token[i] = int(token)
                    tokens.pos[i] = position
                    tokens.n_seq_id[i] = 1
                    tokens.seq_id[i][0] = sequence
                    tokens.logits[i] = logits
                if cpp.llama_decode(context, tokens) != 0:
                    raise SystemExit("llama_decode failed")

            def greedy(rows):
                return [int(np.argmax(np.ctypeslib.as_array(cpp.llama_get_logits_ith(
                    context, row), (self.n_vocab,)))) for row in rows]

            ids = rng.integers(0, self.n_vocab, (batch, prompt))
            submit([(ids[s, p], p, s, p == prompt - 1) for s in range(batch)
                    for p in range(prompt)])
            last = greedy([s * prompt + prompt - 1 for s in range(batch)])
            if first_only:
                return last
            times = []
            for step in range(steps):
                start = time.perf_counter()
                submit([(last[s], prompt + step, s, True) for s in range(batch)])
                last = greedy(range(batch))
                times.append((time.perf_counter() - start) * 1e3)
            return times
        finally:
            cpp.llama_batch_free(tokens)
            cpp.llama_free(context)


def main() -> None:
    command = sys.argv[1]
    if command == "quantize":
        quantize(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    model = Model(sys.argv[2], int(sys.argv[3]))
    if command == "first":
        model.decode_ms(1, int(sys.argv[4]), 0, first_only=True)
        print("first", flush=True)
        model.decode_ms(1, int(sys.argv[4]), 16)
        print(f"rss {peak_rss()}", flush=True)
        return
    import llama_cpp

    print(f"ready llama-cpp-python {llama_cpp.__version__}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "decode":
            times = model.decode_ms(*map(int, words[1:4]))
            print("ms " + " ".join(f"{t:.4f}" for t in times), flush=True)
        elif words[0] == "rss":
            print(f"rss {peak_rss()}", flush=True)


if __name__ == "__main__":
    main()
