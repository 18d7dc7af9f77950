"""The study grid beyond schemes: each cell also has a **setting**, the model-config fields it
changes (``--vary FIELD=v1,v2``) and, with ``--randomized-positions M``, whether it trains at
randomized positions. A study trains every scheme with every setting and every seed, so settings
are compared like schemes: on the same bytes, seed for seed.

A setting is a tuple of ``(field, value)`` pairs; its label (``norm=post,embed_norm=true``) names
the runs (``rope[norm=post]``) and the cell files.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

from .._validate import did_you_mean

__all__ = [
    "NOT_VARIED",
    "RANDOM_POSITIONS",
    "SchemeEntry",
    "Setting",
    "check_vary",
    "model_fields",
    "parse_value",
    "parse_vary",
    "run_name",
    "scheme_entry",
    "setting_label",
    "split_setting",
    "study_settings",
]

#: A cell's setting: ``((field, value), ...)``, in the order of ``--vary`` (empty = the plain model).
Setting = tuple[tuple[str, Any], ...]

#: The setting key of training at randomized positions (a training option, not a model field).
RANDOM_POSITIONS = "random_positions"

#: Model-config fields a study sets itself, with what to use instead of ``--vary``.
NOT_VARIED = {
    "position": "give schemes with --schemes",
    "position_options": "set a scheme's options with --option SCHEME.KEY=VALUE",
    "vocab_size": "the data sets the vocabulary",
    "max_len": "the train length sets it (--train-len)",
    "src_vocab_size": "it applies to encoder-decoder models only",
    "memory_len": "the lab trains without a Transformer-XL memory",
    "layer_positions": "give a per-layer pattern as a scheme entry, e.g. --schemes 'rope*3+nope_temperature'",
    "layer_position_options": "set a pattern's schemes' options with --option SCHEME.KEY=VALUE",
}


def model_fields() -> list[str]:
    """The :class:`~posenc.model.ModelConfig` fields a study may vary."""
    from ..model import ModelConfig

    return [f.name for f in dataclasses.fields(ModelConfig) if f.name not in NOT_VARIED]


def parse_value(text: str) -> Any:
    """One ``--vary`` value: ``none``/``null`` -> ``None``, ``true``/``false`` -> bool, numbers
    as numbers, anything else as the string itself."""
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    try:
        return json.loads(low if low in ("true", "false") else text.strip())
    except json.JSONDecodeError:
        return text.strip()


def parse_vary(specs: list[str]) -> dict[str, tuple]:
    """``["norm=pre,post", "tie=none,output"]`` -> ``{"norm": ("pre", "post"), "tie": (...)}``."""
    vary: dict[str, tuple] = {}
    for spec in specs:
        field, sep, values = spec.partition("=")
        items = [v for v in values.split(",") if v.strip()]
        if not (sep and field.strip() and items):
            raise ValueError(f"--vary {spec!r} is not FIELD=V1,V2,... ; e.g. --vary norm=pre,post")
        if field.strip() in vary:
            raise ValueError(f"--vary {field.strip()!r} is given twice; give all its values at once")
        vary[field.strip()] = tuple(parse_value(v) for v in items)
    return vary


def check_vary(vary: Any, model_config: Any) -> dict[str, tuple]:
    """``vary`` checked against ``model_config`` (a :class:`~posenc.model.ModelConfig` of the
    study): known fields, at least one value each, no repeats, every value building a valid model.
    Returns it with tuples of values."""
    if not isinstance(vary, dict):
        raise TypeError(f"vary must be a dict {{field: (value, ...)}}, got {type(vary).__name__}")
    fields = model_fields()
    types = {f.name: str(f.type) for f in dataclasses.fields(model_config)}
    out = {}
    for field, values in vary.items():
        if field in NOT_VARIED:
            raise ValueError(f"vary field {field!r} cannot be varied: {NOT_VARIED[field]}")
        if field not in fields:
            raise ValueError(
                f"vary field {field!r} is not a model setting{did_you_mean(field, fields)}; "
                f"valid: {', '.join(fields)}"
            )
        values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
        if "None" not in types[field]:  # "none" on the command line is the string (tie=none)
            values = tuple("none" if v is None else v for v in values)
        if not values or len(set(map(repr, values))) != len(values):
            raise ValueError(f"vary {field!r} needs distinct values, got {list(values)}; e.g. norm=pre,post")
        for value in values:
            try:
                dataclasses.replace(model_config, **{field: value})
            except (TypeError, ValueError) as err:
                raise type(err)(f"vary {field}={value!r}: {err}") from None
        out[field] = values
    return out


def study_settings(vary: dict[str, tuple], random_positions: int = 0) -> list[Setting]:
    """Every combination of the varied values (the first field slowest); with ``random_positions``
    each once at ordinary and once at randomized positions. No variation: ``[()]``."""
    combos = [tuple(zip(vary, values)) for values in itertools.product(*vary.values())]
    if not random_positions:
        return combos
    return [s for combo in combos for s in (combo, (*combo, (RANDOM_POSITIONS, random_positions)))]


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def setting_label(setting: Setting) -> str:
    """``"norm=post,embed_norm=true"`` ("" for the plain model), safe in a file name."""
    label = ",".join(f"{field}={_show(value)}" for field, value in setting)
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", label)


def run_name(scheme: str, setting: Setting) -> str:
    """The run's name in tables and file names: ``rope``, or ``rope[norm=post]`` for a setting (a
    per-layer pattern by its label, ``rope-x3+nope_temperature``)."""
    label = scheme_entry(scheme).label
    return f"{label}[{setting_label(setting)}]" if setting else label


def split_setting(setting: Setting) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model-config fields, training options)`` of a setting."""
    model = {k: v for k, v in setting if k != RANDOM_POSITIONS}
    training = {k: v for k, v in setting if k == RANDOM_POSITIONS}
    return model, training


@dataclass(frozen=True)
class SchemeEntry:
    """One entry of a study's schemes (or ``posenc train --scheme``): a scheme name (``rope``), or
    a per-layer pattern of attention schemes (``rope*3+nope_temperature``: RoPE in three layers of
    four, none with a query temperature in the fourth, repeated over the layers; see
    :mod:`posenc.model.layers`). A pattern's model has no input-layer scheme (``nope``).

    Attributes:
        spec: the entry as given, the pattern's separators written ``+``.
        position: the model's ``position`` (the input layer's scheme; ``nope`` for a pattern).
        layers: the pattern as a list of names, or ``None`` for a plain scheme.
    """

    spec: str
    position: str
    layers: tuple[str, ...] | None

    @property
    def names(self) -> tuple[str, ...]:
        """Every scheme name the entry uses (its pattern's distinct names, in order)."""
        return tuple(dict.fromkeys(self.layers)) if self.layers else (self.position,)

    @property
    def label(self) -> str:
        """A readable, file-name-safe name: ``rope``, or ``rope-x3+nope_temperature`` for a pattern."""
        if self.layers is None:
            return self.spec
        parts = []
        for part in self.spec.split("+"):
            name, _, count = part.partition("*")
            parts.append(f"{name.strip()}-x{int(count)}" if count else name.strip())
        return "+".join(parts)


def scheme_entry(spec: object) -> SchemeEntry:
    """The :class:`SchemeEntry` of ``spec``: a pattern when it holds ``*`` or ``+`` (or ``,``),
    each name checked against the registry; errors name the entry and the fix."""
    if not isinstance(spec, str) or not spec.strip():
        raise TypeError(f"a scheme entry must be a scheme name or a pattern like 'rope*3+nope', got {spec!r}")
    spec = spec.strip()
    if not any(sep in spec for sep in "*+,"):
        return SchemeEntry(spec, spec, None)
    from ..model.layers import parse_layer_pattern

    canonical = "+".join(part.strip() for part in spec.replace(",", "+").split("+"))
    return SchemeEntry(canonical, "nope", tuple(parse_layer_pattern(canonical)))
