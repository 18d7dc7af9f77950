"""Tests of posenc.lab.cells: the same numbers here, in local processes and on a Dask cluster;
finished cells skipped on resume; evaluation-time variants; the same data for every cell."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from _lab_toys import tiny_study, write_corpus
from posenc.lab import cells as cells_mod
from posenc.lab import data as data_mod
from posenc.lab import executor as executor_mod
from posenc.lab.cells import Cell, iter_cells, run_cell, study_cells
from posenc.lab.data import study_data


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _numbers(record):
    """Everything a cell measured (not how long it took), from its CellRecord or its file's JSON."""
    record = record if isinstance(record, dict) else record.to_dict()
    runs = [[{k: v for k, v in p.items() if k != "wall_s"} for p in r["eval"]] for r in record["runs"]]
    return record["train"]["loss_every_10_steps"], record["train"]["final_loss_nats"], runs


@pytest.mark.slow
@pytest.mark.xdist_group("ports")
def test_same_cell_same_numbers_here_in_processes_and_on_a_dask_cluster(corpus_dir):
    distributed = pytest.importorskip("distributed")
    config = tiny_study(corpus_dir, schemes=("alibi", "rope"), seeds=(0, 1), variants=("yarn",), steps=12)
    cells = [Cell("alibi", 0), Cell("rope", 1)]
    kw = dict(out=None, device=torch.device("cpu"), resume=False, progress=False, threads=1)
    serial = {r.cell: r for r in iter_cells(config, cells, **kw)}
    local = {r.cell: r for r in iter_cells(config, cells, workers=2, **kw)}
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        on_cluster = {r.cell: r for r in iter_cells(config, cells, cluster=client, **kw)}
    assert set(serial) == set(local) == set(on_cluster) == {"alibi-seed0", "rope-seed1"}
    for name in serial:
        assert _numbers(serial[name]) == _numbers(local[name]) == _numbers(on_cluster[name])
    assert [r.name for r in serial["rope-seed1"].runs] == ["rope", "rope+yarn"]
    assert [r.name for r in serial["alibi-seed0"].runs] == ["alibi"]  # alibi declares no variants


def test_a_killed_study_resumes_and_skips_finished_cells(corpus_dir, tmp_path, monkeypatch):
    config = tiny_study(corpus_dir, schemes=("alibi", "nope"), checkpoint_every=2)
    real_train = cells_mod.train

    def dies_on_nope(model, data, tc, **kw):
        if model.config.position == "nope":
            raise KeyboardInterrupt("killed")
        return real_train(model, data, tc, **kw)

    monkeypatch.setattr(cells_mod, "train", dies_on_nope)
    kw = dict(out=tmp_path, device=torch.device("cpu"), resume=True, progress=False)
    with pytest.raises(KeyboardInterrupt):
        list(iter_cells(config, study_cells(config), **kw))
    first = json.loads((tmp_path / "cells" / "alibi-seed0.json").read_text())
    assert not (tmp_path / "cells" / "nope-seed0.json").exists()

    trained = []
    monkeypatch.setattr(
        cells_mod,
        "train",
        lambda model, *a, **k: trained.append(model.config.position) or real_train(model, *a, **k),
    )
    again = {r.cell: r for r in iter_cells(config, study_cells(config), **kw)}
    assert trained == ["nope"]  # the finished cell was not trained again
    assert again["alibi-seed0"].reused and _numbers(again["alibi-seed0"]) == _numbers(first)
    # a setting that changes the numbers invalidates the cell: it runs again (from its checkpoint)
    other = tiny_study(corpus_dir, schemes=("alibi",), checkpoint_every=2, eval_windows=5)
    rerun = run_cell(other, Cell("alibi", 0), **kw)
    assert not rerun.reused and rerun.train.resumed_from == config.train.steps
    assert len(rerun.runs[0].eval[0]["window_bits"]) == 5


def test_every_cell_reads_the_same_data_and_seeds_change_only_the_model(corpus_dir, monkeypatch):
    seen = []
    real_train = cells_mod.train

    def spy(model, data, tc, **kw):
        seen.append((model.config.position, tc.seed, data, [p.detach().clone() for p in model.parameters()]))
        return real_train(model, data, tc, **kw)

    monkeypatch.setattr(cells_mod, "train", spy)
    config = tiny_study(corpus_dir, schemes=("nope", "sinusoidal"), seeds=(0, 1), steps=2)
    records = [run_cell(config, c) for c in study_cells(config)]
    assert [(s[0], s[1]) for s in seen] == [("nope", 0), ("nope", 1), ("sinusoidal", 0), ("sinusoidal", 1)]
    assert all(torch.equal(s[2], seen[0][2]) for s in seen)  # the same training bytes
    assert not torch.equal(seen[0][3][0], seen[1][3][0])  # another seed, another initialisation
    assert all(torch.equal(a, b) for a, b in zip(seen[0][3], seen[2][3]))  # same seed, same init
    # the evaluation windows depend on the split seed only: the same for every cell
    assert study_data(config).evalset is study_data(tiny_study(corpus_dir, seeds=(5,))).evalset
    assert len({json.dumps(r.runs[0].eval[0]["window_bits"]) for r in records}) == 4


def test_cluster_needs_dask(monkeypatch, corpus_dir):
    import builtins

    real_import = builtins.__import__

    def no_dask(name, *args, **kwargs):
        if name == "distributed":
            raise ImportError("No module named 'distributed'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(ValueError, match=r"cluster needs Dask distributed: pip install 'posenc\[cluster\]'"):
        _run_on_cluster(tiny_study(corpus_dir), "tcp://127.0.0.1:1")


def _run_on_cluster(config, cluster):
    cells = study_cells(config)
    return list(
        iter_cells(
            config, cells, out=None, device=torch.device("cpu"), resume=False, progress=False, cluster=cluster
        )
    )


def test_an_unreachable_cluster_is_a_clear_error_and_leaves_no_client(corpus_dir):
    """A bad or unreachable address is refused before a dask Client exists (a failed Client lingers
    in a background thread and blocks 60 s when collected)."""
    import threading

    pytest.importorskip("distributed")
    threads = threading.active_count()
    with pytest.raises(ValueError, match=r"--cluster 'tcp://127.0.0.1:1': cannot reach the Dask scheduler"):
        _run_on_cluster(tiny_study(corpus_dir), "tcp://127.0.0.1:1")
    for bad in ("", "abc", "/tmp/x", "tcp://host"):
        with pytest.raises(ValueError, match="is not a Dask scheduler address; give tcp://HOST:PORT"):
            _run_on_cluster(tiny_study(corpus_dir), bad)
    assert threading.active_count() == threads


def test_a_changed_corpus_is_never_mistaken_for_the_old_one(tmp_path):
    """Finished cells and checkpoints remember the bytes they read: after the corpus changes, a
    resume neither reuses a cell nor continues a checkpoint trained on the old text."""
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus", n_docs=12)
    config = tiny_study(corpus, checkpoint_every=2)
    out = tmp_path / "study"
    kw = dict(out=out, device=torch.device("cpu"), resume=True, progress=False)
    first = run_cell(config, Cell("alibi", 0), **kw)
    assert run_cell(config, Cell("alibi", 0), **kw).reused
    for f in corpus.iterdir():
        f.write_text(f.read_text().upper())  # the same files, other bytes
    data_mod._study_data.cache_clear()
    with pytest.raises(ValueError, match=r"it was trained on other data .* the corpus changed"):
        run_cell(config, Cell("alibi", 0), **kw)
    assert first.key["data"] != study_data(config).data_id


def test_an_evaluation_that_cannot_fit_is_refused_before_training(corpus_dir, monkeypatch):
    import posenc.lab.memory

    monkeypatch.setattr(cells_mod, "train", lambda *a, **k: pytest.fail("trained before the check"))
    monkeypatch.setattr(posenc.lab.memory, "available_memory", lambda device: 64 * 2**10)  # 64 KiB free
    config = tiny_study(corpus_dir, eval_lens=(8, 32))
    with pytest.raises(ValueError, match=r"evaluation at length 32 \(one window\) would not fit"):
        run_cell(config, Cell("alibi", 0))


@pytest.mark.parametrize("content", ["[1, 2]", '{"key": {}}', "[" * 100_000 + "]" * 100_000, "{nope"])
def test_a_crafted_cell_file_is_a_one_line_error_on_resume(tmp_path, content):
    """A cell file holding a list ended in AttributeError on --resume."""
    cell_file = tmp_path / "alibi-seed0.json"
    cell_file.write_text(content)
    with pytest.raises(ValueError, match=f"the cell file '{cell_file}'") as err:
        cells_mod.finished_cell(cell_file, {"any": "key"})
    assert "\n" not in str(err.value)


def test_a_cell_of_another_posenc_or_torch_version_is_run_again(corpus_dir, tmp_path, monkeypatch):
    import posenc

    config = tiny_study(corpus_dir)
    cell, data, cpu = Cell("alibi", 0), study_data(config), torch.device("cpu")
    key = cells_mod.full_key(config, cell, data, cpu)
    assert key["versions"] == {"posenc": posenc.__version__, "torch": torch.__version__}
    cell_file = tmp_path / "alibi-seed0.json"
    train = {
        "steps": 1,
        "resumed_from": 0,
        "wall_s": 0.1,
        "tokens_per_s": 1.0,
        "threads": 1,
        "final_loss_nats": 5.0,
        "loss_every_10_steps": [5.0],
    }
    record = {
        "cell": cell.name,
        "scheme": "alibi",
        "seed": 0,
        "run": "alibi",
        "setting": {},
        "run_id": None,
        "params": 1,
        "train": train,
        "key": key,
        "runs": [],
    }
    cell_file.write_text(json.dumps(record))
    assert cells_mod.finished_cell(cell_file, cells_mod.full_key(config, cell, data, cpu)).reused
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert cells_mod.finished_cell(cell_file, cells_mod.full_key(config, cell, data, cpu)) is None
    monkeypatch.undo()
    monkeypatch.setattr(posenc, "__version__", "0.0.0")
    assert cells_mod.finished_cell(cell_file, cells_mod.full_key(config, cell, data, cpu)) is None


def test_a_cell_run_again_in_the_same_run_continues_its_own_checkpoint(corpus_dir, tmp_path, monkeypatch):
    """On a cluster, a cell whose worker died is run again by Dask without resume: it continues
    the checkpoint its own run wrote instead of failing with "a checkpoint already exists"."""
    from posenc.lab.runs import RunFolder, writing_for

    config = tiny_study(corpus_dir, checkpoint_every=2, steps=4)
    kw = dict(out=tmp_path, device=torch.device("cpu"), resume=False, progress=False)
    real_train = cells_mod.train

    def dies_at_step_2(*args, **kwargs):
        real_train(*args, **{**kwargs, "stop_at": 2})
        raise KeyboardInterrupt("the worker died")

    with RunFolder(tmp_path, ["results.json"]) as run, writing_for(tmp_path, run.run_id):
        monkeypatch.setattr(cells_mod, "train", dies_at_step_2)
        with pytest.raises(KeyboardInterrupt):
            run_cell(config, Cell("alibi", 0), **kw)
        monkeypatch.setattr(cells_mod, "train", real_train)
        assert (tmp_path / "checkpoints" / "alibi-seed0" / "trainer.safetensors").is_file()
        record = run_cell(config, Cell("alibi", 0), **kw)  # Dask's rerun: resume=False
        assert record.train.resumed_from == 2 and record.train.steps == 4
        assert record.run_id == run.run_id
    again = RunFolder(tmp_path, ["results.json"], resume=True)
    refused = pytest.raises(ValueError, match="a checkpoint already exists")  # another run's checkpoint
    with again as other, writing_for(tmp_path, other.run_id), refused:
        run_cell(config, Cell("alibi", 0), **kw)


def test_a_scheduler_lost_mid_study_is_a_one_line_error(corpus_dir, monkeypatch):
    import contextlib
    from concurrent.futures import Future

    class GoneExecutor:
        def submit(self, *args):
            future = Future()
            future.cancel()  # what Dask does to every future when its scheduler dies
            future.set_running_or_notify_cancel()
            return future

    gone = contextlib.nullcontext(GoneExecutor())
    monkeypatch.setattr(executor_mod, "_dask_executor", lambda cluster: gone)
    config = tiny_study(corpus_dir)
    with pytest.raises(ValueError, match=r"the Dask scheduler went away .* rerun with --resume"):
        list(
            iter_cells(
                config,
                study_cells(config),
                out=None,
                device=torch.device("cpu"),
                resume=False,
                progress=False,
                cluster="tcp://127.0.0.1:1",
            )
        )


@pytest.mark.xdist_group("ports")
def test_a_scheduler_without_workers_is_a_clear_error_after_a_timeout(corpus_dir, monkeypatch):
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(executor_mod, "WORKER_WAIT_S", 1.0)
    config = tiny_study(corpus_dir)
    refused = pytest.raises(ValueError, match=r"has no workers after 1 s; start some \(dask worker tcp://")
    with distributed.LocalCluster(n_workers=0, protocol="tcp", dashboard_address=":0") as cluster, refused:
        list(
            iter_cells(
                config,
                study_cells(config),
                out=None,
                device=torch.device("cpu"),
                resume=False,
                progress=False,
                cluster=cluster.scheduler_address,
            )
        )


def test_cell_keys_of_existing_settings_are_unchanged():
    """A study run before studies had parts resumes its finished cells: the key of a cell is the
    one its file holds (written by posenc at b50c9c8 for this configuration); a training or model
    field the old keys did not have enters the key only when it leaves its default."""
    from posenc.lab.cells import cell_key
    from posenc.lab.config import StudyConfig

    config = StudyConfig(
        schemes=("alibi", "rope"),
        train_len=64,
        eval_lens=(64, 128),
        steps=300,
        batch_size=32,
        warmup_steps=20,
        d_model=64,
        num_layers=2,
        num_heads=4,
        max_chars=3000000,
        seeds=(0, 1),
        position_lr_scale=1.0,
        vary={"norm": ("pre", "post")},
    )
    assert cell_key(config) == {
        "batch_size": 32,
        "corpus": "stdlib",
        "curriculum_steps": 0,
        "d_model": 64,
        "diagnostic_windows": 0,
        "dropout": 0.0,
        "eval_examples": 200,
        "eval_lens": [64, 128],
        "eval_windows": 256,
        "grad_clip": 1.0,
        "lr": 0.003,
        "max_chars": 3000000,
        "min_lr": 0.0003,
        "mode": "lm",
        "num_heads": 4,
        "num_layers": 2,
        "position_lr_scale": 1.0,
        "position_options": {},
        "score_len": None,
        "split_seed": 0,
        "steps": 300,
        "train_len": 64,
        "val_fraction": 0.1,
        "variants": ["linear", "ntk", "yarn"],
        "warmup_steps": 20,
        "weight_decay": 0.1,
    }
    changed = dataclasses.replace(config, train=dataclasses.replace(config.train, betas=(0.8, 0.9)))
    assert cell_key(changed) == {**cell_key(config), "betas": [0.8, 0.9]}
    changed = dataclasses.replace(config, model=dataclasses.replace(config.model, norm_type="rmsnorm"))
    assert cell_key(changed) == {**cell_key(config), "norm_type": "rmsnorm"}
    resumable = dataclasses.replace(config, train=dataclasses.replace(config.train, log_every=1))
    assert cell_key(resumable) == cell_key(config)


@pytest.mark.slow
@pytest.mark.xdist_group("ports")
def test_a_worker_killed_mid_cell_is_replaced_and_its_cell_resumes(corpus_dir, tmp_path):
    """A real Dask worker SIGKILLed after its cell's first checkpoint: Dask reruns the cell on another
    worker, which continues that checkpoint (same run), and the study finishes."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from _lab_toys import TINY

    distributed = pytest.importorskip("distributed")
    flags = list(TINY)
    flags[flags.index("--steps") + 1] = "200"  # long enough to be killed between checkpoints
    out = tmp_path / "study"
    checkpoint = out / "checkpoints" / "alibi-seed0"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, protocol="tcp", dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        cmd = [
            sys.executable,
            "-m",
            "posenc",
            "extrapolate",
            "--schemes",
            "alibi",
            "--seeds",
            "0",
            "--corpus",
            str(corpus_dir),
            *flags,
            "--checkpoint-every",
            "5",
            "--no-progress",
            "--cluster",
            cluster.scheduler_address,
            "--out",
            str(out),
        ]
        study = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while not checkpoint.exists():
            assert study.poll() is None, study.stdout.read()
            assert time.monotonic() < deadline, "no checkpoint after 120 s"
            time.sleep(0.05)
        busy = [worker for worker, tasks in client.processing().items() if tasks]
        assert len(busy) == 1
        os.kill(client.run(os.getpid, workers=busy)[busy[0]], signal.SIGKILL)
        text, _ = study.communicate(timeout=300)
    assert study.returncode == 0, text
    cell = json.loads((out / "cells" / "alibi-seed0.json").read_text())
    assert 0 < cell["train"]["resumed_from"] < 200 and cell["train"]["steps"] == 200
    assert json.loads((out / "results.json").read_text())["summary"]
