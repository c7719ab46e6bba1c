"""`etc serve`: the OpenAI-compatible HTTP server (`etc.serve`) over the
model's engine."""

from __future__ import annotations

import signal
import sys

from .model import engine_class, load_model
from .options import speculative
from .ranks import launched_rank, led


def run_serve(args) -> int:
    engine_class()
    from .. import serve

    # The address is taken before the model loads (minutes, for a large
    # one): a port in use or out of range is an error at once. Rank 0
    # serves; with --tensor-parallel the other ranks only follow.
    speculation = speculative(args)  # its errors before the address is taken
    sock = serve.listen(args.host, args.port) if launched_rank() == 0 else None
    if sock is not None:
        # The address as bound: with --port 0 the system picked the port,
        # and this line is how a caller (a test, a supervisor) learns it.
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"etc: listening on http://{shown}:{port}", file=sys.stderr, flush=True)
    # SIGTERM stops the server as Ctrl-C does: the requests in flight end,
    # and the command exits with status 0 (uvicorn raises it again once it
    # has shut down: as KeyboardInterrupt, which the server takes).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        model = load_model(args)

        def body(model) -> int:
            # With --tensor-parallel, rank 0 serves and the other ranks run
            # each of its steps (docs/distributed.md). Sequences are as long
            # as the model's length (--max-model-len) and the KV cache allow
            # (a warning when --max-model-len asked for more than it holds).
            serve.run(model, args.host, args.port, served_model_name=args.served_model_name,
                      max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                      speculative=speculation, sock=sock,
                      tool_call_parser=args.tool_call_parser,
                      reasoning_parser=args.reasoning_parser)
            return 0

        return led(model, args, body)
    finally:
        if sock is not None:
            sock.close()
