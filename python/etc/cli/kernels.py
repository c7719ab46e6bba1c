"""`etc compile` and `etc cache`: step kernels compiled into the compile
cache (or a file) without a GPU or the weights, and the cache listed or
cleared."""

from __future__ import annotations

import time

from .model import progress_bars
from .options import cache_option, dtype_option, max_model_len


def run_compile(args) -> int:
    from ..models import compile_checkpoint, open_checkpoint
    from ..models.step.kernel import resolve_dtype

    cache = cache_option(args)
    if cache is False and args.output is None:
        raise ValueError("--no-cache without -o FILE: the compiled kernel would go nowhere")
    checkpoint = open_checkpoint(args.checkpoint)
    dtype = resolve_dtype(checkpoint, dtype_option(args))
    progress = progress_bars(args)
    try:
        result = compile_checkpoint(
            args.checkpoint, target=args.target, schedule=args.schedule, workers=args.workers,
            dtype=dtype, max_seq_len=max_model_len(args, checkpoint),
            attention_chunk=args.attention_chunk, chip=args.chip, cache=cache,
            output=args.output, progress=progress, kv_block_size=args.kv_block_size,
            packed=False if args.widen else None, lanes=args.lanes, min_ctas=args.min_ctas)
    finally:
        progress.close()
    where = f"{args.target} {args.chip}" if args.target == "cuda" else args.target
    bounds = [f"{name} {value}" for name, value in (("lanes", args.lanes),
                                                    ("min-ctas", args.min_ctas)) if value]
    where += f" ({', '.join(bounds)})" if bounds else ""
    done = "compiled" if result.source == "compiled" else "found in the cache"
    print(f"{args.checkpoint}: {dtype} step kernel for {where} {done} "
          f"({result.seconds:.1f} s)")
    if result.cache_path is not None:
        print(f"  cache: {result.cache_path}")
    if args.output is not None:
        print(f"  file: {args.output}")
    return 0


def run_cache(args) -> int:
    from ..models.step.kernel_cache import KernelCache

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
