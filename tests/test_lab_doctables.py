"""Tests of posenc.lab.doctables: a page's marked blocks are refilled from results files."""

from __future__ import annotations

import json

import pytest

from posenc.cli import main
from posenc.lab.doctables import regenerate


def _results(delta: float) -> dict:
    iv = {"mean": 2.5, "low": 2.4, "high": 2.6, "n": 40, "over": "seeds and documents", "p_value": None}
    d = {"mean": delta, "low": delta - 0.01, "high": delta + 0.01, "n": 40, "over": "seeds and documents"}
    row = {
        "name": "alibi",
        "length": 16,
        "note": "",
        "bpb_window": iv,
        "delta": d,
        "bpb_all": iv,
        "bpb_beyond": iv,
    }
    return {
        "config": {"mode": "lm", "train_len": 8, "eval_lens": [16], "seeds": [0, 1, 2]},
        "eval": {"score_len": 4},
        "runs": [],
        "summary": [row],
        "environment": {"command": "posenc extrapolate --seeds 0,1,2", "cpus": 2, "device": "cpu"},
        "wall_s": 120.0,
    }


def test_blocks_are_refilled_from_their_results_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps(_results(+0.123)))
    (tmp_path / "b.json").write_text(json.dumps(_results(-0.456)))
    page = tmp_path / "lab.md"
    page.write_text(
        "# Lab\n\ntext kept\n<!-- posenc-results: a.json -->\nold numbers 9.999\n<!-- /posenc-results -->\n"
        "between\n<!-- posenc-results: b.json -->\n<!-- /posenc-results -->\nend\n"
    )
    assert regenerate(page) == 2
    text = page.read_text()
    assert "9.999" not in text and "text kept" in text and "between" in text and text.endswith("end\n")
    first, second = text.split("between")
    assert "| alibi | +0.123 ±0.010 |" in first and "| alibi | -0.456 ±0.010 |" in second
    assert "`posenc extrapolate --seeds 0,1,2` in 2.0 min" in first
    assert regenerate(page) == 2 and page.read_text() == text  # idempotent


def test_a_missing_file_leaves_the_page_unchanged(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps(_results(0.1)))
    page = tmp_path / "lab.md"
    original = (
        "<!-- posenc-results: a.json -->\n<!-- /posenc-results -->\n"
        "<!-- posenc-results: gone.json -->\n<!-- /posenc-results -->\n"
    )
    page.write_text(original)
    with pytest.raises(ValueError, match=r"posenc-results: gone\.json.*cannot read a study"):
        regenerate(page)
    assert page.read_text() == original
    (tmp_path / "plain.md").write_text("# nothing to fill\n")
    assert main(["extrapolate", "--regenerate", str(tmp_path / "plain.md")]) == 2
    assert "has no '<!-- posenc-results: PATH -->'" in capsys.readouterr().err
    assert main(["extrapolate", "--regenerate", str(tmp_path / "missing.md")]) == 2
    assert "--regenerate: cannot read" in capsys.readouterr().err


def test_a_resumed_study_says_its_cells_were_reused_and_how_long_they_trained(tmp_path, monkeypatch):
    """A study resumed from finished cells ran for seconds: its line must not read as the study's
    time, so it names the reused cells and their own training time."""
    monkeypatch.chdir(tmp_path)
    train = {
        "steps": 10,
        "resumed_from": 0,
        "wall_s": 90.0,
        "tokens_per_s": 1.0,
        "threads": 1,
        "final_loss_nats": 2.0,
        "loss_every_10_steps": [2.0],
    }
    cell = {
        "cell": "alibi-seed0",
        "scheme": "alibi",
        "seed": 0,
        "run": "alibi",
        "setting": {},
        "run_id": "x",
        "params": 1,
        "train": train,
    }
    results = {**_results(0.1), "wall_s": 6.0, "cells": [{**cell, "reused": True}, {**cell, "cell": "b"}]}
    (tmp_path / "a.json").write_text(json.dumps(results))
    page = tmp_path / "lab.md"
    page.write_text("<!-- posenc-results: a.json -->\n<!-- /posenc-results -->\n")
    regenerate(page)
    assert "in 0.1 min (2 CPUs, cpu); 1 of 2 cells were reused" in page.read_text()
    assert "training took 1.5 min of that run" in page.read_text()
