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
option, a kernel missing from the cache on a machine without the compiler,
a port out of range or in use: checked before the model loads) print one
line, `etc: error: ...`, and exit with status 1; usage errors exit with 2
(argparse). `ETC_DEBUG=1` shows the traceback instead. Ctrl-C exits with
130, but `etc serve` stops at Ctrl-C or SIGTERM: it ends the requests in
flight (their streams with an error event and `[DONE]`) and exits with 0.

`--tensor-parallel N` (generate, chat, serve) splits the model over N MPI
ranks (docs/distributed.md). Run plainly, the command starts the N ranks
itself (the `mpich` wheel's mpiexec, running this command again); run under
`mpiexec -n N` or `python -m etc.runtime.distributed -n N`, each process is
one rank. Either way rank 0 reads the input and writes the output, and the
others run its steps (`etc.models.lockstep`).

The package: `options` (argument types and shared option groups), `output`
(progress bars, one-line errors), `ranks` (tensor-parallel ranks), `model`
(the model a command loads), and one module per kind of command: `text`
(generate, chat), `serving` (serve), `kernels` (compile, cache).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from .kernels import run_cache, run_compile
from .options import (add_generation_options, add_load_options, add_parallel_options,
                      add_reasoning_option, add_speculative_options, positive_int)
from .output import one_line
from .ranks import (RANK_VARIABLES, abort, broken_job, check_ranks, launched_rank,
                    start_ranks)
from .serving import run_serve
from .text import run_chat, run_generate

__all__ = ["main"]


def parser() -> argparse.ArgumentParser:
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
    add_reasoning_option(generate, "with --chat: printed on stderr, the content on stdout")
    add_generation_options(generate, 128)
    add_speculative_options(generate)
    add_parallel_options(generate, "prints the text")
    add_load_options(generate)
    generate.set_defaults(run=run_generate)

    chat = commands.add_parser("chat", help="chat interactively (streamed, chat template)",
                               description="Reads user messages line by line from stdin and "
                                           "streams the replies. /reset starts over, /exit "
                                           "leaves.")
    chat.add_argument("checkpoint", help="a checkpoint directory or GGUF file")
    chat.add_argument("--system", default=None, help="a system message")
    add_reasoning_option(chat, "printed on stderr and left out of the conversation, the "
                               "content on stdout")
    add_generation_options(chat, 512)
    add_speculative_options(chat)
    add_parallel_options(chat, "reads the messages and prints the replies")
    add_load_options(chat)
    chat.set_defaults(run=run_chat)

    serve = commands.add_parser("serve", help="serve the OpenAI API over HTTP",
                                description="Serves the model with an OpenAI-compatible API "
                                            "(/v1/models, /v1/chat/completions, "
                                            "/v1/completions, /health, /metrics). Requests "
                                            "are at most --max-model-len tokens, and at most "
                                            "what the KV cache holds. Ctrl-C or SIGTERM ends "
                                            "the requests in flight and stops.")
    serve.add_argument("checkpoint", help="a checkpoint directory or GGUF file")
    serve.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000,
                       help="port (default: 8000; 0: one the system picks)")
    serve.add_argument("--max-num-seqs", type=positive_int, default=8,
                       help="requests running at once; more wait (default: 8)")
    serve.add_argument("--served-model-name", default=None,
                       help="the model name clients use (default: the checkpoint's name)")
    serve.add_argument("--tool-call-parser", choices=("hermes", "llama3_json"), default=None,
                       help="how the model writes tool calls (default: from its chat "
                            "template: <tool_call> is hermes, ipython llama3_json; with "
                            "--reasoning-parser harmony the calls are its channels, "
                            "and giving this is an error)")
    add_reasoning_option(serve, "message.reasoning_content")
    add_speculative_options(serve)
    add_parallel_options(serve, "serves")
    add_load_options(serve)
    serve.set_defaults(run=run_serve)

    compile = commands.add_parser(
        "compile", help="compile a model's step kernel into the cache (no GPU needed)",
        description="Compiles the step kernel of CHECKPOINT (its config only: no weights are "
                    "read, no GPU is needed) into the compile cache, or to FILE with -o. "
                    "Loads with the same options then compile nothing.")
    compile.add_argument("checkpoint", help="a checkpoint directory or GGUF file")
    compile.add_argument("-o", "--output", default=None, metavar="FILE",
                         help="also write the kernel to FILE (load it with --kernel FILE)")
    add_load_options(compile, compile_only=True)
    compile.set_defaults(run=run_compile)

    cache = commands.add_parser("cache", help="list or clear the compile cache",
                                description="The compile cache of step kernels.")
    cache.add_argument("action", choices=("list", "clear", "dir"),
                       help="list the kernels, remove them all, or print the directory")
    cache.add_argument("--cache-dir", default=None,
                       help="the cache's directory (default: $ETC_CACHE_DIR, else "
                            "~/.cache/etc)")
    cache.set_defaults(run=run_cache)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the `etc` command line with `argv` (default: sys.argv[1:])."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if hasattr(args, "check_load_options"):  # usage errors argparse cannot see alone
        args.check_load_options(args)
    parallel = getattr(args, "tensor_parallel", 1) > 1
    rank = launched_rank() if parallel else 0
    try:
        if parallel:
            if not any(name in os.environ for name in RANK_VARIABLES):
                return start_ranks(args, argv)
            check_ranks(args)
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
        print(f"etc: {where}error: {kind}{one_line(error)}", file=sys.stderr)
        if parallel and broken_job(error):
            abort()
        return 1
