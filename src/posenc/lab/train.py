"""A training loop worth using: deterministic, resumable, distributed, honest about memory.

What it does, step by step (:func:`train`)::

    batch_at(data, step)        the global batch of this step is a pure function of (seed, step),
                                so every scheme, every resume and every rank sees the same windows
      -> this rank's rows       DDP: rank r takes rows [r B/W, (r+1) B/W) of the global batch B
      -> forward (bf16 autocast on CUDA) -> cross-entropy -> backward (DDP averages gradients)
      -> clip the global gradient norm -> AdamW with lr_at(step): linear warmup, cosine decay
      -> every ``checkpoint_every`` steps: the model's folder with the optimizer state, RNG
         states, step and loss history beside it, written atomically (a temporary folder, renamed)

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
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_int
from .checkpoint import (
    check_checkpointable,
    checkpoint_exists,
    load_checkpoint,
    read_checkpoint_meta,
    save_checkpoint,
    unwrap_model,
)
from .config import IGNORE_INDEX, RESUMABLE_CHANGES, BatchFn, TrainConfig
from .distributed import dist_info
from .memory import check_memory, estimate_memory

__all__ = [
    "TrainResult",
    "batch_at",
    "lr_at",
    "make_optimizer",
    "position_parameters",
    "seed_everything",
    "step_seed",
    "train",
]


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


def step_seed(seed: int, step: int) -> int:
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
    g = torch.Generator().manual_seed(step_seed(seed, step))
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


def position_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters of every positional scheme in ``model`` (each once)."""
    from ..base import PositionalScheme

    seen: dict[int, nn.Parameter] = {}
    for module in unwrap_model(model).modules():
        if isinstance(module, PositionalScheme):
            seen.update((id(p), p) for p in module.parameters() if p.requires_grad)
    return list(seen.values())


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW in three groups: decay on tensors of 2 or more dims (matrices, embeddings), none on
    vectors (biases, LayerNorm gains), the usual GPT recipe; and the positional parameters
    (:func:`position_parameters`) at ``lr * position_lr_scale`` without decay.

    Each group's ``lr_scale`` multiplies the schedule's learning rate (:func:`lr_at`) in :func:`train`.
    """
    positional = {id(p) for p in position_parameters(model)}
    params = [p for p in unwrap_model(model).parameters() if p.requires_grad and id(p) not in positional]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay, "lr_scale": 1.0},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr_scale": 1.0},
        {"params": position_parameters(model), "weight_decay": 0.0, "lr_scale": config.position_lr_scale},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=config.betas)


def _autocast(device: torch.device, mode: str) -> contextlib.AbstractContextManager:
    if mode == "bf16" or (mode == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _check_resumable(path: Path, config: TrainConfig, module: nn.Module, data_id: str | None) -> None:
    """Refuse to resume from ``path`` when the training data, the training config or the model
    config differ (naming every differing field), before anything is loaded."""
    meta = read_checkpoint_meta(path)
    saved_data = meta.get("data_id") or None
    if data_id and saved_data and saved_data != data_id:
        raise ValueError(
            f"cannot resume from {str(path)!r}: it was trained on other data ({saved_data[:16]}..., now "
            f"{data_id[:16]}...: the corpus changed); start a new run in another folder"
        )
    saved_train, saved_model = json.loads(meta["train_config"]), json.loads(meta["model_config"])
    saved_train.setdefault("random_positions", 0)  # checkpoints written before the option existed
    current = config.to_dict()
    diff = [
        f"{k}: checkpoint {saved_train.get(k)!r} vs now {current[k]!r}"
        for k in sorted(current)
        if k not in RESUMABLE_CHANGES and saved_train.get(k) != current[k]
    ]
    model_config = getattr(module, "config", None)
    if hasattr(model_config, "to_dict") and saved_model:
        now = model_config.to_dict()  # the saved config is as it was built (old files: old defaults)
        diff += [
            f"model {k}: checkpoint {saved_model.get(k)!r} vs now {now.get(k)!r}"
            for k in sorted(set(now) | set(saved_model))
            if saved_model.get(k) != now.get(k)
        ]
    if diff:
        raise ValueError(
            f"cannot resume from {str(path)!r}: the config changed ({'; '.join(diff)}); resume with the "
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
    data_id: str | None = None,
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
        checkpoint: the checkpoint folder (:mod:`posenc.lab.checkpoint`; written every
            ``config.checkpoint_every`` steps and at the end by rank 0; a posenc model folder).
        resume: continue from ``checkpoint`` if it exists (a fresh start if it does not).
        progress: show a tqdm bar (loss, tokens/s, lr); ``None`` = only when stderr is a terminal,
            and never on ranks other than 0.
        desc: the progress bar's label.
        stop_at: stop (as if preempted) once this step is reached, after writing a checkpoint;
            ``None`` = run to ``config.steps``.
        memory_check: estimate the memory first and refuse a run that cannot fit
            (:class:`InsufficientMemoryError`); needs ``model.config``.
        on_log: called as ``on_log(step, loss)`` on rank 0 at every log point.
        data_id: names the training data (e.g. the corpus sha256); kept in the checkpoint, and a
            resume with another ``data_id`` is refused.

    Returns:
        a :class:`TrainResult`.
    """
    info = dist_info()
    module = unwrap_model(model)
    if device is None:
        device = next(module.parameters()).device
    device = torch.device(device)
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if config.checkpoint_every and ckpt is None:
        raise ValueError(f"checkpoint_every={config.checkpoint_every} needs a checkpoint path to write to")
    if stop_at is not None:
        check_int(stop_at, "stop_at", minimum=0)
    _check_fits(module, config, info, device, desc, memory_check)
    optimizer = make_optimizer(module, config)
    start, losses, elapsed_before = _start(ckpt, resume, config, module, optimizer, data_id)
    model = _distributed(module, device, info)
    end = config.steps if stop_at is None else min(config.steps, max(stop_at, start))
    if progress is None:
        progress = sys.stderr.isatty()
    bar = _progress_bar(progress and info.is_main, config.steps, start, desc)
    log = _LossLog(losses, config, info, start, bar, on_log)

    model.train()
    t0 = time.perf_counter()
    for step in range(start, end):
        ids, targets = _batch(data, step, config, info)
        positions = _positions(ids, step, config, info)
        log.pending.append(
            _train_step(model, module, optimizer, ids, targets, step, config, device, positions)
        )
        if (step + 1) % config.log_every == 0 or step + 1 == end:
            log.flush(step)
        at_checkpoint = config.checkpoint_every and (step + 1) % config.checkpoint_every == 0
        if ckpt is not None and (at_checkpoint or step + 1 == end):
            log.flush(step)
            _checkpoint(
                ckpt,
                module,
                optimizer,
                step + 1,
                config,
                losses,
                elapsed_before + time.perf_counter() - t0,
                data_id,
                info,
            )
    log.close()
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


def _distributed(module: nn.Module, device: torch.device, info) -> nn.Module:
    """``module`` wrapped in ``DistributedDataParallel`` under torchrun, else itself."""
    if info.world_size <= 1:
        return module
    ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
    return nn.parallel.DistributedDataParallel(module, **ddp_kwargs)


def _checkpoint(ckpt, module, optimizer, step: int, config, losses, elapsed_s: float, data_id, info) -> None:
    """Write the checkpoint (rank 0) and wait for every rank."""
    if info.is_main:
        save_checkpoint(
            ckpt,
            module,
            optimizer,
            step,
            train_config=config,
            losses=losses,
            elapsed_s=elapsed_s,
            data_id=data_id,
        )
    if info.world_size > 1:
        torch.distributed.barrier()


def _start(ckpt: Path | None, resume: bool, config: TrainConfig, module: nn.Module, optimizer, data_id):
    """``(first step, loss history, seconds already trained)``: from the checkpoint when resuming;
    a checkpoint that exists without ``resume`` is refused (it would be overwritten)."""
    if ckpt is not None:
        check_checkpointable(module)  # before a step is spent
    if resume and ckpt is not None and checkpoint_exists(ckpt):
        _check_resumable(ckpt, config, module, data_id)  # before anything is loaded into the model
        state = load_checkpoint(ckpt, module, optimizer)
        return state.step, state.losses, state.elapsed_s
    if ckpt is not None and ckpt.exists():
        raise ValueError(
            f"a checkpoint already exists at {str(ckpt)!r}; resume it (resume=True / --resume), "
            "or delete it or choose another path to start a new run"
        )
    return 0, [], 0.0


def _batch(data, step: int, config: TrainConfig, info) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``(ids, targets)`` ``[b, s]`` of the step's global batch."""
    if callable(data):
        return data(step, info.rank, info.world_size)
    return batch_at(
        data, step, config.batch_size, config.seq_len, config.seed, rank=info.rank, world_size=info.world_size
    )


def _positions(ids: torch.Tensor, step: int, config: TrainConfig, info) -> torch.Tensor | None:
    """This rank's rows ``[b, s]`` of the step's randomized positions (``config.random_positions``),
    a pure function of ``(seed, step)``; ``None`` = ordinary positions."""
    if not config.random_positions:
        return None
    from ..positions import randomized_positions

    g = torch.Generator().manual_seed(step_seed(config.seed + 7_919, step))  # not the batch's draw
    rows = config.batch_size // info.world_size
    every = randomized_positions(config.batch_size, ids.shape[-1], config.random_positions, generator=g)
    return every[info.rank * rows : (info.rank + 1) * rows]  # [b, s] of [B, s]


def _check_fits(
    module: nn.Module, config: TrainConfig, info, device: torch.device, desc: str, memory_check: bool
) -> None:
    """The global batch splits over the processes, and the run fits in memory (before any step)."""
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


def _train_step(
    model: nn.Module,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    ids: torch.Tensor,
    targets: torch.Tensor,
    step: int,
    config: TrainConfig,
    device: torch.device,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """One optimizer step on ``ids``/``targets`` ``[b, s]`` (at ``positions`` ``[b, s]``, default
    ``0 .. s-1``); returns the loss (on the device, unsynced)."""
    lr = lr_at(step, config)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # positional parameters: their own scale
    ids, targets = ids.to(device, non_blocking=True), targets.to(device, non_blocking=True)  # [b, s] each
    with _autocast(device, config.autocast):
        out = model(ids) if positions is None else model(ids, positions=positions.to(device))
    logits = out.logits  # [b, s, V]
    logits = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()  # float64 kept
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # DDP: gradients averaged over ranks here
    if config.grad_clip > 0:
        nn.utils.clip_grad_norm_(module.parameters(), config.grad_clip)
    optimizer.step()
    return loss.detach()


class _LossLog:
    """Losses kept on the device until a log point, then read at once (one sync per ``log_every``)."""

    def __init__(
        self,
        losses: list[float],
        config: TrainConfig,
        info,
        start: int,
        bar,
        on_log: Callable[[int, float], None] | None,
    ) -> None:
        self.losses, self.config, self.info, self.bar, self.on_log = losses, config, info, bar, on_log
        self.pending: list[torch.Tensor] = []
        self.t_log, self.step_log = time.perf_counter(), start

    def flush(self, step: int) -> None:
        if not self.pending:
            return
        values = torch.stack(self.pending).float()  # [k] losses of this rank
        if self.info.world_size > 1:  # the global batch's mean loss, as one process would see it
            torch.distributed.all_reduce(values)
            values /= self.info.world_size
        self.pending.clear()
        values_list = values.cpu().tolist()
        self.losses.extend(values_list)
        now = time.perf_counter()
        tok_s = (step + 1 - self.step_log) * self.config.tokens_per_step / max(now - self.t_log, 1e-9)
        self.t_log, self.step_log = now, step + 1
        if self.bar is not None:
            self.bar.update(step + 1 - self.bar.n)
            lr = lr_at(step, self.config)
            self.bar.set_postfix(loss=f"{values_list[-1]:.3f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}")
        if self.on_log is not None and self.info.is_main:
            self.on_log(step, values_list[-1])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress_bar(enabled: bool, total: int, initial: int, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True, leave=True)
