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

import json
import os
from pathlib import Path
from typing import Any

import torch

from .._paths import write_json
from ..base import DEFAULTS_VERSION
from .classes import MODEL_CLASSES
from .io import build_saved, config_from_metadata, load_weights, save_model_file

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
    try:
        saved = json.loads(config_path.read_text())
        name, config_dict = saved["posenc_model"], saved["config"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{str(config_path)!r} is not a posenc config.json ({err})") from None
    if name not in MODEL_CLASSES:
        raise ValueError(
            f"{str(config_path)!r} names an unknown model class {name!r}; known: {', '.join(MODEL_CLASSES)}"
        )
    if expect is not None and MODEL_CLASSES[name] is not expect:
        raise ValueError(
            f"{str(folder)!r} holds a {name}, not a {expect.__name__}; load it with "
            f"{name}.from_pretrained or posenc.load_model"
        )
    config = config_from_metadata(
        json.dumps(config_dict), {"posenc_defaults": saved.get("posenc_defaults", "")}
    )
    model = build_saved(name, config, device, cross_attention=saved.get("cross_attention", True))
    return load_weights(model, weights, device, dtype).eval()


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
