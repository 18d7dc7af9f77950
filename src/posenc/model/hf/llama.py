"""The Llama-shaped Hugging Face families: Llama, Mistral, Qwen2, Qwen3 (RMSNorm, SwiGLU, RoPE with
every HF rope type, GQA, biases per projection, Qwen3's q/k norm) and Phi-3 (the same block with
fused ``qkv_proj`` and ``gate_up_proj``, LongRoPE).
"""

from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from .fields import (
    ACTIVATIONS_OUT,
    build_config,
    check_heads,
    need,
    read_activation,
    read_sliding_window,
    read_tie,
    rope_options,
)
from .files import HFConfig, HFWeights
from .links import OLD_BUFFERS, TOKEN_TABLE, Family, Link, no_export

__all__ = ["LLAMA", "PHI3"]


def _llama_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    fused = c.get("model_type") == "phi3"
    d, h = c.int("hidden_size"), c.int("num_attention_heads")
    check_heads(c, d, h)
    head_dim = c.int("head_dim", default=d // h)  # Qwen3-0.6B: 16 heads of 128 in a width of 1024
    max_len = c.int("max_position_embeddings", default=2048)
    layers = c.int("num_hidden_layers")
    q = "self_attn.qkv_proj" if fused else "self_attn.q_proj"
    return build_config(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=layers,
        num_heads=h,
        num_kv_heads=c.int("num_key_value_heads", default=h),
        d_ff=c.int("intermediate_size"),
        position="rope",
        position_options=rope_options(c, head_dim),
        d_head=None if head_dim == d // h else head_dim,
        max_len=max_len,
        norm_type="rmsnorm",
        norm_eps=c.float("rms_norm_eps", default=1e-6),
        activation=read_activation(c, "hidden_act", default="silu"),
        gated_mlp=True,
        embed_scale=None,
        tie=read_tie(c, default=False),  # LlamaConfig, Mistral, Qwen2/3 and Phi-3 default to untied
        qkv_bias=w.has(f"model.layers.0.{q}.bias"),
        out_bias=w.has("model.layers.0.self_attn.o_proj.bias"),
        mlp_bias=w.has("model.layers.0.mlp.down_proj.bias"),
        qk_norm=w.has("model.layers.0.self_attn.q_norm.weight"),
        sliding_window=read_sliding_window(c, layers),
    )


def _llama_links(cfg: ModelConfig, fused: bool = False) -> list[Link]:
    b = "decoder.blocks.{i}."
    m = "model.layers.{i}."
    links = [
        Link("model.embed_tokens.weight", (TOKEN_TABLE,)),
        Link("model.norm.weight", ("decoder.norm.weight",)),
    ]
    suffixes = ("weight", "bias") if cfg.projection_bias("qkv") else ("weight",)
    for s in suffixes:
        if fused:
            links.append(
                Link(m + f"self_attn.qkv_proj.{s}", tuple(b + f"attn.{n}_proj.{s}" for n in "qkv"), "rows")
            )
        else:
            links += [Link(m + f"self_attn.{n}_proj.{s}", (b + f"attn.{n}_proj.{s}",)) for n in "qkv"]
    for s in ("weight", "bias") if cfg.projection_bias("out") else ("weight",):
        links.append(Link(m + f"self_attn.o_proj.{s}", (b + f"attn.o_proj.{s}",)))
    for s in ("weight", "bias") if cfg.projection_bias("mlp") else ("weight",):
        if fused:
            links.append(Link(m + f"mlp.gate_up_proj.{s}", (b + f"mlp.gate.{s}", b + f"mlp.up.{s}"), "rows"))
        else:
            links += [Link(m + f"mlp.{n}_proj.{s}", (b + f"mlp.{n}.{s}",)) for n in ("gate", "up")]
        links.append(Link(m + f"mlp.down_proj.{s}", (b + f"mlp.down.{s}",)))
    links += [
        Link(m + "input_layernorm.weight", (b + "norm1.weight",)),
        Link(m + "post_attention_layernorm.weight", (b + "norm2.weight",)),
    ]
    if cfg.qk_norm:
        links += [Link(m + f"self_attn.{n}_norm.weight", (b + f"attn.{n}_norm.weight",)) for n in "qk"]
    if cfg.tie == "none":
        links.append(Link("lm_head.weight", ("lm_head.weight",)))
    return links


def _llama_out(cfg: ModelConfig) -> dict[str, Any]:
    name = (
        "qwen3"
        if cfg.qk_norm
        else "qwen2"
        if cfg.projection_bias("qkv") and not cfg.projection_bias("out")
        else "llama"
    )
    if name == "llama" and cfg.sliding_window is not None:  # Llama with a window: Mistral
        name = "mistral"
        need(
            not cfg.projection_bias("qkv")
            and not cfg.projection_bias("out")
            and not cfg.projection_bias("mlp"),
            name,
            "(a Llama block with sliding_window) has no biases",
        )
    need(cfg.norm_type == "rmsnorm" and cfg.norm == "pre", name, "needs norm_type='rmsnorm', norm='pre'")
    need(cfg.gated_mlp and cfg.residual == "sequential", name, "needs gated_mlp=True, residual='sequential'")
    need(not cfg.embed_norm and not cfg.output_bias, name, "has no embedding norm and no output bias")
    if name == "llama":
        need(
            cfg.projection_bias("qkv") == cfg.projection_bias("out"), name, "attention biases are all or none"
        )
    if name == "qwen2":
        need(not cfg.projection_bias("mlp"), name, "has no MLP biases")
    if name == "qwen3":
        need(
            cfg.projection_bias("qkv") == cfg.projection_bias("out") and not cfg.projection_bias("mlp"),
            name,
            "attention biases are all or none, and no MLP biases",
        )
    out = {
        "model_type": name,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": ACTIVATIONS_OUT[cfg.activation],
        "rms_norm_eps": cfg.norm_eps,
    }
    if name in ("llama", "qwen3"):
        out["attention_bias"] = cfg.projection_bias("qkv")
    if name == "llama":
        out["mlp_bias"] = cfg.projection_bias("mlp")
    if name == "mistral":
        out["sliding_window"] = cfg.sliding_window
    elif name in ("qwen2", "qwen3"):  # every layer windowed, or none
        out["use_sliding_window"] = cfg.sliding_window is not None
        out["sliding_window"] = cfg.sliding_window
        out["max_window_layers"] = 0
    return out


def _same(config: ModelConfig) -> ModelConfig:
    return config


LLAMA = Family(
    "llama",
    ("llama", "mistral", "qwen2", "qwen3"),
    _llama_in,
    _llama_links,
    _llama_out,
    _same,
    {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    },
    OLD_BUFFERS,
)
PHI3 = Family(
    "phi3",
    ("phi3",),
    _llama_in,
    lambda c: _llama_links(c, fused=True),
    no_export("phi3"),
    _same,
    "Phi3ForCausalLM",
    OLD_BUFFERS,
)
