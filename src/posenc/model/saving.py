"""Saving and loading a posenc model in either form: one ``.safetensors`` file
(:mod:`posenc.model.io`) or a ``save_pretrained`` folder (:mod:`posenc.model.pretrained`).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from .classes import MODEL_CLASSES
from .io import build_saved, config_from_metadata, load_weights, read_metadata, save_model_file
from .pretrained import from_pretrained, save_pretrained

__all__ = ["load_model", "save_model"]


def save_model(model: nn.Module, path: str | os.PathLike) -> None:
    """Write ``model``'s weights and config to ``path``: a ``.safetensors`` file, or, when ``path``
    is an existing folder or ends with a path separator, that folder in the ``save_pretrained``
    form (``config.json`` + ``model.safetensors``).

    Raises:
        TypeError: ``model`` is not one of :data:`MODEL_CLASSES`, or its ``position_options`` are
            not JSON-serialisable.
    """
    if os.path.isdir(path) or str(path).endswith(("/", os.sep)):
        save_pretrained(model, path)
        return
    save_model_file(model, path)


def load_model(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> nn.Module:
    """Rebuild the model saved by :func:`save_model` at ``path`` (a file, or a ``save_pretrained``
    folder) and load its weights.

    Returns the model in eval mode on ``device``, in ``dtype`` (default: the dtype it was saved in).
    """
    if os.path.isdir(path):
        return from_pretrained(path, device=device, dtype=dtype)
    metadata = read_metadata(path, "model file")
    if "posenc_model" not in metadata or "posenc_config" not in metadata:
        raise ValueError(f"{path} has no posenc metadata: it was not written by posenc.model.save_model")
    name = metadata["posenc_model"]
    if name not in MODEL_CLASSES:
        raise ValueError(f"{path} holds an unknown model class {name!r}; known: {', '.join(MODEL_CLASSES)}")
    config = config_from_metadata(
        metadata["posenc_config"], metadata, f"{str(path)!r} metadata 'posenc_config'"
    )
    model = build_saved(
        name, config, device, cross_attention=metadata.get("cross_attention", "True") == "True"
    )
    return load_weights(model, path, device, dtype).eval()
