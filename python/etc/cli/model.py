"""The model a command runs: loaded from the checkpoint argument with the
load options, with progress bars, and the parts of it the commands need
(its tokenizer, the serving engine)."""

from __future__ import annotations

import sys

from .options import cache_option, dtype_option, max_model_len
from .output import Progress
from .ranks import launched_rank


def progress_bars(args) -> Progress:
    shown = not args.quiet and (args.progress or sys.stderr.isatty())
    return Progress(shown and launched_rank() == 0)


def load_model(args):
    """The model of `args.checkpoint` with the load options of `args`."""
    from ..models import Model, open_checkpoint

    checkpoint = open_checkpoint(args.checkpoint)
    progress = progress_bars(args)
    try:
        model = Model(checkpoint, target=args.target, schedule=args.schedule,
                      workers=args.workers, dtype=dtype_option(args),
                      max_seq_len=max_model_len(args, checkpoint),
                      attention_chunk=args.attention_chunk, chip=args.chip,
                      cache=cache_option(args), kernel=args.kernel, progress=progress,
                      kv_block_size=args.kv_block_size, kv_cache_tokens=args.kv_cache_tokens,
                      kv_cache_memory=args.kv_cache_memory,
                      tensor_parallel=getattr(args, "tensor_parallel", 1),
                      lanes=args.lanes, min_ctas=args.min_ctas,
                      packed=False if args.widen else None, **step_tokens(args))
    finally:
        progress.close()
    if getattr(args, "verbose", False) and model.rank == 0:
        timings = ", ".join(f"{k} {v:.2f} s" for k, v in model.timings.items())
        print(f"etc: loaded {args.checkpoint} ({model.dtype}, {model.kernel_source} step "
              f"kernel, at most {model.max_step_tokens} tokens a step; {timings})",
              file=sys.stderr)
        if model.not_loaded:
            print(f"etc: {model.not_loaded}", file=sys.stderr)
    return model


def step_tokens(args) -> dict:
    """`max_step_tokens` for the model where the command line gives it."""
    given = getattr(args, "max_step_tokens", None)
    return {} if given is None else {"max_step_tokens": given}


def tokenizer_of(model):
    if model.tokenizer is None:
        raise ValueError(f"{model.path} has no tokenizer: text needs tokenizer.json in the "
                         f"checkpoint directory, or a GGUF file with tokenizer metadata")
    return model.tokenizer


def engine_class():
    """The serving engine's `Engine` class (imported when a command needs it:
    `etc --help` stays free of NumPy)."""
    from ..models.engine import Engine

    return Engine
