"""Tests of posenc.lab.tables: a study's tables (plain and Markdown), read from its typed results."""

from __future__ import annotations

import pytest

from posenc.lab.results import StudyResults
from posenc.lab.stats import seed_interval
from posenc.lab.summary import training_summary
from posenc.lab.tables import format_table


def test_format_table_marks_missing_values():
    def iv(mean, hw=None):
        if hw is None:
            return {"mean": mean, "low": None, "high": None, "n": 1}
        return {"mean": mean, "low": mean - hw, "high": mean + hw, "n": 3}

    def row(name, length, window, delta=None, note=""):
        return {
            "name": name,
            "length": length,
            "note": note,
            "bpb_window": window,
            "delta": delta,
            "bpb_all": window,
            "bpb_beyond": None,
            "accuracy": None,
        }

    results = {
        "config": {"mode": "lm", "train_len": 8, "eval_lens": [8, 16], "seeds": [0, 1, 2]},
        "eval": {"score_len": 4},
        "summary": [
            row("learned", 8, iv(2.5, 0.1)),
            row("learned", 16, None, note="n/a: stops at 8"),
            row("alibi", 8, iv(2.4, 0.05)),
            row("alibi", 16, iv(2.3, 0.05), iv(-0.1, 0.02)),
        ],
    }
    lines = format_table(StudyResults.from_dict({**results, "runs": []})).splitlines()
    assert lines[0].startswith("paired delta vs L=8") and "over 3 seeds" in lines[0]
    assert lines[2].split() == ["learned", "-", "n/a"]
    assert lines[3].split() == ["alibi", "-", "-0.100", "±0.020"]
    assert lines[5].startswith("sliding-window bits/byte: the last 4 targets")
    assert lines[7].split() == ["learned", "2.500", "±0.100", "n/a"]


def test_training_summary_and_table_give_each_run_its_final_loss_with_an_interval():
    def cell(run, seed, final, curve):
        train = {"final_loss_nats": final, "loss_every_10_steps": curve}
        return {"scheme": "rope", "run": run, "seed": seed, "train": train}

    cells = [
        cell("rope", 0, 2.0, [5.0, 3.0, 2.0]),
        cell("rope", 1, 2.2, [5.2, 3.2, 2.2, 2.1]),  # a longer history: cut to the common steps
        cell("rope[norm=post]", 0, 2.5, [5.0, 3.5]),
        {**cell("rope+ft16", 0, 1.9, [2.0]), "finetune": {"steps": 1}},  # fine-tuning: not a trained run
    ]
    summary = training_summary(cells)
    assert list(summary) == ["rope", "rope[norm=post]"]
    rope = summary["rope"]
    assert rope["final_loss"] == pytest.approx(seed_interval([2.0, 2.2]).to_dict())
    assert rope["curve"]["step"] == [0, 10, 20] and rope["curve"]["mean"] == pytest.approx([5.1, 3.1, 2.1])
    assert rope["curve"]["low"][0] < 5.1 < rope["curve"]["high"][0] and rope["seeds"] == [0, 1]
    one = summary["rope[norm=post]"]["curve"]
    assert one["low"] == one["mean"] == one["high"]  # one seed: no interval, the mean itself
    results = {
        "config": {"mode": "lm", "train_len": 8, "eval_lens": [8], "seeds": [0, 1]},
        "eval": {"score_len": 4},
        "summary": [],
        "training": summary,
    }
    text = format_table(StudyResults.from_dict({**results, "runs": []}))
    assert "final training loss, nats/token" in text and "2.100 ±" in text
    assert "| rope[norm=post] | 2.500 |" in format_table(
        StudyResults.from_dict({**results, "runs": []}), True
    )


def test_task_tables_widen_for_intervals_with_both_ends():
    """Wilson intervals print both ends: the columns widen so that cells never run together."""
    from posenc.lab.stats import wilson_interval

    def row(length, k):
        rate = wilson_interval(k, 200).to_dict()
        return {"name": "alibi", "length": length, "note": "", "accuracy": rate, "token_accuracy": None}

    results = {
        "config": {"mode": "copy", "train_len": 8, "eval_lens": [8, 9], "seeds": [0]},
        "runs": [],
        "summary": [row(8, 200), row(9, 169)],
        "eval": {},
    }
    lines = format_table(StudyResults.from_dict(results)).splitlines()
    assert lines[2].split() == ["alibi", "1.000", "[0.981,", "1.000]", "0.845", "[0.788,", "0.889]"]
    assert len(lines[1]) == len(lines[2])  # the header's columns line up with the cells
