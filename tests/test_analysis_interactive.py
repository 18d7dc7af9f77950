"""Tests of posenc.analysis.interactive: the selector figure shows exactly one group of traces for
every menu and slider position, the scaled kernel profile matches the kernel's closed forms, and
the overview, trained and study figures carry the numbers they are built from."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.analysis import display_kernel, kernel_curve, make_probe
from posenc.analysis.interactive import (
    HOOK_COLORS,
    encodings_figure,
    kernel_profile,
    overview_figure,
    selector_figure,
    study_figure,
    trained_figure,
)
from posenc.registry import build_with_context

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}


# ---------------------------------------------------------------------------------------------- selector
def _groups() -> dict[tuple[str, str], list[dict]]:
    """Menu values a, b; slider values 1, 2, 3; group (a, 1) has two traces, the others one."""
    out = {}
    for m in ("a", "b"):
        for s in ("1", "2", "3"):
            count = 2 if (m, s) == ("a", "1") else 1
            out[(m, s)] = [{"type": "scatter", "name": f"{m}{s}-{i}", "y": [i]} for i in range(count)]
    return out


def _group(m: str, s: str) -> set[str]:
    return {t["name"] for t in _groups()[(m, s)]}


def _shown_at(fig: dict, m: int, s: int) -> set[str]:
    """What the page's loader shows for menu index m and slider index s (its rule, in Python)."""
    owner = fig["layout"]["meta"]["selector"]["owner"]
    return {t["name"] for t, o in zip(fig["data"], owner) if o is None or o == [m, s]}


def test_selector_figure_shows_one_group_at_a_time_and_keeps_the_other_choice():
    fig = selector_figure(
        _groups(),
        ("menu", ["a", "b"]),
        ("slider", ["1", "2", "3"]),
        {},
        start=("b", "2"),
        reference=[{"type": "scatter", "name": "ref", "y": [0]}],
    )
    data, layout = fig["data"], fig["layout"]
    assert len(data) == 8  # every group's traces, once, and the reference
    assert {t["name"] for t in data if t["visible"]} == _group("b", "2") | {"ref"}
    assert all(isinstance(t["visible"], bool) for t in data)
    assert layout["meta"]["selector"]["menu"] == 1 and layout["meta"]["selector"]["slider"] == 1
    (slider,) = layout["sliders"]
    assert slider["active"] == 1 and slider["currentvalue"]["prefix"] == "slider = "
    assert [s["label"] for s in slider["steps"]] == ["1", "2", "3"]
    (menu,) = layout["updatemenus"]
    assert menu["active"] == 1 and [b["label"] for b in menu["buttons"]] == ["menu: a", "menu: b"]
    # the buttons and steps only report the choice; the loader shows the group of (menu, slider),
    # so a menu change keeps the slider's value and the reverse
    assert {b["method"] for b in menu["buttons"]} == {s["method"] for s in slider["steps"]} == {"skip"}
    for mi, m in enumerate(("a", "b")):
        for si, v in enumerate(("1", "2", "3")):
            assert _shown_at(fig, mi, si) == _group(m, v) | {"ref"}
    assert layout["margin"] == {"t": 70}  # room for the menu


def test_selector_figure_keeps_the_callers_layout_and_starts_at_the_first_group():
    fig = selector_figure(
        _groups(), ("menu", ["a", "b"]), ("slider", ["1", "2", "3"]), {"height": 300, "margin": {"t": 5}}
    )
    assert {t["name"] for t in fig["data"] if t["visible"]} == _group("a", "1")
    assert fig["layout"]["height"] == 300 and fig["layout"]["margin"] == {"t": 5}
    assert fig["layout"]["sliders"][0]["active"] == 0 and fig["layout"]["updatemenus"][0]["active"] == 0


def test_selector_figure_without_a_menu():
    traces = {("", s): [{"type": "scatter", "name": s}] for s in ("x", "y")}
    fig = selector_figure(traces, None, ("v", ["x", "y"]), {}, start=("", "y"))
    assert [t["visible"] for t in fig["data"]] == [False, True]
    assert "updatemenus" not in fig["layout"] and "margin" not in fig["layout"]
    assert [_shown_at(fig, 0, si) for si in (0, 1)] == [{"x"}, {"y"}]


# ---------------------------------------------------------------------------------------------- profile
def test_kernel_profile_of_sinusoidal_is_the_normalised_cosine_sum():
    n, d = 20, 32
    r, profile = kernel_profile(make_probe("sinusoidal", SMALL), n)
    assert r == list(range(n))
    assert max(abs(v) for v in profile) == 1.0
    # K(r) = sum_k cos(r w_k) / sqrt(d), largest at r = 0 (d/2 / sqrt(d)): scaled by d/2
    expected = [sum(math.cos(k * 10000 ** (-2 * i / d)) for i in range(d // 2)) / (d / 2) for k in r]
    torch.testing.assert_close(torch.tensor(profile), torch.tensor(expected))


def test_kernel_profile_of_alibi_falls_linearly():
    n, heads = 12, 4
    r, profile = kernel_profile(make_probe("alibi", SMALL), n)
    # bidirectional ALiBi: mean over heads of -slope_h r, largest |.| at r = n - 1
    slopes = [2 ** (-8 * (h + 1) / heads) for h in range(heads)]
    raw = [-sum(slopes) / heads * k for k in r]
    expected = [v / max(abs(x) for x in raw) for v in raw]
    assert r == list(range(n))
    assert profile == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert profile[-1] == -1.0


def test_kernel_profile_equals_the_scaled_kernel_curve():
    probe = make_probe("t5", SMALL)
    n = 10
    _, profile = kernel_profile(probe, n)
    kern, _ = display_kernel(probe, n)  # [h, n, n]
    dist, curve = kernel_curve(kern)  # [2n-1], [h, 2n-1]
    mean = curve.mean(0)
    expected = [float(mean[dist == k]) for k in range(n)]
    top = max(abs(v) for v in expected)
    assert profile == pytest.approx([v / top for v in expected], rel=1e-12)
    assert max(abs(v) for v in profile) == 1.0


def test_kernel_profile_of_a_zero_kernel_stays_zero():
    assert kernel_profile(make_probe("nope", SMALL), 5) == ([0, 1, 2, 3, 4], [0.0] * 5)


# ---------------------------------------------------------------------------------------------- overview
def test_overview_figure_one_panel_per_scheme_on_a_shared_grid():
    groups = ["embed", "rotate", "score_bias", "none", "embed"]
    panels = [
        {"title": f"s{i}", "group": g, "r": [0, 1, 2], "y": [1.0, 0.5, float(i)]}
        for i, g in enumerate(groups)
    ]
    panels[1]["extra"] = [("trained", [0, 1], [1.0, 0.2], "dot")]
    fig = overview_figure(panels, columns=2)
    data, layout = fig["data"], fig["layout"]
    rows = math.ceil(len(panels) / 2)
    assert layout["grid"]["rows"] == rows == 3 and layout["grid"]["columns"] == 2
    assert layout["height"] == 190 * rows + 140
    # axis titles: distance under the last panel of each column, K on the first of each row
    x_titled = [i for i, sfx in enumerate(["", "2", "3", "4", "5"]) if layout[f"xaxis{sfx}"]["title"]["text"]]
    y_titled = [i for i, sfx in enumerate(["", "2", "3", "4", "5"]) if layout[f"yaxis{sfx}"]["title"]["text"]]
    assert x_titled == [3, 4] and y_titled == [0, 2, 4]
    # each title gives the panel's largest |K| (the magnitudes the shape view divides away)
    assert [a["text"] for a in layout["annotations"]] == [
        f"<b>s{i}</b> · max |K| {max(1, i):.3g}" for i in range(5)
    ]
    suffixes = ["", "2", "3", "4", "5"]
    for i, (ann, sfx) in enumerate(zip(layout["annotations"], suffixes)):
        assert ann["xref"] == f"x{sfx} domain" and ann["yref"] == f"y{sfx} domain"
        assert ann["font"]["color"] == HOOK_COLORS[groups[i]]
        # every panel's distance axis matches the first panel's; its y-axis is its own (magnitudes)
        assert layout[f"xaxis{sfx}"]["matches"] == (None if i == 0 else "x")
        assert "matches" not in layout[f"yaxis{sfx}"] and layout[f"yaxis{sfx}"]["autorange"] is True
        assert layout[f"xaxis{sfx}"]["showticklabels"] == (i in x_titled)  # ticks where nothing is below
    assert len(data) == 6  # one kernel per panel and one extra
    by_name = {t["name"]: t for t in data}
    kernel, extra = by_name["s1: kernel"], by_name["s1: trained"]
    assert (kernel["xaxis"], kernel["yaxis"], extra["xaxis"], extra["yaxis"]) == ("x2", "y2", "x2", "y2")
    assert extra["line"]["dash"] == "dot" and extra["y"] == [1.0, 0.2]
    assert by_name["s4: kernel"]["y"] == [1.0, 0.5, 4.0] and by_name["s4: kernel"]["xaxis"] == "x5"
    # the menu: magnitude (raw values, the default) or shape (each curve over its own largest |K|,
    # every panel on one y-axis from -1.1 to 1.1), each naming itself on the y-axis title
    magnitude, shape = layout["updatemenus"][0]["buttons"]
    assert layout["updatemenus"][0]["active"] == 0
    assert [t["y"] for t in data] == magnitude["args"][0]["y"]
    names = [t["name"] for t in data]
    assert shape["args"][0]["y"][names.index("s4: kernel")] == [0.25, 0.125, 1.0]
    assert shape["args"][0]["y"][names.index("s1: trained")] == [1.0, 0.2]
    assert all(shape["args"][1][f"yaxis{sfx}.range"] == [-1.1, 1.1] for sfx in suffixes)
    assert magnitude["args"][1]["yaxis.title.text"] == layout["yaxis"]["title"]["text"] == "K (logit units)"
    assert (
        shape["args"][1]["yaxis3.title.text"] == "K / max |K|" and "yaxis2.title.text" not in shape["args"][1]
    )


# ---------------------------------------------------------------------------------------------- trained
def test_trained_figure_heatmaps_are_the_kernels_of_head_0():
    initial = make_probe("t5", SMALL)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        other = make_probe(build_with_context("t5", {**SMALL, "causal": False}), SMALL)
    n = 12
    fig = trained_figure(initial, other, n)
    heat = [t for t in fig["data"] if t["type"] == "heatmap"]
    lines = [t for t in fig["data"] if t["type"] == "scatter"]
    assert [t["name"] for t in heat] == ["initial", "trained"]
    for trace, probe in zip(heat, (initial, other)):
        expected = display_kernel(probe, n)[0][0]  # [n, n] float64, head 0
        z = torch.tensor(trace["z"], dtype=torch.float64)
        assert z.shape == (n, n)
        # z went through float32: every value within float32 rounding of the float64 kernel
        assert bool(((z - expected).abs() <= expected.abs() * 2.0**-24).all())
    # each panel on its own symmetric colour scale, to its own largest |K| (the initial noise is
    # visible, not a uniform square on the trained panel's scale), its range in its title
    for t in heat:
        top = float(torch.tensor(t["z"]).abs().max())
        assert t["zmax"] == top and t["zmin"] == -top and "colorbar" in t
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert any(f"(±{heat[0]['zmax']:.2g})" in text for text in titles)
    assert heat[0]["xaxis"] == "x" and heat[1]["xaxis"] == "x2"
    assert not torch.equal(torch.tensor(heat[0]["z"]), torch.tensor(heat[1]["z"]))
    # one curve per trained head on the third panel, then the initial mean dotted
    assert len(lines) == SMALL["num_heads"] + 1 and all(t["xaxis"] == "x3" for t in lines)
    assert lines[-1]["line"]["dash"] == "dot" and lines[0]["x"] == list(range(n))


def test_encodings_figure_shows_both_tables_on_one_scale():
    initial = make_probe("learned", SMALL)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        other = make_probe(build_with_context("learned", SMALL), SMALL)
    fig = encodings_figure(initial, other, 10)
    first, second = fig["data"]
    for trace, probe in ((first, initial), (second, other)):
        # PE(p) of a learned table is its row p, read here from the parameter itself
        assert torch.equal(torch.tensor(trace["z"]), probe.scheme.weight.detach()[:10])
    assert not torch.equal(torch.tensor(first["z"]), torch.tensor(second["z"]))
    top = max(float(torch.tensor(t["z"]).abs().max()) for t in (first, second))
    assert first["zmax"] == second["zmax"] == top and first["zmin"] == second["zmin"] == -top


# ---------------------------------------------------------------------------------------------- study
def _results() -> dict:
    def row(name, length, mean, low, high):
        return {"name": name, "length": length, "bpb_window": {"mean": mean, "low": low, "high": high}}

    return {
        "config": {"train_len": 16},
        "summary": [
            row("alibi", 16, 2.0, 1.9, 2.1),
            row("alibi", 32, 2.2, 2.0, 2.5),
            row("alibi", 64, 2.6, 2.3, 3.0),
            row("learned", 16, 2.4, None, None),  # one seed: no interval
            row("learned", 32, 3.1, 2.9, 3.4),
            {"name": "learned", "length": 64, "bpb_window": None},  # not measured: no point
        ],
    }


def test_study_figure_bands_are_the_intervals():
    fig = study_figure(_results())
    data = fig["data"]
    assert len(data) == 4  # a band and a line per run
    band, line = data[0], data[1]
    assert band["fill"] == "toself" and band["x"] == [16, 32, 64, 64, 32, 16]
    assert band["y"] == [2.1, 2.5, 3.0, 2.3, 2.0, 1.9]  # highs out, lows back
    assert line["name"] == "alibi" and line["x"] == [16, 32, 64] and line["y"] == [2.0, 2.2, 2.6]
    assert line["customdata"] == [[1.9, 2.1], [2.0, 2.5], [2.3, 3.0]]
    band, line = data[2], data[3]
    assert line["x"] == [16, 32] and line["y"] == [2.4, 3.1]
    assert band["y"] == [2.4, 3.4, 2.9, 2.4]  # no interval at 16: the band closes on the mean
    assert line["customdata"] == [[2.4, 2.4], [2.9, 3.4]]
    assert band["legendgroup"] == line["legendgroup"] == "learned"
    (shape,) = fig["layout"]["shapes"]
    assert shape["x0"] == shape["x1"] == 16
    assert fig["layout"]["xaxis"]["type"] == "log"


def test_overview_of_a_zero_kernel_says_zero_and_its_menu_sits_above_the_panels():
    fig = overview_figure([{"title": "flat", "group": "rotate", "r": [0, 1], "y": [0.0, 0.0]}])
    assert fig["layout"]["annotations"][0]["text"] == "<b>flat</b> · max |K| 0"
    shape = fig["layout"]["updatemenus"][0]["buttons"][1]
    assert shape["args"][0]["y"] == [[0.0, 0.0]]
    assert fig["layout"]["updatemenus"][0]["y"] > 1  # in the top margin, not over the first panel
