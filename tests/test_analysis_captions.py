"""Tests of posenc.analysis.captions: each caption is true of its panel, from the scheme's numbers
(random initial values read as noise, ALiBi's slopes 2^(-8h/H), a learned kernel's diagonals not
constant), and two schemes never share one."""

from __future__ import annotations

import itertools

import pytest

from posenc.analysis import check, make_probe
from posenc.analysis.captions import figure_caption
from posenc.analysis.report import report_kinds

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64, "causal": True}


@pytest.fixture(scope="module")
def captions():
    names = ["sinusoidal", "learned", "rope", "alibi", "t5", "shaw"]
    out = {}
    for n in names:
        p = make_probe(n, SMALL)
        for kind in report_kinds(p, check(p, ["translation_inv"])):
            out[(n, kind)] = figure_caption(p, kind)
    return out


def test_a_random_table_is_called_random_and_a_sinusoid_is_not(captions):
    assert "random numbers" in captions[("learned", "heatmap")]
    assert "flicker" not in captions[("learned", "heatmap")]
    sin = captions[("sinusoidal", "heatmap")]
    assert "random" not in sin and "repeats every 6.3 positions" in sin  # 2 pi / theta_0, theta_0 = 1
    for n in ("t5", "shaw"):  # initial biases: no claim about slopes
        assert (
            "no head prefers near keys yet" in captions[(n, "bias")] and "slope" not in captions[(n, "bias")]
        )


def test_alibi_caption_quotes_its_closed_form_slopes(captions):
    text = captions[("alibi", "bias")]
    assert "falls linearly" in text
    # H = 4 heads: slopes 2^(-8h/4), h = 1..4: 0.25 (head 0, steepest) .. 2^-8 = 0.00391 (head 3)
    assert "head 0 by 0.25 per token" in text and f"head 3 by {2**-8:.3g} " in text
    # at 63 tokens back the two heads differ by 63 * (0.25 - 2^-8)
    assert f"differ by {63 * (0.25 - 2**-8):.3g} logit units" in text


def test_kernel_caption_says_whether_the_diagonals_are_constant(captions):
    assert "Every diagonal is constant" in captions[("alibi", "kernel")]
    assert (
        "not constant" in captions[("learned", "kernel")]
        and "random initial values" in captions[("learned", "kernel")]
    )


def test_no_two_schemes_share_a_caption(captions):
    for (a, ka), (b, kb) in itertools.combinations(captions, 2):
        if a != b:
            assert captions[(a, ka)] != captions[(b, kb)], (a, ka, b, kb)
    assert all(c.startswith(f"<i>{n}</i>: ") for (n, _), c in captions.items())
