"""The lab: train short, test long. A training loop, the length-extrapolation study, synthetic tasks.

* :mod:`.config` - :class:`TrainConfig` (one run) and :class:`~.config.StudyConfig` (a study), presets.
* :mod:`.train` - the deterministic, resumable, distributed training loop; :mod:`.checkpoint`
  (atomic safetensors checkpoints), :mod:`.memory` (refuse runs that cannot fit),
  :mod:`.distributed` (torchrun, threads).
* :mod:`.evalset`, :mod:`.evaluate`, :mod:`.stats` - windows over every validation document, one
  evaluator per mode, paired deltas, bootstrap and t intervals.
* :mod:`.cells`, :mod:`.extrapolate`, :mod:`.compare`, :mod:`.plot` - the study as a grid of
  (scheme, seed) cells run here, in local processes or on a Dask cluster; its summary, tables,
  comparisons and figure.
* :mod:`.commands` - ``posenc train`` and ``posenc extrapolate``.

See docs/lab.md.

Names load on first use, so importing this package (as the command line does to read its
arguments) does not import torch.
"""

from __future__ import annotations

import sys
import types

from .._lazy import lazy_attributes

#: public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "CheckpointState": "checkpoint",
    "load_checkpoint": "checkpoint",
    "load_trained_model": "checkpoint",
    "save_checkpoint": "checkpoint",
    "AUTOCAST_MODES": "config",
    "TrainConfig": "config",
    "DistInfo": "distributed",
    "configure_threads": "distributed",
    "dist_info": "distributed",
    "init_distributed": "distributed",
    "InsufficientMemoryError": "memory",
    "MemoryEstimate": "memory",
    "available_memory": "memory",
    "check_memory": "memory",
    "estimate_memory": "memory",
    "TrainResult": "train",
    "batch_at": "train",
    "lr_at": "train",
    "make_optimizer": "train",
    "position_parameters": "train",
    "seed_everything": "train",
    "train": "train",
}


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)


class _Package(types.ModuleType):
    """Keeps ``posenc.lab.train`` the training function: importing the submodule of the same name
    would otherwise rebind the package attribute to the module (the eager imports re-bound it)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "AUTOCAST_MODES",
    "CheckpointState",
    "DistInfo",
    "InsufficientMemoryError",
    "MemoryEstimate",
    "TrainConfig",
    "TrainResult",
    "available_memory",
    "batch_at",
    "check_memory",
    "configure_threads",
    "dist_info",
    "estimate_memory",
    "init_distributed",
    "load_checkpoint",
    "load_trained_model",
    "lr_at",
    "make_optimizer",
    "position_parameters",
    "save_checkpoint",
    "seed_everything",
    "train",
]
