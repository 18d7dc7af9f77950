"""Save and load posenc models with safetensors (never pickle): weights + config as JSON metadata.

Two forms: one file (``save_model(model, "model.safetensors")``) or a folder as Hugging Face users
know it (``save_model(model, "my-model/")`` = ``model.save_pretrained("my-model")``: ``config.json``
+ ``model.safetensors``, see :mod:`posenc.model.pretrained`); :func:`load_model` reads either.

The file is an ordinary ``.safetensors`` file; its metadata holds ``posenc_model`` (the class
name) and ``posenc_config`` (the :class:`~posenc.model.ModelConfig` as JSON), so
:func:`load_model` rebuilds the model without any code execution. Tied weights (one Parameter
reachable under several names) are stored once and re-tied by the model's constructor.
"""

from __future__ import annotations

import json
import os

import safetensors
import safetensors.torch
import torch
from torch import nn

from ..base import DEFAULTS_VERSION
from .config import ModelConfig
from .transformer import Decoder, Encoder, EncoderDecoder, TransformerLM

__all__ = [
    "MODEL_CLASSES",
    "build_saved",
    "config_from_metadata",
    "load_model",
    "load_weights",
    "read_metadata",
    "save_model",
    "save_model_file",
]

#: The model classes :func:`load_model` can rebuild, by name.
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "TransformerLM": TransformerLM,
    "EncoderDecoder": EncoderDecoder,
    "Encoder": Encoder,
    "Decoder": Decoder,
}


def save_model(model: nn.Module, path: str | os.PathLike) -> None:
    """Write ``model``'s weights and config to ``path``: a ``.safetensors`` file, or, when ``path``
    is an existing folder or ends with a path separator, that folder in the ``save_pretrained``
    form (``config.json`` + ``model.safetensors``).

    Raises:
        TypeError: ``model`` is not one of :data:`MODEL_CLASSES`, or its ``position_options`` are
            not JSON-serialisable.
    """
    if os.path.isdir(path) or str(path).endswith(("/", os.sep)):
        from .pretrained import save_pretrained

        save_pretrained(model, path)
        return
    save_model_file(model, path)


def save_model_file(model: nn.Module, path: str | os.PathLike) -> None:
    """The single-file form of :func:`save_model`: one ``.safetensors`` file at ``path``."""
    name = type(model).__name__
    if MODEL_CLASSES.get(name) is not type(model):
        raise TypeError(f"save_model takes one of {', '.join(MODEL_CLASSES)}, got {name}")
    try:
        config_json = json.dumps(model.config.to_dict())
    except TypeError as err:
        raise TypeError(
            f"the model's config is not JSON-serialisable ({err}); use plain numbers, "
            "strings, lists and dicts in position_options"
        ) from None
    extra = {"cross_attention": str(model.cross_attention)} if isinstance(model, Decoder) else {}
    metadata = {"format": "pt", "posenc_model": name, "posenc_config": config_json,
                "posenc_defaults": DEFAULTS_VERSION, **extra}  # fmt: skip
    safetensors.torch.save_model(model, str(path), metadata=metadata)  # drops duplicate (tied) names


def config_from_metadata(config_json: str, metadata: dict[str, str]) -> ModelConfig:
    """The :class:`ModelConfig` a file was saved with; a file from before defaults version 2 gets
    the old values of the defaults that changed since (``PositionalScheme.legacy_defaults``)."""
    config = ModelConfig.from_dict(json.loads(config_json))
    return config if metadata.get("posenc_defaults") == DEFAULTS_VERSION else config.with_legacy_defaults()


def read_metadata(path: str | os.PathLike, what: str = "file") -> dict[str, str]:
    """The metadata of a safetensors file; ``ValueError`` naming the file when it is missing or
    unreadable (empty, truncated, not safetensors)."""
    if not os.path.isfile(path):
        raise ValueError(f"no {what} at {str(path)!r}")
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except Exception as err:  # safetensors raises its own error types (SafetensorError) for bad files
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from None


def load_model(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> nn.Module:
    """Rebuild the model saved by :func:`save_model` at ``path`` (a file, or a ``save_pretrained``
    folder) and load its weights.

    Returns the model in eval mode on ``device``, in ``dtype`` (default: the dtype it was saved in).
    """
    if os.path.isdir(path):
        from .pretrained import from_pretrained

        return from_pretrained(path, device=device, dtype=dtype)
    metadata = read_metadata(path, "model file")
    if "posenc_model" not in metadata or "posenc_config" not in metadata:
        raise ValueError(f"{path} has no posenc metadata: it was not written by posenc.model.save_model")
    name = metadata["posenc_model"]
    if name not in MODEL_CLASSES:
        raise ValueError(f"{path} holds an unknown model class {name!r}; known: {', '.join(MODEL_CLASSES)}")
    config = config_from_metadata(metadata["posenc_config"], metadata)
    model = build_saved(
        name, config, device, cross_attention=metadata.get("cross_attention", "True") == "True"
    )
    return load_weights(model, path, device, dtype).eval()


def build_saved(
    name: str, config: ModelConfig, device: str | torch.device, *, cross_attention: bool
) -> nn.Module:
    """A fresh model of class ``name`` on ``device`` (not meta + to_empty, which would untie weights)."""
    with torch.device(device):
        if name == "Decoder":
            return Decoder(config, cross_attention=cross_attention)
        return MODEL_CLASSES[name](config)


def load_weights(
    model: nn.Module, path: str | os.PathLike, device: str | torch.device, dtype: torch.dtype | None = None
) -> nn.Module:
    """Load the safetensors file at ``path`` into ``model`` (tied weights stored once), first cast
    to ``dtype`` (default: the floating dtype the weights were saved in). Returns ``model``."""
    state = safetensors.torch.load_file(str(path), device=str(device))
    if dtype is None:
        saved = {t.dtype for t in state.values() if t.is_floating_point()}
        dtype = saved.pop() if len(saved) == 1 else None
    if dtype is not None:
        model.to(dtype)
    _load_tied(model, state)
    return model


def _load_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load ``state`` (each tied tensor under one of its names) into ``model``, re-using ties."""
    params = dict(model.named_parameters(remove_duplicate=False))
    params.update(dict(model.named_buffers(remove_duplicate=False)))
    groups: dict[int, list[str]] = {}
    for key, tensor in params.items():
        groups.setdefault(id(tensor), []).append(key)
    unexpected = sorted(set(state) - set(params))
    if unexpected:
        raise ValueError(f"the file has weights this model does not: {unexpected[:5]}")
    with torch.no_grad():
        for names in groups.values():
            found = [n for n in names if n in state]
            if not found:
                raise ValueError(f"the file lacks the weights {names}")
            target, saved = params[names[0]], state[found[0]]
            if target.shape != saved.shape:
                raise ValueError(
                    f"the file's {found[0]} has shape {tuple(saved.shape)}, the model's "
                    f"{tuple(target.shape)}: the file's config does not describe its weights"
                )
            target.copy_(saved)
