"""The file format of a posenc model: one folder.

::

    posenc.save_model(model, "my-model")      # my-model/config.json + my-model/model.safetensors
    model = posenc.load_model("my-model")     # rebuilt from config.json, eval mode

``config.json`` holds the format version (``posenc_format``), the model class (``posenc_model``),
the :class:`~posenc.model.ModelConfig` (``config``) and, for a decoder stack, ``cross_attention``:
the model is built from it. ``model.safetensors`` holds the weights (safetensors, never pickle; tied
weights once) and, in its metadata, the class and config they were saved with, so a ``config.json``
that no longer describes them is refused instead of loading as another model (RoPE weights read as
NoPE have the same shapes). A folder may hold more beside them: ``tokenizer.json``
(``save_pretrained(folder, tokenizer=...)``), or the trainer state of a training checkpoint
(:data:`TRAINER_FILE`, :mod:`posenc.lab.checkpoint`), and it still loads as a model.

:func:`load_model` also reads what earlier versions of posenc wrote (one ``.safetensors`` file, a
single-file training checkpoint, older folders) through :mod:`posenc.model.legacy`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .._paths import write_json
from .classes import MODEL_CLASSES
from .config import ModelConfig
from .io import build_saved, load_weights, parse_json, read_metadata, write_weights
from .legacy import config_from_saved, load_legacy_file, saved_version

__all__ = [
    "CONFIG_FILE",
    "FORMAT_VERSION",
    "TRAINER_FILE",
    "WEIGHTS_FILE",
    "SavedModel",
    "is_model_folder",
    "load_model",
    "read_saved",
    "save_model",
]

#: The model's class and config (JSON).
CONFIG_FILE = "config.json"
#: The model's weights (safetensors).
WEIGHTS_FILE = "model.safetensors"
#: The trainer state a training checkpoint keeps beside the model (:mod:`posenc.lab.checkpoint`).
TRAINER_FILE = "trainer.safetensors"
#: The version written into ``config.json``; :mod:`posenc.model.legacy` reads older ones.
FORMAT_VERSION = 2

#: The largest ``config.json`` posenc reads (its own are a few kB).
_MAX_CONFIG_BYTES = 1 << 24


def save_model(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write ``model`` into the folder ``path`` (created if needed): ``config.json`` and
    ``model.safetensors``, each written atomically. Returns the folder.

    ``path`` must be a new or empty folder, or one posenc saved a model into (its ``config.json``
    and weights are replaced, other files are kept); posenc never writes over anything else.

    Raises:
        TypeError: ``model`` is not one of :data:`~posenc.model.MODEL_CLASSES`, or its
            ``position_options`` are not JSON-serialisable.
        ValueError: ``path`` ends in ``.safetensors``, is a file, lies under a file, is not
            writable, holds files that are not a posenc model, or holds a training checkpoint.
    """
    name = type(model).__name__
    if MODEL_CLASSES.get(name) is not type(model):
        raise TypeError(f"save_model takes one of {', '.join(MODEL_CLASSES)}, got {name}")
    config = model.config.to_dict()
    try:
        config_json = json.dumps(config)
    except TypeError as err:
        raise TypeError(
            f"the model's config is not JSON-serialisable ({err}); use plain numbers, "
            "strings, lists and dicts in position_options"
        ) from None
    folder = _check_target(Path(path))
    folder.mkdir(parents=True, exist_ok=True)
    saved = {"posenc_format": FORMAT_VERSION, "posenc_model": name, "config": config}
    metadata = {"posenc_format": str(FORMAT_VERSION), "posenc_model": name, "posenc_config": config_json}
    if hasattr(model, "cross_attention"):
        saved["cross_attention"] = bool(model.cross_attention)
        metadata["cross_attention"] = str(bool(model.cross_attention))
    write_weights(model, folder / WEIGHTS_FILE, metadata)
    write_json(folder / CONFIG_FILE, saved)  # last: a folder with a config.json is complete
    return folder


def _check_target(path: Path) -> Path:
    """``path`` as a folder :func:`save_model` may write: a clear ``ValueError`` naming the fix
    for a ``.safetensors`` name, a file, a place that is not writable, a folder of other files or a
    training checkpoint."""
    if path.suffix == ".safetensors":
        raise ValueError(
            f"save_model writes a folder ({CONFIG_FILE} + {WEIGHTS_FILE}), but {str(path)!r} names a "
            f".safetensors file; give a folder path, e.g. {str(path.with_suffix(''))!r}"
        )
    if (path.exists() or path.is_symlink()) and not path.is_dir():
        raise ValueError(
            f"save_model writes a folder, but {str(path)!r} is a file; give a folder path "
            "(posenc never replaces a file with a model)"
        )
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"cannot save a model at {str(path)!r}: {str(ancestor)!r} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"cannot save a model at {str(path)!r}: {str(ancestor)!r} is not writable")
    if ancestor != path:
        return path
    names = sorted(p.name for p in path.iterdir())
    if names and not is_model_folder(path) and not _interrupted_save(path, names):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise ValueError(
            f"{str(path)!r} holds files that are not a posenc model ({shown}); save_model never "
            "writes over them: give a new or empty folder"
        )
    if TRAINER_FILE in names:
        raise ValueError(
            f"{str(path)!r} holds a training checkpoint ({TRAINER_FILE}); a model saved over it would "
            "leave that trainer state describing other weights: give another folder"
        )
    return path


def _interrupted_save(path: Path, names: list[str]) -> bool:
    """A save of posenc's cut before its last step: the folder holds only posenc's weights file
    (with posenc's own metadata, written before ``config.json``) and temporary files of the save."""
    weights = path / WEIGHTS_FILE
    others = [n for n in names if n != WEIGHTS_FILE and not n.startswith(f".{WEIGHTS_FILE}.tmp")]
    if others or not weights.is_file() or weights.is_symlink():
        return False
    try:
        return "posenc_model" in read_metadata(weights, "model file")
    except ValueError:  # not a safetensors file: someone else's
        return False


def is_model_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` that posenc wrote (a regular file, not
    a link, holding a JSON object with ``posenc_model``)."""
    config = Path(path) / CONFIG_FILE
    try:
        if config.is_symlink() or not config.is_file() or config.stat().st_size > _MAX_CONFIG_BYTES:
            return False
        saved = parse_json(config.read_bytes(), str(config))
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "posenc_model" in saved


def load_model(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    *,
    expect: type | None = None,
) -> nn.Module:
    """Rebuild the model saved by :func:`save_model` in the folder ``path`` (a training
    checkpoint's folder too) and load its weights; a ``.safetensors`` file an earlier version of
    posenc wrote (a model or a training checkpoint) loads as well.

    Returns the model in eval mode on ``device``, in ``dtype`` (default: the dtype it was saved in).
    ``expect``: the class the caller wants (``ValueError`` for another).

    Raises:
        ValueError: nothing at ``path``, or not a posenc model (each message names the file, the
            field and the fix): files missing, unreadable or truncated, a ``config.json`` with wrong
            fields or one that does not describe the weights.
    """
    path = Path(path)
    if path.name == WEIGHTS_FILE and is_model_folder(path.parent):
        path = path.parent  # the weights of a folder: the folder is the model
    if path.is_dir():
        model = _load_folder(path, device, dtype, expect)
    elif path.exists():
        model = load_legacy_file(path, device, dtype)
        if expect is not None and type(model) is not expect:
            raise ValueError(f"{str(path)!r} holds a {type(model).__name__}, not a {expect.__name__}")
    else:
        raise ValueError(f"no saved model at {str(path)!r}: give the folder save_model wrote")
    return model


@dataclass(frozen=True)
class SavedModel:
    """What a model folder's ``config.json`` says: the class name, the config (upgraded to the
    current format) and, for a decoder stack, whether it has cross-attention."""

    name: str
    config: ModelConfig
    cross_attention: bool


def read_saved(folder: str | os.PathLike, expect: type | None = None) -> SavedModel:
    """The checked ``config.json`` of the model folder ``folder``, without loading a weight.

    Raises:
        ValueError: ``folder`` lacks ``config.json`` or ``model.safetensors``, its ``config.json`` is
            not a posenc config (each message names the file and the field), does not describe the
            weights, or names another class than ``expect``.
    """
    folder = Path(folder)
    config_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights.is_file():
        raise ValueError(
            f"{str(folder)!r} is not a saved posenc model folder: it needs {CONFIG_FILE} and "
            f"{WEIGHTS_FILE} (written by posenc.save_model(model, folder))"
        )
    where = repr(str(config_path))
    if config_path.stat().st_size > _MAX_CONFIG_BYTES:
        raise ValueError(f"{where} is larger than {_MAX_CONFIG_BYTES >> 20} MiB: it is not a posenc config")
    saved = parse_json(config_path.read_bytes(), where)
    if not isinstance(saved, dict) or not {"posenc_model", "config"} <= saved.keys():
        raise ValueError(f"{where} is not a posenc config.json: it needs 'posenc_model' and 'config'")
    name, cross = saved["posenc_model"], saved.get("cross_attention", True)
    if not isinstance(name, str) or name not in MODEL_CLASSES:
        raise ValueError(f"{where} names an unknown model class {name!r}; known: {', '.join(MODEL_CLASSES)}")
    if expect is not None and MODEL_CLASSES[name] is not expect:
        raise ValueError(
            f"{str(folder)!r} holds a {name}, not a {expect.__name__}; load it with "
            f"{name}.from_pretrained or posenc.load_model"
        )
    if not isinstance(cross, bool):
        raise ValueError(f"{where}: 'cross_attention' must be a bool, got {cross!r}")
    try:
        version = saved_version(saved.get("posenc_format"), saved.get("posenc_defaults"))
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{where} is format {version}, written by a newer posenc (this one reads up to "
            f"{FORMAT_VERSION}); upgrade posenc to load it"
        )
    config = config_from_saved(saved["config"], version, f"{where} field 'config'")
    _check_against_weights(weights, name, saved["config"], cross)
    return SavedModel(name, config, cross)


def _load_folder(folder: Path, device, dtype, expect: type | None) -> nn.Module:
    saved = read_saved(folder, expect)
    model = build_saved(saved.name, saved.config, device, cross_attention=saved.cross_attention)
    return load_weights(model, folder / WEIGHTS_FILE, device, dtype).eval()


def _check_against_weights(weights: Path, name: str, config: dict, cross_attention: bool) -> None:
    """``config.json`` must describe the weights: the weights file records the class and config it
    was saved with, and a scheme with the same shapes (RoPE read as NoPE or ALiBi) would otherwise
    load silently as another model."""
    meta = read_metadata(weights, "model file")
    if "posenc_config" not in meta:
        return  # weights written by other tools: their shapes are checked when they load
    own = parse_json(meta["posenc_config"], f"{str(weights)!r} metadata 'posenc_config'")
    own_cross = meta.get("cross_attention", "True") == "True"
    if meta.get("posenc_model") == name and own == config and own_cross == cross_attention:
        return
    own = own if isinstance(own, dict) else {}
    keys = {**config, **own}
    diff = [f"{k}: {config.get(k)!r} vs {own.get(k)!r}" for k in keys if config.get(k) != own.get(k)]
    if meta.get("posenc_model") != name:
        diff.insert(0, f"model class: {name!r} vs {meta.get('posenc_model')!r}")
    if own_cross != cross_attention:
        diff.append(f"cross_attention: {cross_attention} vs {own_cross}")
    raise ValueError(
        f"{str(weights.parent / CONFIG_FILE)!r} does not describe the weights in {WEIGHTS_FILE} "
        f"({'; '.join(diff)}); restore {CONFIG_FILE} as it was saved"
    )
