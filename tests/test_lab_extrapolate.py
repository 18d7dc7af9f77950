"""Tests of posenc.lab.extrapolate: the study end to end from the command line, the summary across
seeds, the tables, and the study under torchrun. Models are tiny (d=16, 1 layer, a few steps); the
default study is run by hand (docs/lab.md)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from _lab_toys import TINY, torchrun_command, write_corpus
from posenc.cli import main
from posenc.lab.extrapolate import run_study


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_docs=40, size=3000)  # 4 validation documents


def test_tiny_study_with_two_seeds_end_to_end(tmp_path, corpus_dir, capsys):
    out = tmp_path / "study"
    command = [
        "extrapolate",
        "--schemes",
        "learned,alibi,rope",
        "--seeds",
        "0,1",
        "--variants",
        "linear",
        "--corpus",
        str(corpus_dir),
        *TINY,
        "--out",
        str(out),
    ]
    code = main(command)
    assert code == 0
    printed = capsys.readouterr().out
    assert "paired delta vs L=8" in printed and "95% interval over 2 seeds" in printed
    assert "sliding-window bits/byte" in printed and " ±" in printed and "n/a" in printed
    results = json.loads((out / "results.json").read_text())
    assert (out / "extrapolation.png").stat().st_size > 0 and (out / "extrapolation.svg").stat().st_size > 0
    assert (out / "checkpoints" / "alibi-seed1" / "trainer.safetensors").exists()
    assert (out / "cells" / "rope-seed0.json").exists()

    cfg = results["config"]
    assert cfg["seeds"] == [0, 1] and cfg["split_seed"] == 0 and cfg["eval_lens"] == [8, 16, 32]
    assert len(results["corpus"]["sha256"]) == 64
    ev = results["eval"]
    assert ev["windows"] == 6 and ev["score_len"] == 4 and sum(ev["documents"].values()) == 6
    assert results["corpus"]["n_val"] == 4 and ev["n_documents"] >= 3  # windows spread over the documents
    runs = [(r["name"], r["seed"]) for r in results["runs"]]
    assert runs == [
        ("learned", 0),
        ("learned", 1),
        ("alibi", 0),
        ("alibi", 1),
        ("rope", 0),
        ("rope+linear", 0),
        ("rope", 1),
        ("rope+linear", 1),
    ]
    for run in results["runs"]:
        by_len = {p["length"]: p for p in run["eval"]}
        if run["name"] == "learned":  # learned positions cannot run past L: n/a, not a crash
            assert by_len[16]["bpb_window"] is None and by_len[16]["note"].startswith("n/a")
            continue
        assert by_len[8]["delta"] is None and all(0 < by_len[e]["bpb_window"] < 16 for e in (8, 16, 32))
        for e in (16, 32):
            d = by_len[e]["delta"]
            assert d["n"] == results["eval"]["n_documents"] and d["low"] <= d["mean"] <= d["high"]
            diffs = [a - b for a, b in zip(by_len[e]["window_bits"], by_len[8]["window_bits"])]
            assert d["mean"] == pytest.approx(statistics.mean(diffs), abs=1e-9)
    assert len(results["cells"]) == 6 and all(c["train"]["steps"] == 6 for c in results["cells"])

    # the tables again from the saved study, as Markdown, without training
    capsys.readouterr()
    assert main(["extrapolate", "--from", str(out), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("**paired delta vs L=8") and "| scheme | 8 | 16 | 32 |" in md
    assert "| alibi | - | " in md

    # the same folder again: refused without --resume; with it, every finished cell is reused
    assert main(command) == 2
    assert "already holds a run (results.json, extrapolation.png" in capsys.readouterr().err
    assert main([*command, "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert all(c["reused"] for c in again["cells"]) and again["summary"] == results["summary"]


def test_tiny_task_study(tmp_path, capsys):
    code = main(
        [
            "extrapolate",
            "--task",
            "copy",
            "--schemes",
            "learned,nope",
            "--train-len",
            "4",
            "--eval-lens",
            "2,4,8",
            "--steps",
            "4",
            "--batch-size",
            "8",
            "--d-model",
            "16",
            "--seeds",
            "0,1",
            "--layers",
            "1",
            "--heads",
            "2",
            "--threads",
            "1",
            "--workers",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert "exact-match accuracy, task 'copy'" in capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["name"], r["length"]): r for r in results["summary"]}
    assert all(0.0 <= rows["nope", n]["accuracy"]["mean"] <= 1.0 for n in (2, 4, 8))
    assert rows["nope", 8]["accuracy"]["n"] == 2
    assert rows["nope", 8]["accuracy"]["mean"] <= rows["nope", 8]["token_accuracy"]["mean"] <= 1.0
    assert rows["learned", 8]["accuracy"] is None and rows["learned", 8]["note"].startswith("n/a")
    runs = {(r["name"], r["seed"]): r for r in results["runs"]}
    assert math.isfinite(runs["nope", 1]["eval"][0]["accuracy"])
    ranking = {r["name"]: r for r in results["ranking"]}  # past L: nope scored, learned n/a
    assert ranking["nope"]["beyond_L"]["n"] == 2 and ranking["learned"]["beyond_L"] is None
    assert results["config"]["curriculum_steps"] == 4  # the task default, within --steps 4


@pytest.mark.parametrize("task", ["sort", "parity"])
def test_tiny_study_of_a_new_task_with_a_curriculum(tmp_path, capsys, task):
    argv = ["extrapolate", "--task", task, "--schemes", "alibi", "--train-len", "3", "--eval-lens", "3,6"]
    tiny = ["--steps", "6", "--curriculum-steps", "3", "--batch-size", "4", "--d-model", "16"]
    rest = ["--layers", "1", "--heads", "2", "--seeds", "0", "--threads", "1", "--workers", "1"]
    assert main([*argv, *tiny, *rest, "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"exact-match accuracy, task {task!r}" in out and "ranking by mean exact match past L=3" in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["config"]["curriculum_steps"] == 3 and results["ranking"][0]["lengths"] == [6]
    assert (tmp_path / "extrapolation.png").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("ports")
def test_study_under_torchrun_matches_one_process(tmp_path, corpus_dir):
    """Two gloo processes train each cell together (DDP); rank 0 evaluates and writes."""
    import subprocess

    args = [
        "extrapolate",
        "--schemes",
        "alibi,rope",
        "--variants",
        "linear",
        "--seeds",
        "0",
        "--corpus",
        str(corpus_dir),
        *TINY,
    ]
    cmd, env = torchrun_command([*args, "--out", str(tmp_path / "ddp")])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    ddp, one = (json.loads((tmp_path / x / "results.json").read_text()) for x in ("ddp", "one"))
    assert ddp["environment"]["world_size"] == 2
    assert [r["name"] for r in ddp["runs"]] == ["alibi", "rope", "rope+linear"]
    for a, b in zip(ddp["summary"], one["summary"]):  # float summation order differs, nothing else
        if a["bpb_window"] is not None:
            assert a["bpb_window"]["mean"] == pytest.approx(b["bpb_window"]["mean"], abs=1e-4)


def test_randomized_positions_in_task_mode_with_both_test_protocols():
    """Trained at positions drawn from [0, 32): scored at ordinary positions and, as Ruoss et al.
    do, at positions re-sampled from [0, 32) (n/a where an example needs more than 32)."""
    from posenc.lab.config import StudyConfig

    config = StudyConfig(
        ("nope",),
        mode="copy",
        train_len=4,
        eval_lens=(4, 5, 20),
        steps=3,
        batch_size=8,
        d_model=16,
        num_layers=1,
        num_heads=2,
        eval_examples=16,
        randomized_positions=32,
        checkpoint_every=0,
    )
    results = run_study(config, log=None, progress=False, threads=1).to_dict()
    names = {r["name"] for r in results["runs"]}
    assert {"nope", "nope[random_positions=32]", "nope[random_positions=32]+resampled"} <= names
    again = next(r for r in results["runs"] if r["name"].endswith("+resampled"))
    by_len = {p["length"]: p for p in again["eval"]}
    assert by_len[4]["accuracy"] is not None and by_len[4]["note"] == "positions re-sampled from [0, 32)"
    assert by_len[20]["accuracy"] is None and by_len[20]["note"].startswith("n/a: 42 positions")
    assert by_len[5]["wilson"]["accuracy"]["n"] == 16 and by_len[5]["digit_accuracy"] is not None


def test_a_per_layer_pattern_is_a_scheme_of_a_study(tmp_path, corpus_dir, capsys):
    """``--schemes alibi,alibi*2+nope``: the pattern trains and is scored like a scheme, under a
    readable, file-name-safe run name; its cells' models hold the pattern."""
    out = tmp_path / "study"
    command = ["extrapolate", "--schemes", "alibi,alibi*2+nope", "--corpus", str(corpus_dir), *TINY]
    assert main([*command, "--layers", "3", "--steps", "2", "--seeds", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "alibi-x2+nope" in printed
    results = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in results["runs"]] == ["alibi", "alibi-x2+nope"]
    assert results["config"]["schemes"] == ["alibi", "alibi*2+nope"]
    cell = json.loads((out / "cells" / "alibi-x2+nope-seed0.json").read_text())
    assert cell["model_config"]["layer_positions"] == ["alibi", "alibi", "nope"]
    assert cell["model_config"]["position"] == "nope"
    assert (out / "checkpoints" / "alibi-x2+nope-seed0" / "trainer.safetensors").exists()
    assert all(p["bpb_window"] is not None for p in results["runs"][1]["eval"])
