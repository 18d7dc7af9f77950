"""Training checkpoints: the model's folder (:func:`posenc.model.save_model`: ``config.json`` +
``model.safetensors``) with the trainer state beside it in ``trainer.safetensors`` (never pickle):
every AdamW state tensor, the RNG states and the loss history, with the step, the time trained and
the train config in its metadata. A checkpoint folder loads as a model with
:func:`posenc.model.load_model` (and ``posenc extrapolate --model``).

A checkpoint is written whole into a temporary folder beside it (each file flushed to disk), then
swapped in by renaming; a run killed during the write keeps its previous checkpoint, and one
killed between the two renames finds it again under its temporary name (:func:`checkpoint_exists`).
A checkpoint an earlier version wrote as one ``NAME.safetensors`` file is converted into the folder
``NAME`` when a run resumes it (:mod:`posenc.model.legacy` reads it).
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import random
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..model.saving import TRAINER_FILE, is_model_folder, read_saved, save_model
from .config import TrainConfig
from .runs import check_owner, current_run_id

__all__ = [
    "TRAINER_FORMAT",
    "CheckpointState",
    "check_checkpointable",
    "checkpoint_exists",
    "load_checkpoint",
    "load_trained_model",
    "read_checkpoint_meta",
    "save_checkpoint",
    "unwrap_model",
]

#: Written into the trainer state's metadata; a trainer file without it is refused.
TRAINER_FORMAT = "posenc-trainer-1"


# ----------------------------------------------------------------------------------------------
# Checkpoints: the model's folder and the trainer state, written atomically
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
    """Write everything needed to resume at ``step`` into the folder ``path``.

    ``data_id`` names the training data (e.g. the corpus sha256), so a resume can refuse other data.

    The folder is the model's (:func:`posenc.model.save_model`) plus ``trainer.safetensors``: every
    AdamW state tensor, the torch/CUDA/NumPy/Python RNG states, the loss history, and the next
    step and train config as JSON metadata. The whole folder is written under a temporary name and
    swapped in: a run killed mid-write keeps the previous checkpoint.

    Raises:
        ValueError: ``path`` ends in ``.safetensors`` or holds something that is not a checkpoint
            (a file, a folder of other files): posenc never writes over those.
        TypeError: ``model`` is not a posenc model (:data:`~posenc.model.MODEL_CLASSES`).
    """
    model = unwrap_model(model)
    path = Path(path)
    if path.suffix == ".safetensors":
        raise ValueError(
            f"a checkpoint is a folder, but {str(path)!r} names a .safetensors file; give a folder "
            f"path, e.g. {str(path.with_suffix(''))!r}"
        )
    check_owner(path)  # a process of a run that lost its folder writes nothing into it
    checkpoint_exists(path)  # a swap cut short is completed first
    if (path.exists() or path.is_symlink()) and not _is_checkpoint(path):
        raise ValueError(
            f"{str(path)!r} exists and is not a posenc checkpoint; a checkpoint never replaces it: "
            "give another path"
        )
    opt = optimizer.state_dict()
    tensors, scalars = _state_tensors(opt)
    rng_tensors, rng_meta = _rng_state()
    tensors.update(rng_tensors)
    tensors["history.loss"] = torch.tensor(losses or [], dtype=torch.float64)
    metadata = {
        "format": "pt",
        "posenc_trainer": TRAINER_FORMAT,
        "step": str(step),
        "elapsed_s": repr(float(elapsed_s)),
        "train_config": json.dumps(train_config.to_dict()),
        "optimizer_groups": json.dumps(opt["param_groups"]),
        "optimizer_scalars": json.dumps(scalars),
        "rng": json.dumps(rng_meta),
        "torch_version": torch.__version__,
        "data_id": data_id or "",
        "run_id": current_run_id(),
    }
    _write_folder(path, lambda tmp: save_model(model, tmp), tensors, metadata)


def check_checkpointable(model: nn.Module) -> None:
    """``TypeError`` unless a checkpoint can hold ``model``: one of posenc's model classes
    (:data:`~posenc.model.MODEL_CLASSES`), whose folder :func:`posenc.model.load_model` rebuilds."""
    from ..model.classes import MODEL_CLASSES

    name = type(unwrap_model(model)).__name__
    if MODEL_CLASSES.get(name) is not type(unwrap_model(model)):
        raise TypeError(
            f"a checkpoint holds one of posenc's models ({', '.join(MODEL_CLASSES)}), got {name}; "
            "register its class (posenc.model.classes.register_model) or train without a checkpoint"
        )


def _is_checkpoint(path: Path) -> bool:
    return (
        path.is_dir() and not path.is_symlink() and is_model_folder(path) and (path / TRAINER_FILE).is_file()
    )


def _state_tensors(opt: dict[str, Any]):
    """AdamW's state tensors (``optimizer.INDEX.KEY``) on the CPU, and its non-tensor state by
    parameter index."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, scalars


def _temporary(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}{os.getpid()}")


def _write_folder(
    path: Path, write_model, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """``write_model(folder)`` and the trainer state into a temporary folder beside ``path``, each
    file flushed to disk, then swapped in for ``path`` (rename the old one aside, rename the new
    one in, delete the old one)."""
    import safetensors
    import safetensors.torch

    from ..model.io import write_error

    path.parent.mkdir(parents=True, exist_ok=True)
    # One process at a time writes a checkpoint (the run's owner, rank 0): temporary folders of
    # this one that exist now were left by a killed write (the swap was completed or undone by
    # checkpoint_exists before this call).
    for leftover in _temporaries(path):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp, old = _temporary(path, "tmp"), _temporary(path, "old")
    try:
        try:
            write_model(tmp)
        except OSError as err:
            if err.errno is None:
                raise
            raise OSError(err.errno, err.strerror, str(path)) from None  # the checkpoint, not its temporary
        trainer = tmp / TRAINER_FILE
        try:
            safetensors.torch.save_file(tensors, str(trainer), metadata=metadata)
        except safetensors.SafetensorError as err:  # the disk full, among others: an OSError naming the file
            raise write_error(err, path / TRAINER_FILE) from None
        with open(trainer, "rb") as fh:
            os.fsync(fh.fileno())
        if path.exists() and _exchange(tmp, path):
            return  # tmp now holds the previous checkpoint: deleted below
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders ``a`` and ``b`` in one step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``), so ``b`` never goes missing; ``False`` where the system or the file
    system cannot (the caller renames in two steps)."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _temporaries(path: Path) -> list[Path]:
    """The temporary folders of writes of ``path``: ``.NAME.tmp<PID>`` and ``.NAME.old<PID>``."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(tmp|old)\d+")
    if not path.parent.is_dir():
        return []
    return [
        p for p in path.parent.iterdir() if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    ]


def checkpoint_exists(path: str | os.PathLike) -> bool:
    """Whether a checkpoint folder is at ``path``, after completing a swap a killed write left
    half done (the previous checkpoint renamed aside as ``.NAME.old<PID>``, the new one complete
    in ``.NAME.tmp<PID>`` but not yet renamed in) and converting a checkpoint an earlier version
    wrote as ``PATH.safetensors`` into the folder."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        return True
    for aside in _temporaries(path):
        kind, pid = aside.name[len(path.name) + 2 :][:3], aside.name[len(path.name) + 5 :]
        if kind != "old" or not _is_checkpoint(aside):
            continue
        # the new folder was complete before the old one was renamed aside: it is the newer one
        new = path.with_name(f".{path.name}.tmp{pid}")
        os.replace(new if _is_checkpoint(new) else aside, path)
        return True
    if (old_file := path.with_name(f"{path.name}.safetensors")).is_file():
        _convert_legacy(old_file, path)
    return path.exists()


def _convert_legacy(old_file: Path, path: Path) -> None:
    """The single-file checkpoint ``old_file`` written again as the checkpoint folder ``path``
    (the old file is kept)."""
    from ..model.legacy import legacy_checkpoint_parts

    check_owner(path)
    model, tensors, meta = legacy_checkpoint_parts(old_file)
    metadata = {**meta, "format": "pt", "posenc_trainer": TRAINER_FORMAT}
    _write_folder(path, lambda tmp: save_model(model, tmp), tensors, metadata)


#: Metadata fields that hold JSON.
_JSON_META = ("train_config", "optimizer_groups", "optimizer_scalars", "rng")

#: Metadata every checkpoint of this format carries.
_REQUIRED_META = (
    "step",
    "elapsed_s",
    "train_config",
    "optimizer_groups",
    "optimizer_scalars",
    "rng",
)


def read_checkpoint_meta(path: str | os.PathLike) -> dict[str, str]:
    """The trainer state's metadata of the checkpoint folder ``path``, checked, without loading a
    tensor, with the model's class (``model_class``) and config (``model_config``, JSON, as the
    model is built) from its ``config.json``.

    Raises:
        ValueError: the folder is missing, is not a checkpoint (a model folder without trainer
            state, a file), or a file in it is unreadable, truncated or lacks what this format writes.
    """
    from ..model.io import read_metadata

    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        raise ValueError(
            f"{str(path)!r} is a single-file checkpoint of an earlier posenc; resume it by giving the "
            f"folder path {str(path.with_suffix(''))!r} (it is converted), or load its model with "
            "posenc.load_model"
        )
    if not path.is_dir():
        raise ValueError(f"no checkpoint at {str(path)!r}")
    trainer = path / TRAINER_FILE
    if not trainer.is_file():
        raise ValueError(
            f"{str(path)!r} is not a posenc training checkpoint: it has no {TRAINER_FILE} (a model saved "
            "with save_model loads with posenc.model.load_model)"
        )
    meta = read_metadata(trainer, "trainer state")
    if meta.get("posenc_trainer") != TRAINER_FORMAT:
        raise ValueError(
            f"{str(trainer)!r} is not a posenc trainer state (format {meta.get('posenc_trainer')!r}, "
            f"expected {TRAINER_FORMAT!r}); delete the checkpoint {str(path)!r} to start again"
        )
    missing = [k for k in _REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(
            f"the checkpoint {str(path)!r} lacks {missing}: it was not written by this "
            "version's save_checkpoint; delete it to start again"
        )
    _check_meta(path, meta)
    saved = read_saved(path)
    return {**meta, "model_class": saved.name, "model_config": json.dumps(saved.config.to_dict())}


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
    """Load the checkpoint folder written by :func:`save_checkpoint` into ``model`` (and
    ``optimizer``), restore the RNG states, and return the step to continue from and the history.

    Raises:
        ValueError: the folder is missing, unreadable, not a posenc checkpoint, or its weights do
            not match ``model``.
    """
    import safetensors.torch

    from ..model.io import load_weights
    from ..model.saving import WEIGHTS_FILE

    path = Path(path)
    meta = read_checkpoint_meta(path)
    try:
        tensors = safetensors.torch.load_file(str(path / TRAINER_FILE))
    except Exception as err:  # a header that reads but data that does not (truncated file)
        raise ValueError(
            f"{str(path / TRAINER_FILE)!r} is not a readable checkpoint ({err}); delete it to start again"
        ) from None
    _check_tensors(path, tensors)
    model = unwrap_model(model)
    if type(model).__name__ != meta["model_class"]:
        raise ValueError(
            f"the checkpoint {str(path)!r} does not match this model: it holds a {meta['model_class']}, "
            f"not a {type(model).__name__}"
        )
    device = next(iter(model.parameters()), torch.empty(0)).device
    try:
        load_weights(model, path / WEIGHTS_FILE, device)
    except ValueError as err:
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
    """A model from a training checkpoint folder (:func:`save_checkpoint`) or a model folder
    (:func:`posenc.model.save_model`), or a single file an earlier version wrote, in eval mode,
    for analysis (no optimizer, RNG untouched).

    Raises:
        ValueError: nothing at ``path``, or not a posenc model.
    """
    from ..model.saving import load_model

    return load_model(path).eval()
