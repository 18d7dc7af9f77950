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


def test_in_order_a_failure_is_seen_when_it_happens_not_after_the_earlier_jobs():
    release = threading.Event()

    def fail():
        raise RuntimeError("the second job failed")

    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(release.wait, 30)
        failed = pool.submit(fail)
        with pytest.raises(RuntimeError, match="the second job failed"):
            list(finished([slow, failed], None, "run", "-", ordered=True))
        assert not slow.done()  # the first job was still running when the failure came back
        release.set()


def test_a_dead_worker_is_one_error_saying_what_to_do():
    from concurrent.futures.process import BrokenProcessPool

    dead = Future()
    dead.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))
    queued = Future()
    with pytest.raises(ValueError, match=r"a worker process died .* before the study finished; rerun"):
        list(finished([dead, queued], None, "study", "rerun"))
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
        ("tcp://[::1]:1", "cannot reach the Dask scheduler"),  # IPv6 in brackets, as Dask writes it
        ("tcp://[::1:1", "is not a Dask scheduler address"),
        ("tcp://[host:1", "is not a Dask scheduler address"),
        ("x" * 300 + ":8786", "cannot reach the Dask scheduler"),  # a label no resolver takes
    ],
)
def test_a_bad_scheduler_address_is_one_error(address, message):
    with pytest.raises(ValueError, match=message) as err:
        check_scheduler(address)
    assert str(err.value).startswith("--cluster ") and "\n" not in str(err.value)
