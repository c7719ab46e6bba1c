"""LLM inference: Hugging Face checkpoints compiled into one step kernel.

```python
import etc.models
model = etc.models.load("path/to/Qwen3-0.6B", target="cpu")
out = model.generate([[151644, 872], [9707]], max_new_tokens=16, return_logits=True)
out.tokens        # the new ids, per prompt
out.logits[0]     # (16, vocab) float32: what each new token was chosen from
model.kernels     # [the step kernel]: one, for every batch and length
```

Supported: `LlamaForCausalLM`, `Qwen3ForCausalLM` and `Qwen3MoeForCausalLM`
checkpoint directories (config.json and *.safetensors with F32, F16 or BF16
weights under the usual names). See docs/models.md.
"""

from __future__ import annotations

from typing import Optional

from .checkpoint import Checkpoint, CheckpointError, MissingTensorError
from .config import ARCHITECTURES, ModelConfig, UnsupportedConfigError
from .model import Generation, KVCache, Model, Request
from .safetensors import SafetensorsError

__all__ = ["load", "Model", "Generation", "KVCache", "Request", "ModelConfig", "ARCHITECTURES",
           "CheckpointError", "MissingTensorError", "UnsupportedConfigError", "SafetensorsError"]


def load(path, target: str = "cpu", schedule: str = "auto", workers: Optional[int] = None, *,
         dtype: str = "f32", max_seq_len: Optional[int] = None,
         attention_chunk: Optional[int] = None, max_step_tokens: int = 256,
         chip: str = "sm_90a", kernels: str = "native") -> Model:
    """Reads the Hugging Face checkpoint directory `path` (config.json and
    *.safetensors), builds its step graph and compiles it once.

    `target`, `schedule`, `workers`, `chip` and `kernels` are those of
    `etc.compile` (`kernels="cuda"` on the CPU runs the CUDA tile kernels
    with simulated lanes, a check of the GPU code without a GPU)
    (`workers=None`: one per CPU core on the CPU). Weights and activations
    are computed in `dtype` ("f32", "f16" or "bf16"; the KV caches are
    float32). `max_seq_len` (default: the config's max_position_embeddings)
    bounds prompt + new tokens; `attention_chunk` is the KV positions per
    attention chunk task (default: max_seq_len / 16, at least 16);
    `max_step_tokens` bounds the new tokens of one step (longer prefills
    take several steps). Raises `UnsupportedConfigError`,
    `MissingTensorError`, `CheckpointError` or `SafetensorsError` naming
    the field, tensor or file at fault."""
    return Model(Checkpoint(path), target=target, schedule=schedule, workers=workers,
                 dtype=dtype, max_seq_len=max_seq_len, attention_chunk=attention_chunk,
                 max_step_tokens=max_step_tokens, chip=chip, kernels=kernels)
