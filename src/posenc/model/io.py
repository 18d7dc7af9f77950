"""Reading and writing the parts of a saved posenc model, with safetensors (never pickle): the
weights file (tied weights stored once, re-tied by the model's constructor), JSON read with a depth
limit, and the model rebuilt from its class name. The format itself (a folder) is
:mod:`posenc.model.saving`; files of earlier versions are read by :mod:`posenc.model.legacy`.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import os
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import nn

from .classes import MODEL_CLASSES
from .config import ModelConfig

__all__ = [
    "MAX_JSON_DEPTH",
    "MODEL_CLASSES",
    "build_saved",
    "load_weights",
    "parse_json",
    "read_metadata",
    "write_error",
    "write_weights",
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


def write_weights(model: nn.Module, path: str | os.PathLike, metadata: dict[str, str]) -> None:
    """Write ``model``'s weights (tied ones once) and ``metadata`` to the safetensors file ``path``
    atomically: a new temporary file in the same folder (never through a link left in its place),
    flushed to disk, renamed over ``path``; a failed write leaves ``path`` as it was. ``OSError``
    naming ``path`` when the disk is full or the write fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover of a killed write by a process with the same pid
    try:
        # safetensors writes through its own path; the O_EXCL create keeps it off a planted link
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666))
        try:
            safetensors.torch.save_model(model, str(tmp), metadata={"format": "pt", **metadata})
        except safetensors.SafetensorError as err:
            raise write_error(err, path) from None
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


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
    model: nn.Module,
    path: str | os.PathLike,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
    *,
    prefix: str = "",
) -> nn.Module:
    """Load the safetensors file at ``path`` into ``model`` (tied weights stored once), first cast
    to ``dtype`` (default: the floating dtype the weights were saved in). ``prefix``: the weights
    are the tensors whose names start with it (the rest of the file is left out). Returns ``model``.
    ``ValueError`` naming the file when it is unreadable or its weights are not ``model``'s."""
    try:
        state = safetensors.torch.load_file(str(path), device=str(device))
    except Exception as err:  # safetensors' own error types: random bytes, a truncated file
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from None
    state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    if dtype is None:
        saved = {t.dtype for t in state.values() if t.is_floating_point()}
        dtype = saved.pop() if len(saved) == 1 else None
    if dtype is not None:
        model.to(dtype)
    try:
        _load_tied(model, state)
    except ValueError as err:
        raise ValueError(f"{str(path)!r}: {err}") from None
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
