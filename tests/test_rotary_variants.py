"""Tests of posenc.rotary.variants: XPos (Sun et al.'s zeta, distance-only logits,
rotary-embedding-torch parity, overflow limit) and Rope2D (Heo et al.'s axial form)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _rotary_refs import F64, angle_tol, ref_rotate, ref_xpos


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_xpos_matches_paper_reference(layout):
    torch.manual_seed(0)
    xpos = posenc.build("xpos", head_dim=16, layout=layout)
    q, k = torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16)
    pos = torch.arange(1000, 1030)
    oq, ok = xpos.rotate(q, k, pos, pos)
    for x, out, sign in ((q, oq, 1.0), (k, ok, -1.0)):
        ref = ref_xpos(x, pos, 16, sign, layout)
        big = (3.5 ** (1030 / 512)) if sign < 0 else 1.0  # largest xPos scale here: zeta_0^(-m/gamma)
        # float32 angle error, plus float32 rounding of the exponential scale
        torch.testing.assert_close(
            out.double(), ref, rtol=1e-5, atol=angle_tol(1030) * x.abs().max().item() * big
        )


@settings(deadline=None, max_examples=30)
@given(m=st.integers(0, 3000), n=st.integers(0, 3000), t=st.integers(0, 3000), seed=st.integers(0, 2**16))
def test_property_xpos_logit_depends_only_on_distance(m, n, t, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    xpos = posenc.build("xpos", head_dim=16)

    def logit(a, b):
        rq, rk = xpos.rotate(q, k, torch.tensor([a]), torch.tensor([b]))
        return (rq * rk).sum()

    torch.testing.assert_close(logit(m, n), logit(m + t, n + t), rtol=1e-3, atol=1e-4)


def test_xpos_logits_match_rotary_embedding_torch():
    """rotary-embedding-torch re-centres positions on seq_len // 2 each call; logits are the same."""
    ret = pytest.importorskip("rotary_embedding_torch")
    torch.manual_seed(0)
    peer = ret.RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=512)
    ours = posenc.build("xpos", head_dim=16, layout="interleaved")
    q, k = torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)
    pq, pk = peer.rotate_queries_and_keys(q, k)
    oq, ok = ours.rotate(q, k)
    torch.testing.assert_close(oq @ ok.mT, pq @ pk.mT, rtol=1e-4, atol=1e-4)


def test_xpos_refuses_positions_that_overflow():
    xpos = posenc.build("xpos", head_dim=16)
    limit = xpos.max_position(torch.float16)
    q = torch.randn(1, 1, 1, 16, dtype=torch.float16)
    xpos.rotate(q, q, torch.tensor([limit]), torch.tensor([limit]))
    with pytest.raises(
        ValueError, match=r"k_positions reach 5000 but xPos scales .* torch.float16 past \|m\| = 3966"
    ):
        xpos.rotate(q, q, torch.tensor([10]), torch.tensor([5000]))
    # |ln zeta_0| = ln(1.4 / 0.4); fp16 underflows below 2^-14, float32 overflows above ~2^128
    assert limit == int(512 * 14 * math.log(2) / math.log(3.5)) == 3966
    f32 = torch.finfo(torch.float32)
    assert xpos.max_position(torch.float32) == int(
        512 * min(math.log(f32.max), -math.log(f32.tiny)) / math.log(3.5)
    )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_2d_matches_axial_reference(layout):
    torch.manual_seed(0)
    d, rows, cols = 16, 3, 4
    m = posenc.build("rope_2d", head_dim=d, grid=(rows, cols), layout=layout)
    q = torch.randn(2, 2, rows * cols, d)
    oq, _ = m.rotate(q, q)
    # Heo et al. 2024 (axial): pairs 0..r/4-1 turn with the row, r/4..r/2-1 with the column
    coords = torch.tensor([(y, x) for y in range(rows) for x in range(cols)])
    inv = 10000.0 ** (-torch.arange(0, d // 2, 2, dtype=F64) / (d // 2))
    angles = torch.cat((coords[:, :1] * inv, coords[:, 1:] * inv), dim=-1)
    torch.testing.assert_close(oq.double(), ref_rotate(q, angles, layout), rtol=1e-5, atol=1e-5)
    explicit, _ = m.rotate(q, q, coords, coords[None].expand(2, -1, -1))
    torch.testing.assert_close(explicit, oq, rtol=0, atol=0)


@settings(deadline=None, max_examples=30)
@given(
    a=st.tuples(st.integers(0, 500), st.integers(0, 500)),
    b=st.tuples(st.integers(0, 500), st.integers(0, 500)),
    t=st.tuples(st.integers(-200, 200), st.integers(-200, 200)),
    seed=st.integers(0, 2**16),
)
def test_property_rope_2d_relative_per_axis(a, b, t, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 16, dtype=F64, generator=g), torch.randn(1, 1, 1, 16, dtype=F64, generator=g)
    m = posenc.build("rope_2d", head_dim=16)

    def logit(p, r):
        rq, rk = m.rotate(q, k, torch.tensor([p]), torch.tensor([r]))
        return (rq * rk).sum()

    shifted = logit((a[0] + t[0], a[1] + t[1]), (b[0] + t[0], b[1] + t[1]))
    torch.testing.assert_close(logit(a, b), shifted, rtol=1e-4, atol=1e-4)


def test_rope_2d_errors():
    with pytest.raises(ValueError, match="rotary_dim must be a multiple of 4, got 6"):
        posenc.build("rope_2d", head_dim=6)
    m = posenc.build("rope_2d", head_dim=8)
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"q_positions is None .* build rope_2d with grid=\(rows, cols\)"):
        m.rotate(q, q)
    with pytest.raises(ValueError, match=r"k_positions must have shape \[s, 2\] or \[b, s, 2\] with s = 4"):
        m.rotate(q, q, torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"grid must be a \(rows, cols\) pair"):
        posenc.build("rope_2d", head_dim=8, grid=4)


def test_xpos_float64_is_finite_up_to_its_own_limit():
    """In float64 xPos's range check accepts |m| up to 289,519, but its scales were computed in float32
    and overflowed from 36,261 (NaN); they are now float64, so every accepted position is finite and
    the logit of a query and key at one position is their plain dot product."""
    xpos = posenc.build("xpos", head_dim=16)
    limit = xpos.max_position(torch.float64)
    assert limit == 289_519
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for p in (36_260, 36_261, 100_000, limit):
        a, b = xpos(q, q, torch.tensor([p]))
        assert bool(torch.isfinite(a).all() and torch.isfinite(b).all()), p
        torch.testing.assert_close((a * b).sum(), (q * q).sum(), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="289519"):
        xpos(q, q, torch.tensor([limit + 1]))
