"""llama.cpp's side of `bench/quant_race.py`: quantizing a GGUF file with
llama.cpp's own quantizer, and serving decode timings, peak memory and a
timed first token over stdin/stdout, through llama-cpp-python.

It imports neither ETC nor MLIR: it runs under the Python that has
llama-cpp-python (`--peer-python`, see docs/benchmarks.md).

    python bench/quant_peer.py quantize F32.gguf OUT.gguf TYPE   (Q4_K_M, Q8_0, Q4_0)
    python bench/quant_peer.py first FILE.gguf THREADS PROMPT    ("first", then "rss N")
    python bench/quant_peer.py serve FILE.gguf THREADS

`serve` then takes, one a line: `decode B PROMPT STEPS` (answers "ms <t1>
..." per decode step of B sequences) or `quit`. Models load through
bench/decode_peers.py's `LlamaCpp`, with `use_extra_bufts = False`
(llama.cpp's --no-repack): the weight repacking and AMX buffer types of the
llama-cpp-python 0.3.36 build segfault on quantized files on this VM.
"""

from __future__ import annotations

import sys
from pathlib import Path

from decode_peers import LlamaCpp

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


def main() -> None:
    command = sys.argv[1]
    if command == "quantize":
        quantize(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    model = LlamaCpp(None, int(sys.argv[3]), gguf=Path(sys.argv[2]), repack=False)
    if command == "first":
        model.decode_ms(1, int(sys.argv[4]), 0)  # the prompt: its logits are the first token
        print("first", flush=True)
        model.decode_ms(1, int(sys.argv[4]), 16)
        print(f"rss {peak_rss()}", flush=True)
        return
    print(f"ready {model.version}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "decode":
            times = model.decode_ms(*map(int, words[1:4]))
            print("ms " + " ".join(f"{t:.4f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
