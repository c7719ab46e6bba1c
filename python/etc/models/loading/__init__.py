"""Loading a model: checkpoint formats (Hugging Face directories of
safetensors files, GGUF files), the model's configuration (`ModelConfig`)
and its tokenizer and chat template. Nothing here compiles or runs."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import Checkpoint, CheckpointError, MissingTensorError
from .config import ARCHITECTURES, ModelConfig, UnsupportedConfigError
from .gguf import GGUFCheckpoint, GGUFError, is_gguf
from .safetensors import SafetensorsError
from .tokenizer import ChatTemplateError, Tokenizer

__all__ = ["open_checkpoint", "Checkpoint", "GGUFCheckpoint", "CheckpointError",
           "MissingTensorError", "ModelConfig", "ARCHITECTURES", "UnsupportedConfigError",
           "GGUFError", "is_gguf", "SafetensorsError", "Tokenizer", "ChatTemplateError"]


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
