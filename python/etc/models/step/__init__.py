"""One step of a model: the step graph (`graph.build_step_graph`), its
compiled kernel (`kernel`, kept in the compile cache `kernel_cache`), the KV
caches it updates in place (`kv_cache`, with the paged cache's bookkeeping
in `kv_blocks`), the per-request inputs (`request`, `sampling`), tensor
parallel shards (`parallel`), and `model.CompiledModel`, which runs a step
on its weights. A NumPy forward pass (`reference`) checks it."""

from __future__ import annotations

from .kernel import KernelNotCachedError, step_kernel, step_options
from .kv_blocks import DEFAULT_BLOCK_SIZE, BlockManager
from .kv_cache import KVCache, PagedKVCache
from .model import CompiledModel
from .request import Request
from .sampling import SamplingParams

__all__ = ["CompiledModel", "Request", "KVCache", "PagedKVCache", "BlockManager",
           "DEFAULT_BLOCK_SIZE", "SamplingParams", "KernelNotCachedError", "step_kernel",
           "step_options"]
