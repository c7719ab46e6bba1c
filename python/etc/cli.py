"""The `etc` command: generate text, chat, serve the OpenAI API, compile step
kernels into the compile cache, and manage that cache.

```sh
etc generate Qwen3-0.6B/ "The capital of France is"      # streams the text
etc chat model.gguf                                       # interactive, with the chat template
etc serve Qwen3-0.6B/ --host 127.0.0.1 --port 8000        # OpenAI-compatible server
etc generate Qwen3-0.6B/ "Hello" --tensor-parallel 2      # split over 2 MPI ranks
etc compile Qwen3-0.6B/ --target cuda --chip sm_90a       # no GPU needed; fills the cache
etc cache list                                            # what the cache holds
```

Errors a user can act on (a missing file, an unsupported model, a bad
option, a kernel missing from the cache on a machine without the compiler)
print one line, `etc: error: ...`, and exit with status 1; usage errors exit
with 2 (argparse). `ETC_DEBUG=1` shows the traceback instead.

`--tensor-parallel N` (generate, chat, serve) splits the model over N MPI
ranks (docs/distributed.md). Run plainly, the command starts the N ranks
itself (the `mpich` wheel's mpiexec, running this command again); run under
`mpiexec -n N` or `python -m etc.runtime.distributed -n N`, each process is
one rank. Either way rank 0 reads the input and writes the output, and the
others run its steps (`etc.models.lockstep`).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

__all__ = ["main"]

#: `--max-model-len` when not given: the model's context length, at most
#: this (a CPU holds the KV cache in memory: 28 layers of Qwen3-0.6B take
#: 229 KB per position and sequence).
DEFAULT_MAX_MODEL_LEN = 4096
#: `--kv-block-size` when not given (`etc.models.kvpages.DEFAULT_BLOCK_SIZE`;
#: not imported, so that --help needs no NumPy).
DEFAULT_BLOCK_SIZE = 16
#: `--rank-timeout` when not given (`etc.models.lockstep.TIMEOUT_SECONDS`).
DEFAULT_RANK_TIMEOUT = 10.0
#: Set by the command that starts the ranks itself when its stdin is a
#: terminal: rank 0's stdin is then mpiexec's pipe, and `etc chat` prompts
#: as it would at the terminal.
INTERACTIVE_VARIABLE = "ETC_INTERACTIVE"
#: The variables by which MPI launchers tell a process its rank (MPICH's
#: Hydra, Open MPI, PMIx).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


# ----------------------------------------------------------------------
# Progress
# ----------------------------------------------------------------------


class _Progress:
    """`etc.models.load`'s progress callback drawn as tqdm bars on stderr:
    a bar over the weights' tensors, then the elapsed time of the step
    kernel's compilation (or of its load from the cache)."""

    _TITLES = {"cache": "looking up the step kernel in the compile cache",
               "compile": "compiling the step kernel"}

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar = None
        self._phase = None
        self._ticker: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if phase != self._phase:
            self.close()
            self._phase = phase
            if phase == "weights":
                self._bar = tqdm(total=total, desc="loading weights", unit="tensor",
                                 file=sys.stderr, leave=False, dynamic_ncols=True)
            else:
                self._bar = tqdm(total=total, desc=self._TITLES.get(phase, phase),
                                 bar_format="{desc}: {elapsed}", file=sys.stderr,
                                 leave=False)
                # Compiling has no steps to count: redraw the elapsed time.
                self._stop.clear()
                self._ticker = threading.Thread(target=self._tick, daemon=True)
                self._ticker.start()
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._phase = None


# ----------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------


def _add_load_options(parser: argparse.ArgumentParser, *, compile_only: bool = False) -> None:
    group = parser.add_argument_group("model and compile options")
    group.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                       help="where the step kernel runs (default: cpu)")
    group.add_argument("--chip", default="sm_90a",
                       help="the GPU architecture of --target cuda (sm_90a, sm_80; default: "
                            "sm_90a)")
    group.add_argument("--dtype", choices=("f32", "f16", "bf16"), default="f32",
                       help="the weights' and activations' dtype (default: f32)")
    group.add_argument("--workers", type=_positive, default=None,
                       help="CPU worker threads (default: one per core)")
    group.add_argument("--schedule", choices=("auto", "static", "dynamic"), default="auto",
                       help="the step kernel's schedule (default: auto)")
    group.add_argument("--max-model-len", type=_positive, default=None,
                       help=f"the longest sequence, prompt plus new tokens (default: the "
                            f"model's context length, at most {DEFAULT_MAX_MODEL_LEN})")
    group.add_argument("--attention-chunk", type=_positive, default=None,
                       help="KV positions per attention task (default: max-model-len / 16)")
    group.add_argument("--kv-block-size", type=_block_size, default=DEFAULT_BLOCK_SIZE,
                       metavar="P",
                       help=f"positions per block of the paged KV cache, or 'none' for a "
                            f"contiguous slot per sequence (default: {DEFAULT_BLOCK_SIZE})")
    if not compile_only:
        sizes = group.add_mutually_exclusive_group()
        sizes.add_argument("--kv-cache-tokens", type=_positive, default=None, metavar="N",
                           help="positions the paged KV cache holds, over all requests "
                                "(default: max-num-seqs x max-model-len)")
        sizes.add_argument("--kv-cache-memory", type=_bytes, default=None, metavar="BYTES",
                           help="memory of the paged KV cache, e.g. 2GiB or 500MB (default: "
                                "what --kv-cache-tokens takes)")
    group.add_argument("--no-cache", action="store_true",
                       help="neither read nor fill the compile cache")
    group.add_argument("--cache-dir", default=None,
                       help="the compile cache's directory (default: $ETC_CACHE_DIR, else "
                            "~/.cache/etc)")
    if not compile_only:
        group.add_argument("--kernel", default=None, metavar="FILE",
                           help="a step kernel written by 'etc compile -o FILE', instead of "
                                "the cache")
    _add_progress_options(parser)


def _add_parallel_options(parser: argparse.ArgumentParser, role: str) -> None:
    group = parser.add_argument_group("tensor parallelism")
    group.add_argument("--tensor-parallel", type=_positive, default=1, metavar="N",
                       help=f"split the model over N ranks (MPI processes), Megatron-style; "
                            f"etc starts them itself, or run it under 'mpiexec -n N' (or "
                            f"'python -m etc.runtime.distributed -n N'); rank 0 {role}, the "
                            f"others run its steps (default: 1)")
    group.add_argument("--rank-timeout", type=_seconds, default=DEFAULT_RANK_TIMEOUT,
                       metavar="SECONDS",
                       help=f"with --tensor-parallel: a rank that sends no heartbeat for this "
                            f"long counts as hung, and every rank stops with an error naming "
                            f"it (a dead rank on this machine is found at once; default: "
                            f"{DEFAULT_RANK_TIMEOUT:g})")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _add_progress_options(parser: argparse.ArgumentParser) -> None:
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--quiet", "-q", action="store_true",
                       help="no progress bars")
    shown.add_argument("--progress", action="store_true",
                       help="progress bars even when stderr is not a terminal")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def _block_size(text: str) -> Optional[int]:
    if text.lower() == "none":
        return None
    return _positive(text)


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _bytes(text: str) -> int:
    """A size in bytes: an integer with an optional unit (KB, MB, GB: powers
    of 1000; KiB, MiB, GiB: powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 2GiB, 500MB, "
                                         f"1048576)")
    value = int(float(match.group(1)) * _BYTE_UNITS[unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return value


def _cache_option(args):
    if args.no_cache:
        return False
    return args.cache_dir if args.cache_dir else True


def _max_model_len(args, checkpoint) -> int:
    if args.max_model_len is not None:
        return args.max_model_len
    return min(DEFAULT_MAX_MODEL_LEN, checkpoint.config.max_position_embeddings)


def _progress(args) -> _Progress:
    shown = not args.quiet and (args.progress or sys.stderr.isatty())
    return _Progress(shown and _launched_rank() == 0)


def _load(args):
    """The model of `args.checkpoint` with the load options of `args`."""
    from .models import Model, open_checkpoint

    checkpoint = open_checkpoint(args.checkpoint)
    progress = _progress(args)
    try:
        model = Model(checkpoint, target=args.target, schedule=args.schedule,
                      workers=args.workers, dtype=args.dtype,
                      max_seq_len=_max_model_len(args, checkpoint),
                      attention_chunk=args.attention_chunk, chip=args.chip,
                      cache=_cache_option(args), kernel=args.kernel, progress=progress,
                      kv_block_size=args.kv_block_size, kv_cache_tokens=args.kv_cache_tokens,
                      kv_cache_memory=args.kv_cache_memory,
                      tensor_parallel=getattr(args, "tensor_parallel", 1))
    finally:
        progress.close()
    if getattr(args, "verbose", False) and model.rank == 0:
        timings = ", ".join(f"{k} {v:.2f} s" for k, v in model.timings.items())
        print(f"etc: loaded {args.checkpoint} ({model.kernel_source} step kernel; {timings})",
              file=sys.stderr)
    return model


def _sampling(args):
    """The sampling options of `args` as `SamplingParams`, or None (greedy)."""
    options = {name: getattr(args, name) for name in ("temperature", "top_k", "top_p", "min_p",
                                                       "seed")
               if getattr(args, name, None) is not None}
    if not options:
        return None
    from .models.sampling import SamplingParams

    return SamplingParams(**options)


def _add_generation_options(parser: argparse.ArgumentParser, default_new: int) -> None:
    group = parser.add_argument_group("generation options")
    group.add_argument("--max-new-tokens", type=_positive, default=default_new,
                       help=f"new tokens at most (default: {default_new})")
    group.add_argument("--temperature", type=float, default=None,
                       help="sampling temperature (default: 0, greedy)")
    group.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    group.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    group.add_argument("--min-p", type=float, default=None,
                       help="drop tokens below min-p times the most likely one")
    group.add_argument("--seed", type=int, default=None, help="seed of the sampler")
    group.add_argument("--stop", action="append", default=[],
                       help="a stop string (repeatable); the text stops before it")
    group.add_argument("--verbose", "-v", action="store_true",
                       help="say on stderr how the model loaded and how fast it generated")


def _tokenizer(model):
    if model.tokenizer is None:
        raise ValueError(f"{model.path} has no tokenizer: text needs tokenizer.json in the "
                         f"checkpoint directory, or a GGUF file with tokenizer metadata")
    return model.tokenizer


def _stream(engine, ids: list, args, out) -> str:
    """Runs one request on `engine` and writes its text to `out` as it
    comes; returns the text. With --verbose, says on stderr when the first
    token came and how fast the rest did."""
    budget = engine.max_model_len - len(ids)
    if budget < 1:
        raise ValueError(f"the prompt has {len(ids)} tokens, as many as --max-model-len="
                         f"{engine.max_model_len} allows: nothing is left to generate")
    handle = engine.submit(ids, max_new_tokens=min(args.max_new_tokens, budget),
                           stop=args.stop, sampling=_sampling(args))
    pieces = []
    start = time.perf_counter()
    first = None
    count = 0
    for output in handle.outputs():
        if output.error:
            raise RuntimeError(f"generation failed: {output.error}")
        if output.token_ids and first is None:
            first = time.perf_counter() - start
        count += len(output.token_ids)
        if output.text:
            pieces.append(output.text)
            out.write(output.text)
            out.flush()
    if getattr(args, "verbose", False) and first is not None:
        rest = time.perf_counter() - start - first
        rate = f", then {(count - 1) / rest:.1f} tokens/s" if count > 1 and rest > 0 else ""
        print(f"\netc: {len(ids)} prompt tokens, first new token after {first:.3f} s, "
              f"{count} new tokens{rate}", file=sys.stderr)
    return "".join(pieces)


# ----------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------


def _engine():
    """The serving engine's `Engine` class."""
    try:
        from .models.engine import Engine
    except ImportError:
        raise NotImplementedError("this command needs the serving engine (etc.models.engine), "
                                  "which this build of ETC does not have yet") from None
    return Engine


def _led(model, args, body) -> int:
    """`body(model)` for a model on one rank. For a tensor-parallel one,
    `body` runs on rank 0 with a `Leader` for the model, and the other
    ranks follow it; a rank lost while the leader waits (for input, for
    requests) ends rank 0's process at once with an error naming it."""
    if model.tensor_parallel == 1:
        return body(model)
    from .models.lockstep import Leader, follow

    # MPICH's launcher tells the survivors of a rank that died with SIGUSR1,
    # which would end them before they say which rank it was: the
    # heartbeats find it. (Set after MPI_Init, which sets a handler too.)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if model.rank != 0:
        # The launcher passes Ctrl-C and SIGTERM to every rank: rank 0 stops
        # the others when it gets them, or they find it lost.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        follow(model, timeout=args.rank_timeout)
        return 0
    # SIGTERM ends rank 0 as Ctrl-C does (the server sets its own), so
    # that it stops the others on its way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    leader = Leader(model, timeout=args.rank_timeout, on_lost=_lost)
    try:
        return body(leader)
    finally:
        leader.stop()


def _lost(error: BaseException) -> None:
    """Rank 0's end when another rank is lost (called from the heartbeat
    thread, whatever rank 0 is doing): ends the whole MPI job."""
    print(f"etc: error: {_one_line(error)}", file=sys.stderr, flush=True)
    _abort()


def _abort() -> None:
    """Ends every rank of the MPI job: MPI_Abort has the launcher kill them
    all, a hung one included (MPI cannot finalise with a rank lost)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    finally:
        os._exit(1)


def _generate(args) -> int:
    Engine = _engine()
    model = _load(args)
    return _led(model, args, lambda model: _generate_text(Engine, model, args))


def _generate_text(Engine, model, args) -> int:
    tokenizer = _tokenizer(model)
    if args.chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                             add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(args.prompt)
    engine = Engine(model, max_num_seqs=1)
    text = _stream(engine, ids, args, sys.stdout)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


def _chat(args) -> int:
    Engine = _engine()
    model = _load(args)
    return _led(model, args, lambda model: _chat_loop(Engine, model, args))


def _chat_loop(Engine, model, args) -> int:
    tokenizer = _tokenizer(model)
    if tokenizer.chat_template is None:
        raise ValueError(f"{model.path} has no chat template (chat_template.jinja, "
                         f"tokenizer_config.json's chat_template, or tokenizer.chat_template "
                         f"in a GGUF file); use 'etc generate' for plain text")
    engine = Engine(model, max_num_seqs=1)
    interactive = sys.stdin.isatty() or os.environ.get(INTERACTIVE_VARIABLE) == "1"
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    if interactive:
        print("Type a message; /reset starts over, /exit (or Ctrl-D) leaves.", file=sys.stderr)
    while True:
        if interactive:
            try:
                line = input("> ")
            except EOFError:
                print(file=sys.stderr)
                break
        else:
            line = sys.stdin.readline()
            if not line:
                break
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            messages = list(system)
            continue
        messages.append({"role": "user", "content": line})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        try:
            reply = _stream(engine, ids, args, sys.stdout)
        except ValueError as error:
            # The conversation outgrew the model length: say so, forget the
            # message, and go on.
            messages.pop()
            print(f"etc: {_one_line(error)} (/reset starts over)", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": reply})
    return 0


def _serve(args) -> int:
    _engine()
    from . import serve

    model = _load(args)

    def body(model) -> int:
        # With --tensor-parallel, rank 0 serves and the other ranks run
        # each of its steps (docs/distributed.md).
        serve.run(model, args.host, args.port, served_model_name=args.served_model_name,
                  max_num_seqs=args.max_num_seqs, max_model_len=model.max_seq_len)
        return 0

    return _led(model, args, body)


def _compile(args) -> int:
    from .models import compile_checkpoint, open_checkpoint

    cache = _cache_option(args)
    if cache is False and args.output is None:
        raise ValueError("--no-cache without -o FILE: the compiled kernel would go nowhere")
    checkpoint = open_checkpoint(args.checkpoint)
    progress = _progress(args)
    try:
        result = compile_checkpoint(
            args.checkpoint, target=args.target, schedule=args.schedule, workers=args.workers,
            dtype=args.dtype, max_seq_len=_max_model_len(args, checkpoint),
            attention_chunk=args.attention_chunk, chip=args.chip, cache=cache,
            output=args.output, progress=progress, kv_block_size=args.kv_block_size)
    finally:
        progress.close()
    where = f"{args.target} {args.chip}" if args.target == "cuda" else args.target
    done = "compiled" if result.source == "compiled" else "found in the cache"
    print(f"{args.checkpoint}: step kernel for {where} {done} ({result.seconds:.1f} s)")
    if result.cache_path is not None:
        print(f"  cache: {result.cache_path}")
    if args.output is not None:
        print(f"  file: {args.output}")
    return 0


def _cache(args) -> int:
    from .models.cache import KernelCache

    store = KernelCache(args.cache_dir)
    if args.action == "dir":
        print(store.directory)
    elif args.action == "list":
        entries = store.entries()
        if not entries:
            print(f"the compile cache {store.directory} is empty")
            return 0
        total = 0
        for entry in entries:
            total += entry.bytes
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.created))
            print(f"{entry.key}  {entry.bytes / 1e6:7.1f} MB  {when}  {entry.summary}")
        print(f"{len(entries)} kernels, {total / 1e6:.1f} MB in {store.directory}")
    else:
        removed = store.clear()
        print(f"removed {removed} kernels from {store.directory}")
    return 0


# ----------------------------------------------------------------------
# The parser and main
# ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="etc", description="ETC, the Event Tensor Compiler: run LLMs compiled into one "
                                "step kernel (Hugging Face checkpoint directories or GGUF "
                                "files).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="generate text from a prompt (streamed)",
                                   description="Generates text from PROMPT and streams it.")
    generate.add_argument("checkpoint", help="a checkpoint directory or GGUF file")
    generate.add_argument("prompt", help="the prompt text")
    generate.add_argument("--chat", action="store_true",
                          help="send the prompt as a user message through the chat template")
    _add_generation_options(generate, 128)
    _add_parallel_options(generate, "prints the text")
    _add_load_options(generate)
    generate.set_defaults(run=_generate)

    chat = commands.add_parser("chat", help="chat interactively (streamed, chat template)",
                               description="Reads user messages line by line from stdin and "
                                           "streams the replies. /reset starts over, /exit "
                                           "leaves.")
    chat.add_argument("checkpoint", help="a checkpoint directory or GGUF file")
    chat.add_argument("--system", default=None, help="a system message")
    _add_generation_options(chat, 512)
    _add_parallel_options(chat, "reads the messages and prints the replies")
    _add_load_options(chat)
    chat.set_defaults(run=_chat)

    serve = commands.add_parser("serve", help="serve the OpenAI API over HTTP",
                                description="Serves the model with an OpenAI-compatible API "
                                            "(/v1/models, /v1/chat/completions, "
                                            "/v1/completions, /health, /metrics).")
    serve.add_argument("checkpoint", help="a checkpoint directory or GGUF file")
    serve.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--max-num-seqs", type=_positive, default=8,
                       help="requests running at once; more wait (default: 8)")
    serve.add_argument("--served-model-name", default=None,
                       help="the model name clients use (default: the checkpoint's name)")
    _add_parallel_options(serve, "serves")
    _add_load_options(serve)
    serve.set_defaults(run=_serve)

    compile = commands.add_parser(
        "compile", help="compile a model's step kernel into the cache (no GPU needed)",
        description="Compiles the step kernel of CHECKPOINT (its config only: no weights are "
                    "read, no GPU is needed) into the compile cache, or to FILE with -o. "
                    "Loads with the same options then compile nothing.")
    compile.add_argument("checkpoint", help="a checkpoint directory or GGUF file")
    compile.add_argument("-o", "--output", default=None, metavar="FILE",
                         help="also write the kernel to FILE (load it with --kernel FILE)")
    _add_load_options(compile, compile_only=True)
    compile.set_defaults(run=_compile)

    cache = commands.add_parser("cache", help="list or clear the compile cache",
                                description="The compile cache of step kernels.")
    cache.add_argument("action", choices=("list", "clear", "dir"),
                       help="list the kernels, remove them all, or print the directory")
    cache.add_argument("--cache-dir", default=None,
                       help="the cache's directory (default: $ETC_CACHE_DIR, else "
                            "~/.cache/etc)")
    cache.set_defaults(run=_cache)
    return parser


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if isinstance(error, KeyError) and text.startswith("'") and text.endswith("'"):
        text = text[1:-1]
    return " ".join(text.split())


def _launched_rank() -> int:
    """This process's rank in the MPI job an MPI launcher started it in,
    else 0."""
    for name in RANK_VARIABLES:
        if name in os.environ:
            try:
                return int(os.environ[name])
            except ValueError:
                pass
    return 0


def _check_ranks(args) -> None:
    """Under an MPI launcher, the job must have --tensor-parallel ranks."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    if size != args.tensor_parallel:
        raise ValueError(f"--tensor-parallel {args.tensor_parallel}, but this process is one of "
                         f"{size} MPI ranks: start {args.tensor_parallel} (or run the command "
                         f"without mpiexec, and it starts them itself)")


def _start_ranks(args, argv: list) -> int:
    """Runs this command again as --tensor-parallel MPI processes (the
    `mpich` wheel's mpiexec) and returns their exit status: stdin goes to
    rank 0, the ranks' output comes here. Ctrl-C reaches the ranks through
    mpiexec (which ends them); SIGTERM to this process goes to rank 0,
    which stops the others (mpiexec would kill them) and serves no more."""
    from .runtime import distributed

    argv = list(argv)
    if not args.quiet and not args.progress and sys.stderr.isatty():
        argv.insert(1, "--progress")  # the ranks' stderr is mpiexec's pipe
    env = distributed.environment()
    if sys.stdin.isatty():
        env[INTERACTIVE_VARIABLE] = "1"
    process = subprocess.Popen(
        distributed.command(args.tensor_parallel, ["-m", "etc.cli", *argv], supervised=True),
        env=env)

    def terminate(*_) -> None:
        os.kill(_rank_zero(process.pid) or process.pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        while True:
            try:
                return process.wait()
            except KeyboardInterrupt:
                continue  # mpiexec got the Ctrl-C too and passes it on
    finally:
        signal.signal(signal.SIGTERM, previous)


def _rank_zero(root: int) -> Optional[int]:
    """The pid of rank 0's `etc` process among the descendants of `root`
    (mpiexec; Linux's /proc), or None."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                kids = [int(kid) for kid in children.read().split()]
        except OSError:
            continue
        for kid in kids:
            todo.append(kid)
            try:
                with open(f"/proc/{kid}/environ", "rb") as environ:
                    variables = environ.read().split(b"\0")
                with open(f"/proc/{kid}/cmdline", "rb") as cmdline:
                    argv = cmdline.read().split(b"\0")
            except OSError:
                continue
            if b"PMI_RANK=0" in variables and b"etc.cli" in argv and \
                    os.path.basename(argv[0]) != b"sh":
                return kid
    return None


def _broken_job(error: BaseException) -> bool:
    """Whether `error` leaves this rank's MPI job unable to finalise (a
    rank died or hangs)."""
    return type(error).__name__ in ("LostRankError", "DistributedError", "WatchdogError")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the `etc` command line with `argv` (default: sys.argv[1:])."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    parallel = getattr(args, "tensor_parallel", 1) > 1
    rank = _launched_rank() if parallel else 0
    try:
        if parallel:
            if not any(name in os.environ for name in RANK_VARIABLES):
                return _start_ranks(args, argv)
            _check_ranks(args)
        return args.run(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (etc generate ... | head): not an error.
        sys.stderr.close()
        return 0
    except Exception as error:  # every failure is one line, unless debugging
        if os.environ.get("ETC_DEBUG"):
            raise
        kind = "" if isinstance(error, (ValueError, OSError, RuntimeError, ImportError,
                                        KeyError)) else f"{type(error).__name__}: "
        where = f"rank {rank}: " if rank else ""
        print(f"etc: {where}error: {kind}{_one_line(error)}", file=sys.stderr)
        if parallel and _broken_job(error):
            _abort()
        return 1


if __name__ == "__main__":
    sys.exit(main())
