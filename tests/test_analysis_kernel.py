"""Tests of posenc.analysis.kernel: the positional kernel of any scheme, by hook, against plain
float64 formulas written here from the papers (Vaswani 2017 section 3.5, RoFormer eq. 34)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _analysis_toys import ToyALiBi, ToyRoPE, registered
from posenc.analysis import encodings, kernel_curve, make_probe, positional_kernel, rotation_frequencies

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}


def sinusoid_kernel_ref(m: list[int], n: list[int], d: int) -> torch.Tensor:
    """PE(m).PE(n)/sqrt(d) = sum_i cos((m - n) w_i) / sqrt(d), w_i = 10000^(-2i/d) (sin^2 + cos^2 pairs)."""
    out = torch.zeros(len(m), len(n), dtype=torch.float64)
    for a, pm in enumerate(m):
        for b, pn in enumerate(n):
            out[a, b] = sum(math.cos((pm - pn) * 10000 ** (-2 * i / d)) for i in range(d // 2)) / math.sqrt(d)
    return out


def test_sinusoidal_kernel_matches_the_closed_form_including_far_positions():
    q, k = [0, 3, 700, 100_000], [1, 5, 1999, 100_004]
    got = positional_kernel("sinusoidal", torch.tensor(q), torch.tensor(k), context=SMALL)
    assert got.shape == (1, 4, 4) and got.dtype == torch.float64
    # float32 angles at position 1e5: |error| <= p * 2^-24 per term; 16 terms / sqrt(32)
    torch.testing.assert_close(got[0], sinusoid_kernel_ref(q, k, 32), atol=16 * 1e5 * 2**-24, rtol=0)
    near = positional_kernel("sinusoidal", 8, context=SMALL)[0]
    torch.testing.assert_close(
        near, sinusoid_kernel_ref(list(range(8)), list(range(8)), 32), atol=1e-6, rtol=0
    )


def test_embed_kernel_with_projection_and_learned_table():
    probe = make_probe("learned", SMALL)
    table = probe.scheme.weight.detach().double()  # [max_len, d]
    w = torch.randn(32, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got = positional_kernel(probe, 10, projection=w)[0]
    ref = (table[:10] @ w) @ (table[:10] @ w).T / math.sqrt(8)
    torch.testing.assert_close(got, ref, atol=1e-7, rtol=1e-6)
    wk = torch.randn(32, 8, dtype=torch.float64)
    got2 = positional_kernel(probe, 10, projection=(w, wk))[0]
    torch.testing.assert_close(
        got2, (table[:10] @ w) @ (table[:10] @ wk).T / math.sqrt(8), atol=1e-7, rtol=1e-6
    )


def test_rotary_mean_kernel_is_the_trace_formula():
    # E[(R_m c).(R_n c)] over c ~ N(0, I) = trace(R_m^T R_n) = 2 sum_i cos((m - n) theta_i)
    with registered(ToyRoPE):
        got = positional_kernel(
            "toy_rope", torch.tensor([0, 9, 40]), torch.tensor([0, 2, 40]), context=SMALL
        )[0]
    theta = [10000 ** (-2 * i / 16) for i in range(8)]
    ref = torch.tensor(
        [[2 * sum(math.cos((m - n) * t) for t in theta) / 4.0 for n in (0, 2, 40)] for m in (0, 9, 40)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_rotary_random_kernel_matches_a_plain_rope_reference():
    with registered(ToyRoPE):
        got = positional_kernel(
            "toy_rope", 6, torch.tensor([0, 3, 50]), content="random", seed=5, context=SMALL
        )[0]
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 1, 16, generator=g).double()

    def rot(x, p):  # RoFormer eq. 34 in the half layout: pairs (i, i + d/2)
        out = x.clone()
        for i in range(8):
            t = p * 10000 ** (-2 * i / 16)
            out[..., i] = x[..., i] * math.cos(t) - x[..., i + 8] * math.sin(t)
            out[..., i + 8] = x[..., i + 8] * math.cos(t) + x[..., i] * math.sin(t)
        return out

    ref = torch.tensor([[float(rot(q[0], m) @ rot(k[0], n)) / 4.0 for n in (0, 3, 50)] for m in range(6)])
    torch.testing.assert_close(got, ref.double(), atol=1e-5, rtol=0)


def test_bias_kernel_is_the_bias_per_head_and_nope_is_zero():
    with registered(ToyALiBi):
        got = positional_kernel("toy_alibi", 5, context=SMALL)
    slopes = [2 ** (-8 * h / 4) for h in range(1, 5)]
    assert got.shape == (4, 5, 5)
    for h, s in enumerate(slopes):
        ref = torch.tensor([[-s * abs(m - n) for n in range(5)] for m in range(5)], dtype=torch.float64)
        torch.testing.assert_close(got[h], ref)
    assert torch.equal(positional_kernel("nope", 7, context=SMALL), torch.zeros(1, 7, 7, dtype=torch.float64))


def test_learned_kernel_past_its_table_raises_the_schemes_error():
    with pytest.raises(ValueError, match="past the learned position table"):
        positional_kernel("learned", torch.tensor([63, 64]), context=SMALL)


def test_rotation_frequencies_read_off_the_rotation():
    with registered(ToyRoPE):
        got = rotation_frequencies("toy_rope", context={"head_dim": 64})
    ref = torch.tensor([10000 ** (-2 * i / 64) for i in range(32)], dtype=torch.float64)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-9)


@pytest.mark.skipif(
    "rope" not in posenc.schemes(), reason="rope not registered yet (rotary branch not merged)"
)
def test_rotation_frequencies_of_rope_match_its_public_frequencies():
    inv_freq, _ = posenc.rope_frequencies(128, base=10000.0)
    got = rotation_frequencies(posenc.build("rope", head_dim=128))
    torch.testing.assert_close(
        got, torch.sort(inv_freq.double(), descending=True).values, rtol=1e-5, atol=1e-9
    )


def test_encodings_of_2d_scheme_probe_its_first_axis_and_keep_dtype():
    enc = encodings("sinusoidal_2d", torch.tensor([0, 3, 9]), context=SMALL)
    coords = torch.tensor([[0, 0], [3, 0], [9, 0]])
    torch.testing.assert_close(enc, posenc.sinusoidal_nd_table(coords, 32))
    assert encodings("sinusoidal", 4, dtype=torch.bfloat16, context=SMALL).dtype == torch.bfloat16


def test_kernel_curve_averages_diagonals():
    # Toeplitz K[m, n] = f(m - n) with f(r) = r^2 + r: each diagonal's mean is f(r)
    s = 5
    k = torch.tensor([[float((m - n) ** 2 + (m - n)) for n in range(s)] for m in range(s)])[None]
    r, curve = kernel_curve(k.double())
    assert r.tolist() == list(range(-4, 5))
    torch.testing.assert_close(curve[0], (r.double() ** 2 + r.double()))


@settings(deadline=None, max_examples=25)
@given(m=st.integers(0, 2000), n=st.integers(0, 2000), t=st.integers(0, 2000))
def test_rotary_kernel_depends_only_on_distance(m, n, t):
    with registered(ToyRoPE):
        probe = make_probe("toy_rope", SMALL)
        a = positional_kernel(probe, [m], [n], content="random")
        b = positional_kernel(probe, [m + t], [n + t], content="random")
    # float32 angles: error <= 4000 * 2^-24 rad per pair, times |q||k| / sqrt(d_h) ~ 16 / 4
    torch.testing.assert_close(a, b, atol=8 * 4000 * 2**-24 * 4, rtol=0)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="unknown content 'avg'"):
        positional_kernel("sinusoidal", 4, content="avg", context=SMALL)
    with pytest.raises(TypeError, match="q_positions must be integer positions"):
        positional_kernel("sinusoidal", torch.tensor([0.0, 1.0]), context=SMALL)
    with pytest.raises(ValueError, match=r"k_positions must be a non-empty 1-D tensor \[s\]"):
        positional_kernel("sinusoidal", 4, torch.zeros(2, 2, dtype=torch.long), context=SMALL)
    with pytest.raises(ValueError, match=r"projection\[0\] must be a tensor \[d=32, d'\]"):
        positional_kernel("sinusoidal", 4, projection=torch.zeros(5, 5), context=SMALL)
    with pytest.raises(ValueError, match="has no per-position vector"), registered(ToyALiBi):
        encodings("toy_alibi", 4, context=SMALL)
    with pytest.raises(ValueError, match="has no 'rotate' hook"):
        rotation_frequencies("sinusoidal", context=SMALL)
    with pytest.raises(ValueError, match="config applies only when scheme is given by name"):
        make_probe(posenc.build("sinusoidal", d_model=8), config={"base": 10.0})
    with pytest.raises(TypeError, match="scheme must be a registry name or a PositionalScheme"):
        make_probe(3)
    with pytest.raises(ValueError, match=r"kernel must be square \[h, s, s\]"):
        kernel_curve(torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="unknown scheme 'nosuch'"):
        positional_kernel("nosuch", 4)


def test_position_free_query_transform_is_content_and_content_bias_falls_back_to_random():
    from _analysis_toys import ToyContentBias
    from posenc.analysis import display_kernel

    probe = make_probe(ToyContentBias(4, 16), SMALL)
    # queries adds u to q at every position: no positional vector, and its mean over content is 0
    assert not probe.rotates and not probe.has_vectors
    mean = positional_kernel(probe, 6)
    assert mean.shape == (4, 6, 6) and torch.equal(mean, torch.zeros_like(mean))  # bias linear in q: mean 0
    shown, content = display_kernel(probe, 6)
    assert content == "random" and shown.abs().max() > 0
    torch.testing.assert_close(shown, positional_kernel(probe, 6, content="random"))


def test_axial_rotate_is_read_along_its_first_axis():
    """A grid scheme declares its axes (position_dims = 2): 1-D positions become (p, 0)."""
    from _analysis_toys import ToyAxialRoPE

    flat = positional_kernel(ToyRoPE(16), torch.tensor([0, 5, 9]), context=SMALL)
    axial = positional_kernel(ToyAxialRoPE(16), torch.tensor([0, 5, 9]), context=SMALL)
    torch.testing.assert_close(axial, flat)
    torch.testing.assert_close(
        rotation_frequencies(ToyAxialRoPE(16), SMALL), rotation_frequencies(ToyRoPE(16), SMALL)
    )


def test_hooks_are_called_only_in_their_declared_form():
    """The analysis reads position_dims and num_heads; it never tries other shapes and catches the
    error (a scheme that raised on a trial shape was once probed that way)."""
    from _analysis_toys import ToyAxialRoPE

    seen = []

    class Recording(ToyAxialRoPE):
        def rotate(self, q, k, q_positions=None, k_positions=None):
            seen.append((q.shape[1], tuple(q_positions.shape[1:])))
            return super().rotate(q, k, q_positions, k_positions)

    positional_kernel(Recording(16), torch.tensor([0, 5, 9]), context=SMALL)
    rotation_frequencies(Recording(16), SMALL)
    assert seen and set(seen) == {(1, (2,))}  # one head (it declares none), (row, col) coordinates


def test_query_temperature_kernel_is_the_factor_on_the_content_logit():
    """Llama 4's temperature multiplies the queries by f(m): with q = k = c (E[c c^T] = I) it adds
    (f(m) - 1) d_h / sqrt(d_h) to every logit of query m, 0 below floor_scale - 1."""
    probe = make_probe("nope_temperature", SMALL)
    m = torch.tensor([0, 8190, 8191, 20000, 2**40])
    kern = positional_kernel(probe, m, torch.tensor([0, 3]))  # [1, m, n]
    f = torch.tensor(
        [math.log1p(math.floor((p + 1) / 8192)) * 0.1 + 1 for p in m.tolist()], dtype=torch.float64
    )
    want = ((f - 1) * math.sqrt(probe.head_dim))[None, :, None].expand(1, -1, 2)
    torch.testing.assert_close(kern, want, rtol=1e-6, atol=0)
    assert torch.equal(kern[0, :2], torch.zeros(2, 2, dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, probe.head_dim, generator=g)[:, 0]  # what content="random" draws (seed 0)
    random = positional_kernel(probe, m, torch.tensor([0, 3]), content="random")
    torch.testing.assert_close(
        random[0, :, 0], (f - 1) * float(q.double() @ k.double()) / math.sqrt(probe.head_dim)
    )
