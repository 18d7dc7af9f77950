"""Tests of posenc.lab.pretrained: ``posenc extrapolate --model`` prints the tables, writes
results.json, and answers each user mistake with one line and exit code 2."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from _pretrained_toys import untrained_model, write_code_corpus
from posenc.cli import main as cli_main
from posenc.model.hf import save_transformers


@pytest.fixture
def corpus(tmp_path):
    return write_code_corpus(tmp_path)


_model = untrained_model


KW = dict(corpus=None, val_fraction=0.34, eval_windows=8)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main(["extrapolate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_prints_the_table_and_writes_results(tmp_path, corpus, capsys):
    save_transformers(_model(), tmp_path / "hf")
    flags = ["--corpus", corpus, "--val-fraction", "0.34", "--eval-windows", "4", "--variants", "yarn"]
    flags += ["--train-len", "16"]  # a study flag --model reads
    code, out, err = _cli(
        capsys, "--model", tmp_path / "hf", "--eval-lens", "32", *flags, "--out", tmp_path / "o"
    )
    assert code == 0, err
    assert "+yarn" in out and "paired delta vs L=16" in out and "wrote" in out
    record = json.loads((tmp_path / "o" / "results.json").read_text())
    assert record["train_len"] == 16 and [r["name"] for r in record["runs"]] == ["as is", "+yarn"]
    assert record["environment"]["load_avg_start"] and record["model"] == str(tmp_path / "hf")
    # a folder holding results is not overwritten unless asked
    code, _, err = _cli(capsys, "--model", tmp_path / "hf", *flags, "--out", tmp_path / "o")
    assert code == 2 and err.count("\n") == 1
    code, _, err = _cli(capsys, "--model", tmp_path / "hf", *flags, "--out", tmp_path / "o", "--overwrite")
    assert code == 0, err


def test_the_command_gives_one_line_for_each_user_error(tmp_path, corpus, capsys):
    save_transformers(_model(), tmp_path / "hf")
    _model("learned").save_pretrained(tmp_path / "learned")
    (tmp_path / "empty").mkdir()
    (tmp_path / "mamba").mkdir()
    (tmp_path / "mamba" / "config.json").write_text('{"model_type": "mamba"}')
    data = ["--corpus", corpus, "--val-fraction", "0.34", "--eval-windows", "4"]
    cases = {
        "does not exist": ["--model", tmp_path / "nothing"],
        "holds no config.json": ["--model", tmp_path / "empty"],
        "model_type 'mamba' is not one posenc converts": ["--model", tmp_path / "mamba"],
        "go together": ["--model", tmp_path / "hf", "--finetune-len", "32"],
        "longer than the model's positions allow": ["--model", tmp_path / "learned", "--eval-lens", "32"],
        "too few for 4 windows of up to 4096": ["--model", tmp_path / "hf", "--eval-lens", "4096"],
        "--schemes train models of their own": ["--model", tmp_path / "hf", "--schemes", "alibi"],
        ": --seeds train models of their own": ["--model", tmp_path / "hf", "--seeds", "3"],  # named once
        "--layers, --norm-type train models of their own": [  # --train-len is read, not refused
            "--model",
            tmp_path / "hf",
            "--train-len",
            "16",
            "--layers",
            "3",
            "--norm-type",
            "rmsnorm",
        ],
        "is not a comma list": ["--model", tmp_path / "hf", "--eval-lens", "x"],
        "--lr, --peft set how to fine-tune": ["--model", tmp_path / "hf", "--lr", "1e-3", "--peft", "lora"],
    }
    for needle, argv in cases.items():
        code, out, err = _cli(capsys, *argv, *data)
        assert code == 2, (needle, err)
        assert err.startswith("posenc extrapolate: error: ") and err.count("\n") == 1, err
        assert needle in err, (needle, err)
        assert out == ""


def test_quick_keeps_the_work_small(tmp_path, corpus, capsys):
    save_transformers(_model(), tmp_path / "hf")
    argv = ["--model", tmp_path / "hf", "--quick", "--corpus", corpus, "--val-fraction", "0.34"]
    code, out, err = _cli(capsys, *argv, "--variants", "none", "--out", tmp_path / "q")
    assert "as is" in out
    assert code == 0, err
    record = json.loads((tmp_path / "q" / "results.json").read_text())
    assert record["eval_lens"] == [16, 32, 64]  # L, 2L, 4L
    assert record["eval"]["windows"] == 16 and record["environment"]["quick"] is True
    probe = record["runs"][0]["eval"][-1]["probe"]
    assert probe[0]["gain"]["n"] == 16  # trials per distance


# ----------------------------------------------------------------------------------------------
# Hostile flags: one line, exit code 2, before any work
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--threads", "100000"], "--threads 100000 is more than"),  # OpenMP crashed (exit 139)
        (["--device", "cuda:99"], "--device cuda:99 but torch sees"),  # was a torch traceback
        (["--device", "meta"], "--device 'meta' is not a device posenc runs on"),
        (["--score-len", "0"], "--score-len must be >= 1"),  # was read as the default
        (["--eval-lens", "1000000000"], "(one window) would not fit in memory"),
        (["--variants", "yarnn"], "did you mean 'yarn'?"),
        (["--finetune-len", "16", "--finetune-steps", "2"], "is not longer than the trained length L=16"),
        (["--finetune-len", "32", "--finetune-steps", "2", "--batch-size", "1000000000"], "would not fit"),
        (["--workers", "0"], "--workers must be >= 1, got 0"),
        (["--cluster", "not an address"], "is not a Dask scheduler address"),
        (["--cluster", "127.0.0.1:1"], "cannot reach the Dask scheduler"),
    ],
)
def test_a_hostile_flag_is_one_line(tmp_path, corpus, capsys, monkeypatch, argv, needle):
    def no_scoring(*args, **kwargs):
        raise AssertionError("scoring started before the flags were checked")

    monkeypatch.setattr("posenc.lab.pretrained_eval.evaluate_lm", no_scoring)
    save_transformers(_model(), tmp_path / "hf")
    data = ["--corpus", corpus, "--val-fraction", "0.34", "--eval-windows", "4"]
    code, out, err = _cli(capsys, "--model", tmp_path / "hf", *data, *argv)
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert out == ""


def test_a_mistake_leaves_a_previous_run_in_out_even_with_overwrite(tmp_path, corpus, capsys):
    save_transformers(_model(), tmp_path / "hf")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "results.json").write_text('{"mine": 1}')
    data = ["--model", tmp_path / "hf", "--corpus", corpus, "--out", tmp_path / "o"]
    code, _, err = _cli(capsys, *data, "--overwrite", "--eval-lens", "0")
    assert code == 2 and "--eval-lens entry must be >= 1" in err
    assert (tmp_path / "o" / "results.json").read_text() == '{"mine": 1}'
    # without --overwrite: refused, offering what this command can do (it has no --resume)
    code, _, err = _cli(capsys, *data)
    assert code == 2 and "replace it with --overwrite" in err and "--resume" not in err, err
    assert (tmp_path / "o" / "results.json").read_text() == '{"mine": 1}'


def test_the_weights_dtype_is_recorded_and_printed(tmp_path, corpus, capsys):
    save_transformers(_model().to(torch.bfloat16), tmp_path / "hf")
    flags = ["--corpus", corpus, "--val-fraction", "0.34", "--eval-windows", "4", "--variants", "none"]
    code, out, err = _cli(
        capsys, "--model", tmp_path / "hf", *flags, "--eval-lens", "16", "--out", tmp_path / "o"
    )
    assert code == 0, err
    assert "(bfloat16 weights," in out
    assert json.loads((tmp_path / "o" / "results.json").read_text())["environment"]["dtype"] == "bfloat16"


# ----------------------------------------------------------------------------------------------
# Signals: Ctrl-C (130) and SIGTERM (143) during scoring and fine-tuning; one line, no results.json
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "signum, code, phase",
    [
        (signal.SIGINT, 130, "posenc.lab.pretrained_eval.evaluate_lm"),
        (signal.SIGTERM, 143, "posenc.lab.pretrained_eval.evaluate_lm"),
        (signal.SIGINT, 130, "posenc.lab.train.train"),
        (signal.SIGTERM, 143, "posenc.lab.train.train"),
    ],
)
def test_a_signal_stops_the_run_with_one_line_and_no_results(
    tmp_path, corpus, capsys, monkeypatch, request, signum, code, phase
):
    import importlib

    module, name = phase.rsplit(".", 1)
    module = importlib.import_module(module)  # the module (posenc.lab.train is also a function's name)
    real = getattr(module, name)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signum)  # delivered to this (the main) thread, as from a terminal
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted)
    # Python's own Ctrl-C handler, as in a terminal: a test run started in the background inherits
    # SIGINT ignored, and then the signal would never arrive
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    save_transformers(_model(), tmp_path / "hf")
    flags = ["--corpus", corpus, "--val-fraction", "0.34", "--eval-windows", "4", "--variants", "none"]
    flags += ["--eval-lens", "32", "--finetune-len", "32", "--finetune-steps", "2", "--no-progress"]
    got, _, err = _cli(capsys, "--model", tmp_path / "hf", *flags, "--out", tmp_path / "o")
    assert got == code
    assert err.count("\n") == 1 and "no results were written" in err and "--resume" not in err, err
    assert not (tmp_path / "o" / "results.json").exists()
    assert not [p for p in (tmp_path / "o").iterdir() if p.name != ".posenc.lock"]
