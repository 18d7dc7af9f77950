"""The GPT-style Hugging Face families: GPT-2 (learned positions, Conv1D weights stored
``[in, out]``, fused ``c_attn``), GPT-NeoX/Pythia (partial rotary, parallel or sequential residual,
per-head fused q/k/v) and GPT-J (interleaved partial rotary, one norm feeding attention and MLP,
an output bias).
"""

from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from .fields import (
    ACTIVATIONS_OUT,
    all_biases,
    build_config,
    check_heads,
    need,
    read_activation,
    read_tie,
    rope_options,
)
from .files import HFConfig, HFWeights
from .links import OLD_BUFFERS, TOKEN_TABLE, Family, Link, no_export, norm_links

__all__ = ["GPT2", "GPTJ", "GPT_NEOX"]


def _neox_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("hidden_size"), c.int("num_attention_heads")
    check_heads(c, d, h)
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    partial = (
        {}
        if isinstance(params, dict) and "partial_rotary_factor" in params
        else {"rotary_pct": c.float("rotary_pct", "partial_rotary_factor", default=0.25)}
    )
    bias = w.has("gpt_neox.layers.0.attention.query_key_value.bias")
    w.rename("embed_out.weight", "lm_head.weight")
    return build_config(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("num_hidden_layers"),
        num_heads=h,
        d_ff=c.int("intermediate_size"),
        position="rope",
        position_options=rope_options(c, d // h, **partial),
        max_len=c.int("max_position_embeddings", default=2048),
        norm_eps=c.float("layer_norm_eps", default=1e-5),
        activation=read_activation(c, "hidden_act", default="gelu"),
        embed_scale=None,
        tie=read_tie(c, default=False),
        bias=True,
        qkv_bias=bias,
        out_bias=bias,
        residual="parallel" if c.bool("use_parallel_residual", default=True) else "sequential",
    )


def _neox_links(cfg: ModelConfig) -> list[Link]:
    b, m = "decoder.blocks.{i}.", "gpt_neox.layers.{i}."
    qkv = tuple(b + f"attn.{n}_proj" for n in "qkv")
    links = [
        Link("gpt_neox.embed_in.weight", (TOKEN_TABLE,)),
        *norm_links("gpt_neox.final_layer_norm", "decoder.norm"),
    ]
    links += [
        *norm_links(m + "input_layernorm", b + "norm1"),
        *norm_links(m + "post_attention_layernorm", b + "norm2"),
    ]
    for s in ("weight", "bias") if cfg.projection_bias("qkv") else ("weight",):
        links.append(
            Link(m + f"attention.query_key_value.{s}", tuple(f"{p}.{s}" for p in qkv), "heads", cfg.num_heads)
        )
        links.append(Link(m + f"attention.dense.{s}", (b + f"attn.o_proj.{s}",)))
    for s in ("weight", "bias"):
        links += [
            Link(m + f"mlp.dense_h_to_4h.{s}", (b + f"mlp.up.{s}",)),
            Link(m + f"mlp.dense_4h_to_h.{s}", (b + f"mlp.down.{s}",)),
        ]
    if cfg.tie == "none":
        links.append(Link("lm_head.weight", ("lm_head.weight",)))  # "embed_out.weight" in older files
    return links


def _need_gpt_block(cfg: ModelConfig, name: str) -> None:
    """What GPT-2 and GPT-NeoX blocks share, each a ``ValueError`` naming the family otherwise: heads
    of ``d_model / num_heads`` dims, pre-LayerNorm, a plain MLP, no grouped-query attention, and no
    q/k, embedding or output norm/bias, and no sliding window."""
    need(cfg.d_head is None, name, "has heads of d_model / num_heads dims (d_head=None)")
    need(cfg.norm_type == "layernorm" and cfg.norm == "pre", name, "needs norm_type='layernorm', norm='pre'")
    need(not cfg.gated_mlp, name, "has a plain MLP")
    need(cfg.kv_heads == cfg.num_heads, name, "has no grouped-query attention")
    need(
        not cfg.qk_norm and not cfg.embed_norm and not cfg.output_bias,
        name,
        "has no q/k, embedding or output norm/bias",
    )
    need(cfg.sliding_window is None, name, "has no sliding-window attention")


def _neox_out(cfg: ModelConfig) -> dict[str, Any]:
    name = "gpt_neox"
    _need_gpt_block(cfg, name)
    need(cfg.residual != "parallel_shared_norm", name, "has two norms per block")
    return {
        "model_type": name,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "hidden_act": ACTIVATIONS_OUT[cfg.activation],
        "layer_norm_eps": cfg.norm_eps,
        "use_parallel_residual": cfg.residual == "parallel",
        "attention_bias": True,
    }


def _gpt2_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("n_embd", "hidden_size"), c.int("n_head", "num_attention_heads")
    check_heads(c, d, h)
    if not c.bool("scale_attn_weights", default=True) or c.bool(
        "scale_attn_by_inverse_layer_idx", default=False
    ):
        raise ValueError(
            f"{c.source}: posenc scales attention logits by 1/sqrt(d_h) only; this config sets "
            "scale_attn_weights=false or scale_attn_by_inverse_layer_idx=true"
        )
    if c.bool("add_cross_attention", default=False):
        raise ValueError(f"{c.source}: add_cross_attention=true is not a decoder-only GPT-2")
    return build_config(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("n_layer", "num_hidden_layers"),
        num_heads=h,
        d_ff=c.int("n_inner", default=4 * d),
        position="learned",
        max_len=c.int("n_positions", "max_position_embeddings", default=1024),
        norm_eps=c.float("layer_norm_epsilon", default=1e-5),
        activation=read_activation(c, "activation_function", default="gelu_new"),
        embed_scale=None,
        tie=read_tie(c, default=True),
        bias=True,
    )


def _gpt2_links(cfg: ModelConfig) -> list[Link]:
    b, m = "decoder.blocks.{i}.", "transformer.h.{i}."
    qkv = tuple(b + f"attn.{n}_proj" for n in "qkv")
    links = [
        Link("transformer.wte.weight", (TOKEN_TABLE,)),
        Link("transformer.wpe.weight", ("decoder.embed.position.weight",)),
    ]
    links += [
        *norm_links("transformer.ln_f", "decoder.norm"),
        *norm_links(m + "ln_1", b + "norm1"),
        *norm_links(m + "ln_2", b + "norm2"),
    ]
    for s in ("weight", "bias"):
        how = "transpose" if s == "weight" else "same"
        links += [
            Link(m + f"attn.c_attn.{s}", tuple(f"{p}.{s}" for p in qkv), "transpose_rows"),
            Link(m + f"attn.c_proj.{s}", (b + f"attn.o_proj.{s}",), how),
            Link(m + f"mlp.c_fc.{s}", (b + f"mlp.up.{s}",), how),
            Link(m + f"mlp.c_proj.{s}", (b + f"mlp.down.{s}",), how),
        ]
    if cfg.tie == "none":
        links.append(Link("lm_head.weight", ("lm_head.weight",)))
    return links


def _gpt2_out(cfg: ModelConfig) -> dict[str, Any]:
    name = "gpt2"
    _need_gpt_block(cfg, name)
    need(cfg.residual == "sequential", name, "has a sequential block")
    return {
        "model_type": name,
        "n_embd": cfg.d_model,
        "n_inner": cfg.ffn_dim,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_positions": cfg.max_len,
        "activation_function": ACTIVATIONS_OUT[cfg.activation],
        "layer_norm_epsilon": cfg.norm_eps,
    }


def _gptj_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("n_embd", "hidden_size"), c.int("n_head", "num_attention_heads")
    check_heads(c, d, h)
    rotary_dim = c.int("rotary_dim", default=d // h, maximum=d // h)
    return build_config(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("n_layer", "num_hidden_layers"),
        num_heads=h,
        d_ff=c.int("n_inner", default=4 * d),
        position="rope",
        position_options=rope_options(c, d // h, rotary_dim=rotary_dim),
        max_len=c.int("n_positions", "max_position_embeddings", default=2048),
        norm_eps=c.float("layer_norm_epsilon", default=1e-5),
        activation=read_activation(c, "activation_function", default="gelu_new"),
        embed_scale=None,
        tie=read_tie(c, default=False),
        qkv_bias=False,
        out_bias=False,
        mlp_bias=True,
        residual="parallel_shared_norm",
        output_bias=w.has("lm_head.bias"),
    )


def _gptj_links(cfg: ModelConfig) -> list[Link]:
    b, m = "decoder.blocks.{i}.", "transformer.h.{i}."
    links = [
        Link("transformer.wte.weight", (TOKEN_TABLE,)),
        *norm_links("transformer.ln_f", "decoder.norm"),
        *norm_links(m + "ln_1", b + "norm1"),
    ]
    links += [Link(m + f"attn.{n}_proj.weight", (b + f"attn.{n}_proj.weight",)) for n in "qkv"]
    links.append(Link(m + "attn.out_proj.weight", (b + "attn.o_proj.weight",)))
    for s in ("weight", "bias"):
        links += [
            Link(m + f"mlp.fc_in.{s}", (b + f"mlp.up.{s}",)),
            Link(m + f"mlp.fc_out.{s}", (b + f"mlp.down.{s}",)),
        ]
    if cfg.tie == "none":
        links.append(Link("lm_head.weight", ("lm_head.weight",)))
    if cfg.output_bias:
        links.append(Link("lm_head.bias", ("lm_head.bias",)))
    return links


GPT_NEOX = Family(
    "gpt_neox", ("gpt_neox",), _neox_in, _neox_links, _neox_out, all_biases, "GPTNeoXForCausalLM", OLD_BUFFERS
)
GPT2 = Family("gpt2", ("gpt2",), _gpt2_in, _gpt2_links, _gpt2_out, all_biases, "GPT2LMHeadModel", OLD_BUFFERS)
GPTJ = Family(
    "gptj", ("gptj",), _gptj_in, _gptj_links, no_export("gptj"), lambda c: c, "GPTJForCausalLM", OLD_BUFFERS
)
