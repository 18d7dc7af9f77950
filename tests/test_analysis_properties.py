"""Tests of posenc.analysis.properties: each property's number against a hand-derived value."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from _analysis_toys import ToyALiBi, ToyBF16Positions, ToyLearnedBias, ToyRoPE, registered
from posenc.analysis import PROPERTIES, check, fit_shift_map, verify
from test_analysis_spectrum import roformer_bound_ref

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}


def by_name(results):
    return {r.property: r for r in results}


# ------------------------------------------------------------------------------------ relative_linear
def test_sinusoidal_shift_map_is_the_block_rotation_at_float64_rounding():
    pe = posenc.sinusoidal_table(64, 8, dtype=torch.float64)  # [64, 8], interleaved sin/cos
    m, resid = fit_shift_map(pe, 1)
    assert resid < 1e-12
    ref = torch.zeros(8, 8, dtype=torch.float64)
    for i in range(4):  # sin((p+1)w) = sin cos w + cos sin w; cos((p+1)w) = cos cos w - sin sin w
        w = 10000 ** (-2 * i / 8)
        ref[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]]
        )
    torch.testing.assert_close(m, ref, atol=1e-6, rtol=0)


def test_sinusoidal_passes_at_float32_rounding_and_learned_fails():
    sin = by_name(check("sinusoidal", ["relative_linear"]))["relative_linear"]
    # a float32 table's entries carry ~2^-24 relative error: the residual sits at that level
    assert sin.passed and sin.promised and 2**-26 < sin.value < 50 * 2**-24
    learned = by_name(check("learned", ["relative_linear"]))
    rl = learned["relative_linear"]
    # random N(0, 0.02^2) rows: a d x d map fitted on n = 512 - 50 rows (the largest shift) explains
    # about d/n of the variance, so the residual is about sqrt(1 - 128/462)
    assert rl.passed is False and not rl.promised and rl.status == "no"
    assert abs(rl.value - math.sqrt(1 - 128 / 462)) < 0.05


def test_learned_at_init_fails_translation_invariance_but_sinusoidal_holds():
    res = by_name(check("learned", ["translation_inv"]))["translation_inv"]
    assert res.applies and res.passed is False and not res.promised and res.value > 0.1
    sin = by_name(check("sinusoidal", ["translation_inv"]))["translation_inv"]
    assert sin.passed and sin.promised and sin.value < 1e-4


def test_beyond_length_reads_the_declared_max_len():
    res = by_name(check("learned", ["beyond_length"]))["beyond_length"]
    assert res.value == 0.0 and res.passed is False and "past the scheme's max_len=512" in res.reason


# ---------------------------------------------------------------------------------------------- decay
def test_linear_bias_decays_with_its_slope():
    with registered(ToyALiBi):
        res = by_name(check("toy_alibi", ["decay", "symmetry", "translation_inv"], context=SMALL))
    decay = res["decay"]
    slopes = [2 ** (-8 * h / 4) for h in range(1, 5)]
    assert decay.passed and decay.promised
    torch.testing.assert_close(
        torch.tensor(decay.data["slopes"], dtype=torch.float64), -torch.tensor(slopes, dtype=torch.float64)
    )
    # the largest step is the shallowest head's slope over max |bias| = slope_0 * 63
    assert decay.value == pytest.approx(-slopes[-1] / (slopes[0] * 63), rel=1e-6)
    assert res["symmetry"].value == 0.0 and res["translation_inv"].value == 0.0


def test_causal_bias_is_not_symmetric_and_learned_bias_promises_no_decay():
    with registered(ToyALiBi, ToyLearnedBias):
        causal = by_name(check(ToyALiBi(4, causal=True), ["symmetry"], context=SMALL))["symmetry"]
        learned = by_name(check("toy_learned_bias", ["decay"], context=SMALL))["decay"]
    assert causal.passed is False and causal.status == "no"
    assert not learned.promised and learned.status in ("no", "pass")


def test_rotary_decay_uses_roformer_bound():
    with registered(ToyRoPE):
        res = by_name(check("toy_rope", ["decay"], context={"head_dim": 128}))["decay"]
    bound = res.data["bound"]
    # the frequencies are read off a float32 rotation, theta_i to ~2^-24 relative: each phase r theta_i
    # moves by <= r theta_i 2^-24, so |S_j| by <= r 2^-24 sum_i theta_i (doubled for the eigen-solver)
    sum_theta = sum(10000 ** (-2 * i / 128) for i in range(64))
    for r in (0, 1, 10, 100, 250, 512):
        assert bound[r] == pytest.approx(roformer_bound_ref(128, r), rel=1e-9, abs=2 * r * 2**-24 * sum_theta)
    assert bound[0] == pytest.approx(32.5)  # mean_j j for j = 1..64
    assert res.passed and res.promised and res.value < 0.5


@pytest.mark.skipif(
    "rope" not in posenc.schemes(), reason="rope not registered yet (rotary branch not merged)"
)
def test_rope_mean_abs_s_curve_matches_roformer_bound_d128():
    res = by_name(check(posenc.build("rope", head_dim=128), ["decay", "bounded", "translation_inv"]))
    for r in (0, 5, 50, 200):
        assert res["decay"].data["bound"][r] == pytest.approx(
            roformer_bound_ref(128, r), rel=1e-9, abs=2 * r * 2**-24 * 8
        )
    assert not any(r.broken_promise for r in res.values())


@pytest.mark.skipif(
    "alibi" not in posenc.schemes(), reason="alibi not registered yet (bias branch not merged)"
)
def test_alibi_decays_linearly_with_its_paper_slopes():
    res = by_name(check(posenc.build("alibi", num_heads=8), ["decay"]))["decay"]
    got = torch.tensor(res.data["slopes"], dtype=torch.float64)
    torch.testing.assert_close(got, -posenc.alibi_slopes(8).double(), rtol=1e-5, atol=0)
    assert res.passed


# ---------------------------------------------------------------------------------- distinct, bounded
def test_distinct_catches_positions_rounded_to_bf16():
    with registered(ToyBF16Positions):
        res = by_name(check("toy_bf16_positions", context=SMALL | {"max_len": 512}))
    assert res["distinct_fp32"].passed
    # bf16 has 8 significant bits: 257 rounds to 256, so positions collide from 256 on
    assert res["distinct_bf16"].value == 0.0 and res["distinct_bf16"].status == "FAIL"
    assert "identical pair" in res["distinct_bf16"].reason
    sin = by_name(check("sinusoidal", ["distinct_bf16", "distinct_fp16"]))
    assert all(r.passed and r.value > 0.01 for r in sin.values())


def test_bounded_values_and_rotation_norms():
    sin = by_name(check("sinusoidal", ["bounded"]))["bounded"]
    assert sin.value <= 1.0 and sin.value > 0.999 and sin.passed  # sin(p) reaches 1 within 8192 positions
    with registered(ToyRoPE):
        rot = by_name(check("toy_rope", ["bounded"], context=SMALL))["bounded"]
    assert rot.passed and rot.promised and rot.value < 1e-6


# ---------------------------------------------------------------------------------------------- wavelengths
def test_wavelengths_against_the_context_length():
    res = by_name(check("sinusoidal", ["wavelengths"]))["wavelengths"]
    lam = [2 * math.pi * 10000 ** (2 * i / 128) for i in range(64)]
    assert res.data["inside"] == sum(x <= 512 for x in lam) == 31
    assert res.value * 512 == pytest.approx(lam[-1], rel=5e-3)  # fitted frequencies
    with registered(ToyRoPE):
        plain = by_name(check("toy_rope", ["wavelengths"], context=SMALL))["wavelengths"]
        pi = by_name(
            check(
                "toy_rope",
                ["wavelengths"],
                context=SMALL,
                config={"scaling": {"rope_type": "linear", "factor": 4.0}},
            )
        )["wavelengths"]
    # position interpolation by 4 stretches every wavelength by exactly 4
    torch.testing.assert_close(
        torch.tensor(pi.data["wavelength"]), 4 * torch.tensor(plain.data["wavelength"]), rtol=1e-5, atol=0
    )


# ---------------------------------------------------------------------------------------------- registry
def test_nope_has_nothing_to_check_and_learned_wavelengths_do_not_apply():
    assert all(not r.applies and "no positional hooks" in r.reason for r in check("nope"))
    wl = by_name(check("learned", ["wavelengths"]))["wavelengths"]
    assert not wl.applies and "not a fixed linear map" in wl.reason


def test_class_attribute_promises_overrides_the_rules():
    class Declared(ToyLearnedBias):
        name = "declared"
        promises = ("decay",)

    res = by_name(check(Declared(4), ["decay"], context=SMALL))["decay"]
    assert res.promised and res.broken_promise and res.status == "FAIL"


def test_verify_covers_every_registered_scheme_and_property():
    with registered():
        results = verify(properties=["translation_inv"], context=SMALL)
        assert [r.scheme for r in results] == posenc.schemes()
    assert not any(r.broken_promise for r in results)
    assert set(PROPERTIES) >= {"distinct_bf16", "relative_linear", "decay", "wavelengths", "beyond_length"}


def test_errors_name_the_choice():
    with pytest.raises(ValueError, match="unknown property 'smooth'"):
        check("sinusoidal", ["smooth"])
    with pytest.raises(ValueError, match="unknown scheme 'rop'"):
        verify(["rop"])
    with pytest.raises(ValueError, match=r"shift must be in \[1, 3\] for 4 positions, got 4"):
        fit_shift_map(torch.zeros(4, 2), 4)


def test_the_package_loads_its_submodules_on_first_use():
    import posenc.analysis as analysis

    assert analysis.properties.check is analysis.check and analysis.measures.PROPERTIES is PROPERTIES
    with pytest.raises(AttributeError, match="has no attribute 'nosuch'"):
        analysis.nosuch  # noqa: B018
