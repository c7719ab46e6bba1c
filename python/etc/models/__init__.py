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

Supported: `LlamaForCausalLM`, `MistralForCausalLM`, `MixtralForCausalLM`,
`Qwen2ForCausalLM`, `Qwen2MoeForCausalLM`, `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`,
`Gemma2ForCausalLM`, `Gemma3ForCausalLM`, `Phi3ForCausalLM`, `SmolLM3ForCausalLM`,
`GraniteForCausalLM`, `GraniteMoeForCausalLM`, `GraniteMoeSharedForCausalLM`,
`GptOssForCausalLM`, `Olmo2ForCausalLM`, `Olmo3ForCausalLM`, `OlmoeForCausalLM`,
`Glm4ForCausalLM`, `Glm4MoeForCausalLM`, `Ernie4_5ForCausalLM`, `Ernie4_5_MoeForCausalLM`,
`Exaone4ForCausalLM`, `SeedOssForCausalLM`, `HunYuanDenseV1ForCausalLM`,
`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`, `CohereForCausalLM` and `Cohere2ForCausalLM`
checkpoint directories (config.json and
*.safetensors with F32, F16 or BF16 weights under the usual names; gpt-oss's MXFP4 experts;
FP8 checkpoints), and GGUF files of the llama (Mixtral: llama with experts), qwen2, qwen2moe,
qwen3, qwen3moe, gemma2, gemma3, phi3, smollm3, granite, granitemoe (with shared experts too),
gpt-oss, olmo2 (OLMo 3: olmo2 with a window), olmoe, glm4, glm4moe, ernie4_5, ernie4_5-moe,
exaone4, seed_oss, hunyuan-dense, deepseek2, command-r and cohere2 architectures (F32, F16,
BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4).
Compiled step kernels are kept in a compile cache
(`etc.models.step.kernel_cache`), so a second load compiles nothing; this
package imports without MLIR and loads models from the cache there. See
docs/models.md.

The text model of `Gemma3ForConditionalGeneration` and
`Mistral3ForConditionalGeneration` checkpoints (Gemma 3 4B and up, Mistral
Small 3.1/3.2) runs as its causal LM; their vision part is not loaded
(docs/models.md, "Multimodal checkpoints").

The package is layered, each layer importing only those below it:
`loading` (checkpoint formats, config, tokenizer) < `step` (the step graph,
its compiled kernel, KV caches, `CompiledModel`) < `engine` (continuous
batching: scheduler, requests, KV slots, stopping, tensor-parallel
lockstep) < `generation` (`Model.generate` on the engine). This module is
the public face: `load`, `compile_checkpoint` and the names users need.
"""

from __future__ import annotations

from typing import Optional

from .engine import Engine, RequestError, Speculative
from .generation import Generation, Model
from .loading import (ARCHITECTURES, Checkpoint, CheckpointError, ChatTemplateError,
                      GGUFCheckpoint, GGUFError, MissingTensorError, ModelConfig,
                      SafetensorsError, Tokenizer, UnsupportedConfigError, open_checkpoint)
from .step import (DEFAULT_BLOCK_SIZE, BlockManager, CompiledModel, KernelNotCachedError,
                   KVCache, PagedKVCache, Request, SamplingParams, step_kernel, step_options)
from .step.kernel import CompileResult, compile_checkpoint
from .step.kernel_cache import KernelCache

__all__ = ["load", "open_checkpoint", "compile_checkpoint", "CompileResult", "Model",
           "CompiledModel", "Generation", "KVCache", "PagedKVCache", "BlockManager", "Request",
           "SamplingParams", "ModelConfig", "ARCHITECTURES", "Checkpoint", "GGUFCheckpoint",
           "KernelCache", "CheckpointError", "MissingTensorError", "UnsupportedConfigError",
           "SafetensorsError", "GGUFError", "KernelNotCachedError", "Engine", "RequestError",
           "Speculative",
           "Tokenizer", "ChatTemplateError", "step_kernel", "step_options", "DEFAULT_BLOCK_SIZE"]


def load(path, target: str = "cpu", schedule: str = "auto", workers: Optional[int] = None, *,
         dtype: Optional[str] = None, max_seq_len: Optional[int] = None,
         attention_chunk: Optional[int] = None, max_step_tokens: int = 256,
         chip: str = "sm_90a", kernels: str = "native", cache=None, kernel=None,
         progress=None, tensor_parallel: int = 1, kv_dtype: Optional[str] = None,
         kv_block_size: Optional[int] = DEFAULT_BLOCK_SIZE, kv_cache_tokens: Optional[int] = None,
         kv_cache_memory: Optional[int] = None, packed: Optional[bool] = None,
         lanes: Optional[int] = None, min_ctas: Optional[int] = None) -> Model:
    """Reads the Hugging Face checkpoint directory or GGUF file `path`,
    builds its step graph and compiles it once, or takes the compiled step
    kernel from the compile cache.

    `target`, `schedule`, `workers`, `chip` and `kernels` are those of
    `etc.compile` (`kernels="cuda"` on the CPU runs the CUDA tile kernels
    with simulated lanes, a check of the GPU code without a GPU)
    (`workers=None`: one per CPU core on the CPU). Weights and activations
    are computed in `dtype` ("f32", "f16" or "bf16"); None (the default,
    or "auto") is the checkpoint's own: the storage of a safetensors
    checkpoint's weight matrices (a bf16 checkpoint runs in bf16, never
    widened), an FP8 one's unquantized matrices' (bf16), f32 for a GGUF
    file with quantized weights (docs/models.md, "The compute dtype");
    `Model.dtype` says which. The KV caches are in `kv_dtype` (default:
    the compute dtype; "f32" keeps float32 caches for a half-precision
    model). `max_seq_len` (default: the config's max_position_embeddings)
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
    (the engine: max_num_seqs x max_model_len). Sliding-window layers have
    a pool of their own sized for the windows (docs/models.md).

    `cache`: None (default) uses the compile cache (`ETC_CACHE_DIR`, see
    `etc.models.step.kernel_cache`) unless the environment sets `ETC_CACHE=0`; True
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

    `packed`: a GGUF file's quantized weights stay in their block formats,
    and an FP8 checkpoint's e4m3 weights in fp8_e4m3 blocks (docs/models.md,
    "GGUF files", "FP8 checkpoints"): by default (None) on the CPU target
    with its native kernels; True on CUDA and with simulated GPU kernels
    too (those kernels have not run on a GPU yet); False widens them to
    `dtype` (the reference). Split over ranks, each rank keeps its share
    of the blocks: the rows of the Q, K, V, gate and up projections (and
    experts), and the K blocks of the output and down projections. An MLP
    width whose share per rank is not whole blocks of its down
    projection's format is split in whole blocks, each rank's padded with
    zero columns (`model.padded_widths`); an output projection whose K / N
    (its heads) is not whole blocks of its format (256 values for
    the K-quants, 32 for the others) is widened on every rank with
    packed=None (a RuntimeWarning and `model.widened_weights` name it and
    why) and is a ValueError naming it, its block and N with packed=True.

    `lanes` and `min_ctas` (CUDA kernels: target="cuda", or kernels="cuda"
    simulated on the CPU) are those of `etc.compile`: threads per worker
    CTA of the step kernel (default 128) and the worker's `.minnctapersm`.
    They are part of the compile cache's key, and a draft model
    (speculative decoding) takes them too: one CTA size per model. On the
    CPU's own kernels they are a ValueError naming them, as are values
    `etc.compile` refuses.

    Raises `UnsupportedConfigError`, `MissingTensorError`,
    `CheckpointError`, `GGUFError` or `SafetensorsError` naming the field,
    tensor or file at fault."""
    return Model(open_checkpoint(path), target=target, schedule=schedule, workers=workers,
                 dtype=dtype, max_seq_len=max_seq_len, attention_chunk=attention_chunk,
                 max_step_tokens=max_step_tokens, chip=chip, kernels=kernels, cache=cache,
                 kernel=kernel, progress=progress, tensor_parallel=tensor_parallel,
                 kv_dtype=kv_dtype, kv_block_size=kv_block_size, kv_cache_tokens=kv_cache_tokens,
                 kv_cache_memory=kv_cache_memory, packed=packed,
                 lanes=lanes, min_ctas=min_ctas)
