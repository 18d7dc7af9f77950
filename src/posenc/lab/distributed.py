"""Processes and threads: torchrun's process group (DDP inside one training run) and how many
CPU threads a process should use on a shared machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .._threads import MAX_THREADS_PER_CPU, check_threads, usable_cpus

__all__ = [
    "MAX_THREADS_PER_CPU",
    "DistInfo",
    "configure_threads",
    "dist_info",
    "env_int",
    "free_cores",
    "init_distributed",
    "is_lock_holder",
]


def free_cores(world_size: int = 1) -> int:
    """The CPUs this process may run on, divided among ``world_size`` local processes, minus the
    cores other processes keep busy (1-minute load average); at least 1."""
    cpus = max(1, usable_cpus() // max(1, world_size))
    try:
        busy = max(0.0, os.getloadavg()[0] - 1.0)  # the load of everything but ourselves, roughly
    except OSError:  # pragma: no cover - no load average on this platform
        busy = 0.0
    return max(1, min(cpus, round(cpus - busy / max(1, world_size))))


def configure_threads(num_threads: int | None = None, *, world_size: int = 1) -> int:
    """Set torch's intra-op threads and return the number chosen.

    ``None`` picks the CPUs this process may run on, divided among ``world_size`` local
    processes, minus the cores other processes keep busy (1-minute load average): on a shared
    2-core machine, 2 OpenMP threads competing with other jobs spin and can run several times
    slower than 1 thread (measured: a 0.8M-parameter training step took 6.5 s with 2 threads and
    1.5 s with 1 thread at load 11).
    """
    if num_threads is None:
        num_threads = free_cores(world_size)
    check_threads(num_threads)
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


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    """The integer environment variable ``name`` (set by ``torchrun``), ``default`` when unset; a
    ``ValueError`` naming the variable when it is not an integer >= ``minimum``."""
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    if not text.strip().isdigit() or len(text.strip()) > 9 or int(text) < minimum:
        raise ValueError(
            f"the environment variable {name}={text!r} is not an integer >= {minimum}; torchrun sets it: "
            "unset it, or launch with torchrun"
        )
    return int(text)


def is_lock_holder() -> bool:
    """Whether this process takes a run folder's lock: rank 0 of a ``torchrun`` group, or a process
    outside one (a ``RANK`` left in the environment without ``WORLD_SIZE > 1`` does not count)."""
    return env_int("WORLD_SIZE", 1, minimum=1) <= 1 or env_int("RANK", 0) == 0


def dist_info() -> DistInfo:
    """The current process group's rank and size (``DistInfo()`` when not distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return DistInfo(
            torch.distributed.get_rank(),
            torch.distributed.get_world_size(),
            env_int("LOCAL_RANK", torch.distributed.get_rank()),
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
    world = env_int("WORLD_SIZE", 1, minimum=1)
    if world <= 1:
        return dist_info(), device
    local_rank = env_int("LOCAL_RANK", 0)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return dist_info(), device
