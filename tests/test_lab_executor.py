"""Tests of posenc.lab.executor: results come back as they finish or in order, a failure cancels
the queued work, a lost Dask scheduler is one error naming what it interrupted, and a scheduler
address is checked before any work."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from posenc.lab.executor import check_scheduler, finished


def test_results_come_back_in_order_or_as_they_finish():
    release = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(lambda: (release.wait(5), "slow")[1])
        fast = pool.submit(lambda: "fast")
        first = next(finished([slow, fast], None, "study", "-"))
        release.set()
        assert first == "fast"  # as they finish
        assert list(finished([slow, fast], None, "run", "-", ordered=True)) == ["slow", "fast"]


def test_a_failure_cancels_the_queued_work():
    queued = Future()  # never started: what a busy pool holds
    failed = Future()
    failed.set_exception(RuntimeError("a cell failed"))
    with pytest.raises(RuntimeError, match="a cell failed"):
        list(finished([failed, queued], None, "study", "-", ordered=True))
    assert queued.cancelled()


def test_a_lost_scheduler_names_what_it_interrupted():
    gone = Future()
    gone.cancel()  # what Dask does to every future when its scheduler dies
    with pytest.raises(ValueError, match=r"went away before the run finished; start it again"):
        list(finished([gone], "tcp://10.0.0.5:8786", "run", "start it again", ordered=True))
    from concurrent.futures import CancelledError

    with pytest.raises(CancelledError):  # local pools: the cancellation itself, not a Dask message
        list(finished([gone], None, "run", "-", ordered=True))


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("not an address", "is not a Dask scheduler address"),
        ("tcp://host", "is not a Dask scheduler address"),
        ("127.0.0.1:1", "cannot reach the Dask scheduler"),
        ("127.0.0.1:99999", "cannot reach the Dask scheduler"),
    ],
)
def test_a_bad_scheduler_address_is_one_error(address, message):
    with pytest.raises(ValueError, match=message):
        check_scheduler(address)
