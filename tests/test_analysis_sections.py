"""Tests of posenc.analysis.sections: the claims table (verdict word in bold, a dash where nothing is
quoted), the trained section (a note in fast mode, one figure pair per trained scheme otherwise),
the study section (how to run one, intervals as "mean ±half", a note for task studies) and the
property table's status cells."""

from __future__ import annotations

import copy
import json
import math
import re

import torch

from posenc.analysis import Claim, PropertyResult, make_probe
from posenc.analysis.properties import PROPERTIES
from posenc.analysis.sections import claims_section, property_table, study_section, trained_section
from posenc.analysis.trained import TrainedScheme
from posenc.registry import build_with_context

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}
SPEC = re.compile(r'<script type="application/json" id="([^"]*)-spec">(.*?)</script>', re.S)


def _cells(page: str) -> list[list[str]]:
    """The ``<td>`` contents of every row (header rows give an empty list)."""
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", page)]


# ---------------------------------------------------------------------------------------------- claims
def test_claims_section_bolds_the_verdict_word():
    claims = [
        Claim("a < b", "", "measured <i>x</i>", "wrong: it is not: see why", 1.0, "a <code>how</code>"),
        Claim("c", "0.5 & more", "m", "not measured: no data", math.nan, "h"),
        Claim("d", "q", "m", "plain verdict", 0.0, "h"),
    ]
    page = claims_section(claims)
    assert page.startswith(
        "<table><tr><th>claim</th><th>often quoted</th><th>posenc measures</th>"
        "<th>verdict</th><th>how</th></tr>"
    )
    rows = [r for r in _cells(page) if r]
    assert rows == [
        [
            "a &lt; b",
            "–",
            "measured <i>x</i>",
            "<b>wrong</b>: it is not: see why",
            "<small>a <code>how</code></small>",
        ],
        ["c", "0.5 &amp; more", "m", "<b>not measured</b>: no data", "<small>h</small>"],
        ["d", "q", "m", "plain verdict", "<small>h</small>"],
    ]


# ---------------------------------------------------------------------------------------------- trained
def test_trained_section_in_fast_mode_says_it_was_not_trained():
    for out in (trained_section([], False, "n"), trained_section(["anything"], True, "n")):
        assert out.startswith("<p class='note'>Built without training (fast mode)")
        assert "random initial values" in out and "<code>--study DIR</code>" in out


def test_trained_section_draws_each_trained_scheme():
    def pair(name: str) -> TrainedScheme:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            trained = make_probe(build_with_context(name, {**SMALL, "causal": False}), SMALL)
        return TrainedScheme(name, make_probe(name, SMALL), trained, 3, 8, 2.5, "study")

    out = trained_section([pair("learned"), pair("t5")], False, "Trained <b>here</b>.")
    assert out.startswith("<p>Trained <b>here</b>.</p>")
    for name in ("learned", "t5"):
        assert f"<h3 id='trained-{name}'>{name}<span class='tag trained'>trained</span></h3>" in out
    # 2.5 nats = 2.5 / ln 2 = 3.61 bits: the page speaks bits/byte everywhere
    assert out.count("after 3 steps at L = 8 (final training loss 3.61 bits/byte)") == 2 and "nats" not in out
    assert "Head-mean K at distances 0-2" in out and "<i>t5</i>: head 0's K reaches" in out
    assert "far smaller" not in out  # the initial panel's range is measured, not assumed smaller

    assert "<i>learned</i>: the mean cosine between neighbouring positions' vectors" in out
    specs = dict(SPEC.findall(out))
    assert set(specs) == {"trained-learned", "trained-learned-pe", "trained-t5"}  # vectors only for embed
    pe = json.loads(specs["trained-learned-pe"])
    assert len(pe["data"]) == 2 and len(pe["data"][0]["z"]) == 8  # positions 0..L-1


# ---------------------------------------------------------------------------------------------- study
def _ci(mean: float, low: float | None = None, high: float | None = None) -> dict:
    return {"mean": mean, "low": low, "high": high}


def _results(seeds=(0, 1), mode="lm") -> dict:
    def row(name, length, delta, bpb):
        return {"name": name, "length": length, "delta": delta, "bpb_window": bpb}

    config = {"mode": mode, "eval_lens": [8, 16, 32], "train_len": 8, "seeds": list(seeds), "steps": 40}
    return {
        "config": {**config, "d_model": 16, "num_layers": 2},
        "summary": [
            row("alibi", 8, None, _ci(2.0, 1.9, 2.1)),
            row("alibi", 16, _ci(-0.0123, -0.05, 0.02), _ci(2.0, 1.9, 2.1)),
            row("alibi", 32, _ci(0.31, 0.12, 0.5), _ci(2.3, 2.1, 2.5)),
            row("learned", 8, None, _ci(2.1, 2.0, 2.2)),
            row("learned", 16, _ci(0.05), _ci(2.2)),  # one seed's row: no interval
        ],
    }


def test_study_section_without_a_study_says_how_to_run_one():
    out = study_section(None, None)
    assert "<code>posenc extrapolate --out study</code>" in out
    assert "<code>posenc report --study study</code>" in out


def test_study_section_shows_intervals_over_seeds():
    out = study_section(_results(), "runs/<mine>")
    assert "From the study <code>runs/&lt;mine&gt;</code>: 40 steps per model, L = 8, seeds 0, 1" in out
    assert "d = 16, 2 layers" in out and out.count("over 2 seeds") == 3  # both tables' text, the caption
    table = re.search(r"<table>.*?</table>", out, re.S).group(0)
    assert "<th>run</th><th>E = 16</th><th>E = 32</th>" in table and "E = 8<" not in table
    # mean and the 95% half-width (high - low) / 2, signed; one seed: no interval; not run: a dash
    assert re.findall(r"<tr><td>(\w+)</td>(.*?)</tr>", table) == [
        ("alibi", "<td class='num'>-0.012 ±0.035</td><td class='num'>+0.310 ±0.190</td>"),
        ("learned", "<td class='num'>+0.050</td><td class='num'>–</td>"),
    ]
    specs = dict(SPEC.findall(out))
    assert set(specs) == {"study"} and len(json.loads(specs["study"])["data"]) == 4


def test_study_section_shows_the_shipped_study_with_its_command():
    from posenc.analysis.default_study import load_default_study

    study = load_default_study()
    out = study_section(study, None)
    prov = study["provenance"]
    assert f"<code>{prov['command']}</code>, run on {prov['date']} with posenc {prov['posenc']}" in out
    assert "posenc ships the summary of one real study" in out and out.count("<table>") == 2
    seeds = len(study["config"]["seeds"])
    delta = next(r["delta"] for r in study["summary"] if r["delta"])
    scope = f"over {seeds} seeds and {delta['n']} documents" if "over" in delta else f"over {seeds} seeds"
    assert out.count(scope) == 3 and "study" in dict(SPEC.findall(out))


def test_study_section_says_what_its_intervals_cover():
    # a study whose intervals resample documents says so, with how many; with one seed, documents only
    results = _results()
    for row in results["summary"]:
        for metric in ("delta", "bpb_window"):
            if row[metric]:
                row[metric].update(n=17, over="seeds and documents")
    assert study_section(results, "runs/x").count("over 2 seeds and 17 documents") == 3
    one = _results(seeds=(0,))
    for row in one["summary"]:
        if row["delta"]:
            row["delta"].update(n=9, over="documents")
    assert study_section(one, "runs/x").count("over 9 documents (one seed)") == 3
    # a hostile scope is text; a count that is not an integer is left out
    one["summary"][1]["delta"].update(n="9", over="<b>x</b>")
    out = study_section(one, "runs/x")
    assert out.count("over &lt;b&gt;x&lt;/b&gt; (one seed)") == 3 and "<b>x" not in out


def test_study_section_shows_hostile_values_as_text():
    bad = "<script>alert(1)</script>"
    results = _results()
    results["config"].update(steps=bad, d_model=bad, num_layers=bad)
    results["summary"][0]["name"] = bad
    results["summary"][0]["delta"] = {"mean": bad, "low": bad, "high": 1.0}
    out = study_section(results, bad)
    assert "<script>" not in out.replace('<script type="application/json" id="study-spec">', "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt; steps per model" in out


def test_study_section_of_one_seed_and_of_a_task_study():
    one = study_section(_results(seeds=(0,)), "s")
    assert "over evaluation windows (one seed)" in one and "over 2 seeds" not in one
    task = study_section(_results(mode="copy"), "runs/<t>")
    assert task == (
        "<p class='note'>Study runs/&lt;t&gt; is a copy task study; "
        "the report shows language-model studies.</p>"
    )


# ---------------------------------------------------------------------------------------------- properties
def test_property_table_marks_each_status():
    # (applies, passed, promised) -> status: n/a, pass, FAIL (a broken promise), no (not promised)
    cases = [(False, None, True), (True, True, True), (True, False, True), (True, False, False)]
    names = list(PROPERTIES)
    rows = []
    for i, name in enumerate(names):
        applies, passed, promised = cases[i % 4]
        value = None if not applies else 0.125 * (i + 1)
        rows.append(
            PropertyResult(
                scheme="toy",
                property=name,
                applies=applies,
                value=value,
                threshold=0.5,
                comparison="<=",
                passed=passed,
                promised=promised,
                reason="why <so>",
            )
        )
    page = property_table({"toy <1>": rows})
    header = re.search(r"<tr><th>scheme</th>(.*?)</tr>", page).group(1)
    assert re.findall(r'<th title="[^"]*">([^<]*)</th>', header) == names
    assert "<tr><th>toy &lt;1&gt;</th>" in page
    cells = re.findall(r'<td class="(\w+)" title="([^"]*)">(.*?)</td>', page)
    assert len(cells) == len(names)
    expected_class = {0: "na", 1: "pass", 2: "fail", 3: "no"}
    for i, (cls, title, text) in enumerate(cells):
        assert cls == expected_class[i % 4]
        assert title.startswith("why &lt;so&gt;; threshold &lt;= 0.5; ")
        assert title.endswith("not promised" if i % 4 == 3 else "promised")
        if i % 4 == 0:
            assert text == "n/a"
        else:
            assert text == f"{rows[i].status}<br><small>{0.125 * (i + 1):.3g}</small>"
    assert [c[0] for c in cells].count("fail") == sum(r.status == "FAIL" for r in rows) > 0


def test_the_trained_caption_says_which_panel_reaches_further_from_the_numbers():
    from posenc.analysis.captions import trained_kernel_note

    scheme = build_with_context("t5", {**SMALL, "causal": False})
    small, big = make_probe(scheme, SMALL), make_probe(copy.deepcopy(scheme), SMALL)
    with torch.no_grad():
        big.scheme.relative_attention_bias.weight.mul_(10.0)
    assert "(10x larger)" in trained_kernel_note(small, big, 8)
    assert "(10x smaller)" in trained_kernel_note(big, small, 8)
