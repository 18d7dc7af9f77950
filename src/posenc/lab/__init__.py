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
"""

from .checkpoint import CheckpointState, load_checkpoint, load_trained_model, save_checkpoint
from .config import AUTOCAST_MODES, TrainConfig
from .distributed import DistInfo, configure_threads, dist_info, init_distributed
from .memory import InsufficientMemoryError, MemoryEstimate, available_memory, check_memory, estimate_memory
from .train import TrainResult, batch_at, lr_at, make_optimizer, position_parameters, seed_everything, train

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
