"""Training checkpoints: one safetensors file (never pickle) with the weights, the AdamW state,
the RNG states, the step, the loss history and the configs; written atomically (temporary file,
``fsync``, ``os.replace``) so a run killed during the write keeps its previous checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..base import DEFAULTS_VERSION
from .config import TrainConfig
from .runs import check_owner, current_run_id

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointState",
    "load_checkpoint",
    "load_trained_model",
    "read_checkpoint_meta",
    "save_checkpoint",
    "unwrap_model",
]

#: Written into every checkpoint's metadata; a file without it is refused.
CHECKPOINT_FORMAT = "posenc-checkpoint-1"


# ----------------------------------------------------------------------------------------------
# Checkpoints: one safetensors file, written atomically
# ----------------------------------------------------------------------------------------------
@dataclass
class CheckpointState:
    """What :func:`load_checkpoint` restores besides the weights and optimizer: the next step to
    run, the loss history so far, and the configs the run was started with."""

    step: int
    losses: list[float]
    train_config: dict[str, Any]
    model_config: dict[str, Any] | None
    elapsed_s: float


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model itself: ``model.module`` under DistributedDataParallel, else ``model``."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _aliases(model: nn.Module) -> dict[str, str]:
    """Tied parameters: ``{alias name: canonical name}`` (the first name under which each tensor appears)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(keys.astype(np.int64))
    py = random.getstate()
    meta = {"numpy": [kind, int(pos), int(has_gauss), float(cached)], "python": [py[0], list(py[1]), py[2]]}
    return tensors, meta


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda][: torch.cuda.device_count()])
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    *,
    train_config: TrainConfig,
    losses: list[float] | None = None,
    elapsed_s: float = 0.0,
    data_id: str | None = None,
) -> None:
    """Write everything needed to resume at ``step`` to ``path`` (safetensors, never pickle).

    ``data_id`` names the training data (e.g. the corpus sha256), so a resume can refuse other data.

    Holds the weights (tied tensors once), every AdamW state tensor, the torch/CUDA/NumPy/Python
    RNG states, the loss history, the next step, and the train and model configs as JSON
    metadata. Written to a temporary file in the same folder, flushed to disk, then renamed over
    ``path`` with ``os.replace`` (atomic on POSIX): a run killed mid-write leaves the previous
    checkpoint intact.
    """
    model = unwrap_model(model)
    path = Path(path)
    aliases = _aliases(model)
    opt = optimizer.state_dict()
    tensors, scalars = _state_tensors(model, opt, aliases)
    rng_tensors, rng_meta = _rng_state()
    tensors.update(rng_tensors)
    tensors["history.loss"] = torch.tensor(losses or [], dtype=torch.float64)
    model_config = getattr(model, "config", None)
    metadata = {
        "format": "pt",
        "posenc_checkpoint": CHECKPOINT_FORMAT,
        "step": str(step),
        "elapsed_s": repr(float(elapsed_s)),
        "train_config": json.dumps(train_config.to_dict()),
        "model_config": json.dumps(model_config.to_dict() if hasattr(model_config, "to_dict") else None),
        "model_class": type(model).__name__,
        "aliases": json.dumps(aliases),
        "optimizer_groups": json.dumps(opt["param_groups"]),
        "optimizer_scalars": json.dumps(scalars),
        "rng": json.dumps(rng_meta),
        "torch_version": torch.__version__,
        "data_id": data_id or "",
        "posenc_defaults": DEFAULTS_VERSION,
        "run_id": current_run_id(),
    }
    _write_atomically(path, tensors, metadata)


def _state_tensors(model: nn.Module, opt: dict[str, Any], aliases: dict[str, str]):
    """The weights (tied tensors once, as ``model.NAME``) and AdamW's state tensors
    (``optimizer.INDEX.KEY``) on the CPU, and the optimizer's non-tensor state by parameter index."""
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name not in aliases:
            tensors[f"model.{name}"] = tensor.detach().cpu().contiguous()
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, scalars


def _write_atomically(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A temporary file in the same folder, flushed to disk, renamed over ``path`` (atomic on POSIX)."""
    import safetensors
    import safetensors.torch

    check_owner(path)  # a process of a run that lost its folder writes nothing into it
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        try:
            safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
        except safetensors.SafetensorError as err:  # the disk full, among others: an OSError naming the file
            from ..model.io import write_error

            raise write_error(err, path) from None
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


#: Metadata fields that hold JSON.
_JSON_META = ("train_config", "model_config", "aliases", "optimizer_groups", "optimizer_scalars", "rng")

#: Metadata every checkpoint of this format carries.
_REQUIRED_META = (
    "step",
    "elapsed_s",
    "train_config",
    "model_config",
    "aliases",
    "optimizer_groups",
    "optimizer_scalars",
    "rng",
)


def read_checkpoint_meta(path: str | os.PathLike) -> dict[str, str]:
    """The metadata of a training checkpoint, checked, without loading a tensor.

    Raises:
        ValueError: the file is missing, unreadable (truncated, empty, not safetensors), not a posenc
            training checkpoint, or lacks metadata this format writes.
    """
    from ..model.io import read_metadata

    path = Path(path)
    meta = read_metadata(path, "checkpoint")
    if meta.get("posenc_checkpoint") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{str(path)!r} is not a posenc training checkpoint (format {meta.get('posenc_checkpoint')!r}, "
            f"expected {CHECKPOINT_FORMAT!r}); model files from save_model load with posenc.model.load_model"
        )
    missing = [k for k in _REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(
            f"the checkpoint {str(path)!r} lacks {missing}: it was not written by this "
            "version's save_checkpoint; delete it to start again"
        )
    _check_meta(path, meta)
    return meta


def _check_meta(path: Path, meta: dict[str, str]) -> None:
    """Every metadata field :func:`load_checkpoint` reads has the type it writes (JSON nested at
    most 32 deep); a ``ValueError`` naming the file and the field otherwise."""
    from ..model.io import parse_json

    def bad(field: str, expected: str) -> ValueError:
        return ValueError(
            f"the checkpoint {str(path)!r} field {field!r} is not {expected}; it was not written by "
            "save_checkpoint (delete it to start again)"
        )

    parsed = {k: parse_json(meta[k], f"the checkpoint {str(path)!r} field {k!r}") for k in _JSON_META}
    if not meta["step"].isdigit() or len(meta["step"]) > 18:
        raise bad("step", "an integer >= 0")
    try:
        elapsed = float(meta["elapsed_s"])
    except ValueError:
        elapsed = math.nan
    if not math.isfinite(elapsed) or elapsed < 0:
        raise bad("elapsed_s", "a number of seconds >= 0")
    if not isinstance(parsed["train_config"], dict):
        raise bad("train_config", "a JSON object")
    if not isinstance(parsed["model_config"], (dict, type(None))):
        raise bad("model_config", "a JSON object or null")
    aliases = parsed["aliases"]
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise bad("aliases", "a JSON object of parameter names")
    groups = parsed["optimizer_groups"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise bad("optimizer_groups", "a list of parameter groups")
    scalars = parsed["optimizer_scalars"]
    if not isinstance(scalars, dict) or not all(
        k.isdigit() and isinstance(v, dict) for k, v in scalars.items()
    ):
        raise bad("optimizer_scalars", "a JSON object of per-parameter states")
    rng = parsed["rng"]
    numpy_state = rng.get("numpy") if isinstance(rng, dict) else None
    python_state = rng.get("python") if isinstance(rng, dict) else None
    if not (
        isinstance(numpy_state, list)
        and len(numpy_state) == 4
        and isinstance(numpy_state[0], str)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numpy_state[1:])
        and isinstance(python_state, list)
        and len(python_state) == 3
        and isinstance(python_state[0], int)
        and isinstance(python_state[1], list)
        and len(python_state[1]) == 625
        and all(isinstance(v, int) and 0 <= v < 2**32 for v in python_state[1])
        and (python_state[2] is None or isinstance(python_state[2], float))
    ):
        raise bad("rng", "the NumPy and Python random states")


def _check_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The non-weight tensors a checkpoint must hold, with the shapes and dtypes that restore."""
    expected = {
        "history.loss": (torch.float64, None),
        "rng.torch": (torch.uint8, torch.get_rng_state().numel()),
        "rng.numpy": (torch.int64, 624),
    }
    for name, (dtype, numel) in expected.items():
        tensor = tensors.get(name)
        if (
            tensor is None
            or tensor.dtype != dtype
            or tensor.dim() != 1
            or numel not in (None, tensor.numel())
        ):
            got = "missing" if tensor is None else f"{tensor.dtype} of shape {tuple(tensor.shape)}"
            size = "" if numel is None else f" of {numel}"
            raise ValueError(
                f"the checkpoint {str(path)!r} tensor {name!r} must be a 1-D {dtype}{size}, got {got}; "
                "it was not written by save_checkpoint (delete it to start again)"
            )
    for name in tensors:
        if name.startswith("optimizer.") and not re.fullmatch(r"optimizer\.\d{1,9}\.\w+", name):
            raise ValueError(
                f"the checkpoint {str(path)!r} holds a tensor {name!r} save_checkpoint never writes"
            )


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    restore_rng: bool = True,
) -> CheckpointState:
    """Load a checkpoint written by :func:`save_checkpoint` into ``model`` (and ``optimizer``),
    restore the RNG states, and return the step to continue from and the history.

    Raises:
        ValueError: the file is missing, unreadable, not a posenc checkpoint, or its weights do not
            match ``model``.
    """
    import safetensors.torch

    path = Path(path)
    meta = read_checkpoint_meta(path)
    try:
        tensors = safetensors.torch.load_file(str(path))
    except Exception as err:  # a header that reads but data that does not (truncated file)
        raise ValueError(
            f"{str(path)!r} is not a readable checkpoint ({err}); delete it to start again"
        ) from None
    _check_tensors(path, tensors)
    model = unwrap_model(model)
    state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    for alias, canonical in json.loads(meta["aliases"]).items():
        if canonical in state:
            state[alias] = state[canonical]
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"the checkpoint {str(path)!r} does not match this model: {err}") from None
    if optimizer is not None:
        opt_state: dict[int, dict[str, Any]] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, index, name = key.split(".", 2)
                opt_state.setdefault(int(index), {})[name] = value
        for index, values in json.loads(meta["optimizer_scalars"]).items():
            opt_state.setdefault(int(index), {}).update(values)
        groups = json.loads(meta["optimizer_groups"])
        for group in groups:
            if isinstance(group.get("betas"), list):
                group["betas"] = tuple(group["betas"])
        optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    if restore_rng:
        _set_rng_state(tensors, json.loads(meta["rng"]))
    return CheckpointState(
        step=int(meta["step"]),
        losses=tensors["history.loss"].tolist(),
        train_config=json.loads(meta["train_config"]),
        model_config=json.loads(meta["model_config"]),
        elapsed_s=float(meta["elapsed_s"]),
    )


def load_trained_model(path: str | os.PathLike) -> nn.Module:
    """A model from a training checkpoint (:func:`save_checkpoint`) or a model file
    (:func:`posenc.model.save_model`), in eval mode, for analysis (no optimizer, RNG untouched).

    Raises:
        ValueError: the file is missing or is neither kind of posenc file.
    """
    from .. import model as models
    from ..model.io import MODEL_CLASSES, config_from_metadata, read_metadata

    path = Path(path)
    meta = read_metadata(path, "checkpoint")
    if meta.get("posenc_checkpoint") != CHECKPOINT_FORMAT:
        return models.load_model(path).eval()  # a save_model file, or its clear error
    cls = MODEL_CLASSES.get(meta.get("model_class", ""))  # an allow-list, not a lookup on a module
    if cls is None or not meta.get("model_config") or meta["model_config"] == "null":
        raise ValueError(
            f"{str(path)!r} does not record a posenc model class ({', '.join(MODEL_CLASSES)}) and config"
        )
    read_checkpoint_meta(path)
    model = cls(
        config_from_metadata(meta["model_config"], meta, f"the checkpoint {str(path)!r} field 'model_config'")
    )
    load_checkpoint(path, model, restore_rng=False)
    return model.eval()
