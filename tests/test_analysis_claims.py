"""Tests of posenc.analysis.claims: every common claim's number recomputed plainly here (sums of
cosines, the frequency formula), the GPT-2 claim with and without transformers, and the claims a
study settles read from a hand-written results dict."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from posenc.analysis import Claim, common_claims, study_claims
from posenc.analysis.claims import input_layer_claims


@pytest.fixture(scope="module")
def claims() -> list[Claim]:
    return common_claims()


def _find(claims: list[Claim], words: str) -> Claim:
    (found,) = [c for c in claims if words in c.claim]
    return found


def test_every_claim_has_a_verdict_and_a_method(claims):
    assert len(claims) == 6
    for c in claims:
        assert c.verdict.split(":", 1)[0] in ("right", "wrong", "not measured")
        assert c.claim and c.measured and c.how


def test_sinusoidal_encodings_are_far_from_orthogonal(claims):
    c = _find(claims, "nearly orthogonal")
    # mean |PE(i).PE(j)| over i < j < 20 for d = 32, written plainly: PE(i).PE(j) = sum_k cos((i - j) w_k)
    total, count = 0.0, 0
    for i in range(20):
        for j in range(i + 1, 20):
            total += abs(sum(math.cos((i - j) * 10000 ** (-2 * k / 32)) for k in range(16)))
            count += 1
    assert count == 190
    assert c.value == pytest.approx(total / count, rel=1e-12) and c.value > 11  # not 0.0128
    assert c.quoted == "mean |PE(i)·PE(j)| = 0.0128" and c.verdict.startswith("wrong")
    assert f"mean |cos| = {total / count / 16:.3f}" in c.measured  # |PE|^2 = d/2 = 16


def test_frequencies_wavelengths_and_neighbours(claims):
    low = _find(claims, "lowest sinusoidal frequency")
    assert low.value == pytest.approx(10000 ** (-30 / 32), rel=1e-12)
    assert low.quoted == "0.024543" and low.verdict.startswith("wrong")
    first = _find(claims, "longest wavelengths")
    assert first.value == pytest.approx(2 * math.pi)  # dims 0-1 turn once per 2 pi tokens
    assert f"{2 * math.pi * 10000 ** (510 / 512):.4g} tokens" in first.measured  # dims 510-511
    near = _find(claims, "neighbouring positions")
    assert near.value == pytest.approx(1.0, abs=1e-12)  # |PE(1) - PE(0)| / |PE(101) - PE(100)|
    # |PE(p + 1) - PE(p)|^2 = sum_k 2 - 2 cos(w_k): the same for every p
    step = math.sqrt(sum(2 - 2 * math.cos(10000 ** (-2 * k / 512)) for k in range(256)))
    assert f"|PE(1) − PE(0)| = {step:.6f}" in near.measured


def test_a_linear_map_shifts_sinusoidal_encodings(claims):
    c = _find(claims, "fixed linear map")
    assert 0 <= c.value < 1e-9 and c.verdict.startswith("right")


def test_gpt2_learns_its_positions(claims):
    pytest.importorskip("transformers")
    c = _find(claims, "GPT models")
    assert c.value == 1.0 and c.verdict.startswith("wrong")
    assert "Embedding(64, 32)" in c.measured and "requires_grad=True" in c.measured


def test_the_gpt2_claim_leaves_the_callers_rng_alone():
    pytest.importorskip("transformers")
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    common_claims()
    assert torch.equal(torch.random.get_rng_state(), before)


def test_without_transformers_the_gpt2_claim_is_not_measured(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    (c,) = [c for c in common_claims() if "GPT models" in c.claim]
    assert c.verdict.startswith("not measured") and math.isnan(c.value)
    assert "pip install transformers" in c.measured


# ---------------------------------------------------------------------------------------------- studies
def _row(scheme, length, delta, *, variant=None, seeds=(0, 1)):
    name = f"{scheme}+{variant}" if variant else scheme
    return {
        "name": name,
        "scheme": scheme,
        "variant": variant,
        "length": length,
        "seeds": list(seeds),
        "delta": delta,
    }


def test_study_claims_read_the_delta_at_twice_the_trained_length():
    L = 16
    results = {
        "config": {"train_len": L, "steps": 50},
        "summary": [
            _row("sinusoidal", L, None),  # the trained length: no delta
            _row("sinusoidal", 2 * L, {"mean": 0.31, "low": 0.12, "high": 0.5}),  # significantly worse
            _row("sinusoidal", 4 * L, {"mean": 0.9, "low": 0.7, "high": 1.1}),  # not 2L: ignored
            _row("learned", 2 * L, {"mean": 0.05, "low": -0.02, "high": 0.12}),  # interval covers 0
            _row("scaled_sinusoidal", 2 * L, {"mean": 0.04, "low": 0.0, "high": 0.08}),  # low = 0
            _row("learned", 2 * L, {"mean": 0.2, "low": 0.1, "high": 0.3}, variant="linear"),  # variant
            _row("alibi", 2 * L, {"mean": 0.5, "low": 0.4, "high": 0.6}),  # no embed hook
            _row("t5", 2 * L, {"mean": 0.5, "low": 0.4, "high": 0.6}),  # no embed hook
            _row("sinusoidal_2d", 2 * L, {"mean": -0.1, "low": None, "high": None}, seeds=(0,)),
        ],
    }
    out = study_claims(results)
    assert [c.claim.split(" ", 1)[0] for c in out] == [
        "sinusoidal",
        "learned",
        "scaled_sinusoidal",
        "sinusoidal_2d",
    ]
    sin, learned, scaled, two_d = out
    assert sin.claim == "sinusoidal encodings let a model read inputs longer than it was trained on"
    assert sin.verdict.startswith("wrong") and sin.value == 0.31
    assert sin.measured == (
        "bits/byte at E = 32 minus at L = 16 on the same bytes: +0.310 (95%: +0.120 to +0.500), 2 seed(s)"
    )
    assert sin.how == "posenc extrapolate (this study: 50 steps, L = 16)"
    assert learned.verdict.startswith("not contradicted") and learned.value == 0.05
    assert scaled.verdict.startswith("not contradicted")  # a lower bound of 0 is no significant loss
    assert two_d.verdict.startswith("not contradicted") and two_d.value == -0.1
    assert "95%" not in two_d.measured and two_d.measured.endswith("-0.100, 1 seed(s)")


def test_study_claims_of_a_study_without_absolute_schemes_are_empty():
    results = {"config": {"train_len": 8, "steps": 1}, "summary": [_row("alibi", 16, {"mean": 1.0})]}
    assert study_claims(results) == []
    assert study_claims({"config": {"train_len": 8, "steps": 1}}) == []


def test_input_layer_claims_compare_each_value_with_the_claimed_one_seed_for_seed():
    def run(name, seed, bits):
        return {"name": name, "seed": seed, "eval": [{"length": 8, "window_bits": bits}]}

    results = {
        "config": {
            "train_len": 8,
            "steps": 5,
            "schemes": ["rope", "sinusoidal"],
            "seeds": [0, 1],
            "vary": {"norm": ["pre", "post"]},
        },
        "summary": [{**_row("rope", 16, {"mean": 0.5, "low": 0.4, "high": 0.6}), "setting": {"norm": "pre"}}],
        "runs": [
            run("rope[norm=pre]", 0, [2.0, 2.0]),
            run("rope[norm=pre]", 1, [2.1, 2.1]),
            run("rope[norm=post]", 0, [2.5, 2.5]),  # worse than pre in both seeds
            run("rope[norm=post]", 1, [2.6, 2.7]),
            run("sinusoidal[norm=pre]", 0, [3.0, 3.0]),
            run("sinusoidal[norm=post]", 0, [2.0, 2.0]),  # better, one seed: bootstrap over windows
        ],
    }
    out = study_claims(results)  # the row with a setting is not read as an encoding's claim
    assert [c.claim for c in out] == ["pre-LayerNorm trains better than post-LayerNorm"] * 2
    rope, sin = out
    assert rope.verdict.startswith(
        "right for rope: norm=post is measurably worse"
    ) and rope.value == pytest.approx(0.525, abs=1e-6)
    assert rope.measured.startswith(
        "rope: bits/byte at L = 8 with norm=post minus with norm=pre on the same bytes"
    )
    assert sin.verdict.startswith("wrong for sinusoidal") and sin.value == pytest.approx(-1.0, abs=1e-6)
    assert rope.how.startswith("posenc extrapolate --vary norm=")
    two = {
        **results,
        "config": {**results["config"], "vary": {"norm": ["pre", "post"], "tie": ["none", "output"]}},
    }
    assert input_layer_claims(two) == []  # two fields at once: not a clean comparison
