"""A Hugging Face checkpoint folder read and written without ``transformers``: ``config.json`` and
safetensors weights (one ``model.safetensors`` or shards listed in ``model.safetensors.index.json``).

Everything read is checked: the config's fields by type and range (:class:`HFConfig`), the weights'
names and shapes against what the config implies (:class:`HFWeights`), shard names confined to the
folder. Errors are ``ValueError`` naming the file and the field or tensor. Pickle files
(``pytorch_model.bin``) are never read.

Legend: ``V`` vocabulary, ``d`` model width.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from ..._paths import write_json
from ..io import parse_json

__all__ = ["HFConfig", "HFWeights", "read_hf_folder", "write_hf_folder"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: config.json and the shard index are small; a larger file is not one of them (and is not read whole).
_MAX_JSON_BYTES = 16 << 20
_MISSING = object()


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path`` (a ``config.json`` or an index), at most 16 MiB and nested at most
    :data:`~posenc.model.io.MAX_JSON_DEPTH` deep; a one-line ``ValueError`` naming the file otherwise."""
    size = path.stat().st_size
    if size > _MAX_JSON_BYTES:
        raise ValueError(
            f"{str(path)!r} is {size} bytes, too large for a {path.name} (limit {_MAX_JSON_BYTES})"
        )
    data = parse_json(path.read_bytes(), repr(str(path)))
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


class HFConfig:
    """A ``config.json`` dict whose fields are read with checks; errors name ``source`` and the field.

    Args:
        data: the config as a dict (``json.load`` of the file, or ``PretrainedConfig.to_dict()``).
        source: where it came from, for error messages.
    """

    def __init__(self, data: Mapping[str, Any], source: str = CONFIG_FILE) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"{source} must be a JSON object, got {type(data).__name__}")
        self.data, self.source = dict(data), source

    def _bad(self, name: str, want: str, value: object) -> ValueError:
        return ValueError(f"{self.source}: field {name!r} must be {want}, got {value!r}")

    def get(self, name: str, default: Any = None) -> Any:
        """The raw value of field ``name`` (``default`` when absent or null)."""
        value = self.data.get(name)
        return default if value is None else value

    def first(self, names: Iterable[str], default: Any = _MISSING) -> tuple[str, Any]:
        """``(name, value)`` of the first of ``names`` present and not null (configs name fields
        differently per family: ``n_embd``/``hidden_size``); ``ValueError`` when none is and no default."""
        names = tuple(names)
        for name in names:
            if self.data.get(name) is not None:
                return name, self.data[name]
        if default is _MISSING:
            raise ValueError(f"{self.source} lacks the field {' / '.join(map(repr, names))}")
        return names[0], default

    def int(self, *names: str, default: Any = _MISSING, minimum: int = 1, maximum: int = 1 << 40) -> int:
        """An int field in ``[minimum, maximum]`` (the first of ``names`` present)."""
        name, value = self.first(names, default)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self._bad(name, f"an int in [{minimum}, {maximum}]", value)
        return value

    def float(self, *names: str, default: Any = _MISSING, positive: bool = True) -> float:
        """A finite number (> 0 unless ``positive=False``)."""
        name, value = self.first(names, default)
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not ok or (positive and value <= 0):
            raise self._bad(name, "a finite number" + (" > 0" if positive else ""), value)
        return float(value)

    def bool(self, *names: str, default: Any = _MISSING) -> bool:
        name, value = self.first(names, default)
        if not isinstance(value, bool):
            raise self._bad(name, "true or false", value)
        return value

    def str(self, *names: str, default: Any = _MISSING, choices: Iterable[str] | None = None) -> str:
        name, value = self.first(names, default)
        choices = None if choices is None else tuple(choices)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self._bad(name, "a string" if choices is None else f"one of {list(choices)}", value)
        return value


class HFWeights:
    """Named tensors taken one by one with their expected shapes; what is left at the end is an error.

    Args:
        tensors: name -> tensor (a checkpoint's state dict).
        source: the file(s) they came from, for error messages.
        ignore: name suffixes that are not weights (buffers old checkpoints saved: ``attn.bias``,
            ``attn.masked_bias``, ``rotary_emb.inv_freq``); dropped without a word.
    """

    def __init__(
        self, tensors: Mapping[str, torch.Tensor], source: str, ignore: tuple[str, ...] = ()
    ) -> None:
        dotted = tuple("." + suffix for suffix in ignore)  # whole name parts: c_attn.bias is a weight
        self.tensors = {k: v for k, v in tensors.items() if not k.endswith(dotted)}
        self.source = source

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor ``name``, which must have ``shape``; removed from the pool."""
        if name not in self.tensors:
            raise ValueError(
                f"{self.source} lacks the tensor {name!r} (shape {list(shape)}) the config implies"
            )
        t = self.tensors.pop(name)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(
                f"{self.source}: tensor {name!r} has shape {list(t.shape)}, the config implies {list(shape)}"
            )
        if not t.is_floating_point():
            raise ValueError(f"{self.source}: tensor {name!r} has dtype {t.dtype}, expected floating point")
        return t

    def rename(self, old: str, new: str) -> None:
        """Read the tensor saved as ``old`` under ``new`` (a name older checkpoints used)."""
        if old in self.tensors and new not in self.tensors:
            self.tensors[new] = self.tensors.pop(old)

    def drop(self, name: str) -> None:
        """Forget ``name`` if present (a tied output layer saved beside its embedding)."""
        self.tensors.pop(name, None)

    def finish(self) -> None:
        """Raise when tensors the config does not account for are left."""
        if self.tensors:
            left = sorted(self.tensors)
            raise ValueError(
                f"{self.source} has {len(left)} tensor(s) the config does not account for: {left[:6]}"
                + (" ..." if len(left) > 6 else "")
            )


def _shard_paths(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{str(index)!r}: field 'weight_map' must be a non-empty object of name -> file")
        for shard in weight_map.values():
            # a shard is a file of this folder: no separators, no parent references
            if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
                raise ValueError(f"{str(index)!r}: shard {shard!r} is not a file name inside the folder")
        names = dict.fromkeys(weight_map.values())  # each shard once, in order (hashing: linear time)
        return [folder / n for n in names]
    pickles = [n for n in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (folder / n).exists()]
    hint = (
        f"; it has {pickles[0]}, a pickle file, which posenc does not read (it can run code): "
        "re-save it with safetensors (model.save_pretrained(folder, safe_serialization=True))"
        if pickles
        else ""
    )
    raise ValueError(f"{str(folder)!r} has neither {WEIGHTS_FILE} nor {INDEX_FILE}{hint}")


def read_hf_folder(folder: str | os.PathLike) -> tuple[HFConfig, HFWeights]:
    """``config.json`` and every safetensors tensor of a Hugging Face folder (``save_pretrained``),
    on the CPU, as saved. No network, no ``transformers``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(
            f"{str(folder)!r} is not a folder (a Hugging Face checkpoint is a folder with {CONFIG_FILE})"
        )
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"{str(folder)!r} has no {CONFIG_FILE}")
    config = HFConfig(read_json(config_path), str(config_path))
    tensors: dict[str, torch.Tensor] = {}
    paths = _shard_paths(folder)
    for path in paths:
        if not path.is_file():
            raise ValueError(f"the shard {str(path)!r} listed in {INDEX_FILE} is missing")
        try:
            part = safetensors.torch.load_file(str(path), device="cpu")
        except Exception as err:  # safetensors raises its own error types for bad files
            raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from None
        clash = sorted(set(part) & set(tensors))
        if clash:
            raise ValueError(f"{str(path)!r} repeats tensors of another shard: {clash[:3]}")
        tensors.update(part)
    source = str(paths[0]) if len(paths) == 1 else f"the shards of {str(folder)!r}"
    return config, HFWeights(tensors, source)


def write_hf_folder(
    folder: str | os.PathLike,
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (created if needed). Returns
    the folder. A folder that already holds either file is refused unless ``overwrite=True``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is a file; give a folder path to write the checkpoint into")
    existing = [n for n in (CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE) if (folder / n).exists()]
    if existing and not overwrite:
        raise ValueError(
            f"{str(folder)!r} already holds {', '.join(existing)}; pick another folder or overwrite=True"
        )
    folder.mkdir(parents=True, exist_ok=True)
    # safetensors wants contiguous tensors that share no memory
    flat = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    safetensors.torch.save_file(flat, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    write_json(folder / CONFIG_FILE, config)
    return folder
