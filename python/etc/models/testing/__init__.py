"""Tiny random checkpoints, written with NumPy: what ETC's tests, examples
and benchmarks load without downloading anything. `checkpoints` writes them
as Hugging Face directories (config.json, safetensors, tokenizer.json),
`gguf_writer` as llama.cpp's GGUF files; every name is importable from
here (`etc.models.testing.write_gguf`, `.tiny_config`, ...)."""

from .checkpoints import (CHAT_TEMPLATE, GRANITE_MULTIPLIERS, MULTIMODAL, SHAPES, TEXT,
                          as_multimodal, as_transformers5, checkpoint_tensors, fuse_experts,
                          multimodal_tensors, quantize_fp8, shaped_config, tensor_shapes,
                          tiny_config, write_checkpoint, write_tokenizer, write_transformers5)
from .gguf_writer import gguf_tensor_name, write_gguf

__all__ = ["tiny_config", "as_transformers5", "tensor_shapes", "write_checkpoint", "write_gguf",
           "gguf_tensor_name", "checkpoint_tensors", "write_tokenizer", "CHAT_TEMPLATE", "TEXT",
           "shaped_config", "SHAPES", "quantize_fp8", "GRANITE_MULTIPLIERS", "MULTIMODAL",
           "as_multimodal", "multimodal_tensors", "fuse_experts", "write_transformers5"]
