"""A model's step kernel: its options checked and completed with their
defaults (`step_options`), and the kernel itself, from a saved file, the
compile cache or the compiler (`step_kernel`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple, Optional

from ...runtime.abi import check_worker_bounds
from ..loading import open_checkpoint
from ..loading.config import ModelConfig
from . import kernel_cache as _cache
from .kv_blocks import DEFAULT_BLOCK_SIZE
from .kv_cache import KV_DTYPES

__all__ = ["step_options", "step_kernel", "packed_weights", "packed_split", "widened_weights",
           "KernelNotCachedError", "MODEL_DTYPES", "resolve_dtype",
           "DEFAULT_MAX_STEP_TOKENS", "DEFAULT_ATTENTION_CHUNK", "compile_checkpoint",
           "CompileResult"]

#: The dtypes weights and activations may be computed in.
MODEL_DTYPES = ("f32", "f16", "bf16")
#: What `load(dtype=...)` takes for "the checkpoint's own dtype".
AUTO_DTYPES = (None, "auto")
#: How many new tokens one step takes at most, unless told otherwise:
#: longer prompts are prefilled over several steps (chunked prefill), which
#: bounds the activations and the attention scratch a step allocates.
DEFAULT_MAX_STEP_TOKENS = 256
#: KV positions per attention chunk task, unless told otherwise. Small
#: chunks split a long prefill's attention into many tiles that run in
#: parallel; the number of chunks follows the cache's length at run time
#: (not max_seq_len), so the scratch stays T x ceil(L / C) x heads x
#: (head_dim + 2) floats. See docs/models.md and docs/benchmarks.md.
DEFAULT_ATTENTION_CHUNK = 128


class KernelNotCachedError(RuntimeError):
    """The step kernel is not in the compile cache, and this installation
    cannot compile it (the compiler does not import)."""

    def __init__(self, name: str, target: str, store: "Optional[_cache.KernelCache]"):
        import etc

        where = (f"the compile cache {store.directory} has no kernel for it"
                 if store is not None else "the compile cache is off")
        super().__init__(
            f"load: the step kernel of {name} is not compiled: {where}, and the compiler "
            f"cannot be imported here ({etc.compiler_missing()}). Compile it where ETC's "
            f"compiler is installed, with the same options (etc compile {name} --target "
            f"{target} ...), then copy the cache directory here (or set ETC_CACHE_DIR), or "
            f"pass the file 'etc compile -o FILE' wrote as kernel=FILE")


def resolve_dtype(checkpoint, dtype: Optional[str]) -> str:
    """`load`'s `dtype` as the step kernel is built for: None (or "auto")
    is the checkpoint's own (`default_dtype()`: a safetensors
    checkpoint's weight matrices' storage, an FP8 one's unquantized
    matrices' (bf16), f32 for a quantized GGUF file; docs/models.md, "The
    compute dtype"); "f32",
    "f16" or "bf16" as given. Resolved before anything is keyed on it
    (the compile cache, `Model.dtype`), so that none of them says
    "auto"."""
    if dtype in AUTO_DTYPES:
        return checkpoint.default_dtype()
    if dtype not in MODEL_DTYPES:
        raise ValueError(f"load: dtype={dtype!r} is not supported; expected one of "
                         f"{', '.join(MODEL_DTYPES)}, or None / 'auto' for the checkpoint's "
                         f"own")
    return dtype


def step_options(config: ModelConfig, *, target: str = "cpu", schedule: str = "auto",
                 workers: Optional[int] = None, dtype: str = "f32",
                 max_seq_len: Optional[int] = None, attention_chunk: Optional[int] = None,
                 chip: str = "sm_90a", kernels: str = "native",
                 kv_dtype: Optional[str] = None,
                 kv_block_size: Optional[int] = DEFAULT_BLOCK_SIZE,
                 weight_formats: Optional[dict] = None,
                 lanes: Optional[int] = None, min_ctas: Optional[int] = None) -> tuple[dict, dict]:
    """`load`'s options checked and completed with their defaults: the
    options of `build_step_graph` (dtype, max_seq_len, chunk, kv_dtype,
    kv_block_size, weight_formats: the packed weights, `packed_weights`)
    and of `etc.compile` (target, schedule, workers, chip, kernels, and
    lanes and min_ctas where given: CUDA kernels only, `etc.compile`'s
    rules). With the config they are all the step kernel's code depends
    on. The KV
    caches' dtype is by default the compute dtype (a bf16 model
    keeps bf16 keys and values: half the memory and half the attention's
    bytes of float32)."""
    if dtype not in MODEL_DTYPES:
        raise ValueError(f"load: dtype={dtype!r} is not supported; expected one of "
                         f"{MODEL_DTYPES}")
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"load: kv_dtype={kv_dtype!r} is not supported; expected one of "
                         f"{KV_DTYPES}")
    if target not in ("cpu", "cuda"):
        raise ValueError(f"load: target={target!r} is not supported; expected 'cpu' or 'cuda'")
    if max_seq_len is None:
        max_seq_len = config.max_position_embeddings
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"load: max_seq_len={max_seq_len!r} must be a positive int")
    if attention_chunk is None:
        attention_chunk = DEFAULT_ATTENTION_CHUNK
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int) or \
            attention_chunk < 1:
        raise ValueError(f"load: attention_chunk={attention_chunk!r} must be a positive int")
    if workers is None:
        # On CUDA the runtime sizes the grid from the device; the option
        # only records the intent.
        workers = _usable_cores() if target == "cpu" else 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"load: workers={workers!r} must be a positive int")
    if kv_block_size is not None and (isinstance(kv_block_size, bool) or
                                      not isinstance(kv_block_size, int) or kv_block_size < 1):
        raise ValueError(f"load: kv_block_size={kv_block_size!r} must be a positive int (the "
                         f"positions of a KV cache block), or None for a contiguous cache")
    try:
        check_worker_bounds(lanes, min_ctas, cuda_kernels="cuda" in (target, kernels))
    except ValueError as error:
        raise ValueError(f"load: {error}") from None
    graph = dict(dtype=dtype, max_seq_len=max_seq_len, chunk=attention_chunk, kv_dtype=kv_dtype,
                 kv_block_size=kv_block_size)
    if weight_formats:
        # Only packed models name it: other kernels keep their cache keys.
        graph["weight_formats"] = dict(sorted(weight_formats.items()))
    options = dict(target=target, schedule=schedule, workers=workers, chip=chip, kernels=kernels)
    # The worker's bounds, where given (`etc.compile`'s defaults otherwise;
    # the cache key records the CUDA kernels' lanes either way).
    for name, value in (("lanes", lanes), ("min_ctas", min_ctas)):
        if value is not None:
            options[name] = value
    return graph, options


def packed_weights(checkpoint, packed: Optional[bool], *, target: str = "cpu",
                   kernels: str = "native", tensor_parallel: int = 1) -> dict:
    """The weights of `checkpoint` that stay packed (name -> format of
    `etc.packed`; `build_step_graph`'s weight_formats): every weight a GGUF
    file stores in a block format, or an FP8 checkpoint in e4m3
    (`Checkpoint.weight_formats`), that the step reads by rows, or none
    (all widened to the compute dtype, the reference). `packed` None (the
    default) packs them on the CPU target with its native kernels; True
    packs them on CUDA and with simulated GPU kernels too (their GPU
    kernels are checked under the lane simulation and by ptxas, not yet
    run on a GPU); False never.

    With `tensor_parallel` N > 1 each rank keeps its share of the blocks
    (`etc.models.step.parallel`): the column-parallel weights' rows, and
    the row-parallel ones' (output and down projections, down experts)
    columns in whole blocks. A row-parallel weight whose K / N is not
    whole blocks of its format (`parallel.unaligned_packed`) is widened on
    every rank with packed=None (`widened_weights` says why), and is a
    ValueError naming it, its format's block and N with packed=True."""
    return packed_split(checkpoint, packed, target=target, kernels=kernels,
                        tensor_parallel=tensor_parallel)[0]


def packed_split(checkpoint, packed: Optional[bool], *, target: str = "cpu",
                 kernels: str = "native", tensor_parallel: int = 1) -> tuple[dict, dict]:
    """`packed_weights`, and the packed weights of the checkpoint that the
    split over `tensor_parallel` ranks widens on every rank, name -> why
    (`widened_weights`), from one look at the checkpoint's formats."""
    if packed not in (None, True, False):
        raise ValueError(f"load: packed={packed!r} must be True, False or None")
    default = target == "cpu" and kernels == "native"
    if packed is False or (packed is None and not default) or \
            not hasattr(checkpoint, "weight_formats"):
        return {}, {}
    formats = checkpoint.weight_formats()
    widened = widened_weights(checkpoint, formats, tensor_parallel)
    if packed and widened:
        raise ValueError(f"load: packed=True, tensor_parallel={tensor_parallel}: "
                         f"{next(iter(widened.values()))}; load with packed=None to widen such "
                         f"weights on every rank (or packed=False to widen all)")
    return {name: fmt for name, fmt in formats.items() if name not in widened}, widened


def widened_weights(checkpoint, formats: dict, tensor_parallel: int) -> dict:
    """The weights of `formats` (`checkpoint.weight_formats()`) that a
    split over `tensor_parallel` ranks widens, name -> why (see
    `packed_weights`); {} on one rank."""
    if tensor_parallel == 1 or not formats:
        return {}
    from .parallel import shard_config, unaligned_packed

    shard_config(checkpoint.config, tensor_parallel)  # the fields' errors first
    return unaligned_packed(checkpoint.config, formats, tensor_parallel)


def step_kernel(config: ModelConfig, graph_options: dict, compile_options: dict, *,
                cache=None, kernel=None, progress=None, name="the model"):
    """The step kernel of `config` with `step_options`' options, and where
    it came from ("file", "cache" or "compiled") and how long that took:
    the artifact file `kernel` (checked against the options), else the
    compile cache `cache` (as `load` takes it), else compiled (and then
    cached). Only compiling imports the compiler."""
    from ...runtime import load as load_artifact

    workers = compile_options["workers"] if compile_options["target"] == "cpu" else None
    description = _cache.describe(config, graph_options, compile_options)
    start = time.perf_counter()
    if kernel is not None:
        loaded = load_artifact(kernel, workers=workers)
        found = loaded.metadata.get(_cache.METADATA_KEY)
        if found is None:
            raise ValueError(f"load: kernel={str(kernel)!r} is not a model's step kernel (its "
                             f"artifact records no model description); write one with "
                             f"'etc compile CHECKPOINT -o FILE'")
        differ = _cache.differences(found, description)
        if differ:
            raise ValueError(f"load: kernel={str(kernel)!r} was compiled for another model or "
                             f"other options: " + "; ".join(differ))
        return loaded, "file", time.perf_counter() - start
    if cache is None:
        cache = _cache.enabled_by_default()
    store = None
    if cache is not False:
        store = _cache.KernelCache(None if cache is True else cache)
        key = _cache.key_of(description)
        if progress is not None:
            progress("cache", 0, 1)
        found = store.get(key, workers=workers)
        if found is not None:
            if progress is not None:
                progress("cache", 1, 1)
            return found, "cache", time.perf_counter() - start
    import etc

    if etc.compiler_missing() is not None:
        raise KernelNotCachedError(name, compile_options["target"], store)
    if store is None:
        return _compiled(config, graph_options, compile_options, progress, start)
    # Another process may be compiling the same kernel (the other ranks of
    # a tensor-parallel model): wait for it, then load what it saved.
    with store.compiling(key):
        found = store.get(key, workers=workers)
        if found is not None:
            if progress is not None:
                progress("cache", 1, 1)
            return found, "cache", time.perf_counter() - start
        compiled = _compiled(config, graph_options, compile_options, progress, start)
        store.put(key, compiled[0], description)
    return compiled


def _compiled(config, graph_options, compile_options, progress, start):
    # The compiler, imported only now: everything before runs without MLIR.
    from ...compiler import compile as _compile
    from .graph import build_step_graph

    if progress is not None:
        progress("compile", 0, 1)
    compiled = _compile(build_step_graph(config, **graph_options), **compile_options)
    if progress is not None:
        progress("compile", 1, 1)
    return compiled, "compiled", time.perf_counter() - start


def _usable_cores() -> int:
    """The cores this process may run on (`etc.compile`'s default too)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def compile_checkpoint(path, target: str = "cpu", schedule: str = "auto",
                       workers: Optional[int] = None, *, dtype: Optional[str] = None,
                       max_seq_len: Optional[int] = None, attention_chunk: Optional[int] = None,
                       chip: str = "sm_90a", kernels: str = "native", cache=None, output=None,
                       progress=None, kv_dtype: Optional[str] = None,
                       kv_block_size: Optional[int] = DEFAULT_BLOCK_SIZE,
                       packed: Optional[bool] = None, lanes: Optional[int] = None,
                       min_ctas: Optional[int] = None):
    """Compiles the step kernel of the checkpoint at `path` with `load`'s
    options, without reading its weights or needing a GPU: into the compile
    cache (`cache` as `load` takes it), and to the artifact file `output`
    when given (what `load(..., kernel=output)` takes). A kernel already in
    the cache is not compiled again. Returns a `CompileResult`: the kernel,
    its source ("cache" or "compiled"), the seconds that took, and the
    cache file (None when the cache is off or could not be written).
    `dtype` None (or "auto"): the checkpoint's own, as `load` takes it
    (`resolve_dtype`; its tensors' headers say it, no weight is read)."""
    checkpoint = open_checkpoint(path)
    graph_options, compile_options = step_options(
        checkpoint.config, target=target, schedule=schedule, workers=workers,
        dtype=resolve_dtype(checkpoint, dtype),
        max_seq_len=max_seq_len, attention_chunk=attention_chunk, chip=chip, kernels=kernels,
        kv_dtype=kv_dtype, kv_block_size=kv_block_size,
        weight_formats=packed_weights(checkpoint, packed, target=target, kernels=kernels),
        lanes=lanes, min_ctas=min_ctas)
    kernel, source, seconds = step_kernel(checkpoint.config, graph_options, compile_options,
                                          cache=cache, progress=progress, name=str(path))
    description = _cache.describe(checkpoint.config, graph_options, compile_options)
    if output is not None:
        kernel.save(output, metadata={_cache.METADATA_KEY: description})
    if cache is None:
        cache = _cache.enabled_by_default()
    cache_path = None
    if cache is not False:
        cache_path = _cache.KernelCache(None if cache is True else cache).path(
            _cache.key_of(description))
        if not cache_path.is_file():
            cache_path = None
    return CompileResult(kernel, source, seconds, cache_path)


class CompileResult(NamedTuple):
    """What `compile_checkpoint` did."""

    kernel: object
    source: str
    seconds: float
    cache_path: Optional[Path]
