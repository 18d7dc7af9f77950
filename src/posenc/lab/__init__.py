"""The lab: train short, test long. A training loop, the length-extrapolation study, synthetic tasks.

* :mod:`.train` - deterministic, resumable, distributed training with atomic safetensors checkpoints.
* :mod:`.extrapolate` - one small byte-level LM per scheme, evaluated at lengths past the trained one.
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
