"""Files written by earlier versions of posenc, read and brought to the current form.

posenc saves a model as one folder (:mod:`posenc.model.saving`). Earlier versions also wrote:

- a model as one ``.safetensors`` file: the weights, with the model class (``posenc_model``) and
  the config (``posenc_config``, JSON) in the file's metadata;
- a training checkpoint as one ``.safetensors`` file (metadata ``posenc_checkpoint`` =
  ``posenc-checkpoint-1``): the weights under ``model.``, beside the optimizer, RNG and loss history,
  with the class (``model_class``) and config (``model_config``) in its metadata;
- folders whose ``config.json`` records ``posenc_defaults`` instead of ``posenc_format``.

:func:`posenc.model.load_model` reads all of them through this module. Files from before format
version 2 were built when some scheme options had other defaults; :func:`upgrade_config` writes
those old values into the config, so such a model loads as it was trained.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .classes import MODEL_CLASSES
from .config import ModelConfig
from .io import build_saved, load_weights, parse_json, read_metadata

__all__ = [
    "LEGACY_CHECKPOINT_FORMAT",
    "OLD_DEFAULTS",
    "RENAMED_OPTIONS",
    "config_from_saved",
    "legacy_checkpoint_parts",
    "load_legacy_file",
    "saved_version",
    "upgrade_config",
]

#: The format mark of a training checkpoint written as one ``.safetensors`` file.
LEGACY_CHECKPOINT_FORMAT = "posenc-checkpoint-1"

#: Scheme options whose default changed in format version 2, by scheme name, with the value a
#: model saved before was built with (T5's ``max_distance`` now follows ``max_len``).
OLD_DEFAULTS: dict[str, dict[str, Any]] = {"t5": {"max_distance": 128}}

#: Scheme options that took another form, by scheme name: each old key -> ``(new key, convert)``
#: (``None``: dropped). T5's ``bidirectional`` became the model's one ``causal``; ALiBi's ``causal``
#: changed nothing (its bias ``-m |i - j|`` was the same either way) and is gone.
RENAMED_OPTIONS: dict[str, dict[str, tuple[str, Any] | None]] = {
    "t5": {"bidirectional": ("causal", lambda v: not v)},
    "alibi": {"causal": None},
}


def saved_version(mark: Any, defaults_mark: Any = None) -> int:
    """The format version of a saved model: ``mark`` (``posenc_format``: an int, or its text in a
    file's metadata) when given; else 2 for files marked ``posenc_defaults`` ``"2"``, 1 for older
    ones. ``ValueError`` for a mark that is not a positive whole number."""
    if mark is None:
        return 2 if defaults_mark == "2" else 1
    if isinstance(mark, str) and mark.isdigit() and len(mark) < 10:
        mark = int(mark)
    if not isinstance(mark, int) or isinstance(mark, bool) or mark < 1:
        raise ValueError(f"'posenc_format' must be a whole number >= 1, got {mark!r}")
    return mark


def upgrade_config(config: Any, version: int) -> Any:
    """``config`` (a :class:`ModelConfig` dict read from a file of format ``version``) with its
    scheme options in today's form (:data:`RENAMED_OPTIONS`) and the defaults it was built with
    written in (:data:`OLD_DEFAULTS` for a version-1 file, unless the option was set), for the
    model's scheme (``position_options``) and for each scheme of a per-layer pattern
    (``layer_position_options``). Anything that is not a config dict is returned as it is
    (:meth:`ModelConfig.from_dict` names what is wrong).

    Raises:
        ValueError: an old option with a value its new form cannot take (T5's ``bidirectional``
            must be a bool), or an old option given beside its new one.
    """
    if not isinstance(config, dict):
        return config
    out = dict(config)
    position = config.get("position")
    if isinstance(position, str) and isinstance(config.get("position_options", {}), dict):
        out["position_options"] = _upgrade_options(
            position, config.get("position_options", {}), version, "position_options"
        )
    layered = config.get("layer_position_options")
    if isinstance(layered, dict):
        out["layer_position_options"] = {
            name: _upgrade_options(name, opts, version, f"layer_position_options[{name!r}]")
            if isinstance(name, str) and isinstance(opts, dict)
            else opts
            for name, opts in layered.items()
        }
    return out


def _upgrade_options(scheme: str, options: dict[str, Any], version: int, field: str) -> dict[str, Any]:
    """One scheme's options in today's form, with the old defaults of a version-1 file."""
    renamed = RENAMED_OPTIONS.get(scheme, {})
    new_options: dict[str, Any] = {}
    for key, value in options.items():
        if key not in renamed:
            new_options[key] = value
            continue
        if renamed[key] is None:
            continue  # an option that changed nothing (ALiBi's causal)
        new_key, convert = renamed[key]
        if new_key in options:
            raise ValueError(
                f"{field} gives both {key!r} (the earlier form) and {new_key!r}: keep {new_key!r} alone"
            )
        if not isinstance(value, bool):
            raise ValueError(f"{field}[{key!r}] must be true or false, got {value!r}")
        new_options[new_key] = convert(value)
    old = OLD_DEFAULTS.get(scheme, {}) if version < 2 else {}
    return {**{k: v for k, v in old.items() if k not in new_options}, **new_options}


def config_from_saved(data: Any, version: int, where: str) -> ModelConfig:
    """The :class:`ModelConfig` of ``data`` (a config dict read from a file of format ``version``),
    upgraded; ``ValueError`` naming ``where`` (the file and field) for a wrong field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object of ModelConfig fields, got {type(data).__name__}")
    try:
        return ModelConfig.from_dict(upgrade_config(data, version))
    except (TypeError, ValueError) as err:  # the field's own message: name, value and fix
        raise ValueError(f"{where}: {err}") from None


def load_legacy_file(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> nn.Module:
    """The model in an old single-file save or single-file training checkpoint at ``path``, in
    eval mode on ``device`` (in ``dtype``; default: as saved).

    Raises:
        ValueError: the file is missing, unreadable, or neither kind of posenc file.
    """
    path = Path(path)
    meta = read_metadata(path, "model file")
    if meta.get("posenc_checkpoint") == LEGACY_CHECKPOINT_FORMAT:
        name, config = _checkpoint_model(path, meta)
        model = build_saved(name, config, device, cross_attention=True)
        return load_weights(model, path, device, dtype, prefix="model.").eval()
    if "posenc_model" not in meta or "posenc_config" not in meta:
        raise ValueError(
            f"{str(path)!r} has no posenc metadata: it is not a model saved by posenc "
            "(posenc.model.save_model writes a folder: load that folder)"
        )
    name = meta["posenc_model"]
    if name not in MODEL_CLASSES:
        raise ValueError(
            f"{str(path)!r} holds an unknown model class {name!r}; known: {', '.join(MODEL_CLASSES)}"
        )
    version = saved_version(meta.get("posenc_format"), meta.get("posenc_defaults"))
    where = f"{str(path)!r} metadata 'posenc_config'"
    config = config_from_saved(parse_json(meta["posenc_config"], where), version, where)
    cross = meta.get("cross_attention", "True") == "True"
    model = build_saved(name, config, device, cross_attention=cross)
    return load_weights(model, path, device, dtype).eval()


def _checkpoint_model(path: Path, meta: dict[str, str]) -> tuple[str, ModelConfig]:
    """The model class name and the upgraded config an old checkpoint records."""
    name = meta.get("model_class", "")
    if name not in MODEL_CLASSES or not meta.get("model_config") or meta["model_config"] == "null":
        raise ValueError(
            f"{str(path)!r} does not record a posenc model class ({', '.join(MODEL_CLASSES)}) and config"
        )
    version = saved_version(None, meta.get("posenc_defaults"))
    where = f"the checkpoint {str(path)!r} field 'model_config'"
    return name, config_from_saved(parse_json(meta["model_config"], where), version, where)


def legacy_checkpoint_parts(
    path: str | os.PathLike,
) -> tuple[nn.Module, dict[str, torch.Tensor], dict[str, str]]:
    """An old single-file training checkpoint taken apart: ``(model, trainer tensors, trainer
    metadata)``: the model with its weights (on the CPU), the tensors that are not weights
    (``optimizer.*``, ``rng.*``, ``history.loss``) and the metadata fields of the trainer state
    (the model class and config, the aliases of tied weights and the format marks left out).

    Raises:
        ValueError: the file is missing, unreadable or not an old posenc training checkpoint.
    """
    import safetensors.torch

    path = Path(path)
    meta = read_metadata(path, "checkpoint")
    if meta.get("posenc_checkpoint") != LEGACY_CHECKPOINT_FORMAT:
        raise ValueError(
            f"{str(path)!r} is not a posenc training checkpoint (format "
            f"{meta.get('posenc_checkpoint')!r}, expected {LEGACY_CHECKPOINT_FORMAT!r})"
        )
    name, config = _checkpoint_model(path, meta)
    model = build_saved(name, config, "cpu", cross_attention=True)
    load_weights(model, path, "cpu", prefix="model.")
    try:
        tensors = safetensors.torch.load_file(str(path))
    except Exception as err:  # safetensors' own error types: a truncated file
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from None
    trainer = {k: v for k, v in tensors.items() if not k.startswith("model.")}
    dropped = {"format", "posenc_checkpoint", "posenc_defaults", "model_class", "model_config", "aliases"}
    return model, trainer, {k: v for k, v in meta.items() if k not in dropped}
