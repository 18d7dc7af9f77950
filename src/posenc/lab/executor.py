"""Where the lab's work runs and how its results come back: :func:`cell_executor` (local processes
that die with this one, :func:`~posenc.lab.workers.process_pool`, or a Dask cluster) and
:func:`finished` (results as they finish or in order; the queue cancelled when one fails; a lost
scheduler named). A study's cells (:func:`posenc.lab.cells.iter_cells`) and a loaded model's jobs
(:mod:`posenc.lab.pretrained_jobs`) both run here: work is submitted as plain functions of
picklable arguments.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["WORKER_WAIT_S", "cell_executor", "check_scheduler", "finished"]


@contextlib.contextmanager
def cell_executor(workers: int, cluster: Any = None):
    """The executor the lab's work runs on: a Dask cluster (``cluster``: a scheduler address or a
    ``distributed.Client``), else ``workers`` local processes that die with this one
    (:func:`~posenc.lab.workers.process_pool`). Work is submitted as plain functions of picklable
    arguments (``executor.submit(fn, *args)``)."""
    from .workers import process_pool

    if cluster is not None:
        with _dask_executor(cluster) as executor:
            yield executor
    else:
        with process_pool(workers) as executor:
            yield executor


#: How long a study waits for a Dask scheduler to have at least one worker (seconds).
WORKER_WAIT_S = 60.0


@contextlib.contextmanager
def _dask_executor(cluster: Any):
    try:
        import distributed
    except ImportError:
        raise ValueError(
            "a cluster needs Dask distributed: pip install 'posenc[cluster]' (or pip install distributed)"
        ) from None
    if isinstance(cluster, distributed.Client):
        yield cluster.get_executor()
        return
    check_scheduler(cluster)  # before a Client exists: a failed one lingers (its __del__ blocks 60 s)
    with distributed.Client(cluster) as client:
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_S)
        except (TimeoutError, distributed.TimeoutError):
            raise ValueError(
                f"--cluster {cluster!r}: the Dask scheduler has no workers after {WORKER_WAIT_S:g} s; "
                f"start some (dask worker {cluster}) and run again"
            ) from None
        yield client.get_executor()


def check_scheduler(address: object) -> None:
    """``address`` must look like ``[tcp://]HOST:PORT`` (an IPv6 host in brackets:
    ``tcp://[::1]:8786``) and accept a connection (5 s)."""
    import re
    import socket

    match = re.fullmatch(r"(?:tcp://)?(?:\[([0-9A-Fa-f:.]+)\]|([^/:\s\[\]]+)):(\d{1,5})", str(address))
    if match is None:
        raise ValueError(
            f"--cluster {address!r} is not a Dask scheduler address; give tcp://HOST:PORT "
            "(dask scheduler prints it, e.g. tcp://10.0.0.5:8786)"
        )
    try:
        host = match.group(1) or match.group(2)
        socket.create_connection((host, int(match.group(3))), timeout=5).close()
    except (OSError, OverflowError, UnicodeError) as err:  # refused, unknown host, timed out,
        # port out of range, a host name no resolver takes (a label over 63 characters)
        raise ValueError(f"--cluster {address!r}: cannot reach the Dask scheduler ({err})") from None


def finished(futures: list, cluster: Any, what: str, lost: str, *, ordered: bool = False) -> Iterator[Any]:
    """The results of ``futures`` as each finishes (``ordered``: all of them, in the order given,
    once the last is done). When one fails (or Ctrl-C), as soon as it fails, the queued ones are
    cancelled; a worker process that died (killed for memory, say) or a Dask scheduler that went
    away (``cluster`` set) is a ``ValueError`` naming the ``what`` it interrupted and saying
    ``lost`` (what is kept, what to do)."""
    from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, CancelledError, wait

    results: dict[int, Any] = {}
    pending = list(range(len(futures)))
    try:
        while pending:
            # done() also holds for a future cancelled outside a pool (Dask's, when its scheduler
            # goes away), which wait() never reports: look first, then wait a little
            ready = [i for i in pending if futures[i].done()]
            if not ready:
                wait([futures[i] for i in pending], timeout=0.5, return_when=FIRST_COMPLETED)
                continue
            for i in ready:
                pending.remove(i)
                if ordered:  # kept until every earlier one is in: a failure is seen when it happens
                    results[i] = futures[i].result()
                else:
                    yield futures[i].result()
        if ordered:
            yield from (results[i] for i in range(len(futures)))
    except BrokenExecutor:  # a local worker died without a Python error: killed (out of memory?)
        for future in futures:
            future.cancel()
        raise ValueError(
            f"a worker process died (killed, or out of memory?) before the {what} finished; {lost}; "
            "fewer --workers need less memory"
        ) from None
    except CancelledError:  # Dask cancels every future when the scheduler goes away
        if cluster is None:
            raise
        raise ValueError(
            f"--cluster {cluster!r}: the Dask scheduler went away before the {what} finished; {lost}"
        ) from None
    except BaseException:  # one failed (or Ctrl-C): do not wait for the queued ones
        for future in futures:
            future.cancel()
        raise
