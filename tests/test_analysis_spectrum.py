"""Tests of posenc.analysis.spectrum: the shift map, frequencies and RoFormer's bound against
plain formulas."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _analysis_refs import roformer_bound_ref
from posenc.analysis.kernel import make_probe
from posenc.analysis.spectrum import fit_shift_map, fit_shift_maps, roformer_bound, scheme_frequencies


def test_roformer_bound_matches_the_plain_sum():
    theta = torch.tensor([10000 ** (-2 * i / 128) for i in range(64)], dtype=torch.float64)
    got = roformer_bound(theta, torch.tensor([0, 7, 60, 255]))
    ref = torch.tensor([roformer_bound_ref(128, r) for r in (0, 7, 60, 255)], dtype=torch.float64)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


@settings(deadline=None, max_examples=30)
@given(freqs=st.lists(st.floats(0.01, 3.0), min_size=1, max_size=6), shift=st.integers(1, 9))
def test_fit_recovers_any_rotation_trajectory(freqs, shift):
    p = torch.arange(80, dtype=torch.float64)[:, None]
    w = torch.tensor(freqs, dtype=torch.float64)
    x = torch.stack((torch.sin(p * w), torch.cos(p * w)), -1).flatten(-2)  # [80, 2f]
    m, resid = fit_shift_map(x, shift)
    assert resid < 1e-9
    torch.testing.assert_close(x[shift:], x[:-shift] @ m.T, atol=1e-8, rtol=0)


def test_fit_shift_maps_agree_with_one_fit_per_shift():
    enc = posenc.sinusoidal_table(60, 16, dtype=torch.float64)  # [60, 16]
    both = fit_shift_maps(enc, [1, 5])
    for k in (1, 5):
        m, resid = fit_shift_map(enc, k)
        assert resid < 1e-9 and both[k][1] < 1e-9
        torch.testing.assert_close(enc[k:], enc[:-k] @ m.T, atol=1e-9, rtol=0)


def test_scheme_frequencies_exact_for_rotations_and_fitted_for_sinusoids():
    rope = make_probe("rope", {"head_dim": 16})
    theta, how = scheme_frequencies(rope)
    assert how == "exact"
    torch.testing.assert_close(
        theta, torch.tensor([10000 ** (-2 * i / 16) for i in range(8)], dtype=torch.float64)
    )
    sin = make_probe("sinusoidal", {"d_model": 16})
    theta, how = scheme_frequencies(sin)
    assert how == "fitted"
    want = torch.tensor([10000 ** (-2 * i / 16) for i in range(8)], dtype=torch.float64)
    # fitted on the module's float32 encodings at positions up to 131072: float32 angle rounding
    # (2^-24 relative) over ~1e5 positions bounds the fit's accuracy near 1e-5 relative
    torch.testing.assert_close(theta.sort(descending=True).values, want, rtol=1e-4, atol=0)
