"""The lab: train short, test long. A training loop, the length-extrapolation study, synthetic tasks.

Cut by concept:

* configuration - :mod:`.config` (:class:`TrainConfig`, :class:`~.config.CorpusConfig`, one run's
  :class:`~.config.RunConfig` and a study's :class:`~.config.StudyConfig`, composed of them;
  presets), :mod:`.grid` (scheme entries, per-layer patterns, settings), :mod:`.flags` (the
  command-line flags generated from the dataclass fields);
* data - :mod:`.data` (what the cells read: training bytes, evaluation set, task batches),
  :mod:`.evalset` (windows over every validation document);
* training - :mod:`.train` (the deterministic, resumable, distributed loop), :mod:`.checkpoint`,
  :mod:`.finetune` (fine-tuning cells and their controls), :mod:`.memory` (refuse runs that
  cannot fit);
* evaluation - :mod:`.evaluate` (one evaluator per mode, every length), :mod:`.diagnostics`,
  :mod:`.probe`, :mod:`.pretrained`;
* statistics - :mod:`.stats` (bootstrap, t and Wilson intervals, Holm), :mod:`.summary` (across
  seeds), :mod:`.compare` (paired comparisons of schemes, settings, studies), :mod:`.tasks`
  (rankings of task studies);
* execution - :mod:`.cells` (the grid's cells, here, in processes or on Dask), :mod:`.workers`,
  :mod:`.distributed` (torchrun, threads), :mod:`.runs` (run folders, locks),
  :mod:`.extrapolate` (a study from its cells to its results);
* results and reporting - :mod:`.results` (typed records, ``results.json`` with a schema
  version), :mod:`.tables`, :mod:`.plot`, :mod:`.doctables`;
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
