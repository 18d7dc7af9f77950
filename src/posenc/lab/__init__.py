"""The lab: train short, test long. A training loop, the length-extrapolation study, synthetic tasks.

* :mod:`.train` - deterministic, resumable, distributed training with atomic safetensors checkpoints.
* :mod:`.extrapolate` - one small byte-level LM per scheme, evaluated at lengths past the trained one.
* :mod:`.commands` - ``posenc train`` and ``posenc extrapolate``.

See docs/lab.md.
"""

from .train import (
    AUTOCAST_MODES,
    CheckpointState,
    DistInfo,
    InsufficientMemoryError,
    MemoryEstimate,
    TrainConfig,
    TrainResult,
    available_memory,
    batch_at,
    check_memory,
    configure_threads,
    dist_info,
    estimate_memory,
    init_distributed,
    load_checkpoint,
    lr_at,
    make_optimizer,
    save_checkpoint,
    seed_everything,
    train,
)

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
    "lr_at",
    "make_optimizer",
    "save_checkpoint",
    "seed_everything",
    "train",
]
