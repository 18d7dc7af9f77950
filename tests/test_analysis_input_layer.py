"""Tests of posenc.analysis.input_layer: the example sentence's tokens and ids as the section's own
tokenizer encodes them, and one heatmap per pipeline step and scheme whose values follow the input
layer's arithmetic (x sqrt(d), + PE, a rotary scheme adds nothing) within the page's rounding."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
import torch

from posenc.analysis import input_layer
from posenc.analysis.input_layer import EXAMPLE, STEPS, input_layer_section

SCHEMES = ["sinusoidal", "rope"]
D = 16
SPEC = re.compile(r'<script type="application/json" id="input-layer-spec">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    """The section for sinusoidal and rope, and the tokenizer it used (trained once, a few s, and
    kept in a cache folder of this test's own)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        tok, _ = input_layer._tokenizer()
        page = input_layer_section(SCHEMES, d_model=D, dropout=0.1)
        yield page, tok


@pytest.fixture(scope="module")
def steps(section):
    """``{(scheme, step label): z [s, d]}`` read through the figure's own menu and slider."""
    page, _ = section
    spec = json.loads(SPEC.search(page).group(1))
    data = spec["data"]
    assert len(data) == len(SCHEMES) * len(STEPS)
    out, seen = {}, set()
    (menu,) = spec["layout"]["updatemenus"]
    assert [b["label"] for b in menu["buttons"]] == [f"scheme: {s}" for s in SCHEMES]
    (slider,) = spec["layout"]["sliders"]
    assert [s["label"] for s in slider["steps"]] == [label for _, label in STEPS]
    owner = spec["layout"]["meta"]["selector"]["owner"]  # which (menu, slider) view shows each trace
    for mi, scheme in enumerate(SCHEMES):
        for si, (_, label) in enumerate(STEPS):
            (index,) = [i for i, o in enumerate(owner) if o == [mi, si]]  # one trace per step
            seen.add(index)
            out[(scheme, label)] = torch.tensor(data[index]["z"], dtype=torch.float64)
    assert len(seen) == len(data)  # every trace belongs to exactly one (scheme, step)
    return out


def _table_rows(table_html: str) -> dict[str, list[str]]:
    rows = re.findall(r"<tr><td>([^<]*)</td>(.*?)</tr>", table_html)
    return {head: re.findall(r"<td>(.*?)</td>", rest) for head, rest in rows}


def _close_within_rounding(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, slack: Any = 0.0) -> None:
    """|a - b| within the 4-significant-digit rounding of the page (half a unit in the 4th digit is
    at most 5e-4 of a value), summed over the ``scale`` of every rounded value involved, plus
    ``slack`` (float32 error where ``b`` is exact)."""
    assert a.shape == b.shape
    excess = (a - b).abs() - 5e-4 * scale - slack
    assert float(excess.max()) <= 0, float(excess.max())


def test_token_table_matches_the_tokenizer(section):
    page, tok = section
    enc = tok.encode(EXAMPLE)
    first_table = re.search(r"<table>.*?</table>", page, re.S).group(0)
    rows = _table_rows(first_table)
    assert rows["id"] == [str(i) for i in enc.ids]
    assert rows["token"] == [html.escape(repr(t)[1:-1]) for t in enc.tokens]
    assert f"becomes {len(enc.ids)} ids" in page and f"a WordPiece of {tok.vocab_size} tokens" in page
    assert f"<th>{len(enc.ids) - 1}</th></tr>" in first_table  # one position column per token
    assert f"<code>{html.escape(EXAMPLE)}</code>" in page
    # words, not bytes: cat and mat are whole tokens, and the special tokens are explained
    assert {"cat", "mat", "dog", "sat"} <= set(rows["token"]) and "[CLS]" in rows["token"]
    assert "[CLS] opens every input" in page


def test_the_section_shows_what_posenc_encode_prints(section, capsys):
    """The section's tokens and ids are `posenc encode`'s for the same sentence: its default
    tokenizer, trained once and read back from the cache (the section's fixture points the cache
    at a folder of its own)."""
    from posenc.cli import main

    page, _ = section
    rows = _table_rows(re.search(r"<table>.*?</table>", page, re.S).group(0))
    assert main(["encode", EXAMPLE, "--all"]) == 0
    out = capsys.readouterr().out
    assert "wordpiece read from the cache (trained once)" in out
    tokens = re.search(r"1\. tokens \(\d+\): (.*)", out).group(1).split(" ")
    ids = re.search(r"2\. ids \[s=\d+\]: \[(.*?)\]", out).group(1).split(", ")
    assert [html.escape(t) for t in tokens] == rows["token"] and ids == rows["id"]


def test_the_figure_has_one_trace_per_step_and_scheme(section, steps):
    page, tok = section
    n = len(tok.encode(EXAMPLE).ids)
    assert len(steps) == len(SCHEMES) * len(STEPS)
    for z in steps.values():
        assert z.shape == (n, D)
    spec = json.loads(SPEC.search(page).group(1))
    labels = [f"{i}: {t}" for i, t in enumerate(tok.encode(EXAMPLE).tokens)]
    assert all(trace["y"] == labels for trace in spec["data"])
    assert [t["visible"] for t in spec["data"]] == [True] + [False] * (len(spec["data"]) - 1)


def test_steps_follow_the_input_layers_arithmetic(steps):
    lookup, scaled = steps[("sinusoidal", "1 E[ids]")], steps[("sinusoidal", "2 × √d")]
    pe, total = steps[("sinusoidal", "3 PE")], steps[("sinusoidal", "4 sum")]
    # x sqrt(d): sqrt(16) = 4
    _close_within_rounding(scaled, 4 * lookup, scaled.abs() + 4 * lookup.abs())
    # the sum is the scaled embedding plus the positional encoding
    _close_within_rounding(total, scaled + pe, total.abs() + scaled.abs() + pe.abs())
    # Vaswani et al.: PE(p, 2i) = sin(p w_i), PE(p, 2i + 1) = cos(p w_i), w_i = 10000^(-2i/d)
    angle = torch.tensor(
        [[p * 10000 ** (-2 * (j // 2) / D) for j in range(D)] for p in range(pe.shape[0])],
        dtype=torch.float64,
    )  # [s, d]
    expected = torch.where(torch.arange(D) % 2 == 0, angle.sin(), angle.cos())
    # the model computes in float32: its angle is off by up to one rounding, its sin/cos by another
    _close_within_rounding(pe, expected, expected.abs(), slack=angle * 2.0**-23 + 2.0**-23)
    # rope acts inside attention: nothing is added to the input
    rope_pe = steps[("rope", "3 PE")]
    assert bool((rope_pe == 0).all())
    assert torch.equal(steps[("rope", "4 sum")], steps[("rope", "2 × √d")])
    # the same ids and weights (seed 0) whatever the scheme
    assert torch.equal(steps[("rope", "1 E[ids]")], lookup)
    # dropout (train): every value is zeroed or kept and scaled by 1 / (1 - p)
    normed, dropped = steps[("sinusoidal", "5 LayerNorm")], steps[("sinusoidal", "6 dropout (train)")]
    zeroed = dropped == 0
    assert 0 < int(zeroed.sum()) < dropped.numel()
    kept = ~zeroed
    _close_within_rounding(dropped[kept], normed[kept] / 0.9, dropped[kept].abs() + normed[kept].abs() / 0.9)


def test_without_tokenizers_the_section_says_what_to_install(monkeypatch):
    def missing():
        raise ImportError("No module named 'tokenizers' <x>")

    monkeypatch.setattr(input_layer, "_tokenizer", missing)
    out = input_layer_section(SCHEMES)
    assert out.startswith("<p class='note'>") and "pip install 'posenc[text]'" in out
    assert "No module named &#x27;tokenizers&#x27; &lt;x&gt;" in out
