"""Hugging Face interop: a RoPE from a transformers config (:func:`hf_rope_config`,
:func:`rope_from_hf`) and q/k weights moved between the two pairings (:func:`permute_qk_weights`).

Legend: ``h`` heads, ``d_h`` head width, ``r`` rotary width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._validate import check_choice, check_int
from .apply import describe_value
from .modules import RotaryEmbedding
from .scalings import ORIGINAL_LENGTH, ROPE_SCALINGS

# ----------------------------------------------------------------------------------------------
# Interop: Hugging Face configs, checkpoint layouts
# ----------------------------------------------------------------------------------------------
#: HF ``model_type`` values whose attention uses the interleaved layout (GPT-J's rotate_every_two).
HF_INTERLEAVED_MODEL_TYPES = ("gptj", "codegen")
_HF_DROP = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def hf_rope_config(config: Any, *, layout: str | None = None) -> dict[str, Any]:
    """The :func:`posenc.build` arguments of ``"rope"`` that reproduce a Hugging Face config.

    Args:
        config: a ``config.json`` dict or a ``transformers`` config object. Read: ``rope_parameters``
            (transformers >= 5) or ``rope_scaling`` (older), ``rope_theta``, ``partial_rotary_factor``
            (or GPT-NeoX's ``rotary_pct``, GPT-J's ``rotary_dim``), ``max_position_embeddings``,
            ``original_max_position_embeddings``, ``head_dim`` or ``hidden_size / num_attention_heads``,
            ``model_type`` and DeepSeek's ``rope_interleave`` (for the layout), DeepSeek's
            ``qk_rope_head_dim``.
        layout: override the layout (default: ``"interleaved"`` for GPT-J/CodeGen and configs with
            ``rope_interleave=True``, else ``"half"``).

    Returns:
        ``{"head_dim", "base", "rotary_dim" | "partial_rotary_factor", "layout", "scaling"}``.
    """
    # DeepSeek-V2/V3 (MLA) rotate only the qk_rope_head_dim part of each head
    head_dim = _get(config, "qk_rope_head_dim", _get(config, "head_dim"))
    if head_dim is None:
        hidden, heads = _get(config, "hidden_size"), _get(config, "num_attention_heads")
        if hidden is None or heads is None:
            raise ValueError("config needs head_dim, or hidden_size and num_attention_heads, to size RoPE")
        head_dim = hidden // heads
    params = dict(_get(config, "rope_parameters") or _get(config, "rope_scaling") or {})
    if any(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(
            f"config has per-layer-type rope_parameters ({sorted(params)}); pass one entry, e.g. "
            "rope_from_hf({**config, 'rope_parameters': config['rope_parameters']['full_attention']})"
        )
    if "mrope_section" in params:  # Qwen2-VL / Qwen3-VL: plain RoPE would be wrong on image positions
        raise ValueError(
            f"config has mrope_section {params['mrope_section']}: a multimodal RoPE (three position axes); "
            "use posenc.mrope_from_hf(config)"
        )
    rule = params.get("rope_type", params.get("type", "default"))
    if rule not in ROPE_SCALINGS:
        raise ValueError(f"unsupported HF rope_type {rule!r}; posenc supports: {', '.join(ROPE_SCALINGS)}")
    base = params.get("rope_theta", _get(config, "rope_theta", _get(config, "rotary_emb_base", 10000.0)))
    out: dict[str, Any] = {"head_dim": head_dim, "base": float(base)}
    partial = params.get(
        "partial_rotary_factor", _get(config, "partial_rotary_factor", _get(config, "rotary_pct"))
    )
    rule_keys = (*ROPE_SCALINGS[rule].required, *ROPE_SCALINGS[rule].optional)
    # a rule that takes the rotated fraction itself (proportional) spans the whole head
    own_fraction = "partial_rotary_factor" in rule_keys
    if _get(config, "model_type") in HF_INTERLEAVED_MODEL_TYPES and _get(config, "rotary_dim") is not None:
        out["rotary_dim"] = _get(config, "rotary_dim")
    elif partial is not None and partial != 1.0 and not own_fraction:
        out["partial_rotary_factor"] = float(partial)
    if layout is None:
        model_type = _get(config, "model_type")
        interleaved = model_type in HF_INTERLEAVED_MODEL_TYPES or bool(_get(config, "rope_interleave"))
        layout = "interleaved" if interleaved else "half"
    out["layout"] = layout
    if rule == "default":
        out["scaling"] = None
        return out
    scaling = {k: v for k, v in params.items() if k not in _HF_DROP and k in rule_keys}
    if own_fraction:  # HF's default fraction is 1.0
        scaling["partial_rotary_factor"] = 1.0 if partial is None else float(partial)
    max_pos = _get(config, "max_position_embeddings")
    if rule == "dynamic":  # HF's dynamic NTK measures growth against max_position_embeddings
        scaling[ORIGINAL_LENGTH] = max_pos
    elif rule in ("yarn", "llama3", "longrope"):
        # As HF: a top-level original_max_position_embeddings (Phi-3) wins, then the rope dict's, max_pos.
        top = _get(config, ORIGINAL_LENGTH)
        scaling[ORIGINAL_LENGTH] = top if top is not None else params.get(ORIGINAL_LENGTH, max_pos)
        if rule == "yarn" and scaling.get("factor") is None:
            scaling["factor"] = max_pos / scaling[ORIGINAL_LENGTH]
        if rule == "longrope":
            scaling["max_position_embeddings"] = max_pos
    out["scaling"] = {"rope_type": rule, **scaling}
    return out


def rope_from_hf(config: Any, *, layout: str | None = None) -> RotaryEmbedding:
    """A :class:`RotaryEmbedding` that rotates exactly as the HF model with this config.

    Args:
        config: a ``config.json`` dict or a ``transformers`` config object (see :func:`hf_rope_config`).
        layout: override the layout; default from ``model_type``.
    """
    return RotaryEmbedding(**hf_rope_config(config, layout=layout))


_PERMUTE_TARGETS = ("interleaved", "half")


def permute_qk_weights(
    weight: torch.Tensor, num_heads: int, *, to: str = "half", rotary_dim: int | None = None
) -> torch.Tensor:
    """Reorder q/k projection rows between the interleaved and half RoPE layouts.

    ``to="half"`` is the permutation of HF's ``convert_llama_weights_to_hf.py`` (Meta -> HF): within
    each head, row ``2j + c`` moves to row ``c * r/2 + j``. ``to="interleaved"`` is its inverse.
    With permuted weights, half-layout RoPE gives the same q/k (up to this same row permutation of
    the head dims) and the same attention logits as interleaved RoPE with the original weights.

    Args:
        weight: ``[h * d_h, d_in]`` (an ``nn.Linear`` weight) or ``[h * d_h]`` (its bias).
        num_heads: ``h``, the heads of this projection (``num_key_value_heads`` for k with GQA).
        to: ``"half"`` or ``"interleaved"``, the target layout.
        rotary_dim: ``r``, only the first ``r`` rows of each head are permuted (partial rotary);
            default ``d_h``.

    Returns:
        A new tensor of the same shape.
    """
    check_choice(to, "to", _PERMUTE_TARGETS)
    check_int(num_heads, "num_heads")
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (1, 2):
        shape = f" of shape {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else ""
        raise ValueError(
            "weight must be a tensor [h * d_h, d_in] or a bias [h * d_h], "
            f"got {describe_value(weight)}{shape}"
        )
    out_features = weight.shape[0]
    if out_features % num_heads:
        raise ValueError(f"weight has {out_features} rows, not a multiple of num_heads={num_heads}")
    d_h = out_features // num_heads
    r = d_h if rotary_dim is None else check_int(rotary_dim, "rotary_dim", minimum=2, even=True)
    if r > d_h or r % 2:
        raise ValueError(f"rotary_dim must be even and <= d_h = {d_h}, got {r}")
    w = weight.reshape(num_heads, d_h, -1)  # [h * d_h, d_in] -> [h, d_h, d_in]
    rot, rest = w[:, :r], w[:, r:]  # [h, r, d_in], [h, d_h - r, d_in]
    if to == "half":
        rot = rot.unflatten(1, (r // 2, 2)).transpose(1, 2)  # [h, r/2 pairs, 2] -> [h, 2, r/2]
    else:
        rot = rot.unflatten(1, (2, r // 2)).transpose(1, 2)  # [h, 2 halves, r/2] -> [h, r/2, 2]
    w = torch.cat((rot.flatten(1, 2), rest), dim=1)  # [h, r, d_in] ++ [h, d_h - r, d_in] -> [h, d_h, d_in]
    return w.reshape(weight.shape)
