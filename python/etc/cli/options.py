"""The command line's options: the argument types (positive ints, seconds,
byte sizes), the option groups the commands share (loading and compiling,
generation and sampling, tensor parallelism, progress), and what their
values mean for `etc.models` (the compile cache, the model length, the
sampling parameters). Nothing here imports NumPy: `etc --help` stays fast."""

from __future__ import annotations

import argparse
import os
import re
from typing import Optional


#: `--max-model-len` when not given: the model's context length, at most
#: this (a CPU holds the KV cache in memory: 28 layers of Qwen3-0.6B take
#: 229 KB per position and sequence).
DEFAULT_MAX_MODEL_LEN = 4096


#: `--kv-block-size` when not given (`etc.models.step.kv_blocks.DEFAULT_BLOCK_SIZE`;
#: not imported, so that --help needs no NumPy).
DEFAULT_BLOCK_SIZE = 16


#: `--attention-chunk` when not given
#: (`etc.models.step.kernel.DEFAULT_ATTENTION_CHUNK`, not imported either).
DEFAULT_ATTENTION_CHUNK = 128


#: `--max-step-tokens` when not given
#: (`etc.models.step.kernel.DEFAULT_MAX_STEP_TOKENS`, not imported either).
DEFAULT_MAX_STEP_TOKENS = 256


#: `--rank-timeout` when not given (`etc.models.engine.lockstep.TIMEOUT_SECONDS`).
DEFAULT_RANK_TIMEOUT = 10.0


def add_load_options(parser: argparse.ArgumentParser, *, compile_only: bool = False) -> None:
    group = parser.add_argument_group("model and compile options")
    group.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                       help="where the step kernel runs (default: cpu)")
    group.add_argument("--chip", default="sm_90a",
                       help="the GPU architecture of --target cuda (sm_90a, sm_80; default: "
                            "sm_90a)")
    group.add_argument("--dtype", choices=("auto", "f32", "f16", "bf16"), default="auto",
                       help="the weights' and activations' dtype (default: auto, the "
                            "checkpoint's own: a bf16 checkpoint's is bf16; f32 for a GGUF "
                            "file with quantized weights)")
    group.add_argument("--widen", action="store_true",
                       help="widen a GGUF file's quantized weights (or an FP8 checkpoint's) "
                            "to --dtype (the reference) instead of running them packed "
                            "(default on the CPU)")
    group.add_argument("--workers", type=positive_int, default=None,
                       help="CPU worker threads (default: one per core)")
    group.add_argument("--schedule", choices=("auto", "static", "dynamic"), default="auto",
                       help="the step kernel's schedule (default: auto)")
    group.add_argument("--max-model-len", type=positive_int, default=None,
                       help=f"the longest sequence, prompt plus new tokens (default: the "
                            f"model's context length, at most {DEFAULT_MAX_MODEL_LEN})")
    group.add_argument("--attention-chunk", type=positive_int, default=None,
                       help=f"KV positions per attention task (default: "
                            f"{DEFAULT_ATTENTION_CHUNK})")
    group.add_argument("--kv-block-size", type=block_size_or_none, default=DEFAULT_BLOCK_SIZE,
                       metavar="P",
                       help=f"positions per block of the paged KV cache, or 'none' for a "
                            f"contiguous slot per sequence (default: {DEFAULT_BLOCK_SIZE})")
    group.add_argument("--lanes", type=positive_int, default=None, metavar="N",
                       help="--target cuda: threads per worker CTA of the step kernel, a "
                            "multiple of 32 up to 1024 (default: 128, one warpgroup)")
    group.add_argument("--min-ctas", type=positive_int, default=None, metavar="N",
                       help="--target cuda: worker CTAs per SM the step kernel is compiled "
                            "for (.minnctapersm): ptxas then gives a thread at most 65536 / "
                            "(lanes x N) registers (default: no such bound)")
    parser.set_defaults(check_load_options=lambda args: check_worker_options(parser, args))
    if not compile_only:
        group.add_argument("--max-step-tokens", type=positive_int, default=None, metavar="N",
                           help=f"tokens one step of the model takes at most, over all "
                                f"requests; a longer prompt is prefilled in several steps "
                                f"(default: {DEFAULT_MAX_STEP_TOKENS})")
        sizes = group.add_mutually_exclusive_group()
        sizes.add_argument("--kv-cache-tokens", type=positive_int, default=None, metavar="N",
                           help="positions the paged KV cache holds, over all requests "
                                "(default: max-num-seqs x max-model-len); a request's prompt "
                                "and new tokens are at most this many")
        sizes.add_argument("--kv-cache-memory", type=byte_size, default=None, metavar="BYTES",
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
    add_progress_options(parser)


def add_parallel_options(parser: argparse.ArgumentParser, role: str) -> None:
    group = parser.add_argument_group("tensor parallelism")
    group.add_argument("--tensor-parallel", type=positive_int, default=1, metavar="N",
                       help=f"split the model over N ranks (MPI processes), Megatron-style; "
                            f"etc starts them itself, or run it under 'mpiexec -n N' (or "
                            f"'python -m etc.runtime.distributed -n N'); rank 0 {role}, the "
                            f"others run its steps (default: 1)")
    group.add_argument("--rank-timeout", type=positive_seconds, default=DEFAULT_RANK_TIMEOUT,
                       metavar="SECONDS",
                       help=f"with --tensor-parallel: a rank that sends no heartbeat for this "
                            f"long counts as hung, and every rank stops with an error naming "
                            f"it (a dead rank on this machine is found at once; default: "
                            f"{DEFAULT_RANK_TIMEOUT:g})")


def add_progress_options(parser: argparse.ArgumentParser) -> None:
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--quiet", "-q", action="store_true",
                       help="no progress bars")
    shown.add_argument("--progress", action="store_true",
                       help="progress bars even when stderr is not a terminal")


def add_generation_options(parser: argparse.ArgumentParser, default_new: int) -> None:
    group = parser.add_argument_group("generation options")
    group.add_argument("--max-new-tokens", type=positive_int, default=default_new,
                       help=f"new tokens at most (default: {default_new})")
    group.add_argument("--temperature", type=float, default=None,
                       help="sampling temperature (default: 0, greedy; 1 when --top-k, "
                            "--top-p, --min-p or --seed is given)")
    group.add_argument("--top-k", type=int, default=None,
                       help="sample from the k most likely tokens (0 or -1: all)")
    group.add_argument("--top-p", type=float, default=None,
                       help="sample from the most likely tokens whose probability reaches "
                            "top-p")
    group.add_argument("--min-p", type=float, default=None,
                       help="sample without the tokens below min-p times the most likely "
                            "one")
    group.add_argument("--seed", type=int, default=None,
                       help="seed of the sampler (the same tokens every run)")
    group.add_argument("--stop", action="append", default=[],
                       help="a stop string (repeatable); the text stops before it")
    group.add_argument("--verbose", "-v", action="store_true",
                       help="say on stderr how the model loaded and how fast it generated")


def add_speculative_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("speculative decoding")
    group.add_argument("--speculative", choices=("ngram",), default=None,
                       help="verify proposed tokens in each step: ngram proposes what followed "
                            "the latest earlier occurrence of the text's last few tokens "
                            "(prompt lookup); greedy output is the same, sampled output "
                            "follows the same distribution")
    group.add_argument("--draft-model", default=None, metavar="PATH",
                       help="verify the greedy tokens of this smaller model (a checkpoint "
                            "directory or GGUF file with the same tokenizer, loaded with the "
                            "same options) in each step instead")
    group.add_argument("--speculative-tokens", type=positive_int, default=None, metavar="K",
                       help="tokens proposed per request and step at most (default: 8 "
                            "with ngram, 4 with a draft model)")
    group.add_argument("--speculative-ngram", type=positive_int, nargs=2, default=None,
                       metavar=("MIN", "MAX"),
                       help="lengths of the suffix ngram looks up, longest first (default: "
                            "2 4)")


#: What --reasoning-parser takes (`etc.models.reasoning.CHOICES`; not
#: imported, so that --help needs no NumPy).
REASONING_CHOICES = ("auto", "none", "qwen3", "seed_oss", "harmony")


def add_reasoning_option(parser: argparse.ArgumentParser, where: str) -> None:
    """--reasoning-parser: how a chat answer's reasoning is told from its
    content (`etc.models.reasoning`); `where` says where the reasoning
    goes."""
    parser.add_argument("--reasoning-parser", choices=REASONING_CHOICES,
                        default="auto",
                        help=f"split a chat answer's reasoning ({where}) from its content: "
                             f"qwen3 (<think>...</think>), seed_oss (<seed:think>..."
                             f"</seed:think>), harmony (gpt-oss's channels), none; "
                             f"default auto: harmony where the tokenizer has <|channel|> and "
                             f"<|message|> (or the model is gpt-oss), seed_oss where it has "
                             f"</seed:think>, qwen3 where it has </think>")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def block_size_or_none(text: str) -> Optional[int]:
    if text.lower() == "none":
        return None
    return positive_int(text)


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def byte_size(text: str) -> int:
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


def dtype_option(args):
    """`--dtype` as `etc.models.load` takes it: None for auto."""
    return None if args.dtype == "auto" else args.dtype


def cache_option(args):
    if args.no_cache:
        return False
    return args.cache_dir if args.cache_dir else True


def max_model_len(args, checkpoint) -> int:
    if args.max_model_len is not None:
        return args.max_model_len
    return min(DEFAULT_MAX_MODEL_LEN, checkpoint.config.max_position_embeddings)


def check_worker_options(parser: argparse.ArgumentParser, args) -> None:
    """--lanes and --min-ctas: --target cuda only, with the values
    `etc.compile` takes (`etc.runtime.abi.check_worker_bounds`); a usage
    error of `parser` naming the option otherwise."""
    given = [f"--{name.replace('_', '-')} {value}" for name, value in
             (("lanes", args.lanes), ("min_ctas", args.min_ctas)) if value is not None]
    if not given:
        return
    if args.target != "cuda":
        parser.error(f"{given[0]} applies to --target cuda (the step kernel's worker CTAs "
                     f"on the GPU); --target {args.target} runs its workers as CPU threads")
    from ..runtime.abi import check_worker_bounds

    try:
        check_worker_bounds(args.lanes, args.min_ctas, cuda_kernels=True)
    except ValueError as error:
        # etc.compile's names, as the options are spelt.
        message = str(error).replace("lanes=", "--lanes ").replace("min_ctas=", "--min-ctas ")
        parser.error(message)


def speculative(args):
    """The speculative decoding options of `args` as an
    `etc.models.Speculative`, or None."""
    tokens, ngram, draft = args.speculative_tokens, args.speculative_ngram, args.draft_model
    if draft is not None:
        if args.speculative is not None or ngram is not None:
            raise ValueError("--draft-model proposes the tokens: give it or --speculative ngram "
                             "(and --speculative-ngram), not both")
        if not os.path.exists(draft):
            raise ValueError(f"--draft-model {draft}: no such file or directory")
    elif args.speculative is None:
        given = [name for name, value in (("--speculative-tokens", tokens),
                                          ("--speculative-ngram", ngram)) if value is not None]
        if given:
            raise ValueError(f"{given[0]} sets how requests speculate; give --speculative "
                             f"ngram or --draft-model too")
        return None
    from ..models import Speculative

    # tokens=None: Speculative's default for the method (8 for ngram, 4 for a draft).
    options = dict(method=args.speculative) if draft is None else dict(draft=draft)
    options["tokens"] = tokens
    if ngram is not None:
        if ngram[0] > ngram[1]:
            raise ValueError(f"--speculative-ngram {ngram[0]} {ngram[1]}: MIN must not be more "
                             f"than MAX")
        options["ngram"] = tuple(ngram)
    return Speculative(**options)


def sampling_params(args):
    """The sampling options of `args` as `SamplingParams`, or None (greedy).
    --top-k, --top-p, --min-p and --seed sample, at temperature 1 unless
    --temperature says otherwise; with --temperature 0 (greedy) they would
    do nothing, and are refused (ValueError)."""
    options = {name: getattr(args, name) for name in ("temperature", "top_k", "top_p", "min_p",
                                                       "seed")
               if getattr(args, name, None) is not None}
    if not options:
        return None
    if options.get("temperature") == 0 and len(options) > 1:
        given = ", ".join(f"--{name.replace('_', '-')}" for name in options
                          if name != "temperature")
        raise ValueError(f"{given} do{'es' * (len(options) == 2)} nothing with --temperature 0 "
                         f"(greedy: the most likely token every time); leave out "
                         f"--temperature to sample at 1, or give another temperature")
    options.setdefault("temperature", 1.0)
    from ..models.step.sampling import SamplingParams

    try:
        return SamplingParams(**options)
    except ValueError as error:
        # SamplingParams' names, as the options are spelt.
        message = str(error).removeprefix("SamplingParams: ")
        for name in options:
            message = message.replace(f"{name}=", f"--{name.replace('_', '-')} ")
        raise ValueError(message) from None
