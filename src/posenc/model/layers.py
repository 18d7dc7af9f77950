"""A scheme per layer: the pattern of ``ModelConfig.layer_positions`` (Llama 4: RoPE in three layers
of four, none with a query temperature in the fourth), read, checked and built.

A pattern is a list of scheme names, or a string of names separated by ``,`` or ``+`` each with an
optional repeat count (``"rope*3,nope_temperature"``, or ``"rope*3+nope_temperature"`` where commas
already separate a list, as in a command line's list of schemes); it repeats over the layers, so
layer ``i`` uses entry ``i mod len(pattern)``. Entries act in attention only (the input layer uses
``position``), so a scheme with the ``embed`` hook, or one that encodes grids, is refused with the
reason.

Legend: ``L`` layers.
"""

from __future__ import annotations

from typing import Any

from .._validate import check_int, did_you_mean
from ..base import PositionalScheme
from ..registry import build_with_context, config_keys, scheme_class, schemes

__all__ = [
    "build_layer_schemes",
    "check_layer_positions",
    "layer_scheme_names",
    "llama4_layers",
    "parse_layer_pattern",
]

#: the longest pattern a string may spell out (a repeat count larger than any model's depth is a typo)
MAX_PATTERN = 4096


def parse_layer_pattern(text: str) -> list[str]:
    """``"rope*3,nope_temperature"`` (or ``"rope*3+nope_temperature"``) -> ``["rope", "rope", "rope",
    "nope_temperature"]``."""
    out: list[str] = []
    for part in text.replace("+", ",").split(","):
        name, star, count = part.strip().partition("*")
        name = name.strip()
        if not name:
            raise ValueError(
                f"layer_positions {text!r} has an empty entry; write e.g. 'rope*3,nope_temperature'"
            )
        repeat = 1
        if star:
            try:
                repeat = int(count)
            except ValueError:
                raise ValueError(
                    f"layer_positions entry {part.strip()!r} needs a whole repeat count after '*', "
                    "e.g. 'rope*3'"
                ) from None
            check_int(repeat, f"the repeat count of {name!r} in layer_positions")
        if len(out) + repeat > MAX_PATTERN:
            raise ValueError(f"layer_positions {text!r} spells more than {MAX_PATTERN} layers")
        out += [name] * repeat
    return out


def check_layer_positions(config: Any, value: object, options: object) -> list[str] | None:
    """The pattern as a list of names (``None`` when not set), after checking every name, that it
    acts in attention on token sequences, and ``options`` (``{name: {option: value}}``)."""
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise TypeError(
            "layer_position_options must be a dict {scheme name: {option: value}}, got "
            f"{type(options).__name__}"
        )
    if value is None:
        if options:
            raise ValueError("layer_position_options is set but layer_positions is not; set both or neither")
        return None
    if isinstance(value, str):
        names = parse_layer_pattern(value)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(n, str) for n in value):
        names = list(value)
    else:
        raise TypeError(
            "layer_positions must be a non-empty list of scheme names or a pattern string such as "
            f"'rope*3,nope_temperature', got {value!r}"
        )
    for name in names:
        if name not in schemes():
            raise ValueError(
                f"unknown scheme {name!r} in layer_positions; valid: {', '.join(schemes())}"
                + did_you_mean(name, schemes())
            )
        cls = scheme_class(name)
        if "embed" in cls.hooks or cls.position_dims != 1:
            why = "adds to the input embeddings" if "embed" in cls.hooks else "encodes grids, not sequences"
            raise ValueError(
                f"layer_positions entry {name!r} {why}; a layer's scheme acts in attention: use "
                "position= for the input layer and attention schemes (rope, alibi, nope, ...) per layer"
            )
    stray = sorted(set(options) - set(names))
    if stray:
        raise ValueError(f"layer_position_options names {stray}, which are not in layer_positions {names}")
    for name, opts in options.items():
        unknown = sorted(set(opts) - set(config_keys(name)))
        if unknown:
            raise ValueError(
                f"unknown layer_position_options[{name!r}] keys {unknown}; "
                f"valid: {', '.join(config_keys(name))}"
            )
    return names


def layer_scheme_names(config: Any) -> list[str]:
    """The scheme name of each of the ``L`` layers (``position`` everywhere without a pattern)."""
    pattern = config.layer_positions or [config.position]
    return [pattern[i % len(pattern)] for i in range(config.num_layers)]


def _options(config: Any, name: str) -> dict[str, Any]:
    if name in config.layer_position_options:
        return config.layer_position_options[name]
    return config.position_options if name == config.position else {}


def build_layer_schemes(config: Any, causal: bool) -> tuple[list[PositionalScheme], list[int]]:
    """The schemes of a patterned stack and, per layer, the index of its scheme: with
    ``share_position`` the layers with the same name share one instance, else each has its own.
    Refuses a scheme without the form the stack needs (causal for a decoder, bidirectional for an
    encoder)."""
    built: list[PositionalScheme] = []
    index: list[int] = []
    by_name: dict[str, int] = {}
    for name in layer_scheme_names(config):
        cls = scheme_class(name)
        if not (cls.causal_ok if causal else cls.bidirectional_ok):
            form = (
                "causal form (a decoder needs one)" if causal else "bidirectional form (an encoder needs one)"
            )
            raise ValueError(f"layer_positions entry {name!r} has no {form}")
        if config.share_position and name in by_name:
            index.append(by_name[name])
            continue
        built.append(build_with_context(name, config.scheme_context(causal), _options(config, name)))
        by_name[name] = len(built) - 1
        index.append(len(built) - 1)
    return built, index


def llama4_layers(config: Any) -> dict[str, Any]:
    """The ``ModelConfig`` fields that give a Hugging Face Llama 4 text config's positions: RoPE
    (interleaved pairs, its ``rope_parameters``) in the layers with ``no_rope_layers[i] = 1``, and
    in the others no positions, with the query temperature when ``attn_temperature_tuning``
    (``floor_scale``, ``attn_scale``).

    Returns ``{"layer_positions": [L names], "layer_position_options": {...}}``. Llama 4's L2 norm of
    q and k in RoPE layers (``use_qk_norm``) is not a positional scheme and is not reproduced.
    """
    from ..rotary.hf import hf_rope_config

    def get(key: str, default: Any = None) -> Any:
        return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)

    flags = get("no_rope_layers")
    if not isinstance(flags, (list, tuple)) or not flags:
        raise ValueError(
            "config has no no_rope_layers list (1 = RoPE, 0 = no positions per layer): not Llama 4"
        )
    tuned = bool(get("attn_temperature_tuning", False))
    without = "nope_temperature" if tuned else "nope"
    names = ["rope" if flag else without for flag in flags]
    rope = hf_rope_config(config, layout="interleaved")
    rope.pop("head_dim")
    options: dict[str, dict[str, Any]] = {"rope": rope} if any(flags) else {}
    if tuned and not all(flags):  # some layer is position-free, with the temperature
        options[without] = {"floor_scale": float(get("floor_scale")), "attn_scale": float(get("attn_scale"))}
    return {"layer_positions": names, "layer_position_options": options}
