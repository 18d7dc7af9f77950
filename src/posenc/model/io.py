"""The single-file form of a saved posenc model, with safetensors (never pickle): weights + config as
JSON metadata. :func:`posenc.model.save_model` / :func:`~posenc.model.load_model`
(:mod:`posenc.model.saving`) write and read it, or the folder form of :mod:`posenc.model.pretrained`.

The file is an ordinary ``.safetensors`` file; its metadata holds ``posenc_model`` (the class
name) and ``posenc_config`` (the :class:`~posenc.model.ModelConfig` as JSON), so
:func:`~posenc.model.load_model` rebuilds the model without any code execution. Tied weights (one Parameter
reachable under several names) are stored once and re-tied by the model's constructor.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import nn

from ..base import DEFAULTS_VERSION
from .classes import MODEL_CLASSES
from .config import ModelConfig

__all__ = [
    "MAX_JSON_DEPTH",
    "MODEL_CLASSES",
    "build_saved",
    "config_from_metadata",
    "load_weights",
    "parse_json",
    "read_metadata",
    "save_model_file",
    "write_error",
]

#: The deepest nesting of lists and objects posenc accepts in JSON it reads from a file (its own
#: files nest 4 levels at most); deeper JSON is refused before anything recurses through it.
MAX_JSON_DEPTH = 32


def write_error(err: Exception, path: str | os.PathLike) -> OSError:
    """A ``safetensors`` write failure (its ``SafetensorError`` wraps the OS error in text) as an
    ``OSError`` naming ``path``: the disk full (``ENOSPC``), or another input/output error."""
    text = str(err)
    full = "No space left" in text or "StorageFull" in text or getattr(err, "errno", None) == errno.ENOSPC
    if full:
        return OSError(errno.ENOSPC, "no space left on device", str(path))
    return OSError(
        errno.EIO,
        f"cannot write the file ({text.splitlines()[0][:200] if text else type(err).__name__})",
        str(path),
    )


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
    extra = {"cross_attention": str(model.cross_attention)} if hasattr(model, "cross_attention") else {}
    metadata = {"format": "pt", "posenc_model": name, "posenc_config": config_json,
                "posenc_defaults": DEFAULTS_VERSION, **extra}  # fmt: skip
    try:
        safetensors.torch.save_model(model, str(path), metadata=metadata)  # drops duplicate (tied) names
    except safetensors.SafetensorError as err:
        raise write_error(err, path) from None


def parse_json(text: str | bytes, where: str) -> Any:
    """``text`` parsed as JSON, nested at most :data:`MAX_JSON_DEPTH` deep; a ``ValueError``
    naming ``where`` (the file and field) for text that is not UTF-8 or not JSON, or nests deeper."""
    try:
        value = json.loads(text)
    except ValueError as err:  # not JSON, not UTF-8, an integer of more than 4300 digits
        raise ValueError(f"{where} is not valid JSON ({str(err)[:200]})") from None
    except RecursionError:
        value = None
        depth = MAX_JSON_DEPTH + 1
    else:
        depth = _depth(value)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(
            f"{where} nests lists/objects more than {MAX_JSON_DEPTH} deep; it is not a posenc file"
        )
    return value


def _depth(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_JSON_DEPTH:
            stack.extend((child, level + 1) for child in children)
    return deepest


def config_from_metadata(
    config_json: str, metadata: dict[str, str], where: str = "the model config"
) -> ModelConfig:
    """The :class:`ModelConfig` a file was saved with; a file from before defaults version 2 gets
    the old values of the defaults that changed since (``PositionalScheme.legacy_defaults``).
    ``where`` names the file and field for errors (``ValueError``: bad JSON, a wrong field)."""
    data = parse_json(config_json, where)
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object of ModelConfig fields, got {type(data).__name__}")
    try:
        config = ModelConfig.from_dict(data)
        return (
            config if metadata.get("posenc_defaults") == DEFAULTS_VERSION else config.with_legacy_defaults()
        )
    except (TypeError, ValueError) as err:  # the field's own message: name, value and fix
        raise ValueError(f"{where}: {err}") from None


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


def build_saved(
    name: str, config: ModelConfig, device: str | torch.device, *, cross_attention: bool
) -> nn.Module:
    """A fresh model of class ``name`` on ``device`` (not meta + to_empty, which would untie weights)."""
    cls = MODEL_CLASSES[name]
    takes_cross = "cross_attention" in inspect.signature(cls).parameters  # a decoder stack
    with torch.device(device):
        return cls(config, cross_attention=cross_attention) if takes_cross else cls(config)


def load_weights(
    model: nn.Module, path: str | os.PathLike, device: str | torch.device, dtype: torch.dtype | None = None
) -> nn.Module:
    """Load the safetensors file at ``path`` into ``model`` (tied weights stored once), first cast
    to ``dtype`` (default: the floating dtype the weights were saved in). Returns ``model``."""
    try:
        state = safetensors.torch.load_file(str(path), device=str(device))
    except Exception as err:  # safetensors' own error types: random bytes, a truncated file
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from None
    if dtype is None:
        saved = {t.dtype for t in state.values() if t.is_floating_point()}
        dtype = saved.pop() if len(saved) == 1 else None
    if dtype is not None:
        model.to(dtype)
    _load_tied(model, state)
    return model


def _load_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load ``state`` (each tied tensor under one of its names) into ``model``, re-using ties."""
    # every name of every parameter and persistent buffer (tied ones under each name); buffers a
    # module recomputes itself (non-persistent: frequencies, precomputed rows) are not in files
    params = model.state_dict(keep_vars=True)
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
            if target.is_floating_point() and not saved.is_floating_point():
                raise ValueError(
                    f"the file's {found[0]} is {saved.dtype}, not a floating-point tensor: it is not a "
                    "posenc model's weights"
                )
            if saved.is_floating_point() and saved.isnan().any():
                raise ValueError(f"the file's {found[0]} holds NaN values: the weights are broken")
            target.copy_(saved)
