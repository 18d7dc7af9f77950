"""Tests of posenc.lab.runs: output folders checked first, locked, never silently overwritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from posenc.lab.runs import LOCK_NAME, RunFolder, check_folder, remove_stale_temporaries, write_json


def test_check_folder(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert check_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"  # creatable
    with pytest.raises(ValueError, match=r"--out '.*a_file' is a file, not a folder"):
        check_folder(tmp_path / "a_file")
    with pytest.raises(ValueError, match=r"lies under the file '.*a_file'"):
        check_folder(tmp_path / "a_file" / "sub")
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="is not writable"):
            check_folder(ro / "run")


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    (tmp_path / "checkpoint.safetensors").write_text("old run")
    (tmp_path / "mine.txt").write_text("not part of a run")
    with (
        pytest.raises(
            ValueError,
            match=r"already holds a run \(checkpoint.safetensors\); continue it with "
            "--resume, replace it with --overwrite",
        ),
        RunFolder(tmp_path, ["checkpoint.safetensors", "cells"]),
    ):
        pass
    with RunFolder(tmp_path, ["checkpoint.safetensors"], resume=True):
        assert (tmp_path / "checkpoint.safetensors").read_text() == "old run"
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / "a.json").write_text("{}")
    with RunFolder(tmp_path, ["checkpoint.safetensors", "cells"], overwrite=True):
        assert not (tmp_path / "checkpoint.safetensors").exists() and not (tmp_path / "cells").exists()
    assert (tmp_path / "mine.txt").read_text() == "not part of a run"  # only the run's own files go
    with pytest.raises(ValueError, match="give --resume or --overwrite, not both"):
        RunFolder(tmp_path, [], resume=True, overwrite=True)


def test_one_writer_at_a_time(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from posenc.lab.runs import RunFolder\n"
            f"with RunFolder({str(tmp_path)!r}, []):\n    print('locked', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        busy = rf"is being written by another posenc process \(pid {holder.pid}\)"
        with pytest.raises(ValueError, match=busy), RunFolder(tmp_path, []):
            pass
    finally:
        holder.kill()
        holder.wait()
    with RunFolder(tmp_path, []):  # released when its process ended
        assert (tmp_path / LOCK_NAME).exists()


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    stale = tmp_path / "checkpoints" / f".a.safetensors.tmp{int(dead.stdout)}"
    stale.parent.mkdir()
    stale.write_bytes(b"x" * 100)
    live = tmp_path / f".results.json.tmp{os.getpid()}"  # a live process may still be writing it
    live.write_text("{")
    keep = tmp_path / ".hidden.tmpfile"
    keep.write_text("user's")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and keep.exists()


def test_write_json_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    write_json(path, {"a": 1})

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_lock_that_is_a_symlink_is_refused_and_its_target_kept(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(target)
    refused = r"\.posenc\.lock is a symbolic link; posenc will not write through it"
    with pytest.raises(ValueError, match=refused), RunFolder(out, ["results.json"]):
        pass
    assert target.read_text() == "keep me"


def test_the_lock_names_the_holder_and_a_fresh_run_id_and_forgets_it_on_release(tmp_path):
    with RunFolder(tmp_path, ["results.json"]) as first:
        pid, run_id = (tmp_path / LOCK_NAME).read_text().split()
        assert int(pid) == os.getpid() and run_id == first.run_id and len(run_id) == 16
    assert (tmp_path / LOCK_NAME).read_text() == ""
    with RunFolder(tmp_path, ["results.json"], resume=True) as second:
        assert second.run_id != first.run_id


def test_a_process_of_an_old_run_cannot_write_into_a_newer_one(tmp_path):
    """The orphan of a killed study checks its run id before each write: a study started in the
    folder since (--overwrite or --resume) has another id, so the orphan's files never land."""
    from posenc.lab.runs import RunFolderLost, check_owner, writing_for

    with RunFolder(tmp_path, ["results.json"]) as old, writing_for(tmp_path, old.run_id):
        write_json(tmp_path / "cells" / "a.json", {"ok": 1})  # the holder's run writes
    assert json.loads((tmp_path / "cells" / "a.json").read_text()) == {"ok": 1}
    # the old run's folder released: nobody holds it
    with writing_for(tmp_path, old.run_id), pytest.raises(RunFolderLost, match="no process holds it"):
        write_json(tmp_path / "cells" / "a.json", {"ok": 2})
    (tmp_path / "results.json").write_text("{}")
    with RunFolder(tmp_path, ["results.json"], overwrite=True) as new:
        with writing_for(tmp_path, old.run_id):
            taken = f"no longer belongs to run {old.run_id}.*another run holds"
            with pytest.raises(RunFolderLost, match=taken):
                write_json(tmp_path / "cells" / "b.json", {"from": "old"})
            check_owner(tmp_path.parent / "elsewhere.json")  # outside the folder: not its business
        with writing_for(tmp_path, new.run_id):
            write_json(tmp_path / "cells" / "b.json", {"from": "new"})
    assert json.loads((tmp_path / "cells" / "b.json").read_text()) == {"from": "new"}


def test_a_checkpoint_of_a_lost_run_is_not_written(tmp_path):
    import torch

    from _lab_toys import tiny_config
    from posenc.lab.checkpoint import read_checkpoint_meta, save_checkpoint
    from posenc.lab.config import TrainConfig
    from posenc.lab.runs import RunFolderLost, writing_for
    from posenc.model import TransformerLM

    model = TransformerLM(tiny_config())
    opt = torch.optim.AdamW(model.parameters())
    ckpt = tmp_path / "checkpoints" / "a"
    with RunFolder(tmp_path, ["results.json"]) as run, writing_for(tmp_path, run.run_id):
        save_checkpoint(ckpt, model, opt, 1, train_config=TrainConfig(steps=2))
        assert read_checkpoint_meta(ckpt)["run_id"] == run.run_id
    with writing_for(tmp_path, run.run_id), pytest.raises(RunFolderLost):
        save_checkpoint(ckpt, model, opt, 2, train_config=TrainConfig(steps=2))
    assert read_checkpoint_meta(ckpt)["step"] == "1"


def test_safetensors_own_temporaries_of_a_killed_write_are_removed_by_the_lock_holder(tmp_path):
    """safetensors writes through ``.tmpXXXXXX`` (no pid); a kill mid-write left it (139 MB)."""
    (tmp_path / "checkpoints").mkdir()
    left = tmp_path / "checkpoints" / ".tmpWaSUCP"
    left.write_bytes(b"x" * 100)
    kept = [tmp_path / "checkpoints" / ".tmpseven77", tmp_path / "checkpoints" / "tmpAbCdEf"]
    for path in kept:
        path.write_text("not a temporary of a write")
    assert remove_stale_temporaries(tmp_path) == []  # without the lock, a writer may be alive
    (tmp_path / "results.json").write_text("{}")
    with RunFolder(tmp_path, ["results.json"], resume=True):
        assert not left.exists() and all(p.exists() for p in kept)


@pytest.mark.parametrize("name", ["checkpoints", "results.json"])
def test_an_artifact_that_is_a_symlink_out_of_the_folder_is_refused(tmp_path, name):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    (out / name).symlink_to(elsewhere)
    refused = f"{name} is a symbolic link; posenc writes a run only inside"
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        folder = RunFolder(out, ["results.json", "checkpoints"], **flags)
        with pytest.raises(ValueError, match=refused), folder:
            pass
    assert elsewhere.is_dir() and (out / name).is_symlink()
