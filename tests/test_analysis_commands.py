"""Tests of posenc.analysis.commands: ``posenc verify``, ``posenc plot`` and ``posenc report``."""

from __future__ import annotations

import json

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
    assert main(["report", "-o", str(tmp_path / "rep"), "sinusoidal", "learned", "nope"]) == 0
    page = tmp_path / "rep" / "index.html"
    assert page.stat().st_size > 100_000 and "wrote" in capsys.readouterr().out
    assert page.read_text(encoding="utf-8").count('<img src="data:image/png;base64,') == 7
