"""A model compiled into one step kernel: its weights (on the device for
CUDA), its KV caches, and `step`, one kernel run over a ragged batch of
requests (prefill, decode or both). The engine drives it; `etc.models.Model`
(generation) adds `generate` on top."""

from __future__ import annotations

import collections
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ... import packed
from ..loading import mla_layout
from ..loading.checkpoint import STORAGE, Checkpoint
from . import kernel_cache as _cache
from .kernel import (DEFAULT_MAX_STEP_TOKENS, packed_split, resolve_dtype, step_kernel,
                     step_options)
from .kv_blocks import DEFAULT_BLOCK_SIZE
from .kv_cache import KV_STORAGE, KVCache, PagedKVCache, layer_tables
from .request import Request
from .sampling import (MAX_LOGPROBS, adjustment_inputs, fresh_seeds, mask_inputs,
                       sampling_inputs)

if TYPE_CHECKING:
    from ...compiler import CompiledKernel

__all__ = ["CompiledModel"]


class CompiledModel:
    """A decoder-only model compiled into one step kernel: its weights, KV
    caches and `step` (the engine drives it; `etc.models.Model` adds
    `generate`)."""

    def __init__(self, checkpoint, *, target: str = "cpu", schedule: str = "auto",
                 workers: Optional[int] = None, dtype: Optional[str] = None,
                 max_seq_len: Optional[int] = None, attention_chunk: Optional[int] = None,
                 max_step_tokens: int = DEFAULT_MAX_STEP_TOKENS, chip: str = "sm_90a",
                 kernels: str = "native", cache=None, kernel=None,
                 progress: Optional[Callable[[str, int, int], None]] = None,
                 tensor_parallel: int = 1, kv_dtype: Optional[str] = None,
                 kv_block_size: Optional[int] = DEFAULT_BLOCK_SIZE,
                 kv_cache_tokens: Optional[int] = None, kv_cache_memory: Optional[int] = None,
                 packed: Optional[bool] = None, lanes: Optional[int] = None,
                 min_ctas: Optional[int] = None):
        from .parallel import padded_blocks, shard_config, shard_weight

        config = checkpoint.config
        # None or "auto": the checkpoint's own (a bf16 checkpoint computes
        # in bf16), resolved before the cache key and everything else.
        dtype = resolve_dtype(checkpoint, dtype)
        #: The ranks the model is split over (Megatron-style) and this
        #: process's rank; `_shard` is its share of the heads and columns.
        self.tensor_parallel = tensor_parallel
        #: Whether rank 0's `etc.models.engine.lockstep.Leader` runs the steps of
        #: every rank (serving), rather than every rank its own.
        self.led = False
        shard_config(config, tensor_parallel)  # the fields' errors first
        self.rank = 0
        if tensor_parallel > 1:
            from mpi4py import MPI

            self.rank = MPI.COMM_WORLD.Get_rank()
        #: What the step graph is built from (`build_step_graph`'s options)
        #: and compiled with (`etc.compile`'s): with the config, the key of
        #: the compile cache.
        #: The weights that stay packed (name -> format of `etc.packed`).
        #: And the packed weights of the checkpoint that this split widens
        #: on every rank, name -> why (`kernel.widened_weights`).
        self.weight_formats, self.widened_weights = packed_split(
            checkpoint, packed, target=target, kernels=kernels, tensor_parallel=tensor_parallel)
        #: The MLP widths split in whole blocks of their packed down
        #: projections, each rank's share padded with zero columns
        #: (`parallel.padded_blocks`: field -> block); {} when none is.
        self.padded_widths = padded_blocks(config, self.weight_formats, tensor_parallel)
        self._shard = shard_config(config, tensor_parallel, self.padded_widths)
        if self.widened_weights:
            warnings.warn(f"load: tensor_parallel={tensor_parallel} widens on every rank: "
                          + "; ".join(self.widened_weights.values()), RuntimeWarning,
                          stacklevel=3)
        self.graph_options, self.compile_options = step_options(
            config, target=target, schedule=schedule, workers=workers, dtype=dtype,
            max_seq_len=max_seq_len, attention_chunk=attention_chunk, chip=chip,
            kernels=kernels, kv_dtype=kv_dtype, kv_block_size=kv_block_size,
            weight_formats=self.weight_formats, lanes=lanes, min_ctas=min_ctas)
        if tensor_parallel > 1:
            self.graph_options["ranks"] = tensor_parallel
        if isinstance(max_step_tokens, bool) or not isinstance(max_step_tokens, int) or \
                max_step_tokens < 1:
            raise ValueError(f"load: max_step_tokens={max_step_tokens!r} must be a positive int")
        if target == "cuda":
            # The weights go to the device: fail now, not after compiling
            # (and after the arguments' own errors, which need no device).
            from ...runtime.cuda import require_device

            require_device("load(target='cuda')")
        self.config = config
        self.checkpoint = checkpoint
        self.path = checkpoint.path
        #: What of the checkpoint is not loaded, in words: a multimodal
        #: checkpoint's vision tower and projector (ETC runs its text
        #: model); None when the whole checkpoint is the model.
        self.not_loaded = getattr(checkpoint, "not_loaded", None)
        #: The compute dtype of weights and activations ("f32", "f16" or
        #: "bf16"): `load`'s, or the checkpoint's own when it gave None.
        self.dtype = dtype
        #: The KV caches' dtype (by default the compute dtype).
        self.kv_dtype = self.graph_options["kv_dtype"]
        self.target = target
        #: The checkpoint's `Tokenizer` (None without one), and the ids that
        #: end a sequence (config.json, generation_config.json).
        self.tokenizer = checkpoint.tokenizer()
        self.eos_token_ids = tuple(checkpoint.eos_token_ids())
        #: The longest sequence (prompt + new tokens) the model serves.
        self.max_seq_len = self.graph_options["max_seq_len"]
        #: KV positions per attention chunk task.
        self.attention_chunk = self.graph_options["chunk"]
        #: Positions per block of the paged KV cache (None: contiguous slots).
        self.kv_block_size = self.graph_options["kv_block_size"]
        self.max_step_tokens = max_step_tokens
        #: Blocks of the model's paged KV cache (`paged_cache`), from
        #: kv_cache_tokens or kv_cache_memory; None: sized by its first user.
        #: With sliding layers, their pool's blocks too (None: as many).
        self.kv_cache_blocks, self.kv_cache_window_blocks = \
            self._pool_blocks(kv_cache_tokens, kv_cache_memory)
        self._paged_cache: Optional[PagedKVCache] = None
        # Held while `paged_cache` looks at and replaces the shared pool
        # (generate calls from several threads), and around a kernel run.
        self._pool_lock = threading.Lock()
        self._run_lock = threading.Lock()
        # `step`'s own arrays, kept between runs (`_kept_arrays`).
        self._kept: collections.OrderedDict = collections.OrderedDict()
        self._graph = None
        # How the compile cache was asked for, and the draft models loaded
        # with this model's options (`draft_model`).
        self._cache_option = cache
        self._drafts: dict = {}
        #: Seconds spent loading: "weights", and "compile" or "cache".
        self.timings: dict[str, float] = {}
        start = time.perf_counter()
        report = None if progress is None else \
            (lambda done, total: progress("weights", done, total))
        # Each weight cut to this rank's share as it is read.
        split = None if tensor_parallel == 1 else \
            (lambda name, array: shard_weight(config, name, array, tensor_parallel, self.rank,
                                              self.weight_formats.get(name), self.padded_widths))
        if isinstance(checkpoint, Checkpoint):
            # Read in the compute dtype's storage: a bf16 or f16 checkpoint
            # computed in its own dtype is never widened to float32 (an FP8
            # one's packed weights stay e4m3).
            weights = checkpoint.weights(dtype, progress=report, formats=self.weight_formats,
                                         shard=split)
        else:
            weights = checkpoint.weights(progress=report, formats=self.weight_formats,
                                         shard=split)
        # The RoPE tables (LongRoPE's factors for this context length),
        # unless the file has its own.
        for name, table in config.rope_tables(self.max_seq_len).items():
            weights.setdefault(name, table)
        if config.mla is not None:  # DeepSeek: the pe key's placement into its heads
            weights[mla_layout.PLACE] = mla_layout.place(self._shard)
        self._weights = {name: self._as_dtype(name, array) for name, array in weights.items()}
        self.timings["weights"] = time.perf_counter() - start
        step, source, seconds = step_kernel(self._shard, self.graph_options, self.compile_options,
                                            cache=cache, kernel=kernel, progress=progress,
                                            name=str(self.path))
        #: Where the step kernel came from: "compiled", "cache" (the
        #: compile cache) or "file" (`kernel=`).
        self.kernel_source = source
        self.timings["compile" if source == "compiled" else "cache"] = seconds
        self._kernels = (step,)
        #: The step kernel with the weights bound (`partial`), made at the
        #: first step without a cache to bind (`_bound_step`).
        self._step = None
        if target == "cuda":
            self._weights = {name: _to_device(step, name, array)
                             for name, array in self._weights.items()}

    def _pool_blocks(self, tokens, memory) -> tuple:
        """The paged cache's blocks for `load`'s kv_cache_tokens or
        kv_cache_memory (checked), and its sliding layers' pool's (None: as
        many). A sequence of max_seq_len holds on a sliding layer the
        blocks of its window and a step (`window_pool_tokens`), so that
        pool gets that share of the others' blocks (at least one
        sequence's), and kv_cache_memory pays for both."""
        given = {name: value for name, value in (("kv_cache_tokens", tokens),
                                                 ("kv_cache_memory", memory))
                 if value is not None}
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"load: {name}={value!r} must be a positive int")
        if len(given) > 1:
            raise ValueError("load: give kv_cache_tokens or kv_cache_memory, not both")
        if not given:
            return None, None
        if self.kv_block_size is None:
            raise ValueError(f"load: {next(iter(given))} sizes the paged KV cache, but "
                             f"kv_block_size=None asks for a contiguous one")
        block = self.kv_cache_bytes_per_block
        one = self.window_pool_tokens(1, self.max_step_tokens)
        share = 1.0 if one is None else min(1.0, one / self.max_seq_len)
        if tokens is not None:
            blocks = -(-tokens // self.kv_block_size)
        else:
            if memory < block:
                raise ValueError(f"load: kv_cache_memory={memory} bytes is less than one KV "
                                 f"cache block ({block} bytes: {self.kv_block_size} positions "
                                 f"of every layer's keys and values)")
            layers = self.config.num_layers
            sliding = len(self.config.sliding_layers) if one is not None else 0
            blocks = int(memory // (block / layers * (layers - sliding + sliding * share)))
        if share == 1.0:
            return blocks, None
        window = max(int(blocks * share), one // self.kv_block_size)
        return blocks, (window if window < blocks else None)

    @property
    def kv_cache_bytes_per_block(self) -> int:
        """The memory of one block of the paged cache: 2 (K and V) x layers
        x kv_block_size x kv_heads x head_dim x bytes per value."""
        return PagedKVCache.bytes_per_block(self._shard, self.kv_block_size,
                                            KV_STORAGE[self.kv_dtype].itemsize)

    def describe(self) -> dict:
        """What the step kernel's code depends on (see
        `etc.models.step.kernel_cache.describe`): its compile-cache key's material."""
        return _cache.describe(self.config, self.graph_options, self.compile_options)

    @property
    def graph(self):
        """The step graph (`etc.Graph`; built on first use, needs the
        compiler)."""
        if self._graph is None:
            from .graph import build_step_graph

            self._graph = build_step_graph(self._shard, **self.graph_options)
        return self._graph

    def _as_dtype(self, name: str, array: np.ndarray) -> np.ndarray:
        """Weights as the graph's inputs take them: float16 arrays for f16;
        bf16 bit patterns (uint16) for bf16, converted once here rather than
        by the runtime at every step; float32 for f32. The RoPE tables,
        attention sinks (gpt-oss) and expert selection biases (GLM-4.5) are
        float32 in every dtype."""
        if name.startswith("inv_freq") or name.endswith(("_sinks", "_selection_bias")):
            return np.ascontiguousarray(array, np.float32)
        if array.dtype == STORAGE[self.dtype] or \
                name in self.weight_formats:
            return array
        if self.dtype == "bf16":
            from ... import bfloat16
            from ...runtime import aligned

            return aligned.aligned(bfloat16.to_bits(array))
        return array.astype(np.float16)

    # -- public API --------------------------------------------------------

    @property
    def kernels(self) -> list["CompiledKernel"]:
        """The compiled kernels: one step kernel, whatever the batch size,
        prompt lengths and number of steps."""
        return list(self._kernels)

    def __repr__(self) -> str:
        c = self.config
        return (f"<Model {c.architecture} layers={c.num_layers} hidden={c.hidden_size} "
                f"vocab={c.vocab_size} dtype={self.dtype} target={self.target}" +
                (f" ({self.not_loaded})" if self.not_loaded else "") + ">")

    @property
    def num_parameters(self) -> int:
        """The number of weights (the RoPE frequencies and MLA's pe
        placement excluded; a packed weight's values, not its bytes)."""
        def count(name, w):
            fmt = packed.FORMATS.get(self.weight_formats.get(name))
            if fmt is None:
                return int(np.prod(w.shape))
            return int(np.prod(w.shape[:-1])) * (w.shape[-1] // fmt.nbytes * fmt.block)
        return sum(count(name, w) for name, w in self._weights.items()
                   if not name.startswith("inv_freq") and name != mla_layout.PLACE)

    def new_cache(self, slots: int, length: int):
        """Empty KV caches for `slots` sequences of up to `length` positions
        (at most `max_seq_len`): a `KVCache`, or with the paged cache a
        `PagedKVCache` of slots x ceil(length / kv_block_size) blocks whose
        sequences 0 .. slots - 1 hold the blocks of `length` positions each
        (no prefix reuse: `paged_cache` is the model's shared pool)."""
        for what, value in (("slots", slots), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"new_cache: {what}={value!r} must be a positive int")
        if length > self.max_seq_len:
            raise ValueError(f"new_cache: length={length} is longer than the model's "
                             f"max_seq_len={self.max_seq_len}")
        allocate = None
        if self.target == "cuda":
            allocate = self._kernels[0].runtime.device_zeros
        if self.kv_block_size is None:
            return KVCache(self._shard, slots, length, allocate, self.kv_dtype)
        blocks = -(-length // self.kv_block_size)
        cache = self._new_paged(slots * blocks, prefix_caching=False)
        for slot in range(slots):
            cache.admit(slot, (), length)
        return cache

    def paged_cache(self, tokens: Optional[int] = None,
                    window_tokens: Optional[int] = None) -> PagedKVCache:
        """The model's paged KV cache, shared by everything that runs on it
        (the engine, `generate`), so that prompts share cached prefixes
        across requests and calls. Its size is load's kv_cache_tokens or
        kv_cache_memory; without them, its first user's `tokens` (and
        `window_tokens` for the sliding layers' pool, as many as `tokens`
        when None or more: see `window_pool_tokens`), and a later user that
        needs more replaces it by a larger one while no sequence holds
        blocks (the cached prefixes are dropped)."""
        if self.kv_block_size is None:
            raise ValueError("paged_cache: the model was loaded with kv_block_size=None (a "
                             "contiguous cache); use new_cache")
        with self._pool_lock:
            cache = self._paged_cache
            if self.kv_cache_blocks is not None:
                if cache is None:
                    cache = self._paged_cache = self._new_paged(
                        self.kv_cache_blocks, window_blocks=self.kv_cache_window_blocks)
                return cache
            if tokens is None:
                tokens = self.max_seq_len
            blocks = -(-tokens // self.kv_block_size)
            window_blocks = None if window_tokens is None or window_tokens >= tokens else \
                -(-window_tokens // self.kv_block_size)
            short = cache is None or cache.num_blocks < blocks or (
                cache.window_manager is not None and
                cache.window_manager.num_blocks < (window_blocks or blocks))
            if cache is None or (short and not len(cache.manager)):
                cache = self._paged_cache = None  # the old arrays go before the new ones come
                cache = self._paged_cache = self._new_paged(blocks, window_blocks=window_blocks)
            return cache

    def window_pool_tokens(self, sequences: int, step_tokens: int) -> Optional[int]:
        """The positions the sliding layers' pool needs for `sequences`
        sequences at once when a step computes at most `step_tokens` of a
        sequence's positions: each holds the blocks its window and the
        step's new positions span, W - 1 + step_tokens positions, plus one
        block where they start inside a block. None without sliding layers
        (or with a contiguous cache)."""
        window = self.config.sliding_window if self.config.sliding_layers else None
        if window is None or self.kv_block_size is None:
            return None
        spans = -(-(window - 1 + step_tokens) // self.kv_block_size) + 1
        return sequences * spans * self.kv_block_size

    def new_paged_cache(self, tokens: int, window_tokens: Optional[int] = None
                        ) -> PagedKVCache:
        """A paged KV cache of its own (not the model's shared pool) that
        holds `tokens` positions, rounded up to whole blocks; with
        `window_tokens`, the sliding layers' pool holds that many (by
        default, and at most, as many as the others': a sequence holds
        fewer of its blocks, those its windows see)."""
        if self.kv_block_size is None:
            raise ValueError("new_paged_cache: the model was loaded with kv_block_size=None "
                             "(a contiguous cache); use new_cache")
        given = {"tokens": tokens} if window_tokens is None else \
            {"tokens": tokens, "window_tokens": window_tokens}
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"new_paged_cache: {name}={value!r} must be a positive int")
        blocks = {name: -(-value // self.kv_block_size) for name, value in given.items()}
        window = blocks.get("window_tokens")
        return self._new_paged(blocks["tokens"], window_blocks=None if window is None or
                               window >= blocks["tokens"] else window)

    def draft_model(self, path) -> "CompiledModel":
        """The draft model at `path` (a checkpoint directory or GGUF file)
        for speculative decoding, loaded with this model's options (target,
        dtype, workers, max_seq_len, KV cache layout, compile cache) the
        first time and kept: every engine of this model shares it. Its
        step kernel's workers are as wide as this model's (lanes, min_ctas:
        one CTA size per model)."""
        from ..loading import open_checkpoint

        key = str(path)
        with self._pool_lock:
            draft = self._drafts.get(key)
        if draft is None:
            graph, compiled = self.graph_options, self.compile_options
            draft = type(self)(open_checkpoint(path), target=compiled["target"],
                               schedule=compiled["schedule"], workers=compiled["workers"],
                               dtype=graph["dtype"], max_seq_len=graph["max_seq_len"],
                               attention_chunk=graph["chunk"],
                               max_step_tokens=self.max_step_tokens, chip=compiled["chip"],
                               kernels=compiled["kernels"], cache=self._cache_option,
                               kv_dtype=graph["kv_dtype"], kv_block_size=graph["kv_block_size"],
                               lanes=compiled.get("lanes"), min_ctas=compiled.get("min_ctas"))
            with self._pool_lock:
                draft = self._drafts.setdefault(key, draft)
        return draft

    def _new_paged(self, blocks: int, prefix_caching: bool = True,
                   window_blocks: Optional[int] = None) -> PagedKVCache:
        allocate = None
        if self.target == "cuda":
            allocate = self._kernels[0].runtime.device_zeros
        return PagedKVCache(self._shard, blocks, self.kv_block_size, allocate=allocate,
                            storage=KV_STORAGE[self.kv_dtype], dtype=self.kv_dtype,
                            prefix_caching=prefix_caching, window_blocks=window_blocks)

    def step(self, cache, requests: Sequence[Request], return_logits: bool = False,
             return_logprobs: bool = False):
        """Runs one step: every request's new tokens go into the cache, and
        the next id of each request comes back, chosen on the device from
        the logits of its last new token with its `sampling` parameters; a
        request with `choices` = c gets the id chosen after each of its
        last c tokens. Returns (logits, next_ids): next_ids (C,) int32,
        the requests' choices in order (C = R when every request makes one
        choice), and the logits (C, vocab) float32 they were chosen from
        with `return_logits`, else None (on CUDA they then stay on the
        device: only the ids are copied back). With `return_logprobs`,
        (logits, next_ids, (values, ids)): for each choice whose sampling
        asks for `logprobs`, values[c, 0] the log-probability of its token,
        ids[c, j] and values[c, 1 + j] its j-th most likely token and that
        one's (j < logprobs), computed on the device; the other rows'
        entries are undefined. Requests may bring any
        number of tokens (prefill, decode, or a mix in one step). With a
        `PagedKVCache`, a request's slot is its sequence in the cache's
        block manager, whose blocks must cover its positions."""
        data = self._step_data(cache, requests)
        return self.run_step(data, len(data["sample_rows"]), return_logits, cache=cache,
                             return_logprobs=return_logprobs, keep=True)

    def run_step(self, data: dict, count: int, return_logits: bool = False, cache=None,
                 return_logprobs: bool = False, keep: bool = False):
        """Runs the step kernel on `data`, the inputs of a step that makes
        `count` choices (`sample_rows`), but the weights (`step_inputs`
        without them: the weights are bound once); returns what `step`
        does. With `cache`, the KV cache whose arrays `data` holds, those
        are bound once too (per cache).

        One run at a time per model (engines in several threads, such as
        concurrent `generate` calls, take turns): a run already uses every
        worker, and a device's runtime state is the kernel's.

        `keep` (`step`'s own data, which nobody else holds): the step's
        arrays are copied into arrays kept from the last steps of the same
        shapes, and the ids come back through kept `out=` arrays, so that
        the runtime is given the same arrays as at the last step and reuses
        its binding (`etc.runtime.bind_plan`): binding a dozen new small
        arrays, checking the new `out=` and writing their addresses took
        about 0.3 ms of a decode step's 0.8 ms of host time (SmolLM2-135M
        shape, bf16, 2026-11-29)."""
        with self._run_lock:
            step, data = self._bound_step(data, cache)
            if return_logits:
                logits, next_ids, values, ids = step.run(**data)
                return (np.asarray(logits, dtype=np.float32), next_ids) + \
                    (((values, ids),) if return_logprobs else ())
            # Only what is asked for leaves the device.
            if keep:
                data, out = self._kept_arrays(data, count, return_logprobs)
            else:
                out = self._new_out(count, return_logprobs)
            step.run(**data, out=out)
            if keep:  # the kept arrays are the next step's
                out = {name: array.copy() for name, array in out.items()}
            result = (None, out["next_ids"])
            values, ids = out.get("next_ids_logprobs"), out.get("next_ids_logprob_ids")
            return result + ((values, ids),) if return_logprobs else result

    @staticmethod
    def _new_out(count: int, return_logprobs: bool) -> dict:
        """The `out=` arrays of a step that makes `count` choices."""
        out = {"next_ids": np.empty(count, np.int32)}
        if return_logprobs:
            out["next_ids_logprobs"] = np.empty((count, 1 + MAX_LOGPROBS), np.float32)
            out["next_ids_logprob_ids"] = np.empty((count, MAX_LOGPROBS), np.int32)
        return out

    #: How many shapes of step arrays `_kept_arrays` keeps.
    KEPT_SHAPES = 4

    def _kept_arrays(self, data: dict, count: int, return_logprobs: bool) -> tuple:
        """`data`'s values copied into arrays kept from an earlier step with
        the same names, shapes and dtypes (or `data`'s own arrays, kept from
        now on), and the kept `out=` arrays for `count` choices: the last
        KEPT_SHAPES such sets. Called under the run lock."""
        # (`count` is sample_rows' length: its shape is in the key.)
        key = (return_logprobs,
               *((name, value.shape, value.dtype.str) for name, value in data.items()))
        kept = self._kept.pop(key, None)
        if kept is None:
            kept = (data, self._new_out(count, return_logprobs))
        else:
            for name, array in kept[0].items():
                array[...] = data[name]
        self._kept[key] = kept
        while len(self._kept) > self.KEPT_SHAPES:
            self._kept.popitem(last=False)
        return kept

    def _bound_step(self, data: dict, cache) -> tuple:
        """The step kernel with the weights bound (`partial`), and with
        `cache`'s arrays too when given, and what `data` leaves to pass.

        A step then checks and addresses (on the CPU) only its dozen small
        arrays: the weights' and the caches' checks took about 0.6 ms of a
        19 ms decode step of a 135 M model. The binding of a cache is kept
        on the cache (it ends with it) and made again if the cache's arrays
        were replaced."""
        if cache is None:
            if self._step is None:
                self._step = self._kernels[0].partial(**self._weights)
            return self._step, data
        arrays = cache.arrays
        binding = getattr(cache, "_step_binding", None)
        if binding is None or binding[0]() is not self or \
                any(arrays[name] is not array for name, array in binding[1].items()):
            cache._step_binding = None  # the old binding goes first
            bound = {name: data[name] for name in arrays}
            binding = cache._step_binding = (
                weakref.ref(self), bound, self._kernels[0].partial(**self._weights, **bound))
        return binding[2], {name: value for name, value in data.items() if name not in arrays}

    def _fresh_seeds(self, count: int) -> list:
        """Random seeds for the requests without one. Every rank of a
        tensor-parallel model must draw the same tokens, so rank 0's seeds
        go to all (the ranks run the same steps)."""
        seeds = fresh_seeds(count)
        # Led by rank 0 (`etc.models.engine.lockstep`), the other ranks get the
        # seeds with the rest of the step's inputs.
        if self.tensor_parallel > 1 and count and not self.led:
            from mpi4py import MPI

            seeds = MPI.COMM_WORLD.bcast(seeds, root=0)
        return seeds

    def _check_cache(self, cache) -> None:
        """`cache` is one this model's kernel can use: a `KVCache` no longer
        than the compiled max_seq_len (the attention's chunk grid and index
        checks are sized by it), or with the paged cache a `PagedKVCache` of
        the model's block size; its arrays have this model's shapes."""
        if not isinstance(cache, (KVCache, PagedKVCache)):
            raise TypeError(f"step: 'cache' must be a KVCache or PagedKVCache "
                            f"(Model.new_cache, Model.paged_cache), got {type(cache).__name__}")
        # Checked before for this model, with the same arrays (a decode
        # step's cache: the checks below took 0.1 ms of a step).
        checked = getattr(cache, "_checked_for", None)
        arrays = tuple(cache.arrays.values())
        if checked is not None and checked[0]() is self and len(checked[1]) == len(arrays) \
                and all(a is b for a, b in zip(checked[1], arrays)):
            return
        paged = isinstance(cache, PagedKVCache)
        if paged != (self.kv_block_size is not None):
            want = "a PagedKVCache" if self.kv_block_size is not None else "a KVCache"
            raise ValueError(f"step: the model's step kernel takes {want} (kv_block_size="
                             f"{self.kv_block_size}), got {type(cache).__name__}")
        c = self._shard  # this rank's heads
        if paged:
            if cache.block_size != self.kv_block_size:
                raise ValueError(f"step: the cache's blocks hold {cache.block_size} positions, "
                                 f"the model's {self.kv_block_size}")
            tables = layer_tables(c)
            if set(cache.tables) != set(tables):
                raise ValueError(f"step: the cache's block tables are {sorted(cache.tables)}, "
                                 f"the model's {sorted(set(tables))} (a cache of another "
                                 f"model?)")
            rows = [(cache.tables[name].num_blocks, cache.block_size) for name in tables]
            what = "blocks, block_size"
        else:
            if cache.length > self.max_seq_len:
                raise ValueError(f"step: the cache holds {cache.length} positions, more than "
                                 f"the max_seq_len={self.max_seq_len} the model is compiled for")
            rows, what = [(cache.slots, cache.length)] * c.num_layers, "slots, length"
        width = c.num_kv_heads * c.head_dim
        for i in range(c.num_layers):
            expected = (*rows[i], width)
            for kind in ("k", "v"):
                name = f"l{i}_{kind}_cache"
                array = cache.arrays.get(name)
                if array is None:
                    raise ValueError(f"step: the cache has no {name!r} (a cache of another "
                                     f"model?)")
                if tuple(array.shape) != expected:
                    raise ValueError(f"step: cache {name!r} has shape {tuple(array.shape)}, "
                                     f"expected {expected} ({what}, kv_heads * head_dim)")
        cache._checked_for = (weakref.ref(self), arrays)

    def step_inputs(self, cache, requests: Sequence[Request]) -> dict:
        """The step kernel's inputs for `requests` (checked): token ids, the
        ragged batch's index arrays (the block tables of a paged cache), the
        sampling parameters (`sampling.sampling_inputs`), the weights and
        the caches, by name. `step` runs the kernel on them; benchmarks bind
        them once."""
        return {**self._step_data(cache, requests), **self._weights}

    def _step_data(self, cache, requests: Sequence[Request]) -> dict:
        """`step_inputs` without the weights.

        Python lists, converted once: a NumPy build of the index arrays
        (cumsum, repeat) took the same 66 us in a loop, but in real decode
        steps of a 1b model, run right after the kernel has swept the
        caches, 0.27 ms instead of 0.14 at B = 1 and 0.31 instead of 0.20
        at B = 16 (its dozens of NumPy calls run cold; 2026-11-28)."""
        self._check_cache(cache)
        if not requests:
            raise ValueError("step: no requests")
        paged = isinstance(cache, PagedKVCache)
        capacity = self.max_seq_len if paged else cache.length
        ids, positions, token_request = [], [], []
        slot, length, first, last = [], [], [], []
        rows, row_positions, choices = [], [], []
        vocab = self.config.vocab_size
        seen = set()
        for r, request in enumerate(requests):
            tokens = list(request.tokens)
            if not tokens:
                raise ValueError(f"step: request {r} brings no tokens")
            if not paged and not 0 <= request.slot < cache.slots:
                raise ValueError(f"step: request {r} uses slot {request.slot}, but the cache "
                                 f"has {cache.slots} slots")
            if request.slot in seen:
                raise ValueError(f"step: slot {request.slot} is used by two requests")
            seen.add(request.slot)
            end = request.start + len(tokens)
            if request.start < 0 or end > capacity:
                raise ValueError(f"step: request {r} covers positions [{request.start}, {end}), "
                                 f"a sequence longer than the cache ({capacity} positions)")
            for i, token in enumerate(tokens):
                if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or \
                        not 0 <= token < vocab:
                    raise ValueError(f"step: request {r}, token {i}: id {token!r} is outside "
                                     f"the vocabulary [0, {vocab})")
            count = request.choices
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or \
                    not 1 <= count <= len(tokens):
                raise ValueError(f"step: request {r}: choices={count!r} must be an int in "
                                 f"[1, {len(tokens)}] (its tokens)")
            first.append(len(ids))
            ids += tokens
            positions += range(request.start, end)
            token_request += [r] * len(tokens)
            last.append(len(ids) - 1)
            slot.append(request.slot)
            length.append(end)
            # A choice after the token at position p is the token of p + 1.
            rows += range(len(ids) - count, len(ids))
            row_positions += range(end - count + 1, end + 1)
            choices.append(int(count))
        i32 = lambda values: np.asarray(values, dtype=np.int32)
        addressing = cache.block_tables(slot, length) if paged else dict(request_slot=i32(slot))
        per_choice = {**sampling_inputs([q.sampling for q in requests], self._fresh_seeds),
                      **adjustment_inputs([q.adjustments for q in requests]),
                      **mask_inputs([q.token_mask for q in requests], vocab)}
        if len(rows) > len(requests):  # each request's parameters on each of its rows
            per_choice = {name: np.repeat(value, choices, axis=0)
                          for name, value in per_choice.items()}
        return dict(ids=i32(ids), positions=i32(positions), token_request=i32(token_request),
                    **addressing, request_length=i32(length), request_first=i32(first),
                    request_last=i32(last), sample_rows=i32(rows),
                    sample_position=i32(row_positions), **per_choice, **cache.arrays)


def _to_device(kernel, name: str, array: np.ndarray):
    """Weight `name` copied once to the device in the storage its graph
    input has (bf16 as its 16-bit patterns; a packed weight's blocks
    repacked into the GPU layout of `etc.packed`): the CUDA runtime uses
    device arrays in place, so weights are not copied every step."""
    from ...runtime.cpu import to_storage

    dtype = kernel.abi.argument(name).dtype
    return kernel.runtime.device_array(to_storage(array, dtype), dtype=dtype)
