"""What posenc reads from a Hugging Face ``config.json`` and writes into one, shared by the families:
checked fields (activations, head sizes, RoPE, tying, sliding windows), the ModelConfig built from
them, and the positional fields of an export.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from ...rotary.hf import hf_rope_config
from ...rotary.hf_out import hf_rope_fields
from ..config import ModelConfig
from .files import HFConfig

__all__ = [
    "ACTIVATIONS_IN",
    "ACTIVATIONS_OUT",
    "all_biases",
    "build_config",
    "check_heads",
    "need",
    "positions_out",
    "read_activation",
    "read_sliding_window",
    "read_tie",
    "rope_options",
]

#: HF activation names -> ``ModelConfig.activation``.
ACTIVATIONS_IN = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
#: ``ModelConfig.activation`` -> the HF name written on export.
ACTIVATIONS_OUT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def build_config(c: HFConfig, **fields: Any) -> ModelConfig:
    """``ModelConfig(**fields)``, refused before anything is allocated when its weights would not
    fit in free memory; errors prefixed with the config file."""
    try:
        config = ModelConfig(**fields)
        config.check_fits()
        return config
    except (TypeError, ValueError) as err:
        raise ValueError(f"{c.source}: {err}") from None


def read_activation(c: HFConfig, *names: str, default: str) -> str:
    value = c.str(*names, default=default)
    if value not in ACTIVATIONS_IN:
        raise ValueError(
            f"{c.source}: field {names[0]!r} = {value!r} is not an activation posenc has; "
            f"supported: {', '.join(ACTIVATIONS_IN)}"
        )
    return ACTIVATIONS_IN[value]


def check_heads(c: HFConfig, d: int, h: int) -> None:
    """``num_attention_heads`` must divide ``hidden_size``."""
    if d % h:
        raise ValueError(f"{c.source}: num_attention_heads={h} does not divide hidden_size={d}")


def rope_options(c: HFConfig, head_dim: int, **extra: Any) -> dict[str, Any]:
    """RoPE options for the model's ``position_options`` (``head_dim`` comes from the model)."""
    try:
        options = hf_rope_config({**c.data, "head_dim": head_dim, **extra})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{c.source}: {err}") from None
    options.pop("head_dim")
    return options


def read_tie(c: HFConfig, default: bool) -> str:
    return "output" if c.bool("tie_word_embeddings", default=default) else "none"


#: ``sliding_window`` where a config.json lacks the field, as transformers' config classes default.
_WINDOW_DEFAULTS: dict[str, int | None] = {"mistral": 4096}

#: Model types whose attention has no window, whatever config.json says (transformers ignores it).
_NO_WINDOW = ("llama",)

#: Model types that window only with ``use_sliding_window`` (default false), from
#: ``max_window_layers`` on (default 28) unless ``layer_types`` says which layers.
_OPT_IN_WINDOW = ("qwen2", "qwen3")


def read_sliding_window(c: HFConfig, num_layers: int) -> int | None:
    """The window transformers applies to every layer of this checkpoint, else None.

    Read per ``model_type`` as transformers reads it: Mistral and Phi-3 window every layer with
    ``sliding_window`` (Mistral's default 4096 where the field is absent); Qwen2/3 only with
    ``use_sliding_window`` true, in the layers ``layer_types`` names or from ``max_window_layers``
    on; Llama never (a ``sliding_window`` field there is ignored, with a warning). Where only some
    layers are windowed, a warning says that posenc attends to every earlier token there (it
    windows every layer or none). Each field is read with its type checked, only where present
    (HF writes null for "no window")."""
    model_type = c.get("model_type")
    present = "sliding_window" in c.data
    window = c.int("sliding_window", minimum=1) if c.get("sliding_window") is not None else None
    if not present:
        window = _WINDOW_DEFAULTS.get(model_type)
    if model_type in _NO_WINDOW:
        if window is not None:
            warnings.warn(
                f"{c.source}: sliding_window={window} is ignored: a {model_type} model attends to every "
                "earlier token (transformers reads the field the same way)",
                stacklevel=4,
            )
        return None
    opt_in = model_type in _OPT_IN_WINDOW
    if window is None or (opt_in and not c.bool("use_sliding_window", default=False)):
        return None
    types = c.get("layer_types")
    if types is not None:
        if (
            not isinstance(types, list)
            or len(types) != num_layers
            or not all(isinstance(t, str) for t in types)
        ):
            raise ValueError(f"{c.source}: layer_types must be a list of {num_layers} strings, got {types!r}")
        windowed = [t == "sliding_attention" for t in types]
    elif opt_in:  # the layers from max_window_layers on are windowed
        first = c.int("max_window_layers", default=28, minimum=0)
        windowed = [i >= first for i in range(num_layers)]
    else:
        windowed = [True] * num_layers
    if all(windowed):
        return window
    if any(windowed):
        warnings.warn(
            f"{c.source}: sliding_window={window} in {sum(windowed)} of {num_layers} layers is not "
            "reproduced: posenc windows every layer or none, so it attends to every earlier token and "
            f"logits differ from the original past {window} tokens",
            stacklevel=4,
        )
    return None


def need(ok: bool, family: str, why: str) -> None:
    if not ok:
        raise ValueError(f"{family}: {why}")


def _is_position_table(scheme: Any, config: ModelConfig) -> bool:
    """Whether the input layer's scheme adds one trained row per position (GPT-2's ``wpe``): an
    additive table whose only parameter is ``weight [max_len, d]``, row ``p`` for position ``p``."""
    if scheme is None or not getattr(scheme, "additive_table", False):
        return False
    params = dict(scheme.named_parameters())
    weight = params.get("weight")
    shape = (config.max_len, config.d_model)
    return set(params) == {"weight"} and tuple(weight.shape) == shape and getattr(scheme, "offset", 0) == 0


def positions_out(model: Any, family: str) -> dict[str, Any]:
    """The positional config fields ``family`` writes for ``model``: RoPE's fields for a rotary
    family (with posenc's ``layout``, which the caller removes), none for GPT-2 (its table is a
    weight); ``ValueError`` when the model's positions are not the family's."""
    config = model.config
    attention, embedded = model.decoder.scheme(0), model.decoder.embed.position
    if family == "gpt2":
        need(
            attention is None and _is_position_table(embedded, config),
            family,
            "learns one vector per position (position='learned', no padding row)",
        )
        return {}
    rope = hf_rope_fields(attention, config.max_len)
    need(rope is not None and embedded is None, family, "rotates queries and keys (position='rope')")
    need(config.share_position or config.num_layers == 1, family, "has one RoPE for all layers")
    return rope


def all_biases(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, bias=True, qkv_bias=None, out_bias=None, mlp_bias=None)
