"""Tests of posenc.lab.pretrained: ``posenc extrapolate --model`` prints the tables, writes
results.json, and answers each user mistake with one line and exit code 2."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.cli import main as cli_main
from posenc.model import ModelConfig, TransformerLM
from posenc.model.hf import save_transformers

TEXT = "def f(x):\n    return x * 2 + 1\n" * 40


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(6):
        (folder / f"m{i}.py").write_text(TEXT.replace("2", str(i)))
    return str(folder)


def _model(position="rope", vocab_size=256, max_len=16, **kw) -> TransformerLM:
    torch.manual_seed(0)
    # a large init makes attention, and so positions, matter in an untrained model
    config = ModelConfig(
        vocab_size=vocab_size,
        d_model=32,
        num_layers=2,
        num_heads=4,
        position=position,
        max_len=max_len,
        init_std=0.5,
        **kw,
    )
    return TransformerLM(config).eval()


KW = dict(corpus=None, val_fraction=0.34, eval_windows=8)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main(["extrapolate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_prints_the_table_and_writes_results(tmp_path, corpus, capsys):
    save_transformers(_model(), tmp_path / "hf")
    flags = ["--corpus", corpus, "--val-fraction", "0.34", "--eval-windows", "4", "--variants", "yarn"]
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
        "--layers, --norm-type train models of their own": [
            "--model",
            tmp_path / "hf",
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
