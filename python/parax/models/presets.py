"""Preset model configs, written with the field names of each family's Hugging
Face `config.json` (values as published on the Hugging Face hub for the named
checkpoint; the tiny presets are ours, for tests).
"""

# Llama 3.1 rope scaling, as in meta-llama/Llama-3.1-{8,70,405}B config.json.
_LLAMA31_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

PRESETS = {
    # --- tiny models, one per family, for tests -------------------------------
    "tiny-llama": {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False,
    },
    "tiny-qwen2": {  # Qwen2 / Qwen2.5: q/k/v biases, tied embeddings (the small ones)
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True,
        "use_sliding_window": False, "sliding_window": 128, "max_window_layers": 2,
    },
    "tiny-qwen3": {  # Qwen3: RMSNorm of each head's q and k, explicit head_dim
        "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "vocab_size": 256, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    },
    "tiny-gemma": {  # Gemma (1): 1 + w norms, scaled embeddings, GeGLU (exact GELU), MQA
        "model_type": "gemma", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "hidden_act": "gelu", "pad_token_id": 0,
    },
    "tiny-gemma2": {  # Gemma 2: soft-capped scores and logits, even layers local
        "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 24, "sliding_window": 64,
        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,  # (small: random scores cross them)
        "pad_token_id": 0,
    },
    "tiny-gemma3": {  # Gemma 3: 1 + w norms, sandwich norms, GeGLU, local and global layers
        "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},  # (the global layers')
        "query_pre_attn_scalar": 24, "sliding_window": 64, "sliding_window_pattern": 3,
        "pad_token_id": 0,
    },
    "tiny-qwen3-moe": {
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    "tiny-phi3": {  # Phi-3: fused qkv_proj and gate_up_proj; a partial rotary (Phi-4-mini's)
        "model_type": "phi3", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "max_position_embeddings": 128, "original_max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "tie_word_embeddings": False, "sliding_window": 64,
        "pad_token_id": 0,  # (transformers' default, 32000, is past this vocabulary)
    },
    "tiny-mistral": {  # a sliding window of 64: programs of up to 64 positions
        "model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "sliding_window": 64,
    },
    "tiny-gpt2": {
        "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
        "vocab_size": 256, "n_positions": 128, "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
    },
    "tiny-mixtral": {
        "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0, "num_local_experts": 4,
        "num_experts_per_tok": 2, "tie_word_embeddings": False,
    },
    "tiny-qwen2-moe": {
        "model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "num_experts": 8, "num_experts_per_tok": 2,
        "norm_topk_prob": False, "tie_word_embeddings": False,
    },
    "tiny-deepseek-v3": {
        "model_type": "deepseek_v3", "hidden_size": 64,
        "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_hidden_layers": 2, "first_k_dense_replace": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
    },
    # --- published models ------------------------------------------------------
    # Qwen2.5-72B (sizes as Qwen/Qwen2.5-72B publishes them): 72.7 B parameters.
    "qwen2.5-72b": {
        "model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "vocab_size": 152064, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 80,
    },
    # Qwen3-32B and Qwen3-235B-A22B (sizes as Qwen/Qwen3-32B and
    # Qwen/Qwen3-235B-A22B publish them): 32.8 B; 235 B, 22 B active.
    "qwen3-32b": {
        "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
        "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    },
    # Qwen3-30B-A3B (sizes as Qwen/Qwen3-30B-A3B publishes them): 30.5 B,
    # 3.3 B active.
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    "qwen3-235b-a22b": {
        "model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288,
        "moe_intermediate_size": 1536, "num_hidden_layers": 94, "num_attention_heads": 64,
        "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    # Phi-3-medium (sizes as microsoft/Phi-3-medium-4k-instruct publishes
    # them): 14 B; a sliding window of 2047.
    "phi-3-medium": {
        "model_type": "phi3", "hidden_size": 5120, "intermediate_size": 17920,
        "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 10,
        "vocab_size": 32064, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "sliding_window": 2047,
    },
    # Gemma 7B (sizes as google/gemma-7b's config.json publishes them): 8.54 B.
    "gemma-7b": {
        "model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
        "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "gelu",
    },
    # Gemma 2 9B (sizes as google/gemma-2-9b's config.json publishes them): 9.24 B.
    "gemma-2-9b": {
        "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
        "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    },
    # Gemma 3 27B's text model (sizes as google/gemma-3-27b-it's config.json
    # publishes them in its text_config): 27 B.
    "gemma-3-27b": {
        "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
        "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
        "head_dim": 128, "vocab_size": 262208, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 168, "sliding_window": 1024, "sliding_window_pattern": 6,
    },
    # Mistral Large 2 (sizes as mistralai/Mistral-Large-Instruct-2407 publishes
    # them): 123 B.
    "mistral-large-2": {
        "model_type": "mistral", "hidden_size": 12288, "intermediate_size": 28672,
        "num_hidden_layers": 88, "num_attention_heads": 96, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 32768, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "sliding_window": None,
    },
    # meta-llama/Meta-Llama-3-8B
    "llama3-8b": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False,
    },
    # meta-llama/Llama-3.1-70B
    "llama3-70b": {
        "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
        "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": _LLAMA31_ROPE_SCALING,
        "tie_word_embeddings": False,
    },
    # meta-llama/Llama-3.1-405B
    "llama3-405b": {
        "model_type": "llama", "hidden_size": 16384,
        "intermediate_size": 53248, "num_hidden_layers": 126,
        "num_attention_heads": 128, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": _LLAMA31_ROPE_SCALING, "tie_word_embeddings": False,
    },
    # meta-llama/Llama-2-7b-hf (the Llama 2 member of the family)
    "llama2-7b": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "vocab_size": 32000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False,
    },
    # GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288,
    # 96 heads, context 2048; GPT-2 BPE vocabulary of 50257), GPT-2 layout.
    # GPT-3's alternating locally banded sparse attention is not modelled.
    "gpt3-175b": {
        "model_type": "gpt2", "n_embd": 12288, "n_layer": 96, "n_head": 96,
        "vocab_size": 50257, "n_positions": 2048, "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
    },
    # mistralai/Mixtral-8x7B-v0.1
    "mixtral-8x7b": {
        "model_type": "mixtral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 32000, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
        "num_local_experts": 8, "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    # deepseek-ai/DeepSeek-V3 (its multi-token prediction module, one depth, is
    # built for a loss given --mtp-weight)
    "deepseek-v3": {
        "model_type": "deepseek_v3", "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "first_k_dense_replace": 3,
        "num_attention_heads": 128, "num_key_value_heads": 128,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "beta_fast": 32, "beta_slow": 1, "factor": 40,
            "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096, "type": "yarn",
        },
        "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
    },
}
