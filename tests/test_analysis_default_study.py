"""Tests of posenc.analysis.default_study: the shipped summary loads, is small and says where it
came from; a malformed study is refused in one line naming the file and the field; the summary
keeps what the page draws from a real (tiny) study."""

from __future__ import annotations

import json

import pytest

from _lab_toys import tiny_study, write_corpus
from posenc.analysis.default_study import SUMMARY_FILE, check_study, load_default_study, main, study_summary


def test_the_shipped_summary_is_a_small_real_study_with_its_provenance():
    study = load_default_study()
    assert study is not None and SUMMARY_FILE.stat().st_size < 16_000
    prov = study["provenance"]
    cfg = study["config"]
    seeds = ",".join(map(str, cfg["seeds"]))
    assert prov["command"].startswith("posenc extrapolate ") and f"--seeds {seeds}" in prov["command"]
    assert {"posenc", "date", "torch", "python", "corpus_sha256"} <= set(prov)
    assert cfg["mode"] == "lm" and len(cfg["seeds"]) >= 3 and cfg["train_len"] in cfg["eval_lens"]
    names = {r["name"] for r in study["summary"]}
    assert set(cfg["schemes"]) <= names
    for row in study["summary"]:  # intervals over the seeds and documents where it reads past L
        if row["delta"] is not None and row["length"] != cfg["train_len"]:
            d = row["delta"]
            assert d["over"] == "seeds and documents" and d["n"] >= 10 and d["low"] <= d["mean"] <= d["high"]


@pytest.mark.parametrize(
    ("results", "field"),
    [
        ([], "(top level)"),
        ({"summary": []}, "'config'"),
        ({"config": {"mode": "lm", "train_len": 8, "eval_lens": [8]}, "summary": []}, "'config.seeds'"),
        (
            {"config": {"mode": "lm", "train_len": 8, "eval_lens": 8, "seeds": [0]}, "summary": []},
            "'config.eval_lens'",
        ),
        ({"config": {"mode": "lm", "train_len": 8, "eval_lens": [8], "seeds": [0]}}, "'summary'"),
        (
            {
                "config": {"mode": "lm", "train_len": 8, "eval_lens": [8], "seeds": [0]},
                "summary": [{"name": "x"}],
            },
            "'summary[0]'",
        ),
    ],
)
def test_a_malformed_study_is_refused_naming_the_file_and_field(results, field):
    with pytest.raises(ValueError) as err:
        check_study(results, "runs/x/results.json")
    text = str(err.value)
    assert text.startswith("runs/x/results.json: field " + field) and "\n" not in text


def test_summary_of_a_real_study_keeps_what_the_page_draws(tmp_path, capsys):
    from posenc.lab.extrapolate import run_study

    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    run_study(
        tiny_study(corpus, schemes=("nope", "alibi"), seeds=(0, 1), variants=()), out=tmp_path / "s", log=None
    )
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    summary = study_summary(results, "posenc extrapolate --out s", "2026-01-02")
    assert summary["provenance"]["command"] == "posenc extrapolate --out s"
    assert summary["provenance"]["date"] == "2026-01-02"
    assert len(summary["summary"]) == len(results["summary"])
    for kept, full in zip(summary["summary"], results["summary"]):
        assert kept["name"] == full["name"] and kept["length"] == full["length"]
        assert kept["bpb_window"]["mean"] == full["bpb_window"]["mean"]
        # what each interval covers travels with it: the page says it
        assert kept["bpb_window"]["over"] == full["bpb_window"]["over"] == "seeds and documents"
    out = tmp_path / "which.json"
    assert main([str(tmp_path / "s"), "--command", "cmd", "--output", str(out)]) == 0
    written = check_study(json.loads(out.read_text()), str(out))
    assert written["provenance"]["command"] == "cmd" and len(written["summary"]) == len(results["summary"])
    assert main([str(tmp_path / "nowhere"), "--command", "cmd", "--output", str(out)]) == 2
    assert "error: " in capsys.readouterr().err
