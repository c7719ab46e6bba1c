"""`etc serve`: the OpenAI-compatible HTTP server (`etc.serve`) over the
model's engine."""

from __future__ import annotations

from .model import engine_class, load_model
from .ranks import led


def run_serve(args) -> int:
    engine_class()
    from .. import serve

    model = load_model(args)

    def body(model) -> int:
        # With --tensor-parallel, rank 0 serves and the other ranks run
        # each of its steps (docs/distributed.md).
        serve.run(model, args.host, args.port, served_model_name=args.served_model_name,
                  max_num_seqs=args.max_num_seqs, max_model_len=model.max_seq_len)
        return 0

    return led(model, args, body)
