"""Hugging Face model families and posenc's model, both ways: for each family, how its
``config.json`` becomes a :class:`~posenc.model.ModelConfig` and back, and how each of its tensors
maps onto posenc's (:class:`Link`).

A family adapter is where an HF architecture's choices are written down once: Llama, Mistral,
Qwen2/Qwen3 and Phi-3 (RMSNorm, SwiGLU, RoPE with every HF rope type, GQA, q/k norm, Phi-3's fused
projections), GPT-NeoX/Pythia (partial rotary, parallel residual, per-head fused q/k/v), GPT-2
(learned positions, Conv1D weights), GPT-J (interleaved partial rotary, one norm for a parallel
block, an output bias) and Bloom (ALiBi, an embedding LayerNorm). The positional scheme each HF
architecture implements is named here, as the registry names schemes: an adapter describes one
fixed architecture.

Legend: ``V`` vocabulary, ``d`` model width, ``h`` heads, ``h_kv`` key/value heads, ``d_h`` head
width, ``f`` MLP width, ``L`` layers.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..rotary.hf import hf_rope_config
from .config import ModelConfig
from .hf_files import HFConfig, HFWeights

__all__ = ["FAMILIES", "TOKEN_TABLE", "Family", "Link", "expand", "family_for", "rope_parameters_out"]

#: HF activation names -> ``ModelConfig.activation``.
_ACTIVATIONS_IN = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
#: ``ModelConfig.activation`` -> the HF name written on export.
_ACTIVATIONS_OUT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
#: The posenc name of the token table.
TOKEN_TABLE = "decoder.embed.token.weight"


@dataclass(frozen=True)
class Link:
    """One HF tensor and the posenc tensor(s) it holds.

    Attributes:
        hf: the HF name (``{i}`` = layer index).
        posenc: the posenc name(s) (``{i}`` = layer index).
        how: ``"same"``; ``"transpose"`` (GPT-2's Conv1D stores ``[in, out]``); ``"rows"`` (the
            parts stacked along dim 0: Phi-3's ``qkv_proj``); ``"transpose_rows"`` (GPT-2's
            ``c_attn``); ``"heads"`` (per head ``[q_h; k_h; v_h]``: GPT-NeoX, Bloom).
        heads: ``h`` for ``"heads"``.
    """

    hf: str
    posenc: tuple[str, ...]
    how: str = "same"
    heads: int = 0

    def hf_shape(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The HF tensor's shape given its posenc parts' shapes."""
        if self.how == "transpose" or self.how == "transpose_rows":
            rows = sum(s[0] for s in shapes)
            return (shapes[0][1], rows) if len(shapes[0]) == 2 else (rows,)
        if self.how in ("rows", "heads"):
            return (sum(s[0] for s in shapes), *shapes[0][1:])
        return shapes[0]

    def to_posenc(self, t: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        if self.how == "same":
            return [t]
        if self.how == "transpose" or (self.how == "transpose_rows" and t.dim() == 1):
            return [t.t()] if self.how == "transpose" else list(t.split([s[0] for s in shapes]))
        if self.how == "transpose_rows":
            return list(t.t().split([s[0] for s in shapes]))
        if self.how == "rows":
            return list(t.split([s[0] for s in shapes]))
        per_head = t.unflatten(0, (self.heads, len(shapes), -1))  # [h, n, d_h, ...]
        return [per_head[:, j].flatten(0, 1) for j in range(len(shapes))]

    def to_hf(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if self.how == "same":
            return parts[0]
        if self.how == "transpose":
            return parts[0].t()
        if self.how == "transpose_rows":
            joined = torch.cat(parts)
            return joined.t() if joined.dim() == 2 else joined
        if self.how == "rows":
            return torch.cat(parts)
        return torch.stack([p.unflatten(0, (self.heads, -1)) for p in parts], dim=1).flatten(0, 2)


@dataclass(frozen=True)
class Family:
    """One HF architecture.

    Attributes:
        name: the ``model_type`` it writes (export).
        model_types: the ``model_type`` values it reads.
        config_in: ``(HFConfig, HFWeights) -> ModelConfig`` (the weights answer which biases exist).
        links: ``ModelConfig -> [Link]`` for every tensor of the model.
        config_out: ``(ModelConfig, rope options) -> config.json dict``; ``ValueError`` saying why a
            config does not fit this family.
        export_config: the config whose tensors the export writes (e.g. every bias on: missing
            posenc biases are written as zeros).
        ignore: HF name suffixes that are buffers, not weights.
        architecture: the class name HF's ``architectures`` field gets.
    """

    name: str
    model_types: tuple[str, ...]
    config_in: Callable[[HFConfig, HFWeights], ModelConfig]
    links: Callable[[ModelConfig], list[Link]]
    config_out: Callable[[ModelConfig], dict[str, Any]]
    export_config: Callable[[ModelConfig], ModelConfig]
    architecture: str
    ignore: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------
# Shared readers
# ----------------------------------------------------------------------------------------------
def _build(c: HFConfig, **fields: Any) -> ModelConfig:
    """``ModelConfig(**fields)``, refused before anything is allocated when its weights would not
    fit in free memory; errors prefixed with the config file."""
    try:
        config = ModelConfig(**fields)
        config.check_fits()
        return config
    except (TypeError, ValueError) as err:
        raise ValueError(f"{c.source}: {err}") from None


def _activation(c: HFConfig, *names: str, default: str) -> str:
    value = c.str(*names, default=default)
    if value not in _ACTIVATIONS_IN:
        raise ValueError(
            f"{c.source}: field {names[0]!r} = {value!r} is not an activation posenc has; "
            f"supported: {', '.join(_ACTIVATIONS_IN)}"
        )
    return _ACTIVATIONS_IN[value]


def _heads(c: HFConfig, d: int, h: int, head_dim: int | None = None) -> None:
    if d % h:
        raise ValueError(f"{c.source}: num_attention_heads={h} does not divide hidden_size={d}")
    if head_dim is not None and head_dim != d // h:
        raise ValueError(
            f"{c.source}: field 'head_dim' = {head_dim} differs from hidden_size / num_attention_heads = "
            f"{d // h}; posenc's attention takes d_h = d_model / num_heads"
        )


def _rope(c: HFConfig, head_dim: int, **extra: Any) -> dict[str, Any]:
    """RoPE options for the model's ``position_options`` (``head_dim`` comes from the model)."""
    try:
        options = hf_rope_config({**c.data, "head_dim": head_dim, **extra})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{c.source}: {err}") from None
    options.pop("head_dim")
    return options


def _tie(c: HFConfig, default: bool) -> str:
    return "output" if c.bool("tie_word_embeddings", default=default) else "none"


def _no_sliding_window(c: HFConfig, max_len: int) -> None:
    window = c.get("sliding_window")
    used = c.get("use_sliding_window", True)
    if window is not None and used and window < max_len:
        warnings.warn(
            f"{c.source}: sliding_window={window} is not reproduced: posenc attends to every earlier "
            f"token, so logits differ from the original past {window} tokens",
            stacklevel=4,
        )


def rope_parameters_out(model_config: ModelConfig, rope: Any) -> dict[str, Any]:
    """The HF ``rope_parameters`` (and length fields) of a built posenc RoPE."""
    # written always: families default it differently (GPT-NeoX 0.25, Llama 1.0)
    params: dict[str, Any] = {
        "rope_type": rope.scaling_rule,
        "rope_theta": rope.base,
        "partial_rotary_factor": rope.rotary_dim / rope.head_dim,
    }
    out: dict[str, Any] = {"max_position_embeddings": model_config.max_len or 2048}
    scaling = dict(rope.scaling_params)
    l0 = scaling.pop("original_max_position_embeddings", None)
    if rope.scaling_rule == "dynamic":
        out["max_position_embeddings"] = l0  # HF's dynamic NTK grows past max_position_embeddings
    elif rope.scaling_rule == "longrope":
        out["max_position_embeddings"] = scaling.pop(
            "max_position_embeddings", out["max_position_embeddings"]
        )
        out["original_max_position_embeddings"] = l0
    elif l0 is not None:
        params["original_max_position_embeddings"] = l0
    params.update(scaling)
    out["rope_parameters"] = params
    # the same, in the fields transformers < 5 reads
    out.update(rope_theta=rope.base, rotary_emb_base=rope.base, rotary_pct=params["partial_rotary_factor"])
    if rope.scaling_rule != "default":
        out["rope_scaling"] = dict(params)
    return out


def _need(ok: bool, family: str, why: str) -> None:
    if not ok:
        raise ValueError(f"{family}: {why}")


# ----------------------------------------------------------------------------------------------
# Llama, Mistral, Qwen2, Qwen3, Phi-3
# ----------------------------------------------------------------------------------------------
def _llama_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    fused = c.get("model_type") == "phi3"
    d, h = c.int("hidden_size"), c.int("num_attention_heads")
    _heads(c, d, h, c.get("head_dim") and c.int("head_dim"))
    max_len = c.int("max_position_embeddings", default=2048)
    _no_sliding_window(c, max_len)
    q = "self_attn.qkv_proj" if fused else "self_attn.q_proj"
    return _build(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("num_hidden_layers"),
        num_heads=h,
        num_kv_heads=c.int("num_key_value_heads", default=h),
        d_ff=c.int("intermediate_size"),
        position="rope",
        position_options=_rope(c, d // h),
        max_len=max_len,
        norm_type="rmsnorm",
        norm_eps=c.float("rms_norm_eps", default=1e-6),
        activation=_activation(c, "hidden_act", default="silu"),
        gated_mlp=True,
        embed_scale=None,
        tie=_tie(c, default=not fused and c.get("model_type") != "qwen3"),
        qkv_bias=w.has(f"model.layers.0.{q}.bias"),
        out_bias=w.has("model.layers.0.self_attn.o_proj.bias"),
        mlp_bias=w.has("model.layers.0.mlp.down_proj.bias"),
        qk_norm=w.has("model.layers.0.self_attn.q_norm.weight"),
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
    _need(cfg.position == "rope", name, f"position={cfg.position!r}; this family rotates (position='rope')")
    _need(cfg.norm_type == "rmsnorm" and cfg.norm == "pre", name, "needs norm_type='rmsnorm', norm='pre'")
    _need(cfg.gated_mlp and cfg.residual == "sequential", name, "needs gated_mlp=True, residual='sequential'")
    _need(not cfg.embed_norm and not cfg.output_bias, name, "has no embedding norm and no output bias")
    if name == "llama":
        _need(
            cfg.projection_bias("qkv") == cfg.projection_bias("out"), name, "attention biases are all or none"
        )
    if name == "qwen2":
        _need(not cfg.projection_bias("mlp"), name, "has no MLP biases")
    if name == "qwen3":
        _need(
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
        "hidden_act": _ACTIVATIONS_OUT[cfg.activation],
        "rms_norm_eps": cfg.norm_eps,
    }
    if name in ("llama", "qwen3"):
        out["attention_bias"] = cfg.projection_bias("qkv")
    if name == "llama":
        out["mlp_bias"] = cfg.projection_bias("mlp")
    return out


# ----------------------------------------------------------------------------------------------
# GPT-NeoX / Pythia
# ----------------------------------------------------------------------------------------------
def _neox_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("hidden_size"), c.int("num_attention_heads")
    _heads(c, d, h)
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    partial = (
        {}
        if isinstance(params, dict) and "partial_rotary_factor" in params
        else {"rotary_pct": c.float("rotary_pct", "partial_rotary_factor", default=0.25)}
    )
    bias = w.has("gpt_neox.layers.0.attention.query_key_value.bias")
    w.rename("embed_out.weight", "lm_head.weight")
    return _build(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("num_hidden_layers"),
        num_heads=h,
        d_ff=c.int("intermediate_size"),
        position="rope",
        position_options=_rope(c, d // h, **partial),
        max_len=c.int("max_position_embeddings", default=2048),
        norm_eps=c.float("layer_norm_eps", default=1e-5),
        activation=_activation(c, "hidden_act", default="gelu"),
        embed_scale=None,
        tie=_tie(c, default=False),
        bias=True,
        qkv_bias=bias,
        out_bias=bias,
        residual="parallel" if c.bool("use_parallel_residual", default=True) else "sequential",
    )


def _ln(hf: str, posenc: str) -> list[Link]:
    return [Link(f"{hf}.{s}", (f"{posenc}.{s}",)) for s in ("weight", "bias")]


def _neox_links(cfg: ModelConfig) -> list[Link]:
    b, m = "decoder.blocks.{i}.", "gpt_neox.layers.{i}."
    qkv = tuple(b + f"attn.{n}_proj" for n in "qkv")
    links = [
        Link("gpt_neox.embed_in.weight", (TOKEN_TABLE,)),
        *_ln("gpt_neox.final_layer_norm", "decoder.norm"),
    ]
    links += [*_ln(m + "input_layernorm", b + "norm1"), *_ln(m + "post_attention_layernorm", b + "norm2")]
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


def _neox_out(cfg: ModelConfig) -> dict[str, Any]:
    name = "gpt_neox"
    _need(cfg.position == "rope", name, f"position={cfg.position!r}; GPT-NeoX rotates (position='rope')")
    _need(cfg.norm_type == "layernorm" and cfg.norm == "pre", name, "needs norm_type='layernorm', norm='pre'")
    _need(not cfg.gated_mlp and cfg.residual != "parallel_shared_norm", name, "has a plain MLP and two norms")
    _need(cfg.kv_heads == cfg.num_heads, name, "has no grouped-query attention")
    _need(
        not cfg.qk_norm and not cfg.embed_norm and not cfg.output_bias,
        name,
        "has no q/k, embedding or output norm/bias",
    )
    return {
        "model_type": name,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "hidden_act": _ACTIVATIONS_OUT[cfg.activation],
        "layer_norm_eps": cfg.norm_eps,
        "use_parallel_residual": cfg.residual == "parallel",
        "attention_bias": True,
    }


def _all_biases(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, bias=True, qkv_bias=None, out_bias=None, mlp_bias=None)


# ----------------------------------------------------------------------------------------------
# GPT-2
# ----------------------------------------------------------------------------------------------
def _gpt2_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("n_embd", "hidden_size"), c.int("n_head", "num_attention_heads")
    _heads(c, d, h)
    if not c.bool("scale_attn_weights", default=True) or c.bool(
        "scale_attn_by_inverse_layer_idx", default=False
    ):
        raise ValueError(
            f"{c.source}: posenc scales attention logits by 1/sqrt(d_h) only; this config sets "
            "scale_attn_weights=false or scale_attn_by_inverse_layer_idx=true"
        )
    if c.bool("add_cross_attention", default=False):
        raise ValueError(f"{c.source}: add_cross_attention=true is not a decoder-only GPT-2")
    return _build(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("n_layer", "num_hidden_layers"),
        num_heads=h,
        d_ff=c.int("n_inner", default=4 * d),
        position="learned",
        max_len=c.int("n_positions", "max_position_embeddings", default=1024),
        norm_eps=c.float("layer_norm_epsilon", default=1e-5),
        activation=_activation(c, "activation_function", default="gelu_new"),
        embed_scale=None,
        tie=_tie(c, default=True),
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
        *_ln("transformer.ln_f", "decoder.norm"),
        *_ln(m + "ln_1", b + "norm1"),
        *_ln(m + "ln_2", b + "norm2"),
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
    _need(
        cfg.position == "learned",
        name,
        f"position={cfg.position!r}; GPT-2 learns positions (position='learned')",
    )
    _need(not cfg.position_options.get("padding_idx"), name, "learned positions without a padding row")
    _need(cfg.norm_type == "layernorm" and cfg.norm == "pre", name, "needs norm_type='layernorm', norm='pre'")
    _need(not cfg.gated_mlp and cfg.residual == "sequential", name, "has a plain MLP and a sequential block")
    _need(cfg.kv_heads == cfg.num_heads, name, "has no grouped-query attention")
    _need(
        not cfg.qk_norm and not cfg.embed_norm and not cfg.output_bias,
        name,
        "has no q/k, embedding or output norm/bias",
    )
    return {
        "model_type": name,
        "n_embd": cfg.d_model,
        "n_inner": cfg.ffn_dim,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_positions": cfg.max_len,
        "activation_function": _ACTIVATIONS_OUT[cfg.activation],
        "layer_norm_epsilon": cfg.norm_eps,
    }


# ----------------------------------------------------------------------------------------------
# GPT-J
# ----------------------------------------------------------------------------------------------
def _gptj_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("n_embd", "hidden_size"), c.int("n_head", "num_attention_heads")
    _heads(c, d, h)
    rotary_dim = c.int("rotary_dim", default=d // h, maximum=d // h)
    return _build(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("n_layer", "num_hidden_layers"),
        num_heads=h,
        d_ff=c.int("n_inner", default=4 * d),
        position="rope",
        position_options=_rope(c, d // h, rotary_dim=rotary_dim),
        max_len=c.int("n_positions", "max_position_embeddings", default=2048),
        norm_eps=c.float("layer_norm_epsilon", default=1e-5),
        activation=_activation(c, "activation_function", default="gelu_new"),
        embed_scale=None,
        tie=_tie(c, default=False),
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
        *_ln("transformer.ln_f", "decoder.norm"),
        *_ln(m + "ln_1", b + "norm1"),
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


# ----------------------------------------------------------------------------------------------
# Bloom
# ----------------------------------------------------------------------------------------------
def _bloom_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("hidden_size", "n_embed"), c.int("n_head", "num_attention_heads")
    _heads(c, d, h)
    if c.bool("apply_residual_connection_post_layernorm", default=False):
        raise ValueError(f"{c.source}: apply_residual_connection_post_layernorm=true is not supported")
    return _build(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("n_layer", "num_hidden_layers"),
        num_heads=h,
        position="alibi",
        norm_eps=c.float("layer_norm_epsilon", default=1e-5),
        activation="gelu_tanh",  # Bloom's own tanh-approximated GELU
        embed_scale=None,
        embed_norm=True,
        tie=_tie(c, default=True),
        bias=True,
    )


def _bloom_links(cfg: ModelConfig) -> list[Link]:
    b, m = "decoder.blocks.{i}.", "transformer.h.{i}."
    qkv = tuple(b + f"attn.{n}_proj" for n in "qkv")
    links = [
        Link("transformer.word_embeddings.weight", (TOKEN_TABLE,)),
        *_ln("transformer.word_embeddings_layernorm", "decoder.embed.norm"),
        *_ln("transformer.ln_f", "decoder.norm"),
        *_ln(m + "input_layernorm", b + "norm1"),
        *_ln(m + "post_attention_layernorm", b + "norm2"),
    ]
    for s in ("weight", "bias"):
        links += [
            Link(
                m + f"self_attention.query_key_value.{s}",
                tuple(f"{p}.{s}" for p in qkv),
                "heads",
                cfg.num_heads,
            ),
            Link(m + f"self_attention.dense.{s}", (b + f"attn.o_proj.{s}",)),
            Link(m + f"mlp.dense_h_to_4h.{s}", (b + f"mlp.up.{s}",)),
            Link(m + f"mlp.dense_4h_to_h.{s}", (b + f"mlp.down.{s}",)),
        ]
    if cfg.tie == "none":
        links.append(Link("lm_head.weight", ("lm_head.weight",)))
    return links


def _no_export(name: str) -> Callable[[ModelConfig], dict[str, Any]]:
    def refuse(cfg: ModelConfig) -> dict[str, Any]:
        raise ValueError(f"{name}: export to this family is not implemented; export reads it only")

    return refuse


_OLD_BUFFERS = (
    "attn.bias",
    "attn.masked_bias",
    "attn.embed_positions",
    "rotary_emb.inv_freq",
    "attention.bias",
    "attention.masked_bias",
)

#: Every family, in the order export tries them.
FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        ("llama", "mistral", "qwen2", "qwen3"),
        _llama_in,
        _llama_links,
        _llama_out,
        lambda c: c,
        "LlamaForCausalLM",
        _OLD_BUFFERS,
    ),
    Family(
        "gpt_neox",
        ("gpt_neox",),
        _neox_in,
        _neox_links,
        _neox_out,
        _all_biases,
        "GPTNeoXForCausalLM",
        _OLD_BUFFERS,
    ),
    Family("gpt2", ("gpt2",), _gpt2_in, _gpt2_links, _gpt2_out, _all_biases, "GPT2LMHeadModel", _OLD_BUFFERS),
    Family(
        "phi3",
        ("phi3",),
        _llama_in,
        lambda c: _llama_links(c, fused=True),
        _no_export("phi3"),
        lambda c: c,
        "Phi3ForCausalLM",
        _OLD_BUFFERS,
    ),
    Family(
        "gptj",
        ("gptj",),
        _gptj_in,
        _gptj_links,
        _no_export("gptj"),
        lambda c: c,
        "GPTJForCausalLM",
        _OLD_BUFFERS,
    ),
    Family(
        "bloom",
        ("bloom",),
        _bloom_in,
        _bloom_links,
        _no_export("bloom"),
        lambda c: c,
        "BloomForCausalLM",
        _OLD_BUFFERS,
    ),
)


def family_for(model_type: object, source: str) -> Family:
    """The family that reads ``model_type``; ``ValueError`` naming the supported ones."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = sorted(t for f in FAMILIES for t in f.model_types)
    if model_type is None:
        raise ValueError(
            f"{source} has no model_type, so it is not a Hugging Face checkpoint; a folder written by "
            "posenc's save_pretrained loads with posenc.load_model"
        )
    raise ValueError(
        f"{source}: model_type {model_type!r} is not one posenc converts; supported: {', '.join(known)}"
    )


def expand(links: list[Link], num_layers: int) -> list[Link]:
    """Links with ``{i}`` expanded for every layer."""
    out = []
    for link in links:
        if "{i}" not in link.hf:
            out.append(link)
            continue
        for i in range(num_layers):
            out.append(
                dataclasses.replace(
                    link, hf=link.hf.format(i=i), posenc=tuple(p.format(i=i) for p in link.posenc)
                )
            )
    return out
