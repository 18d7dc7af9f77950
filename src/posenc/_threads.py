"""How many CPU threads a process may ask torch for: the CPUs it may run on, times a small factor."""

from __future__ import annotations

import os

from ._validate import check_int

__all__ = ["MAX_THREADS_PER_CPU", "check_threads", "usable_cpus"]

#: ``--threads`` may oversubscribe the CPUs this process may run on by this factor at most: more
#: threads only contend (and 100,000 crashed torch's thread pool; 5,000 took minutes to start).
MAX_THREADS_PER_CPU = 4


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_threads(value: object, name: str = "--threads") -> int:
    """``value`` as a thread count in ``1..MAX_THREADS_PER_CPU * usable_cpus()``, else a clear
    TypeError/ValueError naming ``name`` and the largest count allowed."""
    count = check_int(value, name)
    most = MAX_THREADS_PER_CPU * usable_cpus()
    if count > most:
        raise ValueError(
            f"{name} {count} is more than {MAX_THREADS_PER_CPU} per CPU this process may run on "
            f"({usable_cpus()} CPUs): give at most {most}, or leave it out"
        )
    return count
