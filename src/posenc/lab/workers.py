"""Local worker processes that never outlive the process that started them.

A study's cells run in a ``concurrent.futures.ProcessPoolExecutor`` of spawned interpreters. A
worker left behind by a killed study would go on training, write into a run folder it no longer
owns and start the queued cells, so each worker:

* asks Linux to kill it when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``: this covers
  ``kill -9`` of the parent, which runs no code of its own);
* watches its parent's pid from a thread (every :data:`WATCH_S` seconds) and kills itself when
  the parent is gone (other systems, and any gap in the first rule);
* ignores SIGINT: Ctrl-C reaches every process of the terminal's group, and the parent alone
  answers it (by stopping the pool), so the workers print no tracebacks.

:func:`process_pool` stops the pool (queued cells cancelled, running workers terminated) when the
block it guards raises, e.g. the ``KeyboardInterrupt`` of Ctrl-C or of SIGTERM (``posenc``'s
command line turns SIGTERM into one); :func:`stop_pools` does the same for every open pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

__all__ = ["WATCH_S", "process_pool", "stop_pools"]

#: How often a worker checks that its parent is alive (seconds).
WATCH_S = 0.5

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

#: Open pools with the worker processes they started: what :func:`stop_pools` stops.
_OPEN: list[tuple[ProcessPoolExecutor, set]] = []


def _die_with_parent(parent: int) -> None:
    """The worker initializer: see the module docstring."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # no libc: the watchdog alone
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="posenc-parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while True:
        time.sleep(WATCH_S)
        if os.getppid() != parent:  # re-parented: the process that started this one is gone
            os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def process_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` spawned processes that die with this one; stopped (not waited for)
    when the ``with`` block raises, shut down normally otherwise."""
    before = set(multiprocessing.active_children())
    # spawn: a fresh interpreter per worker (fork would copy torch's thread pools)
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_die_with_parent,
        initargs=(os.getpid(),),
    )
    entry = (pool, before)
    _OPEN.append(entry)
    try:
        yield pool
    except BaseException:
        _stop(pool, before)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        _OPEN.remove(entry)


def _stop(pool: ProcessPoolExecutor, before: set) -> None:
    """Cancel the queued work and terminate the pool's processes (those started since ``before``)."""
    pool.shutdown(wait=False, cancel_futures=True)
    started = [p for p in multiprocessing.active_children() if p not in before]
    for process in started:
        process.terminate()
    for process in started:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def stop_pools() -> None:
    """Stop every pool :func:`process_pool` has open (the command line calls it on Ctrl-C/SIGTERM)."""
    for pool, before in list(_OPEN):
        _stop(pool, before)
