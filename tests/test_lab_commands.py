"""Tests of posenc.lab.commands: ``posenc extrapolate`` and ``posenc train`` from the command line:
argument errors, --option parsing, --out checked before any work, a run never overwritten or
mislabelled, a single-file corpus, the help text, and the workers/threads defaults."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from _lab_toys import lab_text, text_corpus_in, train_cli_args, write_corpus
from posenc.cli import main
from posenc.lab.commands import parse_options


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_docs=40, size=3000)  # 4 validation documents


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory) -> Path:
    return text_corpus_in(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eval-lens", "128,abc"], "--eval-lens '128,abc' is not a comma list of ints"),
        (["--schemes", ","], "--schemes ',' is empty"),
        (["--seeds", "0,x"], "--seeds '0,x' is not a comma list of ints"),
        (["--seed", "1", "--seeds", "0,1"], "give --seed or --seeds, not both"),
        (["--seeds", "1,0"], "seeds must be increasing without repeats"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--variants", "yarnn"], "unknown variants entry 'yarnn'"),
        (["--resume"], "--resume and --overwrite need --out"),
        (["--markdown"], "--markdown formats a finished study: use it with --from"),
        (["--from", "/nonexistent"], "--from: cannot read a study from '/nonexistent'"),
        (["--option", "t5max=3"], "--option 't5max=3' is not SCHEME.KEY=VALUE"),
        (["--option", "alibi.slope=2"], "unknown position_options key of 'alibi' 'slope'"),
        (["--vary", "nrom=pre,post"], "vary field 'nrom' is not a model setting; did you mean 'norm'?"),
        (["--vary", "norm=pre,sideways"], "vary norm='sideways': unknown norm 'sideways'"),
        (["--vary", "norm"], "--vary 'norm' is not FIELD=V1,V2,... ; e.g. --vary norm=pre,post"),
        (
            ["--vary", "vocab_size=8,16"],
            "vary field 'vocab_size' cannot be varied: the data sets the vocabulary",
        ),
        (["--finetune-len", "256"], "finetune_len and finetune_steps go together"),
        (["--finetune-len", "256", "--finetune-steps", "9"], "none of ['alibi'] has any; add e.g. rope"),
        (["--randomized-positions", "8"], "randomized_positions=8 must be >= train_len=128"),
        (["--diagnostics", "300"], "diagnostic_windows=300 must be <= eval_windows=256"),
    ],
)
def test_cli_errors(argv, message, capsys):
    assert main(["extrapolate", "--schemes", "alibi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.strip().count("\n") == 0  # one line


def test_cli_varies_a_model_setting_with_diagnostics(tmp_path, corpus_dir, capsys):
    tiny = [
        "--train-len",
        "8",
        "--eval-lens",
        "8,16",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--d-model",
        "16",
        "--layers",
        "1",
        "--heads",
        "2",
        "--eval-windows",
        "4",
        "--workers",
        "1",
        "--no-progress",
        "--seeds",
        "0",
    ]
    argv = [
        "extrapolate",
        "--schemes",
        "alibi",
        "--corpus",
        str(corpus_dir),
        "--out",
        str(tmp_path / "v"),
        "--vary",
        "embed_norm=false,true",
        "--vary",
        "init_std=0.02,0.1",
        "--diagnostics",
        "2",
        *tiny,
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "alibi[embed_norm=true,init_std=0.1]" in out and "mean attended distance" in out
    results = json.loads((tmp_path / "v" / "results.json").read_text())
    assert results["config"]["vary"] == {"embed_norm": [False, True], "init_std": [0.02, 0.1]}
    assert results["config"]["diagnostic_windows"] == 2 and len(results["cells"]) == 4
    assert results["model_configs"]["alibi[embed_norm=true,init_std=0.1]"]["init_std"] == 0.1


def test_parse_options():
    assert parse_options(["t5.max_distance=64", "t5.bidirectional=false", "rope.layout=interleaved"]) == {
        "t5": {"max_distance": 64, "bidirectional": False},
        "rope": {"layout": "interleaved"},
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_cuda_without_a_gpu(capsys, tmp_path):
    assert main(["extrapolate", "--schemes", "alibi", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "--device cuda but torch sees no CUDA device" in capsys.readouterr().err


def test_workers_default_to_the_free_cores_and_threads_stay_per_cell(monkeypatch, corpus_dir):
    import posenc.lab.distributed as dist
    import posenc.lab.extrapolate as ex

    seen = {}

    def fake_run_study(config, **kw):
        seen.update(workers=kw["workers"], threads=kw["threads"])
        raise SystemExit(0)

    monkeypatch.setattr(dist, "free_cores", lambda world_size=1: 3)
    monkeypatch.setattr(ex, "run_study", fake_run_study)
    base = ["extrapolate", "--schemes", "alibi,nope", "--seeds", "0,1", "--corpus", str(corpus_dir)]
    with pytest.raises(SystemExit):
        main(base)
    assert seen == {"workers": 3, "threads": 1}  # three cells at once, one thread each
    with pytest.raises(SystemExit):
        main([*base, "--threads", "2"])
    assert seen == {"workers": 3, "threads": 2}  # --threads sets each cell's threads, not the workers
    with pytest.raises(SystemExit):
        main([*base, "--workers", "1", "--threads", "2"])
    assert seen == {"workers": 1, "threads": 2}


def test_cli_never_loses_or_mislabels_a_run(tmp_path, text_corpus, capsys):
    run = tmp_path / "run"
    assert main(train_cli_args(text_corpus, run, 6)) == 0
    saved = (run / "checkpoint" / "trainer.safetensors").read_bytes()
    capsys.readouterr()
    # a new run into the same folder: refused, the old run untouched
    assert main(train_cli_args(text_corpus, run, 3)) == 2
    err = capsys.readouterr().err
    assert "already holds a run (checkpoint, model, train.json)" in err
    assert (run / "checkpoint" / "trainer.safetensors").read_bytes() == saved
    # resuming with another architecture: refused with the differing fields, nothing written
    changed = [*train_cli_args(text_corpus, run, 6), "--resume", "--dropout", "0.2"]
    changed[changed.index("alibi")] = "nope"
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "model dropout: checkpoint 0.0 vs now 0.2" in err and "model position: checkpoint 'alibi'" in err
    assert (run / "checkpoint" / "trainer.safetensors").read_bytes() == saved
    assert json.loads((run / "train.json").read_text())["model_config"]["position"] == "alibi"
    # an explicit --overwrite replaces it
    assert main([*train_cli_args(text_corpus, run, 3), "--overwrite"]) == 0
    assert json.loads((run / "train.json").read_text())["end_step"] == 3


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_cli_out_checked_before_any_work(tmp_path, text_corpus, capsys, monkeypatch, where):
    import posenc.lab.cells

    def no_training(*args, **kwargs):
        pytest.fail("trained before checking --out")

    monkeypatch.setattr(sys.modules["posenc.lab.train"], "train", no_training)
    monkeypatch.setattr(posenc.lab.cells, "train", no_training)
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "sub"
    for command in (
        train_cli_args(text_corpus, out, 3),
        ["extrapolate", "--schemes", "alibi", "--corpus", str(text_corpus), "--out", str(out)],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert ("is a file, not a folder" in err or "lies under the file" in err) and "Traceback" not in err


def test_cli_trains_on_a_single_file_split_by_position(tmp_path, capsys):
    big = tmp_path / "bigdoc.txt"
    big.write_text(lab_text()[:40000])
    assert main(train_cli_args(big, tmp_path / "run", 2, val_fraction=0.25)) == 0
    corpus = json.loads((tmp_path / "run" / "train.json").read_text())["corpus"]
    assert (corpus["n_documents"], corpus["n_train"], corpus["n_val"], corpus["val_fraction"]) == (
        1,
        1,
        1,
        0.25,
    )
    capsys.readouterr()
    assert main(train_cli_args(big, tmp_path / "bad", 2, val_fraction=1.5)) == 2
    assert "val_fraction must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_train_help_speaks_of_one_run(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "per scheme" not in text and "task mode" not in text and "evaluation windows" not in text
    assert "--steps STEPS optimizer steps. (default 600)" in text and "--val-fraction" in text
    with pytest.raises(SystemExit):
        main(["extrapolate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    steps = "--steps STEPS optimizer steps. (default 600; --quick: 300; task mode: 2500; "
    assert steps + "--task addition_reversed: 10000)" in text
    assert "examples. (default 0,1,2; --quick: 0)" in text  # what --quick runs: one seed
    assert "with --task, one seed of the task at its own budget" in text


def _study(argv: list[str]):
    import argparse

    from posenc.lab.commands import extrapolate_args, study_config

    parser = argparse.ArgumentParser()
    extrapolate_args(parser)
    return study_config(parser.parse_args(argv))


def test_task_mode_defaults_are_the_budget_that_learns():
    c = _study(["--task", "copy"])
    budget = (c.model.d_model, c.model.num_layers, c.model.num_heads, c.train.batch_size, c.train.steps)
    budget += (c.curriculum_steps,)
    assert budget == (64, 4, 4, 64, 2500, 600)
    # L, every length just past it (where schemes differ), 2L and 3L
    assert (c.train_len, c.eval_lens, c.seeds) == (8, (8, 9, 10, 11, 12, 13, 14, 15, 16, 24), (0, 1, 2))
    assert _study(["--task", "copy", "--train-len", "4"]).eval_lens == (4, 5, 6, 7, 8, 9, 10, 11, 12)
    assert _study(["--task", "copy", "--eval-lens", "8,12"]).eval_lens == (8, 12)  # given: kept
    assert _study(["--task", "sort", "--steps", "50"]).curriculum_steps == 50  # the default, within --steps
    assert _study(["--task", "copy", "--curriculum-steps", "0"]).curriculum_steps == 0
    lm = _study([])
    assert (lm.curriculum_steps, lm.model.d_model, lm.train.steps) == (0, 128, 600)  # lm: unchanged
    # a task's own budget where the shared one does not learn it; the user's --steps still wins
    assert _study(["--task", "addition_reversed"]).train.steps == 10_000
    assert _study(["--task", "addition_reversed", "--steps", "300"]).train.steps == 300
    assert _study(["--task", "addition"]).train.steps == 2500


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--curriculum-steps", "5"], "curriculum_steps=5 needs a synthetic task"),
        (
            ["--task", "copy", "--steps", "10", "--curriculum-steps", "20"],
            "curriculum_steps=20 must be <= steps=10",
        ),
    ],
)
def test_curriculum_errors_are_one_line(argv, message, capsys):
    assert main(["extrapolate", "--schemes", "alibi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
