"""Tests of posenc.lab.distributed: configure_threads sets torch's threads (a given count, or the
free cores) and refuses a count below one. DDP itself runs in test_lab_train's torchrun test."""

from __future__ import annotations

import os

import pytest
import torch

from posenc.lab import configure_threads


def test_configure_threads():
    old = torch.get_num_threads()
    try:
        assert configure_threads(1) == 1 and torch.get_num_threads() == 1
        auto = configure_threads()
        assert 1 <= auto <= (os.cpu_count() or 1)
        with pytest.raises(ValueError, match="--threads must be >= 1"):
            configure_threads(0)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("threads", [100_000, 5000])
def test_too_many_threads_are_refused_before_torch_sees_them(threads, capsys, tmp_path):
    """--threads 100000 crashed torch's thread pool (segfault) and 5000 took minutes."""
    from posenc.cli import main
    from posenc.lab.distributed import MAX_THREADS_PER_CPU

    old = torch.get_num_threads()
    with pytest.raises(ValueError, match=f"--threads {threads} is more than {MAX_THREADS_PER_CPU} per CPU"):
        configure_threads(threads)
    assert torch.get_num_threads() == old
    assert main(["train", "--out", str(tmp_path / "run"), "--threads", str(threads), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--threads {threads} is more than" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("name", "value"), [("WORLD_SIZE", "two"), ("RANK", "-1"), ("LOCAL_WORLD_SIZE", "0")]
)
def test_garbage_in_torchrun_variables_is_one_line_naming_the_variable(
    name, value, monkeypatch, capsys, tmp_path
):
    from posenc.cli import main

    monkeypatch.setenv(name, value)
    if name == "RANK":
        monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--out", str(tmp_path / "run"), "--steps", "1", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the environment variable {name}={value!r} is not an integer" in err


def test_a_stray_rank_outside_torchrun_does_not_skip_the_lock(monkeypatch):
    from posenc.lab.distributed import is_lock_holder

    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert is_lock_holder()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not is_lock_holder()
