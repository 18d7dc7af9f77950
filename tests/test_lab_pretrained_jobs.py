"""Tests of posenc.lab.pretrained_jobs: a loaded model's run split into jobs (its variants, its
fine-tuning runs) gives, on several processes, the numbers of one process."""

from __future__ import annotations

import json

import pytest

from _pretrained_toys import untrained_model, write_code_corpus
from posenc.cli import main as cli_main
from posenc.lab.finetune_pretrained import FinetunePlan
from posenc.lab.pretrained_eval import evaluate_setup, prepare_pretrained
from posenc.lab.pretrained_jobs import score_all, score_job, train_all, train_job
from posenc.model.hf import save_transformers


@pytest.fixture
def corpus(tmp_path):
    return write_code_corpus(tmp_path)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main(["extrapolate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_job_computes_what_the_run_in_this_process_does(tmp_path, corpus):
    save_transformers(untrained_model(), tmp_path / "hf")
    options = dict(corpus=corpus, val_fraction=0.34, eval_windows=4, eval_lens=(32,), variants=("yarn",))
    options["device"] = "cpu"
    setup = prepare_pretrained(str(tmp_path / "hf"), **options)
    assert _untimed(score_job(str(tmp_path / "hf"), options, 1, "yarn")) == _untimed(
        setup.score_variant("yarn")
    )
    plan = FinetunePlan.checked(setup, 32, 2)
    run = plan.runs(setup)[-1]  # the control
    points, train = train_job(str(tmp_path / "hf"), options, 1, plan.__dict__, run)
    here_points, here_train = plan.train_and_score(setup, *run, progress=False)
    assert _untimed(points) == _untimed(here_points) and train["loss_last"] == here_train["loss_last"]
    # the mappers hand evaluate_setup and FinetunePlan.run one result per item, in order
    jobs = dict(threads=1, workers=2)
    results = evaluate_setup(setup, score_all(str(tmp_path / "hf"), options, **jobs))
    assert _untimed(results["runs"]) == _untimed(evaluate_setup(setup)["runs"])
    ft = plan.run(setup, results, train_all=train_all(str(tmp_path / "hf"), options, plan, **jobs))
    assert [r["name"] for r in ft["runs"]] == [name for name, _, _ in plan.runs(setup)]


def test_several_workers_give_the_numbers_of_one_process(tmp_path, corpus, capsys):
    """The variants and the fine-tuning runs as jobs on two spawned processes: each rebuilds the run
    from the model's path and the options, so every number equals the one-process run's."""
    save_transformers(untrained_model(), tmp_path / "hf")
    argv = ["--model", tmp_path / "hf", "--corpus", corpus, "--val-fraction", "0.34", "--eval-windows", "4"]
    argv += ["--eval-lens", "32", "--variants", "yarn,ntk", "--finetune-len", "32", "--finetune-steps", "2"]
    argv += ["--threads", "1", "--no-progress"]
    records = []
    for workers, out in (("1", "one"), ("2", "two")):
        code, _, err = _cli(capsys, *argv, "--workers", workers, "--out", tmp_path / out)
        assert code == 0, err
        records.append(json.loads((tmp_path / out / "results.json").read_text()))
    one, two = records
    assert two["environment"]["workers"] == 2 and one["environment"]["workers"] == 1
    assert [r["name"] for r in two["runs"]] == ["as is", "+yarn", "+ntk"]
    assert _untimed(two["runs"]) == _untimed(one["runs"])  # every point, interval and probe
    assert _untimed(two["finetune"]) == _untimed(one["finetune"])  # losses, points, deltas


def _double(path, options, threads, x):
    return 2 * x


def _die(path, options, threads, code):
    import os

    os._exit(code)  # what the out-of-memory killer does to a worker: no Python error, no traceback


def test_workers_are_capped_at_the_jobs_and_a_dead_worker_is_one_error():
    from posenc.lab.pretrained_jobs import _map

    # a pool of 2**31 processes cannot start; two jobs need two
    assert _map(_double, "model", {}, None, [(1,), (2,)], 2**31, None) == [2, 4]
    with pytest.raises(ValueError, match=r"a worker process died .* before the run finished; start it again"):
        _map(_die, "model", {}, None, [(3,)], 2, None)


def test_the_record_says_how_many_processes_ran():
    from types import SimpleNamespace

    from posenc.lab.pretrained import _processes, _where

    setup = SimpleNamespace(variants=("yarn", "ntk"))  # 3 scoring jobs
    plan = SimpleNamespace(runs=lambda s: [("ft", None, False)] * 4)  # 4 fine-tuning jobs
    assert _processes(None, setup, None) == 1
    assert _processes({"workers": 2**31, "cluster": None}, setup, None) == 3
    assert _processes({"workers": 2**31, "cluster": None}, setup, plan) == 4
    assert _processes({"workers": 2, "cluster": None}, setup, plan) == 2
    assert _processes({"workers": 8, "cluster": "tcp://h:1"}, setup, plan) is None
    assert _where({"cluster": None, "workers": 2, "threads": 1}) == "2 worker(s) x 1 thread(s)"
    assert (
        _where({"cluster": "tcp://h:1", "workers": None, "threads": 1})
        == "cluster tcp://h:1, 1 thread(s) per job"
    )


def _untimed(record):
    """``record`` without its wall-clock times (the one thing two runs may not share)."""
    if isinstance(record, dict):
        return {k: _untimed(v) for k, v in record.items() if k != "wall_s"}
    if isinstance(record, list):
        return [_untimed(v) for v in record]
    return record
