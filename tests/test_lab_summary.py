"""Tests of posenc.lab.summary: a study's numbers across seeds (means and intervals per run and
length, training losses per trained run)."""

from __future__ import annotations

import statistics

import pytest

from _lab_toys import tiny_study, write_corpus
from posenc.lab.extrapolate import run_study
from posenc.lab.stats import paired_bootstrap, seed_interval
from posenc.lab.summary import summarize, training_summary


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_docs=40, size=3000)  # 4 validation documents


def test_summary_is_the_mean_of_the_runs_with_a_t_interval(corpus_dir):
    config = tiny_study(corpus_dir, schemes=("alibi",), seeds=(0, 1), variants=())
    results = run_study(config, log=None, progress=False, threads=1).to_dict()
    row = next(r for r in results["summary"] if r["name"] == "alibi" and r["length"] == 32)
    runs = [next(p for p in r["eval"] if p["length"] == 32) for r in results["runs"]]
    for metric in ("bpb_all", "bpb_beyond"):  # no per-window values: a t interval over seeds
        values = [p[metric] for p in runs]
        assert row[metric]["mean"] == pytest.approx(statistics.mean(values), abs=1e-12)
        assert {k: v for k, v in row[metric].items() if k != "over"} == pytest.approx(
            {k: v for k, v in seed_interval(values).to_dict().items() if k != "over"}
        )
    # per-window values: the bootstrap over seeds and documents of the same windows
    bits = [p["window_bits"] for p in runs]
    clusters = results["eval"]["window_documents"]
    assert row["bpb_window"] == paired_bootstrap(bits, clusters, seed=8).to_dict()
    assert row["bpb_window"]["mean"] == pytest.approx(
        statistics.mean(p["bpb_window"] for p in runs), abs=1e-12
    )
    deltas = [p["delta"]["mean"] for p in runs]
    assert row["delta"]["mean"] == pytest.approx(statistics.mean(deltas), abs=1e-12)
    assert row["delta_over"] == "seeds and documents" and row["seeds"] == [0, 1]
    assert row["delta"]["n"] == results["eval"]["n_documents"] and row["delta"]["p_value"] is not None


def test_one_seed_keeps_the_bootstrap_interval_over_windows():
    point = {
        "length": 16,
        "note": "",
        "bpb_window": 2.0,
        "bpb_all": 2.1,
        "bpb_beyond": 2.2,
        "accuracy": None,
        "delta": {"mean": 0.1, "low": 0.05, "high": 0.2, "n": 32},
    }
    base = {**point, "length": 8, "delta": None, "bpb_beyond": None}
    rows = summarize([{"name": "rope", "scheme": "rope", "variant": None, "seed": 0, "eval": [base, point]}])
    assert rows[1]["delta"] == point["delta"] and rows[1]["delta_over"] == "windows"
    assert rows[1]["bpb_window"] == {
        "mean": 2.0,
        "low": None,
        "high": None,
        "n": 1,
        "over": "seeds",
        "p_value": None,
    }
    assert rows[0]["delta"] is None and rows[0]["bpb_beyond"] is None


def test_training_curves_prefer_the_mean_of_each_ten_steps():
    train = {"final_loss_nats": 2.0, "loss_every_10_steps": [9.0, 9.0], "loss_mean_10_steps": [5.0, 3.0]}
    summary = training_summary([{"scheme": "alibi", "run": "alibi", "seed": 0, "train": train}])
    assert summary["alibi"]["curve"]["mean"] == [5.0, 3.0]
