"""The folder form of a saved model, as Hugging Face users know it: ``config.json`` +
``model.safetensors`` (+ ``tokenizer.json`` when a tokenizer is given). No pickle anywhere.

::

    lm.save_pretrained("my-model")                    # or posenc.save_model(lm, "my-model/")
    lm = TransformerLM.from_pretrained("my-model")    # or posenc.load_model("my-model")
    tok = posenc.text.load_tokenizer("my-model")      # when one was saved with it

``model.safetensors`` is the single-file form of :func:`posenc.model.save_model` (weights plus the
config in its metadata), so it also loads alone; ``config.json`` holds the same config for people
and tools to read, and is what :func:`from_pretrained` builds the model from.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from .._paths import write_json
from ..base import DEFAULTS_VERSION
from .classes import MODEL_CLASSES
from .io import build_saved, config_from_metadata, load_weights, parse_json, read_metadata, save_model_file

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "Pretrained", "from_pretrained", "save_pretrained"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_pretrained(model: torch.nn.Module, folder: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Write ``model`` into ``folder`` (created if needed): ``config.json``, ``model.safetensors``
    and, with ``tokenizer`` (a :class:`posenc.text.Tokenizer`), ``tokenizer.json``.

    Returns the folder. Raises ``ValueError`` when ``folder`` is an existing file, ``TypeError`` for
    a model that is not a posenc model (as :func:`posenc.model.save_model`).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"save_pretrained writes a folder, but {str(folder)!r} is a file; give a folder path "
            "(or posenc.save_model(model, 'model.safetensors') for one file)"
        )
    name = type(model).__name__
    if MODEL_CLASSES.get(name) is not type(model):
        raise TypeError(f"save_pretrained takes one of {', '.join(MODEL_CLASSES)}, got {name}")
    if tokenizer is not None and not callable(getattr(tokenizer, "save", None)):
        raise TypeError(f"tokenizer must be a posenc.text.Tokenizer, got {type(tokenizer).__name__}")
    folder.mkdir(parents=True, exist_ok=True)
    save_model_file(model, folder / WEIGHTS_FILE)
    config = {"posenc_model": name, "posenc_defaults": DEFAULTS_VERSION, "config": model.config.to_dict()}
    if hasattr(model, "cross_attention"):
        config["cross_attention"] = bool(model.cross_attention)
    write_json(folder / CONFIG_FILE, config)
    if tokenizer is not None:
        tokenizer.save(folder / "tokenizer.json")
    return folder


def from_pretrained(
    folder: str | os.PathLike,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    expect: type | None = None,
) -> torch.nn.Module:
    """Rebuild the model :func:`save_pretrained` wrote into ``folder``, in eval mode on ``device``,
    in ``dtype`` (default: the dtype its weights were saved in). ``expect``: the class the caller
    wants (``ValueError`` otherwise)."""
    folder = Path(folder)
    config_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not folder.is_dir() or not config_path.is_file() or not weights.is_file():
        raise ValueError(
            f"{str(folder)!r} is not a saved posenc model folder: it needs {CONFIG_FILE} and "
            f"{WEIGHTS_FILE} (written by model.save_pretrained(folder))"
        )
    where = repr(str(config_path))
    saved = parse_json(config_path.read_bytes(), where)
    if not isinstance(saved, dict) or not {"posenc_model", "config"} <= saved.keys():
        raise ValueError(f"{where} is not a posenc config.json: it needs 'posenc_model' and 'config'")
    name, config_dict = saved["posenc_model"], saved["config"]
    if not isinstance(name, str) or name not in MODEL_CLASSES:
        raise ValueError(f"{where} names an unknown model class {name!r}; known: {', '.join(MODEL_CLASSES)}")
    if expect is not None and MODEL_CLASSES[name] is not expect:
        raise ValueError(
            f"{str(folder)!r} holds a {name}, not a {expect.__name__}; load it with "
            f"{name}.from_pretrained or posenc.load_model"
        )
    defaults, cross = saved.get("posenc_defaults", ""), saved.get("cross_attention", True)
    if not isinstance(defaults, str) or not isinstance(cross, bool):
        raise ValueError(f"{where}: 'posenc_defaults' must be a string and 'cross_attention' a bool")
    config = config_from_metadata(
        json.dumps(config_dict), {"posenc_defaults": defaults}, f"{where} field 'config'"
    )
    _check_against_weights(weights, name, config, cross)
    model = build_saved(name, config, device, cross_attention=cross)
    return load_weights(model, weights, device, dtype).eval()


def _check_against_weights(weights: Path, name: str, config, cross_attention: bool) -> None:
    """``config.json`` must describe the weights: the model file carries its own class and config
    (:func:`~posenc.model.io.save_model_file`), and a scheme with the same shapes (RoPE read as
    NoPE or ALiBi) would otherwise load silently as another model."""
    meta = read_metadata(weights, "model file")
    if "posenc_config" not in meta:
        return  # weights written by other tools: their shapes are checked when they load
    where = f"{str(weights)!r} metadata 'posenc_config'"
    own = config_from_metadata(meta["posenc_config"], meta, where)
    own_cross = meta.get("cross_attention", "True") == "True"
    if (
        meta.get("posenc_model") != name
        or own != config
        or (own_cross != cross_attention and "cross_attention" in meta)
    ):
        a, b = dataclasses.asdict(config), dataclasses.asdict(own)
        diff = [f"{k}: {a[k]!r} vs {b[k]!r}" for k in a if a[k] != b[k]]
        if meta.get("posenc_model") != name:
            diff.insert(0, f"model class: {name!r} vs {meta.get('posenc_model')!r}")
        raise ValueError(
            f"{str(weights.parent / CONFIG_FILE)!r} does not describe the weights in {WEIGHTS_FILE} "
            f"({'; '.join(diff) or 'cross_attention differs'}); restore config.json or load the weights "
            f"file alone with posenc.load_model({str(weights)!r})"
        )


class Pretrained:
    """``save_pretrained`` / ``from_pretrained`` methods for posenc's model classes."""

    def save_pretrained(self, folder: str | os.PathLike, tokenizer: Any = None) -> Path:
        """Write this model into ``folder``: ``config.json``, ``model.safetensors`` (and
        ``tokenizer.json`` with a tokenizer)."""
        return save_pretrained(self, folder, tokenizer)  # type: ignore[arg-type]

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
    ):
        """The model saved in ``folder`` by :meth:`save_pretrained`, in eval mode on ``device``."""
        return from_pretrained(folder, device=device, dtype=dtype, expect=cls)
