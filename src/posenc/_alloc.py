"""Refuse an allocation that cannot fit, before making it.

Every entry point that sizes memory from a user's numbers (a table of ``max_len`` rows, a
vocabulary, a model of ``d_model``, a run's activations) estimates the bytes first and raises
:class:`InsufficientMemoryError` naming the need, what is free and the fix, instead of letting the
allocator fail after minutes of paging (or the OS kill the process). One mechanism: the lab's run
estimate (:mod:`posenc.lab.memory`) and :func:`check_allocation` share this error and
:func:`available_memory`.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

__all__ = ["InsufficientMemoryError", "available_memory", "check_allocation", "format_gib"]


class InsufficientMemoryError(MemoryError, ValueError):
    """A run's estimated memory exceeds what the device has free (raised before it starts).

    A ``ValueError`` too, so the CLI reports it as a bad configuration with its message.
    """


def factory_kwargs(device: object = None, dtype: object = None) -> dict:
    """``{"device": ..., "dtype": ...}`` for ``torch.empty``/``nn.Linear``, as ``nn.Linear``'s own
    factory kwargs: ``device`` a ``torch.device``, a string (``"cpu"``, ``"cuda:0"``, ``"meta"``) or
    None; ``dtype`` a floating-point ``torch.dtype`` or None (the default dtype). ``TypeError`` or
    ``ValueError`` naming the argument otherwise."""
    if device is not None and not isinstance(device, (str, torch.device, int)):
        raise TypeError(f"device must be a torch.device or a string like 'cpu', got {type(device).__name__}")
    if device is not None:
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(
                f"device {device!r} is not a device; use e.g. 'cpu', 'cuda:0' or 'meta'"
            ) from None
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(
            f"dtype must be a floating-point torch.dtype (e.g. torch.bfloat16), got {dtype!r}: "
            "parameters are floats"
        )
    return {"device": device, "dtype": dtype}


def format_gib(n: float) -> str:
    """``n`` bytes as GiB (from 128 MiB) or MiB, two or one decimals."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


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


def check_allocation(
    shape: tuple[int, ...] | list[int],
    dtype: torch.dtype | None,
    what: str,
    fix: str,
    *,
    device: torch.device | str | None = None,
    headroom: float = 0.9,
) -> None:
    """Raise :class:`InsufficientMemoryError` when a tensor of ``shape`` and ``dtype`` would not fit
    in ``headroom`` of the free memory of ``device`` (default: torch's default device; nothing is
    checked on the meta device, where nothing is allocated).

    Args:
        shape: the tensor's shape (Python ints, so the product cannot overflow).
        dtype: its dtype (``None`` = torch's default dtype).
        what: the argument(s) that sized it, for the message (``"max_len=1099511627776, d_model=512"``).
        fix: what to change (``"use a smaller max_len"``).
    """
    device = torch.device(device) if device is not None else torch.get_default_device()
    if device.type == "meta":
        return
    itemsize = torch.empty((), dtype=dtype or torch.get_default_dtype(), device="meta").element_size()
    need = math.prod(int(n) for n in shape) * itemsize
    free = available_memory(device)
    if need > headroom * free:
        raise InsufficientMemoryError(
            f"{what} needs a {list(shape)} table of about {format_gib(need)}, but only "
            f"{format_gib(free)} is free on {device}; {fix}"
        )
