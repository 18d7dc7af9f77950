"""Tiny random Hugging Face models of each family posenc converts (test-only; needs transformers).

Each entry builds a ``transformers`` config with a few layers of width 64; the models are random,
so logits compare the whole computation. Built on demand: importing this module needs no
transformers.
"""

from __future__ import annotations

from typing import Any

V = 97

#: the shape most entries share: width 64, 2 layers, 4 heads
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
ROPE = {"rope_theta": 10000.0}

#: name -> (config class name, kwargs). Variants cover GQA ratios, biases, rope types, partial
#: factors and both residual forms.
FAMILY_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {**SMALL, "num_key_value_heads": 2}),
    "llama_mha_biases": (
        "LlamaConfig",
        {
            **SMALL,
            "hidden_size": 48,
            "num_attention_heads": 3,
            "attention_bias": True,
            "mlp_bias": True,
            "tie_word_embeddings": False,
        },
    ),
    "llama_linear": (
        "LlamaConfig",
        {
            **SMALL,
            "num_key_value_heads": 1,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        },
    ),
    "llama_dynamic": (
        "LlamaConfig",
        {
            **SMALL,
            "max_position_embeddings": 8,
            "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, **ROPE},
        },
    ),
    "llama_yarn": (
        "LlamaConfig",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                **ROPE,
            },
        },
    ),
    "llama3": (
        "LlamaConfig",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "rope_theta": 500000.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "mistral": (
        "MistralConfig",
        {**SMALL, "num_attention_heads": 8, "num_key_value_heads": 2, "sliding_window": None},
    ),
    # sliding windows shorter than the tests' 12 tokens, so the band hides keys in prefill and decoding
    "mistral_window": (
        "MistralConfig",
        {**SMALL, "num_attention_heads": 8, "num_key_value_heads": 2, "sliding_window": 4},
    ),
    "qwen2": ("Qwen2Config", {**SMALL, "num_key_value_heads": 1}),
    "qwen2_window": (
        "Qwen2Config",
        {
            **SMALL,
            "num_key_value_heads": 1,
            "use_sliding_window": True,
            "sliding_window": 5,
            "max_window_layers": 0,
        },
    ),
    "qwen3": ("Qwen3Config", {**SMALL, "num_key_value_heads": 2, "head_dim": 16}),
    "qwen3_wide_heads": ("Qwen3Config", {**SMALL, "num_key_value_heads": 2, "head_dim": 32}),
    "phi3": (
        "Phi3Config",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "pad_token_id": 0,
            "max_position_embeddings": 64,
            "original_max_position_embeddings": 64,
        },
    ),
    "phi3_window": (
        "Phi3Config",
        {**SMALL, "pad_token_id": 0, "max_position_embeddings": 64, "sliding_window": 3},
    ),
    "phi3_longrope": (
        "Phi3Config",
        {
            **SMALL,
            "pad_token_id": 0,
            "max_position_embeddings": 64,
            "original_max_position_embeddings": 8,
            "rope_parameters": {
                "rope_type": "longrope",
                **ROPE,
                "short_factor": [1.0 + i / 8 for i in range(8)],
                "long_factor": [2.0 + i / 4 for i in range(8)],
            },
        },
    ),
    "gpt_neox": ("GPTNeoXConfig", dict(SMALL)),
    "gpt_neox_sequential": (
        "GPTNeoXConfig",
        {
            **SMALL,
            "num_attention_heads": 2,
            "use_parallel_residual": False,
            "rotary_pct": 0.5,
            "tie_word_embeddings": True,
        },
    ),
    "gpt2": ("GPT2Config", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64}),
    "gptj": ("GPTJConfig", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "rotary_dim": 8}),
    "bloom": ("BloomConfig", {"hidden_size": 64, "n_layer": 2, "n_head": 4}),
    "bloom_6_heads": ("BloomConfig", {"hidden_size": 48, "n_layer": 2, "n_head": 6}),
}


def hf_model(name: str, seed: int = 0):
    """A random eval-mode ``AutoModelForCausalLM`` of the entry ``name``, float32."""
    import torch
    import transformers

    cls_name, kwargs = FAMILY_CONFIGS[name]
    config = getattr(transformers, cls_name)(vocab_size=V, bos_token_id=None, eos_token_id=None, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms start at ones and biases at zero: randomise them so they count
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model
