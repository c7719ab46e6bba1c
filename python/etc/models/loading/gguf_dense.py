"""What the GGUF metadata of EXAONE 4 (`exaone4`), Seed-OSS (`seed_oss`)
and Hunyuan dense (`hunyuan-dense`) says as config.json fields
(`families_dense`), for `GGUFCheckpoint._hf_config`.

llama.cpp's converter writes EXAONE 4's window and per-layer sliding flags
as keys and its llama3 RoPE as frequency factors (`rope_freqs.weight`,
read with the weights); Hunyuan's NTK-alpha RoPE folded into
`rope.freq_base`; Seed-OSS's biases as tensors. None of the three has its
Q and K rows permuted (NEOX-style RoPE, rotate_half's pairs)."""

from __future__ import annotations

from .families_dense import EXAONE4, HUNYUAN_DENSE, SEED_OSS
from .fields import UnsupportedConfigError

__all__ = ["ARCHITECTURES", "EXAONE4_LLAMA_CPP_32B", "config"]

#: GGUF `general.architecture` -> Hugging Face architecture.
ARCHITECTURES = {"exaone4": EXAONE4, "seed_oss": SEED_OSS, "hunyuan-dense": HUNYUAN_DENSE}
#: What llama.cpp fixes for an `exaone4` file of EXAONE-4.0-32B's 64 layers
#: without window keys: a window of 4096 on all but every 4th layer.
EXAONE4_LLAMA_CPP_32B = (64, 4096, 4)


def config(ckpt, fields: dict) -> dict:
    """The config.json fields of `ckpt`'s metadata and tensors beyond the
    common ones in `fields`: EXAONE 4's window (`attention.sliding_window`,
    on the layers `attention.sliding_window_pattern` flags, else on all but
    every 4th, Exaone4Config's default pattern; without a window, every
    layer full with RoPE, but for llama.cpp's rule for 64 layers,
    `EXAONE4_LLAMA_CPP_32B`); Seed-OSS's q/k/v and o biases where the file
    has them, its head size hidden / heads unless `attention.key_length`
    says otherwise (llama.cpp's, where SeedOssConfig's default is 128)."""
    a = ckpt.architecture
    if a == "exaone4":
        layers = fields["num_hidden_layers"]
        window = ckpt._key("attention.sliding_window") or None
        flags = ckpt._key("attention.sliding_window_pattern")
        count, default_window, pattern = EXAONE4_LLAMA_CPP_32B
        if window is None and layers == count:
            window = default_window
        if window is None:
            return {"sliding_window": None}
        if not isinstance(flags, list):
            flags = [(i + 1) % pattern != 0 for i in range(layers or 0)]
        if isinstance(layers, int) and len(flags) != layers:
            raise UnsupportedConfigError(
                f"{ckpt.path}: GGUF metadata exaone4.attention.sliding_window_pattern has "
                f"{len(flags)} flags for {layers} layers")
        return {"sliding_window": window,
                "layer_types": ["sliding_attention" if flag else "full_attention"
                                for flag in flags]}
    if a == "seed_oss":
        out = {"attention_bias": "blk.0.attn_q.bias" in ckpt._tensors,
               "attention_out_bias": "blk.0.attn_output.bias" in ckpt._tensors}
        if ckpt._key("attention.key_length") is None and fields["hidden_size"] and \
                fields["num_attention_heads"]:
            out["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
        return out
    return {}
