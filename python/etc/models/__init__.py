"""LLM inference: Hugging Face checkpoints compiled into one step kernel.

```python
import etc.models
model = etc.models.load("path/to/Qwen3-0.6B", target="cpu")
out = model.generate([[151644, 872], [9707]], max_new_tokens=16, return_logits=True)
out.tokens        # the new ids, per prompt
out.logits[0]     # (16, vocab) float32: what each new token was chosen from
model.kernels     # [the step kernel]: one, for every batch and length
model.generate([{"role": "user", "content": "Hi"}], 32).text   # with tokenizer.json
```

Supported: `LlamaForCausalLM`, `Qwen3ForCausalLM` and `Qwen3MoeForCausalLM`
checkpoint directories (config.json and *.safetensors with F32, F16 or BF16
weights under the usual names), and GGUF files of the llama, qwen3 and
qwen3moe architectures (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K).
Compiled step kernels are kept in a compile cache (`etc.models.cache`), so a
second load compiles nothing; this package imports without MLIR and loads
models from the cache there. See docs/models.md.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from pathlib import Path

from .cache import KernelCache
from .checkpoint import Checkpoint, CheckpointError, MissingTensorError
from .config import ARCHITECTURES, ModelConfig, UnsupportedConfigError
from .gguf import GGUFCheckpoint, GGUFError, is_gguf
from .kvpages import DEFAULT_BLOCK_SIZE, BlockManager, PagedKVCache
from .model import (Generation, KernelNotCachedError, KVCache, Model, Request, step_kernel,
                    step_options)
from .engine import Engine, RequestError
from .safetensors import SafetensorsError
from .tokenizer import ChatTemplateError, Tokenizer
from .sampling import SamplingParams

__all__ = ["load", "open_checkpoint", "compile_checkpoint", "Model", "Generation", "KVCache",
           "PagedKVCache", "BlockManager", "Request", "SamplingParams", "ModelConfig",
           "ARCHITECTURES", "Checkpoint", "GGUFCheckpoint", "KernelCache", "CheckpointError",
           "MissingTensorError", "UnsupportedConfigError", "SafetensorsError", "GGUFError",
           "KernelNotCachedError", "Engine", "RequestError", "Tokenizer", "ChatTemplateError"]


def open_checkpoint(path):
    """The checkpoint at `path`: a `GGUFCheckpoint` for a GGUF file, a
    `Checkpoint` for a Hugging Face directory; `CheckpointError` for
    anything else."""
    path = Path(path)
    if path.is_dir():
        return Checkpoint(path)
    if is_gguf(path):
        return GGUFCheckpoint(path)
    if path.is_file():
        raise CheckpointError(f"{path}: neither a GGUF file nor a checkpoint directory "
                              f"(config.json and *.safetensors)")
    raise CheckpointError(f"{path}: no such file or directory")


def load(path, target: str = "cpu", schedule: str = "auto", workers: Optional[int] = None, *,
         dtype: str = "f32", max_seq_len: Optional[int] = None,
         attention_chunk: Optional[int] = None, max_step_tokens: int = 256,
         chip: str = "sm_90a", kernels: str = "native", cache=None, kernel=None,
         progress=None, tensor_parallel: int = 1, kv_dtype: Optional[str] = None,
         kv_block_size: Optional[int] = DEFAULT_BLOCK_SIZE, kv_cache_tokens: Optional[int] = None,
         kv_cache_memory: Optional[int] = None) -> Model:
    """Reads the Hugging Face checkpoint directory or GGUF file `path`,
    builds its step graph and compiles it once, or takes the compiled step
    kernel from the compile cache.

    `target`, `schedule`, `workers`, `chip` and `kernels` are those of
    `etc.compile` (`kernels="cuda"` on the CPU runs the CUDA tile kernels
    with simulated lanes, a check of the GPU code without a GPU)
    (`workers=None`: one per CPU core on the CPU). Weights and activations
    are computed in `dtype` ("f32", "f16" or "bf16"); the KV caches are
    in `kv_dtype` (default: `dtype`; "f32" keeps float32 caches for a
    half-precision model). `max_seq_len` (default: the config's max_position_embeddings)
    bounds prompt + new tokens; `attention_chunk` is the KV positions per
    attention chunk task (default 128; the number of chunks follows the
    cache's length at run time);
    `max_step_tokens` bounds the new tokens of one step (longer prefills
    take several steps).

    The KV cache is paged (docs/models.md, "The paged KV cache"): blocks of
    `kv_block_size` positions (None: a contiguous slot of the full length
    per sequence), shared through block tables, with prefix reuse. Its
    pool (`Model.paged_cache`) holds `kv_cache_tokens` positions or takes
    `kv_cache_memory` bytes; without either it is sized by its first user
    (the engine: max_num_seqs x max_model_len).

    `cache`: None (default) uses the compile cache (`ETC_CACHE_DIR`, see
    `etc.models.cache`) unless the environment sets `ETC_CACHE=0`; True
    uses it, False never; a path uses that directory. `kernel`: the path of
    a step kernel saved by `etc compile ... -o FILE`, used instead (checked
    against this model and options). Without the compiler (no MLIR) a
    model loads only from the cache or `kernel`, else
    `KernelNotCachedError`. `progress(phase, done, total)` is called as
    weights load ("weights", per tensor) and the kernel is looked up
    ("cache") or compiled ("compile").

    `tensor_parallel=N` splits the model over N ranks (Megatron-style: each
    rank its share of the attention heads, MLP columns and every expert's
    columns, the partial sums added by an all-reduce fused into the step
    kernel): run N processes (`python -m etc.runtime.distributed -n N
    script.py`), each calling `load` and then `generate` with the same
    arguments, in the same order (docs/distributed.md). A head count, MLP
    width or expert width that N does not divide is a ValueError naming
    the field.

    Raises `UnsupportedConfigError`, `MissingTensorError`,
    `CheckpointError`, `GGUFError` or `SafetensorsError` naming the field,
    tensor or file at fault."""
    return Model(open_checkpoint(path), target=target, schedule=schedule, workers=workers,
                 dtype=dtype, max_seq_len=max_seq_len, attention_chunk=attention_chunk,
                 max_step_tokens=max_step_tokens, chip=chip, kernels=kernels, cache=cache,
                 kernel=kernel, progress=progress, tensor_parallel=tensor_parallel,
                 kv_dtype=kv_dtype, kv_block_size=kv_block_size, kv_cache_tokens=kv_cache_tokens,
                 kv_cache_memory=kv_cache_memory)


def compile_checkpoint(path, target: str = "cpu", schedule: str = "auto",
                       workers: Optional[int] = None, *, dtype: str = "f32",
                       max_seq_len: Optional[int] = None, attention_chunk: Optional[int] = None,
                       chip: str = "sm_90a", kernels: str = "native", cache=None, output=None,
                       progress=None, kv_dtype: Optional[str] = None,
                       kv_block_size: Optional[int] = DEFAULT_BLOCK_SIZE):
    """Compiles the step kernel of the checkpoint at `path` with `load`'s
    options, without reading its weights or needing a GPU: into the compile
    cache (`cache` as `load` takes it), and to the artifact file `output`
    when given (what `load(..., kernel=output)` takes). A kernel already in
    the cache is not compiled again. Returns a `CompileResult`: the kernel,
    its source ("cache" or "compiled"), the seconds that took, and the
    cache file (None when the cache is off or could not be written)."""
    checkpoint = open_checkpoint(path)
    graph_options, compile_options = step_options(
        checkpoint.config, target=target, schedule=schedule, workers=workers, dtype=dtype,
        max_seq_len=max_seq_len, attention_chunk=attention_chunk, chip=chip, kernels=kernels,
        kv_dtype=kv_dtype, kv_block_size=kv_block_size)
    kernel, source, seconds = step_kernel(checkpoint.config, graph_options, compile_options,
                                          cache=cache, progress=progress, name=str(path))
    from .cache import METADATA_KEY, describe, enabled_by_default, key_of

    description = describe(checkpoint.config, graph_options, compile_options)
    if output is not None:
        kernel.save(output, metadata={METADATA_KEY: description})
    if cache is None:
        cache = enabled_by_default()
    cache_path = None
    if cache is not False:
        cache_path = KernelCache(None if cache is True else cache).path(key_of(description))
        if not cache_path.is_file():
            cache_path = None
    return CompileResult(kernel, source, seconds, cache_path)


class CompileResult(NamedTuple):
    """What `compile_checkpoint` did."""

    kernel: object
    source: str
    seconds: float
    cache_path: Optional[Path]
