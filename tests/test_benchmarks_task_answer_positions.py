"""Tests of benchmarks/task_answer_positions.py: one accuracy per answer token (the end token last),
the task a lab checkpoint was trained on read from its study, and each bad argument one usage
error with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.model import ModelConfig, TransformerLM, save_model
from posenc.text.tasks import generate_task

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "task_answer_positions.py"
sys.path.insert(0, str(SCRIPT.parent))
import task_answer_positions as tap  # noqa: E402


def _checkpoint(tmp_path: Path, mode: str | None) -> Path:
    """A lab-shaped folder, OUT/checkpoints/RUN, with a tiny untrained model and OUT/results.json."""
    torch.manual_seed(0)
    folder = tmp_path / "out" / "checkpoints" / "nope-seed0"
    save_model(TransformerLM(ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2)), folder)
    if mode is not None:
        (tmp_path / "out" / "results.json").write_text(json.dumps({"config": {"mode": mode}}))
    return folder


def test_one_accuracy_per_answer_token_and_the_end_token(tmp_path):
    folder = _checkpoint(tmp_path, "copy")
    model = tap.load_model(folder).eval()
    ex = generate_task("copy", 2, 5, seed=0)
    accuracy = tap.answer_accuracy(model, "copy", 5, examples=20)
    assert len(accuracy) == int(ex.answer_mask[0].sum()) and all(0.0 <= a <= 1.0 for a in accuracy)
    assert tap.trained_task(folder) == "copy"


@pytest.mark.parametrize("text", ["[", "[]", '{"config": 3}', '{"config": {}}'])
def test_a_study_record_that_does_not_say_its_task_is_not_read(tmp_path, text):
    folder = _checkpoint(tmp_path, None)
    (tmp_path / "out" / "results.json").write_text(text)
    assert tap.trained_task(folder) is None
    assert tap.trained_task(tmp_path / "elsewhere") is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["copy", "x"], "must be a question length >= 1"),
        (["copy", "0"], "must be a question length >= 1"),
        (["nosuch", "5"], "invalid choice: 'nosuch'"),
        (["addition", "5"], "was trained on 'copy'"),
        (["copy", "5"], "no saved model"),  # in a folder with no model
    ],
)
def test_each_bad_argument_is_one_usage_error(tmp_path, capsys, args, message):
    folder = _checkpoint(tmp_path, "copy") if message != "no saved model" else tmp_path / "none"
    with pytest.raises(SystemExit) as exit_:
        tap.main([str(folder), *args])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # argparse's usage, then one error line
    assert exit_.value.code == 2 and last.startswith("task_answer_positions.py: error: ") and message in last


def test_the_script_runs_as_a_command(tmp_path):
    folder = _checkpoint(tmp_path, "copy")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(folder), "copy", "3"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("n=3: ") and len(run.stdout.split()) == 2 + 3  # 3 digits, end token
