"""Tests of posenc.lab.plot: plot_study writes the png and the svg (three panels in lm mode, two in
task modes), draws every run with its interval, and averages the loss-by-position curves over seeds."""

from __future__ import annotations

import pytest

from posenc.lab.plot import _curves, _series, plot_attention, plot_study, plot_training


def _iv(mean, half=None):
    if half is None:
        return {"mean": mean, "low": None, "high": None, "n": 1}
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": 2}


def _study(mode: str = "lm") -> dict:
    metric = "bpb_window" if mode == "lm" else "accuracy"

    def row(name, variant, length, value, delta=None):
        return {"name": name, "variant": variant, "length": length, metric: value, "delta": delta}

    summary = [
        row("alibi", None, 8, _iv(2.5, 0.25)),
        row("alibi", None, 16, _iv(2.25, 0.25), _iv(-0.125, 0.0625)),
        row("rope+yarn", "yarn", 8, _iv(2.75, 0.5)),
        row("rope+yarn", "yarn", 16, None),  # not measured: left out of the line
        row("learned", None, 8, _iv(2.625)),  # one seed: no interval
    ]
    runs = [
        {"name": "alibi", "seed": s, "eval": [{"length": 16, "curve": [[0, 3.0 + s], [1, 2.0 + s]]}]}
        for s in (0, 1)
    ]
    config = {"mode": mode, "train_len": 8, "eval_lens": [8, 16], "seeds": [0, 1]}
    return {"config": config, "summary": summary, "runs": runs}


def test_series_keeps_measured_points_and_uses_the_mean_without_an_interval():
    rows = _study()["summary"]
    assert _series(rows, "alibi", "bpb_window") == ([8, 16], [2.5, 2.25], [2.25, 2.0], [2.75, 2.5])
    assert _series(rows, "rope+yarn", "bpb_window") == ([8], [2.75], [2.25], [3.25])
    assert _series(rows, "learned", "bpb_window") == ([8], [2.625], [2.625], [2.625])
    assert _series(rows, "alibi", "delta") == ([16], [-0.125], [-0.1875], [-0.0625])


def test_curves_are_the_mean_over_seeds():
    results = _study()
    assert _curves(results, "alibi", 16) == ([0, 1], [3.5, 2.5])
    assert _curves(results, "alibi", 8) is None and _curves(results, "learned", 16) is None


@pytest.mark.parametrize("mode", ["lm", "copy"])
def test_plot_study_writes_png_and_svg(tmp_path, mode):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    written = plot_study(_study(mode), tmp_path / "figure.png")
    assert written == [tmp_path / "figure.png", tmp_path / "figure.svg"]
    assert (tmp_path / "figure.png").read_bytes().startswith(b"\x89PNG")
    svg = (tmp_path / "figure.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert plt.get_fignums() == []  # the figure is closed


def test_plot_attention_and_training_write_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    study = _study()
    for row in study["summary"]:
        for metric in ("attn_entropy", "attn_distance", "attn_beyond"):
            row[metric] = _iv(1.0 + row["length"] / 16, 0.1) if row["bpb_window"] else None
    curve = {"step": [0, 10, 20], "mean": [5.0, 4.0, 3.5], "low": [4.9, 3.9, 3.4], "high": [5.1, 4.1, 3.6]}
    study["training"] = {"alibi": {"curve": curve}, "learned": {"curve": curve}}
    assert plot_attention(study, tmp_path / "a.png") == [tmp_path / "a.png", tmp_path / "a.svg"]
    assert plot_training(study, tmp_path / "t.png") == [tmp_path / "t.png", tmp_path / "t.svg"]
    assert (tmp_path / "a.png").read_bytes().startswith(b"\x89PNG") and "<svg" in (
        tmp_path / "t.svg"
    ).read_text()
    assert plt.get_fignums() == []


def test_task_plot_has_exact_match_with_the_learned_line_and_the_tokens_right(tmp_path):
    pytest.importorskip("matplotlib")
    study = _study("copy")
    study["summary"][0]["token_accuracy"] = _iv(0.75, 0.125)  # older rows lack it: left out
    plot_study(study, tmp_path / "figure.png")
    svg = (tmp_path / "figure.svg").read_text()
    assert "95% (learned)" in svg and "answer tokens right" in svg and "exact-match accuracy" in svg


def test_lm_plot_has_the_probe_panel_when_the_study_has_the_probe(tmp_path):
    """The effective-context probe is drawn in its own panel: gain by distance per run, with the
    interval; a study without probe rows keeps three panels."""
    pytest.importorskip("matplotlib")
    study = _study("lm")
    plot_study(study, tmp_path / "without.png")
    assert "effective-context probe" not in (tmp_path / "without.svg").read_text()
    study["probe"] = [
        {"name": "alibi", "distance": d, "seeds": [0, 1], "gain": _iv(g, 0.01)}
        for d, g in ((8, 0.5), (16, 0.25), (32, 0.0))
    ] + [
        {
            "name": "learned",
            "distance": 8,
            "seeds": [0, 1],
            "gain": {**_iv(0.1, 0.0), "low": None, "high": None},
        }
    ]
    plot_study(study, tmp_path / "with.png")
    svg = (tmp_path / "with.svg").read_text()
    assert "effective-context probe" in svg and "distance between the copies (tokens)" in svg
