"""Tests of posenc.lab.workers: a study's worker processes never outlive the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _group(pgid: int, but: int) -> list[int]:
    """The live processes of process group ``pgid`` other than ``but``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != but:
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still alive (not zombies) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in pids if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _checkpoints(out: Path) -> int:
    """How many cells of the study in ``out`` have a checkpoint (its temporary folders left out)."""
    return sum(not p.parent.name.startswith(".") for p in (out / "checkpoints").glob("*/trainer.safetensors"))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_a_two_worker_study_leaves_no_process(tmp_path, sig):
    """kill (SIGTERM) or kill -9 of `posenc extrapolate --workers 2` while both workers train: no
    process of the study is left 10 s later, and no worker wrote a cell file afterwards."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "posenc",
        "extrapolate",
        "--task",
        "copy",
        "--schemes",
        "nope,alibi",
        "--train-len",
        "4",
        "--eval-lens",
        "4",
        "--steps",
        "100000",
        "--batch-size",
        "2",
        "--d-model",
        "8",
        "--layers",
        "1",
        "--heads",
        "2",
        "--seeds",
        "0",
        "--threads",
        "1",
        "--workers",
        "2",
        "--checkpoint-every",
        "1",
        "--no-progress",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    log = tmp_path / "stderr.txt"  # a file, not a pipe: a surviving worker would hold a pipe open
    with open(log, "wb") as err:
        main = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _checkpoints(out) < 2:
            assert main.poll() is None, log.read_text()
            time.sleep(0.2)
        workers = _group(main.pid, but=main.pid)
        assert _checkpoints(out) == 2 and len(workers) >= 2
        main.send_signal(sig)
        code = main.wait(timeout=30)
        stderr = log.read_text()
        left = _gone_within(workers, 10)
        assert left == [], f"left alive: {left}"
        if sig == signal.SIGTERM:
            assert code == 143 and stderr.strip() == (
                "posenc extrapolate: terminated (SIGTERM); a run folder keeps its finished work (--resume)"
            )
        else:
            assert code == -signal.SIGKILL
        assert not (out / "cells").exists()  # 100000 steps: no cell finished, none was written
    finally:
        for pid in [main.pid, *_group(main.pid, but=-1)]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        main.wait()


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _pid() -> int:
    return os.getpid()


def test_the_pool_is_stopped_not_waited_for_when_its_block_raises():
    from posenc.lab.workers import process_pool

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), process_pool(1) as pool:
        pid = pool.submit(_pid).result(timeout=60)
        pool.submit(_sleep, 60)
        raise KeyboardInterrupt
    assert _gone_within([pid], 5) == [] and time.monotonic() - t0 < 50


def _death_signal_and_watchdog() -> tuple[int, bool]:
    """In a worker: the signal Linux sends it when its parent dies, and whether the watchdog runs."""
    import ctypes
    import threading

    sig = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    return sig.value, any(t.name == "posenc-parent-watch" for t in threading.enumerate())


def test_a_worker_ignores_ctrl_c_and_dies_with_its_parent():
    from posenc.lab.workers import process_pool

    with process_pool(1) as pool:
        pid = pool.submit(_pid).result(timeout=60)
        os.kill(pid, signal.SIGINT)  # Ctrl-C reaches the whole group; the parent alone answers it
        assert pool.submit(_pid).result(timeout=60) == pid
        if sys.platform.startswith("linux"):
            assert pool.submit(_death_signal_and_watchdog).result(timeout=60) == (signal.SIGKILL, True)
