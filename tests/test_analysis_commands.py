"""Tests of posenc.analysis.commands: ``posenc verify``, ``posenc plot`` and ``posenc report``."""

from __future__ import annotations

import contextlib
import json

import pytest

from _analysis_toys import ToyBF16Positions, registered
from posenc.cli import main


def test_verify_table_and_json(capsys):
    assert main(["verify", "sinusoidal", "learned", "--property", "translation_inv", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "sinusoidal  translation_inv  pass" in out and "learned     translation_inv  no*" in out
    assert "Every scheme keeps every property it promises." in out
    assert main(["verify", "learned", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["property"] for r in rows} >= {"distinct_bf16", "translation_inv"}
    assert next(r for r in rows if r["property"] == "beyond_length")["status"] == "no"


def test_verify_exits_1_on_a_broken_promise(capsys):
    with registered(ToyBF16Positions):
        assert main(["verify", "toy_bf16_positions", "--property", "distinct_bf16"]) == 1
    assert "1 broken promise(s): toy_bf16_positions.distinct_bf16" in capsys.readouterr().out


def test_verify_and_plot_errors(capsys, tmp_path):
    assert main(["verify", "nosuch"]) == 2
    assert "unknown scheme 'nosuch'" in capsys.readouterr().err
    assert main(["verify", "sinusoidal", "--property", "smooth"]) == 2
    assert "unknown property 'smooth'" in capsys.readouterr().err
    out = tmp_path / "k.png"
    assert main(["plot", "sinusoidal", "--kind", "kernel_curve", "-o", str(out)]) == 0
    assert out.stat().st_size > 5000 and "wrote" in capsys.readouterr().out
    assert main(["plot", "sinusoidal", "--kind", "nope", "-o", str(out)]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_report_command(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", "-o", str(out), "sinusoidal", "learned", "nope", "--fast", "--max-len", "64"]) == 0
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "wrote" in capsys.readouterr().out and "L = 64, causal" in page  # the library's default
    assert page.count('<img src="data:image/png;base64,') == 4  # sinusoidal 2, learned 2 (nope none)
    assert "Built without training (fast mode)" in page


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--d-model", "33"], "--d-model must be even"),
        (["--head-dim", "0"], "--head-dim must be >= 2, got 0"),
        (["--max-len", "100000"], "--max-len=100000 is too large"),
        (["--fast", "--study", "x"], "not allowed with argument"),
        (["--study", "{tmp}"], "holds no results.json"),
        (["--cache-dir", "{tmp}/afile"], "--cache-dir '"),
        (["-o", "-"], "-o '-': the report is a folder holding index.html, not a stream"),
        (["--study", "{tmp}/bad"], "results.json: field 'config' is missing"),
        (["--causal", "--bidirectional"], "not allowed with argument"),
    ],
)
def test_report_command_errors(tmp_path, capsys, argv, match):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text('{"summary": []}')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with contextlib.suppress(SystemExit):  # argparse's own errors exit 2 as well
        assert main(["report", "-o", str(tmp_path / "rep"), "nope", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err.strip().splitlines()[-1] and "Traceback" not in err
