"""Tests of posenc.analysis.explore: each explorer is offered to the schemes whose hooks and options
fit it, and each figure shows the numbers its caption promises (the similarity curve is a function
of n - p, ALiBi's bias is -slope * distance and masked after the query in the causal form, linear
rotary scaling stretches the kernel by its factor), checked against formulas written here."""

from __future__ import annotations

import json
import math
import re

import torch

import posenc
from posenc.analysis.explore import EXPLORERS, explorers
from posenc.analysis.page import interactive

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 8, "max_len": 64, "causal": False}
SIMILARITY, SCALINGS, BASES, HEADS = EXPLORERS


def _cos_sum(r: float, d: int, base: float = 10000.0) -> float:
    """sum_k cos(r w_k) over the d/2 frequencies w_k = base^(-2k/d) (sinusoidal and rotary alike)."""
    return sum(math.cos(r * base ** (-2 * k / d)) for k in range(d // 2))


def _by_key(fig: dict) -> dict[str, dict]:
    """Traces by name (each explore figure names its traces by the values that made them)."""
    names = [t["name"] for t in fig["data"] if "name" in t]
    assert len(set(names)) == len(names)
    return {t["name"]: t for t in fig["data"]}


# ---------------------------------------------------------------------------------------------- choice
def test_explorers_follow_hooks_and_config_keys():
    assert explorers(["nope"]) == [] and explorers([]) == []  # an empty choice is not "all schemes"
    assert explorers(["alibi"]) == [(HEADS, "alibi")]  # a score_bias
    assert explorers(["learned"]) == []  # an embed without a base option
    assert explorers(["t5", "learned", "shaw"]) == [(HEADS, "t5")]  # the first score_bias
    assert explorers(["sinusoidal"]) == [(SIMILARITY, "sinusoidal")]
    assert explorers(["xpos"]) == [(BASES, "xpos")]  # rotates and takes base, but no scaling
    assert explorers(["sinusoidal", "rope", "alibi"]) == [
        (SIMILARITY, "sinusoidal"),
        (SCALINGS, "rope"),
        (BASES, "rope"),
        (HEADS, "alibi"),
    ]
    # the first accepted scheme of the list is taken
    assert [n for _, n in explorers(["xpos", "rope"])] == ["rope", "xpos"]
    assert {ex.title for ex, _ in explorers()} == {ex.title for ex in EXPLORERS}  # every registered scheme


# ---------------------------------------------------------------------------------------------- similarity
def test_similarity_is_one_at_the_query_and_depends_only_on_the_offset():
    fig = SIMILARITY.build("sinusoidal", SMALL)
    traces = _by_key(fig)
    L = 64
    widths, offsets = [16, 32, 64, 512], [0, 8, 16, 32, 48, 63]
    assert len(traces) == len(widths) * len(offsets)
    menu = fig["layout"]["updatemenus"][0]
    assert [b["label"] for b in menu["buttons"]] == [f"d_model: {d}" for d in widths]
    assert [s["label"] for s in fig["layout"]["sliders"][0]["steps"]] == [str(p) for p in offsets]
    assert [t["name"] for t in fig["data"] if t["visible"]] == ["d = 32, p = 16"]  # the context's width
    for d in widths:
        for p in offsets:
            y = traces[f"d = {d}, p = {p}"]["y"]
            assert len(y) == L and math.isclose(y[p], 1.0, rel_tol=0, abs_tol=1e-12)
            # PE(p).PE(n) = sum_k cos((n - p) w_k) and |PE|^2 = d/2 at every position
            expected = [_cos_sum(n - p, d) / (d / 2) for n in range(L)]
            torch.testing.assert_close(torch.tensor(y, dtype=torch.float32), torch.tensor(expected))
        # moving the query moves the curve: the curve at p = 8 is the curve at p = 0, shifted by 8
        a, b = traces[f"d = {d}, p = 0"]["y"], traces[f"d = {d}, p = 8"]["y"]
        torch.testing.assert_close(torch.tensor(b[8:], dtype=torch.float32), torch.tensor(a[: L - 8]))


# ---------------------------------------------------------------------------------------------- bias
def test_bias_explorer_causal_masks_and_bidirectional_is_minus_slope_distance():
    heads = SMALL["num_heads"]
    fig = HEADS.build("alibi", SMALL)
    n = 48  # the explorer shows at most 48 positions
    slopes = [2 ** (-8 * (h + 1) / heads) for h in range(heads)]  # ALiBi, section 3 (H a power of two)
    assert len(fig["data"]) == 2 * heads
    assert [s["label"] for s in fig["layout"]["sliders"][0]["steps"]] == [str(h) for h in range(heads)]
    # the data is in (form, head) order: causal heads first, then bidirectional heads
    causal, bidirectional = fig["data"][:heads], fig["data"][heads:]
    assert [t["visible"] for t in fig["data"]] == [False] * heads + [True] + [False] * (heads - 1)
    for h in range(heads):
        z = causal[h]["z"]
        assert len(z) == n and all(len(row) == n for row in z)
        for m in range(n):
            for k in range(n):
                if k > m:  # a key after the query: masked
                    assert math.isnan(z[m][k])
                else:
                    assert math.isclose(z[m][k], -slopes[h] * (m - k), rel_tol=1e-6, abs_tol=0)
        zb = torch.tensor(bidirectional[h]["z"], dtype=torch.float64)
        assert torch.equal(zb, zb.T)
        assert bidirectional[h]["zmax"] == -bidirectional[h]["zmin"] == float(zb.abs().max())
    dist = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    torch.testing.assert_close(
        torch.tensor(bidirectional[0]["z"], dtype=torch.float64), -slopes[0] * dist, rtol=1e-6, atol=0
    )
    # on the page the masked entries are JSON nulls, not NaN (which JSON cannot hold)
    page = interactive("bias", fig, "")
    spec = json.loads(re.search(r'id="bias-spec">(.*?)</script>', page, re.S).group(1))
    z0 = spec["data"][0]["z"]
    assert z0[0][1] is None and z0[5][47] is None and z0[47][5] is not None and z0[3][3] == 0.0


def test_bias_explorer_starts_with_the_contexts_form_and_shows_at_most_16_heads():
    fig = HEADS.build("alibi", {**SMALL, "num_heads": 64, "causal": True})
    labels = [s["label"] for s in fig["layout"]["sliders"][0]["steps"]]
    assert labels == [str(h) for h in range(0, 64, 4)]  # 16 heads, evenly spread
    assert len(fig["data"]) == 2 * 16
    assert fig["layout"]["updatemenus"][0]["active"] == 0  # causal
    assert "autorange" not in fig["layout"]["yaxis"]  # position 0 at the bottom left, as in every heatmap
    shown = [i for i, t in enumerate(fig["data"]) if t["visible"]]
    assert shown == [0]  # causal, head 0
    # head 60 of 64: slope 2^(-8 * 61 / 64), bidirectional entry (0, 10)
    last = fig["data"][16 + 15]["z"]
    assert math.isclose(last[0][10], -(2 ** (-8 * 61 / 64)) * 10, rel_tol=1e-6)
    for heads in (17, 20, 31, 40):  # not a multiple of 16: still at most 16 on the slider
        fig = HEADS.build("alibi", {**SMALL, "num_heads": heads})
        assert len(fig["layout"]["sliders"][0]["steps"]) <= 16


# ---------------------------------------------------------------------------------------------- rotary
def _curve(trace: dict) -> dict[int, float]:
    return dict(zip(trace["x"], trace["y"]))


def test_scalings_offer_every_rule_with_plain_rope_as_reference_on_a_fixed_axis():
    from posenc.rotary.scalings import ROPE_SCALINGS

    ctx = {**SMALL, "max_len": 32}
    fig = SCALINGS.build("rope", ctx)
    traces = _by_key(fig)
    n, d_h = 4 * 32, SMALL["head_dim"]
    rules = [b["label"].removeprefix("scaling: ") for b in fig["layout"]["updatemenus"][0]["buttons"]]
    assert sorted(rules) == sorted(set(ROPE_SCALINGS) - {"default"})  # every rule posenc's RoPE takes
    assert len(traces) == len(rules) * 4 + 1
    plain = traces["none (plain RoPE)"]
    owner = fig["layout"]["meta"]["selector"]["owner"]
    assert owner[fig["data"].index(plain)] is None and plain["visible"]  # the reference is always shown
    assert sorted(plain["x"]) == list(range(n))
    for label in rules:  # factor 1: every scaling is plain RoPE
        t = traces[f"{label}, factor 1"]
        assert t["x"] == plain["x"] and t["y"] == plain["y"]
    for label in rules:  # a factor above 1 changes the kernel under every rule
        assert traces[f"{label}, factor 4"]["y"] != plain["y"], label
    one = _curve(plain)
    # RoFormer, mean content: K(r) = 2 sum_i cos(r theta_i) / sqrt(d_h), theta_i = 10000^(-2i/d_h)
    expected = [2 * _cos_sum(r, d_h) / math.sqrt(d_h) for r in range(n)]
    torch.testing.assert_close(torch.tensor([one[r] for r in range(n)]), torch.tensor(expected))
    # position interpolation: factor f divides every frequency by f, so K_f(f r) = K_1(r)
    for f in (2, 4):
        scaled = _curve(traces[f"linear, factor {f}"])
        rs = range((n - 1) // f + 1)
        torch.testing.assert_close(
            torch.tensor([scaled[f * r] for r in rs]), torch.tensor([one[r] for r in rs])
        )
    ntk = _curve(traces["ntk, factor 4"])
    assert ntk != one  # NTK changes the kernel, but not at r = 0 (the norm)
    assert math.isclose(ntk[0], math.sqrt(d_h), rel_tol=1e-6)
    # one y-axis for every view: it holds every curve
    lo, hi = fig["layout"]["yaxis"]["range"]
    assert all(lo <= y <= hi for t in fig["data"] for y in t["y"])


def test_bases_explorer_sets_the_rotary_frequencies():
    fig = BASES.build("rope", SMALL)
    traces = _by_key(fig)
    d_h, L = SMALL["head_dim"], SMALL["max_len"]
    assert "updatemenus" not in fig["layout"]
    assert [t["name"] for t in fig["data"] if t["visible"]] == ["base 10000"]
    for base in (100, 1000, 10000, 100000, 1000000):
        curve = _curve(traces[f"base {base}"])
        assert sorted(curve) == list(range(L))
        expected = [2 * _cos_sum(r, d_h, base) / math.sqrt(d_h) for r in range(L)]
        torch.testing.assert_close(torch.tensor([curve[r] for r in range(L)]), torch.tensor(expected))


def test_bias_explorer_builds_t5_as_a_decoder_and_as_an_encoder():
    """The two forms are the scheme built with the model's one ``causal`` argument: T5's decoder
    buckets clip keys after the query to distance 0, its encoder buckets tell them apart."""
    fig = HEADS.build("t5", SMALL)
    heads = SMALL["num_heads"]
    causal = torch.tensor(fig["data"][0]["z"], dtype=torch.float64)  # head 0, [m, n]
    encoder = torch.tensor(fig["data"][heads]["z"], dtype=torch.float64)
    future = torch.ones(causal.shape, dtype=torch.bool).triu(1)  # keys after the query
    assert bool(causal[future].isnan().all()) and not bool(encoder.isnan().any())
    pos = torch.arange(causal.shape[0])
    for form, shown in ((True, causal), (False, encoder)):
        torch.manual_seed(0)  # as the analysis builds a scheme
        t5 = posenc.build_with_context("t5", {**SMALL, "causal": form})
        assert t5.causal is form
        want = t5.score_bias(pos, pos)[0, 0].double().detach()  # head 0: [m, n]
        keep = ~future if form else torch.ones_like(future)
        torch.testing.assert_close(shown[keep], want[keep], rtol=1e-6, atol=1e-9)
    assert not torch.equal(encoder, encoder.T)  # keys after the query: buckets of their own


def test_bias_explorer_offers_only_the_forms_a_scheme_has():
    """CoPE has no bidirectional form (``bidirectional_ok`` False): its explorer shows the causal
    form alone."""
    from posenc.analysis.explore import _heads

    fig = _heads("cope", {"max_len": 16, "num_heads": 2, "head_dim": 8, "d_model": 16, "causal": True})
    assert len(fig["data"]) == 2  # two heads of the causal form
    forms = str(fig["layout"])
    assert "causal" in forms and "bidirectional" not in forms
