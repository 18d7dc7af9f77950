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
from typing import Any

from .._validate import did_you_mean

__all__ = [
    "RANDOM_POSITIONS",
    "Setting",
    "check_vary",
    "grid_fields",
    "model_fields",
    "parse_value",
    "parse_vary",
    "run_name",
    "setting_label",
    "settings_summary",
    "split_setting",
    "study_settings",
]

#: A cell's setting: ``((field, value), ...)``, in the order of ``--vary`` (empty = the plain model).
Setting = tuple[tuple[str, Any], ...]

#: The setting key of training at randomized positions (a training option, not a model field).
RANDOM_POSITIONS = "random_positions"

#: Model-config fields a study sets itself, with what to use instead of ``--vary``.
_NOT_VARIED = {
    "position": "give schemes with --schemes",
    "position_options": "set a scheme's options with --option SCHEME.KEY=VALUE",
    "vocab_size": "the data sets the vocabulary",
    "max_len": "the train length sets it (--train-len)",
    "src_vocab_size": "it applies to encoder-decoder models only",
    "memory_len": "the lab trains without a Transformer-XL memory",
}


def model_fields() -> list[str]:
    """The :class:`~posenc.model.ModelConfig` fields a study may vary."""
    from ..model import ModelConfig

    return [f.name for f in dataclasses.fields(ModelConfig) if f.name not in _NOT_VARIED]


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
        if field in _NOT_VARIED:
            raise ValueError(f"vary field {field!r} cannot be varied: {_NOT_VARIED[field]}")
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
    """The run's name in tables: ``rope``, or ``rope[norm=post]`` for a setting."""
    return f"{scheme}[{setting_label(setting)}]" if setting else scheme


def split_setting(setting: Setting) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model-config fields, training options)`` of a setting."""
    model = {k: v for k, v in setting if k != RANDOM_POSITIONS}
    training = {k: v for k, v in setting if k == RANDOM_POSITIONS}
    return model, training


def settings_summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run with a setting other than the grid's first, minus the run of the same scheme and
    variant with the first setting, on the same bytes, seed for seed
    (:func:`~posenc.lab.compare.paired_rows`): ``[{"run", "against", "rows"}]``."""
    from .compare import paired_rows

    cfg = results["config"]
    first = study_settings(cfg.get("vary") or {}, cfg.get("randomized_positions") or 0)[0]
    runs = {(r["name"], r["seed"]): r for r in results["runs"]}
    pairs: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for run in results["runs"]:
        setting = tuple(run.get("setting", {}).items())
        if run.get("finetune") or setting == first:
            continue
        own, ref = run_name(run["scheme"], setting), run_name(run["scheme"], first)
        against = ref + run["name"][len(own) :]  # the same variant suffix (``+yarn``)
        if (against, run["seed"]) in runs:
            pairs.setdefault((run["name"], against), []).append((runs[against, run["seed"]], run))
    return [
        {"run": run, "against": against, "rows": paired_rows(run, p, results["eval"].get("window_documents"))}
        for (run, against), p in pairs.items()
    ]


def grid_fields(args: Any) -> dict[str, Any]:
    """The study fields of ``--vary``, ``--randomized-positions``, fine-tuning and ``--diagnostics``."""
    fields: dict[str, Any] = {"vary": parse_vary(args.vary)} if args.vary else {}
    given = {
        "randomized_positions": args.randomized_positions,
        "finetune_len": args.finetune_len,
        "finetune_steps": args.finetune_steps,
        "diagnostic_windows": args.diagnostics,
    }
    return {**fields, **{k: v for k, v in given.items() if v is not None}}
