"""The widths of real models (from their published config.json), for
checks and benchmarks at real sizes with few layers and random weights:
`checkpoints.shaped_config(name, layers)` builds a config from one."""

#: The widths of real models (from their published config.json), for
#: checks and benchmarks at real sizes with few layers and random weights.
SHAPES = {
    "llama-3.2-1b": dict(
        architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=2048,
        intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=True, rope_scaling={
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "gemma-3-1b": dict(
        architecture="Gemma3ForCausalLM", vocab_size=262144, hidden_size=1152,
        intermediate_size=6912, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, rope_scaling=None, sliding_window=512,
        sliding_window_pattern=6, query_pre_attn_scalar=256, tie_word_embeddings=True),
    "phi-3-mini-4k": dict(
        architecture="Phi3ForCausalLM", vocab_size=32064, hidden_size=3072,
        intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
        max_position_embeddings=4096, original_max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=2047, tie_word_embeddings=False,
        head_dim=None),
    # (Phi-4-mini's LongRoPE factors: 48 per set, as published; the values
    # here are not the published ones.)
    "phi-4-mini": dict(
        architecture="Phi3ForCausalLM", vocab_size=200064, hidden_size=3072,
        intermediate_size=8192, num_attention_heads=24, num_key_value_heads=8,
        max_position_embeddings=131072, original_max_position_embeddings=4096,
        partial_rotary_factor=0.75, rms_norm_eps=1e-5, rope_theta=10000.0,
        sliding_window=262144, tie_word_embeddings=True, head_dim=None,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 48 for i in range(48)],
                      "long_factor": [1.0 + i for i in range(48)]}),
    "smollm3-3b": dict(
        architecture="SmolLM3ForCausalLM", vocab_size=128256, hidden_size=2048,
        intermediate_size=11008, num_attention_heads=16, num_key_value_heads=4, head_dim=None,
        max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=5000000.0,
        tie_word_embeddings=True, no_rope_layer_interval=4, no_rope_layers=None,
        use_sliding_window=False, sliding_window=None),
    "qwen2.5-0.5b": dict(
        architecture="Qwen2ForCausalLM", vocab_size=151936, hidden_size=896,
        intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768,
        max_window_layers=24, head_dim=None),
    "qwen3-0.6b": dict(
        architecture="Qwen3ForCausalLM", vocab_size=151936, hidden_size=1024,
        intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True),
    "qwen3-30b-a3b": dict(
        architecture="Qwen3MoeForCausalLM", vocab_size=151936, hidden_size=2048,
        intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True),
    "qwen1.5-moe-a2.7b": dict(
        architecture="Qwen2MoeForCausalLM", vocab_size=151936, hidden_size=2048,
        intermediate_size=5632, num_attention_heads=16, num_key_value_heads=16, head_dim=None,
        max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, num_experts=60, num_experts_per_tok=4,
        moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
        norm_topk_prob=False, use_sliding_window=False),
    "granite-3.3-8b": dict(
        architecture="GraniteForCausalLM", vocab_size=49159, hidden_size=4096,
        intermediate_size=12800, num_attention_heads=32, num_key_value_heads=8, head_dim=None,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=10000000.0,
        tie_word_embeddings=True, embedding_multiplier=12.0, attention_multiplier=0.0078125,
        residual_multiplier=0.22, logits_scaling=16.0),
    "mixtral-8x7b": dict(
        architecture="MixtralForCausalLM", vocab_size=32000, hidden_size=4096,
        intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=None,
        max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
        sliding_window=None, tie_word_embeddings=False, num_local_experts=8,
        num_experts_per_tok=2),
    "gpt-oss-20b": dict(
        architecture="GptOssForCausalLM", vocab_size=201088, hidden_size=2880,
        intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=150000.0,
        tie_word_embeddings=False, num_local_experts=32, num_experts_per_tok=4,
        sliding_window=128, layer_types=None,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                      "beta_slow": 1.0, "truncate": False,
                      "original_max_position_embeddings": 4096}),
    "olmo-2-1b": dict(
        architecture="Olmo2ForCausalLM", vocab_size=100352, hidden_size=2048,
        intermediate_size=8192, num_attention_heads=16, num_key_value_heads=16, head_dim=None,
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=500000.0,
        tie_word_embeddings=False),
    "glm-4-9b": dict(
        architecture="Glm4ForCausalLM", vocab_size=151552, hidden_size=4096,
        intermediate_size=13696, num_attention_heads=32, num_key_value_heads=2, head_dim=128,
        max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0,
        partial_rotary_factor=0.5, tie_word_embeddings=False),
    # (MLA: heads of 128 + 64 for q and k, v 128, a latent of 512; 64
    # experts by softmax, 2 shared, layer 0 dense.)
    "deepseek-v2-lite": dict(
        architecture="DeepseekV2ForCausalLM", vocab_size=102400, hidden_size=2048,
        intermediate_size=10944, num_attention_heads=16, num_key_value_heads=16,
        max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6,
        n_shared_experts=2, moe_intermediate_size=1408, first_k_dense_replace=1, n_group=1,
        topk_group=1, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
        routed_scaling_factor=1.0,
        rope_scaling={"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
                      "mscale": 0.707, "mscale_all_dim": 0.707,
                      "original_max_position_embeddings": 4096}),
}
