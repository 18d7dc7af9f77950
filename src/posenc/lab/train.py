"""A training loop worth using: deterministic, resumable, distributed, honest about memory.

What it does, step by step (:func:`train`)::

    batch_at(data, step)        the global batch of this step is a pure function of (seed, step),
                                so every scheme, every resume and every rank sees the same windows
      -> this rank's rows       DDP: rank r takes rows [r B/W, (r+1) B/W) of the global batch B
      -> forward (bf16 autocast on CUDA) -> cross-entropy -> backward (DDP averages gradients)
      -> clip the global gradient norm -> AdamW with lr_at(step): linear warmup, cosine decay
      -> every ``checkpoint_every`` steps: weights, optimizer state, RNG states, step and loss
         history into one safetensors file, written atomically (temporary file + ``os.replace``)

Because the batch depends only on ``(seed, step)``, resuming needs only the weights, the AdamW
moments, the RNG states (dropout) and the step: a run killed after a checkpoint and resumed ends
with bit-identical weights to an uninterrupted one (same device, thread count and torch version).

Distributed: launched under ``torchrun``, :func:`init_distributed` joins the process group (gloo on
CPU, NCCL on CUDA) and :func:`train` wraps the model in ``DistributedDataParallel``; the global
batch stays the same, so ``W`` processes follow the same trajectory as one (up to float summation
order). Rank 0 alone logs and writes checkpoints.

Legend: ``B`` global batch, ``b`` per-rank batch, ``s`` sequence length, ``V`` vocabulary,
``W`` world size (processes), ``n`` bytes of training data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_choice, check_fields, check_int, check_positive_float

__all__ = [
    "AUTOCAST_MODES",
    "CHECKPOINT_FORMAT",
    "IGNORE_INDEX",
    "BatchFn",
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

#: ``TrainConfig.autocast`` values: mixed precision for the forward pass.
AUTOCAST_MODES: dict[str, str] = {
    "auto": "bf16 autocast on CUDA, full float32 elsewhere",
    "bf16": "bf16 autocast on any device (slow on CPUs without bf16 units)",
    "off": "full float32",
}

#: Targets with this value are left out of the loss (``F.cross_entropy``'s default).
IGNORE_INDEX = -100

#: A batch source: ``(step, rank, world_size) -> (ids [b, s], targets [b, s])``, this rank's rows of
#: the step's global batch; a pure function of its arguments (so resume and DDP stay exact).
BatchFn = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]

#: Written into every checkpoint's metadata; a file without it is refused.
CHECKPOINT_FORMAT = "posenc-checkpoint-1"


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """How to train: budget, batch, optimizer, schedule, checkpoints.

    Args:
        steps: optimizer steps.
        batch_size: ``B``, the *global* batch (windows per step, all processes together).
        seq_len: ``s``, tokens per window (the train length L).
        lr: peak learning rate (reached after warmup).
        min_lr: learning rate at the end of the cosine decay.
        warmup_steps: linear warmup from ``lr / warmup_steps`` to ``lr``.
        weight_decay: AdamW decoupled weight decay, on matrices and embeddings only (not on
            biases, LayerNorm gains or other vectors).
        betas: AdamW ``(beta1, beta2)``.
        grad_clip: clip the global gradient norm to this (0 = no clipping).
        seed: seeds the batches (with the step) and, via :func:`seed_everything`, the RNGs.
        checkpoint_every: write a checkpoint every this many steps (0 = only at the end);
            needs a checkpoint path in :func:`train`.
        log_every: how often the history and progress bar are refreshed (each refresh reads
            the loss from the device, a synchronisation on CUDA).
        autocast: a key of :data:`AUTOCAST_MODES`.
    """

    steps: int = 600
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 0
    log_every: int = 10
    autocast: str = "auto"

    def __post_init__(self) -> None:
        check_int(self.steps, "steps")
        check_int(self.batch_size, "batch_size")
        check_int(self.seq_len, "seq_len")
        check_positive_float(self.lr, "lr")
        check_positive_float(self.min_lr, "min_lr")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr={self.min_lr} must be <= lr={self.lr} (the cosine decays lr -> min_lr)")
        check_int(self.warmup_steps, "warmup_steps", minimum=0)
        if isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, (int, float)) \
                or not 0 <= self.weight_decay < 1:
            raise ValueError(f"weight_decay must be a number in [0, 1), got {self.weight_decay!r}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(x, (int, float)) and 0 <= x < 1 for x in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        self.betas = (float(betas[0]), float(betas[1]))
        clip = self.grad_clip
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
            raise ValueError(f"grad_clip must be a number >= 0 (0 = no clipping), got {self.grad_clip!r}")
        check_int(self.seed, "seed", minimum=0)
        check_int(self.checkpoint_every, "checkpoint_every", minimum=0)
        check_int(self.log_every, "log_every")
        check_choice(self.autocast, "autocast", AUTOCAST_MODES)

    @property
    def tokens_per_step(self) -> int:
        """``B * s``: tokens in one global batch."""
        return self.batch_size * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` listing the valid ones."""
        check_fields(cls, data)
        data = dict(data)
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        return cls(**data)


#: Fields that may change between a run and its resumption (they do not change the result).
_RESUMABLE_CHANGES = ("checkpoint_every", "log_every")


# ----------------------------------------------------------------------------------------------
# Pure pieces: schedule, batches, seeding, threads
# ----------------------------------------------------------------------------------------------
def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate of step ``step`` (0-based): linear warmup, then cosine decay to ``min_lr``.

    Warmup: ``lr * (step + 1) / warmup_steps`` for ``step < warmup_steps``. Then with
    ``t = (step - warmup) / (steps - warmup)`` in ``[0, 1)``:
    ``min_lr + (lr - min_lr) * (1 + cos(pi t)) / 2``.
    """
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    t = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr + (config.lr - config.min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0)))


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit seed for ``(seed, step)``, different for every pair in practice (golden-ratio mixing)."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + 1) % (2**63 - 1)


def batch_at(
    data: torch.Tensor,
    step: int,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch of ``step``: ``B`` random windows of ``s + 1`` tokens, split into
    inputs and next-token targets; a pure function of ``(data, seed, step)``.

    Args:
        data: ``[n]`` integer tokens (uint8 bytes for a byte-level LM), ``n > s``.
        step: the optimizer step (0-based).
        batch_size: ``B``, the global batch.
        seq_len: ``s``.
        seed: the run's seed.
        rank, world_size: this process's share: rows ``[rank B/W, (rank+1) B/W)``; ``W`` must divide ``B``.

    Returns:
        ``(ids, targets)``, each ``[B/W, s]`` int64 on ``data``'s device; ``targets[:, i] = ids[:, i+1]``
        within the window, i.e. ``data[start + i + 1]``.
    """
    n = data.shape[-1]
    if data.dim() != 1 or data.is_floating_point():
        raise ValueError(f"data must be a 1-D integer token tensor [n], got {data.dtype} {tuple(data.shape)}")
    if n <= seq_len + 1:
        raise ValueError(
            f"the training data has {n} tokens, too few for windows of seq_len + 1 = {seq_len + 1}; "
            "use more data or a shorter seq_len"
        )
    if batch_size % world_size:
        raise ValueError(
            f"batch_size={batch_size} (global) must be divisible by world_size={world_size} processes; "
            f"use a multiple of {world_size}"
        )
    g = torch.Generator().manual_seed(_step_seed(seed, step))
    # [B] window starts: window i is data[start_i : start_i + s + 1]
    starts = torch.randint(0, n - seq_len, (batch_size,), generator=g)
    per_rank = batch_size // world_size
    starts = starts[rank * per_rank : (rank + 1) * per_rank].to(data.device)  # [b]
    index = starts[:, None] + torch.arange(seq_len + 1, device=data.device)  # [b, 1] + [s + 1] -> [b, s + 1]
    windows = data[index].long()  # [b, s + 1]
    return windows[:, :-1], windows[:, 1:]  # [b, s] inputs, [b, s] targets


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and every CUDA device) with ``seed``."""
    check_int(seed, "seed", minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def configure_threads(num_threads: int | None = None, *, world_size: int = 1) -> int:
    """Set torch's intra-op threads and return the number chosen.

    ``None`` picks the CPUs this process may run on, divided among ``world_size`` local
    processes, minus the cores other processes keep busy (1-minute load average): on a shared
    2-core machine, 2 OpenMP threads competing with other jobs spin and can run several times
    slower than 1 thread (measured: a 0.8M-parameter training step took 6.5 s with 2 threads and
    1.5 s with 1 thread at load 11).
    """
    if num_threads is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        cpus = max(1, cpus // max(1, world_size))
        try:
            busy = max(0.0, os.getloadavg()[0] - 1.0)  # the load of everything but ourselves, roughly
        except OSError:  # pragma: no cover - no load average on this platform
            busy = 0.0
        num_threads = max(1, min(cpus, round(cpus - busy / max(1, world_size))))
    check_int(num_threads, "num_threads")
    torch.set_num_threads(num_threads)
    return num_threads


# ----------------------------------------------------------------------------------------------
# Distributed
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: ``rank`` of ``world_size`` processes, ``local_rank`` on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes files."""
        return self.rank == 0


def dist_info() -> DistInfo:
    """The current process group's rank and size (``DistInfo()`` when not distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return DistInfo(
            torch.distributed.get_rank(),
            torch.distributed.get_world_size(),
            int(os.environ.get("LOCAL_RANK", torch.distributed.get_rank())),
        )
    return DistInfo()


def init_distributed(device: str | torch.device = "cpu") -> tuple[DistInfo, torch.device]:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE > 1`` in the environment).

    Uses NCCL for CUDA and gloo otherwise; on CUDA each process takes GPU ``LOCAL_RANK``. Without
    ``torchrun`` (or with one process) this does nothing and returns ``(DistInfo(), device)``.

    Returns:
        ``(info, device)``: this process's rank/world and the device it must use.
    """
    device = torch.device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return dist_info(), device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return dist_info(), device


# ----------------------------------------------------------------------------------------------
# Memory: refuse a run that cannot fit, before it starts
# ----------------------------------------------------------------------------------------------
class InsufficientMemoryError(MemoryError, ValueError):
    """A run's estimated memory exceeds what the device has free (raised before it starts).

    A ``ValueError`` too, so the CLI reports it as a bad configuration with its message.
    """


@dataclass(frozen=True)
class MemoryEstimate:
    """A rough upper estimate of a run's peak memory, in bytes, by part."""

    weights: int
    grads: int
    optimizer: int
    activations: int
    detail: str = ""

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations

    def summary(self) -> str:
        parts = [("weights", self.weights), ("grads", self.grads), ("AdamW", self.optimizer),
                 ("activations", self.activations)]
        inner = ", ".join(f"{k} {_gib(v)}" for k, v in parts if v)
        return f"{_gib(self.total)} ({inner}{'; ' + self.detail if self.detail else ''})"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def estimate_memory(
    model_config: Any,
    batch_size: int,
    seq_len: int,
    *,
    training: bool = True,
    num_params: int | None = None,
    bytes_per_value: int = 4,
) -> MemoryEstimate:
    """Estimate the peak memory of training (or evaluating) a :class:`~posenc.model.TransformerLM`.

    The model is float32; AdamW keeps two moments per parameter. Per layer and token a pre-LN
    block keeps about ``10 d + 2 d_ff`` values for the backward pass; attention with a score
    bias or an explicit softmax holds ``h s^2`` values per window (counted as if every window
    materialised its attention matrix, an upper bound for fused kernels); the output layer holds
    logits, their softmax and its gradient, ``3 V`` per token.

    Args:
        model_config: a :class:`~posenc.model.ModelConfig` (``d_model``, ``num_layers``,
            ``num_heads``, ``ffn_dim``, ``vocab_size``).
        batch_size: windows per process (not the global batch).
        seq_len: ``s``.
        training: with gradients and optimizer state (False: inference, one layer alive at a time).
        num_params: the exact parameter count if known (default: from the config).
    """
    c = model_config
    d, f, h, L, V = c.d_model, c.ffn_dim, c.num_heads, c.num_layers, c.vocab_size
    if num_params is None:
        num_params = V * d + L * (4 * d * d + 2 * d * f + 4 * d) + 2 * d
    bpv = bytes_per_value
    tokens = batch_size * seq_len
    attention = batch_size * h * seq_len * seq_len * bpv  # [b, h, s, s] probabilities/logits of one layer
    logits = tokens * V * bpv * 3
    weights = num_params * bpv
    if training:
        per_layer = tokens * (10 * d + 2 * f) * bpv + attention
        return MemoryEstimate(weights, weights, 2 * weights, L * per_layer + logits,
                              f"batch {batch_size} x seq {seq_len}, {L} layers")
    per_layer = tokens * (6 * d + f) * bpv + 2 * attention  # live tensors of the layer being computed
    return MemoryEstimate(weights, 0, 0, per_layer + logits, f"inference, batch {batch_size} x seq {seq_len}")


def available_memory(device: str | torch.device = "cpu") -> int:
    """Bytes free for a new run: CUDA ``mem_get_info`` free memory, or the OS's available RAM
    (``MemAvailable`` on Linux, else physical pages free)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_memory(
    estimate: MemoryEstimate,
    device: str | torch.device = "cpu",
    *,
    available: int | None = None,
    what: str = "this run",
    headroom: float = 0.9,
) -> None:
    """Raise :class:`InsufficientMemoryError` when ``estimate`` does not fit in ``headroom`` of the
    free memory of ``device`` (``available`` overrides the measurement, e.g. in tests)."""
    free = available_memory(device) if available is None else available
    if estimate.total > headroom * free:
        raise InsufficientMemoryError(
            f"{what} would not fit in memory: it needs about {estimate.summary()}, but only "
            f"{_gib(free)} is free on {torch.device(device)}. Reduce the batch size (or evaluate in smaller "
            "chunks), the sequence length or the model size, or use a device with more memory."
        )


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


def _unwrap(model: nn.Module) -> nn.Module:
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
) -> None:
    """Write everything needed to resume at ``step`` to ``path`` (safetensors, never pickle).

    Holds the weights (tied tensors once), every AdamW state tensor, the torch/CUDA/NumPy/Python
    RNG states, the loss history, the next step, and the train and model configs as JSON
    metadata. Written to a temporary file in the same folder, flushed to disk, then renamed over
    ``path`` with ``os.replace`` (atomic on POSIX): a run killed mid-write leaves the previous
    checkpoint intact.
    """
    import safetensors.torch

    model = _unwrap(model)
    path = Path(path)
    aliases = _aliases(model)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name not in aliases:
            tensors[f"model.{name}"] = tensor.detach().cpu().contiguous()
    opt = optimizer.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
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
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


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
        ValueError: the file is missing, not a posenc checkpoint, or its weights do not match ``model``.
    """
    import safetensors
    import safetensors.torch

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {str(path)!r}; run without resume to start a new run")
    with safetensors.safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    if meta.get("posenc_checkpoint") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{str(path)!r} is not a posenc training checkpoint (format {meta.get('posenc_checkpoint')!r}, "
            f"expected {CHECKPOINT_FORMAT!r}); model files from save_model load with posenc.model.load_model"
        )
    tensors = safetensors.torch.load_file(str(path))
    model = _unwrap(model)
    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
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
    import safetensors

    from .. import model as models

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {str(path)!r}")
    try:
        with safetensors.safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception as err:  # safetensors raises its own error types for non-safetensors files
        raise ValueError(f"{str(path)!r} is not a safetensors file: {err}") from None
    if meta.get("posenc_checkpoint") != CHECKPOINT_FORMAT:
        return models.load_model(path).eval()  # a save_model file, or its clear error
    cls = getattr(models, meta.get("model_class", ""), None)
    if cls is None or not meta.get("model_config") or meta["model_config"] == "null":
        raise ValueError(f"{str(path)!r} does not record a posenc model class and config")
    model = cls(models.ModelConfig.from_dict(json.loads(meta["model_config"])))
    load_checkpoint(path, model, restore_rng=False)
    return model.eval()


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """What a :func:`train` call did.

    Attributes:
        losses: the training loss of every step run so far (including steps before a resume).
        start_step: the step this call started from (0, or the checkpoint's step).
        end_step: the next step to run (``config.steps`` when finished).
        wall_s: seconds spent in this call (checkpoint writing included).
        tokens_per_s: training tokens (global batch) per second in this call.
        completed: whether all ``config.steps`` were run.
    """

    losses: list[float] = field(default_factory=list)
    start_step: int = 0
    end_step: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    completed: bool = False


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with decay on tensors of 2 or more dims (matrices, embeddings) and none on vectors
    (biases, LayerNorm gains), the usual GPT recipe."""
    params = [p for p in _unwrap(model).parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)


def _autocast(device: torch.device, mode: str) -> contextlib.AbstractContextManager:
    if mode == "bf16" or (mode == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _check_resumable(saved: dict[str, Any], config: TrainConfig, path: Path) -> None:
    current = config.to_dict()
    diff = sorted(k for k in current if k not in _RESUMABLE_CHANGES and saved.get(k) != current[k])
    if diff:
        shown = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current[k]!r}" for k in diff)
        raise ValueError(
            f"cannot resume from {str(path)!r}: the training config changed ({shown}); resume with the "
            "same settings, or start a new run in another folder"
        )


def train(
    model: nn.Module,
    data: torch.Tensor | BatchFn,
    config: TrainConfig,
    *,
    device: str | torch.device | None = None,
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool | None = None,
    desc: str = "train",
    stop_at: int | None = None,
    memory_check: bool = True,
    on_log: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train ``model`` (ids ``[b, s]`` -> logits ``[b, s, V]``) on ``data`` by next-token prediction.

    Call :func:`seed_everything` before building the model so its initialisation is reproducible;
    batches depend only on ``config.seed`` and the step (:func:`batch_at`).

    Args:
        model: an ``nn.Module`` returning logits ``[b, s, V]`` (or an object with ``.logits``),
            already on ``device``. Under ``torchrun`` (a process group is initialised) it is
            wrapped in ``DistributedDataParallel`` here.
        data: ``[n]`` integer tokens (kept on the CPU; batches are moved to ``device``), or a
            :data:`BatchFn` ``(step, rank, world_size) -> (ids [b, s], targets [b, s])`` giving this
            rank's share of the step's global batch, a pure function of its arguments (targets
            equal to :data:`IGNORE_INDEX` do not count, e.g. the questions of a synthetic task).
        config: the :class:`TrainConfig`.
        device: where the model lives (default: the device of its first parameter).
        checkpoint: path of the checkpoint file (written every ``config.checkpoint_every`` steps
            and at the end by rank 0).
        resume: continue from ``checkpoint`` if it exists (a fresh start if it does not).
        progress: show a tqdm bar (loss, tokens/s, lr); ``None`` = only when stderr is a terminal,
            and never on ranks other than 0.
        desc: the progress bar's label.
        stop_at: stop (as if preempted) once this step is reached, after writing a checkpoint;
            ``None`` = run to ``config.steps``.
        memory_check: estimate the memory first and refuse a run that cannot fit
            (:class:`InsufficientMemoryError`); needs ``model.config``.
        on_log: called as ``on_log(step, loss)`` on rank 0 at every log point.

    Returns:
        a :class:`TrainResult`.
    """
    info = dist_info()
    module = _unwrap(model)
    if device is None:
        device = next(module.parameters()).device
    device = torch.device(device)
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if config.checkpoint_every and ckpt is None:
        raise ValueError(f"checkpoint_every={config.checkpoint_every} needs a checkpoint path to write to")
    if stop_at is not None:
        check_int(stop_at, "stop_at", minimum=0)
    if config.batch_size % info.world_size:
        raise ValueError(
            f"batch_size={config.batch_size} (global) must be divisible by the {info.world_size} processes; "
            f"use a multiple of {info.world_size}"
        )
    local_batch = config.batch_size // info.world_size
    if memory_check and hasattr(module, "config"):
        n_params = sum(p.numel() for p in module.parameters())
        estimate = estimate_memory(module.config, local_batch, config.seq_len, num_params=n_params)
        what = f"training {desc} (batch {local_batch} x {config.seq_len} per process)"
        check_memory(estimate, device, what=what)

    optimizer = make_optimizer(module, config)
    start, losses, elapsed_before = 0, [], 0.0
    if resume and ckpt is not None and ckpt.is_file():
        state = load_checkpoint(ckpt, module, optimizer)
        _check_resumable(state.train_config, config, ckpt)
        start, losses, elapsed_before = state.step, state.losses, state.elapsed_s
    if info.world_size > 1:
        ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
        model = nn.parallel.DistributedDataParallel(module, **ddp_kwargs)
    else:
        model = module
    end = config.steps if stop_at is None else min(config.steps, max(stop_at, start))
    if progress is None:
        progress = sys.stderr.isatty()
    bar = _progress_bar(progress and info.is_main, config.steps, start, desc)

    model.train()
    pending: list[torch.Tensor] = []
    t0 = time.perf_counter()
    t_log, step_log = t0, start

    def flush(step: int) -> None:
        nonlocal t_log, step_log
        if not pending:
            return
        values = torch.stack(pending).float()  # [k] losses of this rank
        if info.world_size > 1:  # the global batch's mean loss, as one process would see it
            torch.distributed.all_reduce(values)
            values /= info.world_size
        pending.clear()
        values_list = values.cpu().tolist()
        losses.extend(values_list)
        now = time.perf_counter()
        tok_s = (step + 1 - step_log) * config.tokens_per_step / max(now - t_log, 1e-9)
        t_log, step_log = now, step + 1
        if bar is not None:
            bar.update(step + 1 - bar.n)
            lr = lr_at(step, config)
            bar.set_postfix(loss=f"{values_list[-1]:.3f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}")
        if on_log is not None and info.is_main:
            on_log(step, values_list[-1])

    for step in range(start, end):
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if callable(data):
            ids, targets = data(step, info.rank, info.world_size)
        else:
            ids, targets = batch_at(data, step, config.batch_size, config.seq_len, config.seed,
                                    rank=info.rank, world_size=info.world_size)
        ids, targets = ids.to(device, non_blocking=True), targets.to(device, non_blocking=True)  # [b, s] each
        with _autocast(device, config.autocast):
            out = model(ids)
        logits = getattr(out, "logits", out)  # [b, s, V]
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP: gradients averaged over ranks here
        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(module.parameters(), config.grad_clip)
        optimizer.step()
        pending.append(loss.detach())
        if (step + 1) % config.log_every == 0 or step + 1 == end:
            flush(step)
        at_checkpoint = config.checkpoint_every and (step + 1) % config.checkpoint_every == 0
        if ckpt is not None and (at_checkpoint or step + 1 == end):
            flush(step)
            if info.is_main:
                save_checkpoint(ckpt, module, optimizer, step + 1, train_config=config, losses=losses,
                                elapsed_s=elapsed_before + time.perf_counter() - t0)
            if info.world_size > 1:
                torch.distributed.barrier()
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0
    model.eval()
    return TrainResult(
        losses=losses,
        start_step=start,
        end_step=max(end, start),
        wall_s=wall,
        tokens_per_s=(end - start) * config.tokens_per_step / max(wall, 1e-9),
        completed=max(end, start) >= config.steps,
    )


def _progress_bar(enabled: bool, total: int, initial: int, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True, leave=True)
