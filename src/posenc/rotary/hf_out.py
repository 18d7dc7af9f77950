"""RoPE out to Hugging Face: the ``config.json`` fields that make a ``transformers`` model rotate
exactly as a posenc :class:`~posenc.rotary.RotaryEmbedding` (the inverse of
:func:`posenc.rotary.hf.hf_rope_config`).
"""

from __future__ import annotations

from typing import Any

from .modules import RotaryEmbedding
from .scalings import ORIGINAL_LENGTH

__all__ = ["hf_rope_fields"]


def hf_rope_fields(scheme: object, max_len: int | None) -> dict[str, Any] | None:
    """The HF config fields of ``scheme``, or None when it is not a plain :class:`RotaryEmbedding`
    (xPos, 2D RoPE and other schemes rotate otherwise; a model without one has none).

    Args:
        scheme: a built scheme (``model.decoder.scheme(0)``).
        max_len: the model's nominal length, written as ``max_position_embeddings`` (2048 when None).

    Returns:
        ``{"rope_parameters", "max_position_embeddings", "layout", ...}`` and the fields
        ``transformers`` < 5 reads (``rope_theta``, ``rotary_pct``, ``rope_scaling``). ``layout`` is
        posenc's (``"half"`` for Llama/NeoX-style attention); the caller removes it.
    """
    if type(scheme) is not RotaryEmbedding:
        return None
    rule = scheme.scaling_rule
    if rule == "ntk":  # the one posenc rule transformers has no rope_type for
        raise ValueError(
            "RoPE scaling 'ntk' (static NTK-aware) has no Hugging Face rope_type, so transformers "
            "could not load the export; it is plain RoPE with base b * s^(r/(r-2)): build the model "
            "with that base and no scaling to export it"
        )
    # written always: families default it differently (GPT-NeoX 0.25, Llama 1.0)
    params: dict[str, Any] = {
        "rope_type": rule,
        "rope_theta": scheme.base,
        "partial_rotary_factor": scheme.rotary_dim / scheme.head_dim,
    }
    out: dict[str, Any] = {"max_position_embeddings": max_len or 2048, "layout": scheme.layout}
    scaling = dict(scheme.scaling_params)
    l0 = scaling.pop(ORIGINAL_LENGTH, None)
    if rule == "dynamic":
        out["max_position_embeddings"] = l0  # HF's dynamic NTK grows past max_position_embeddings
    elif rule == "longrope":  # Phi-3 keeps both lengths at the top level
        out["max_position_embeddings"] = scaling.pop(
            "max_position_embeddings", out["max_position_embeddings"]
        )
        out[ORIGINAL_LENGTH] = l0
    elif l0 is not None:
        params[ORIGINAL_LENGTH] = l0
    params.update(scaling)
    out["rope_parameters"] = params
    out.update(
        rope_theta=scheme.base, rotary_emb_base=scheme.base, rotary_pct=params["partial_rotary_factor"]
    )
    if rule != "default":
        out["rope_scaling"] = dict(params)
    return out
