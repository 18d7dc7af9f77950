"""Tests of posenc.fire: FIRE against the paper's equations written plainly in float64 (Li et al.
2024: b(i, j) = f(psi(i - j) / psi(max(i, L))), psi(x) = log(c x + 1), f an MLP), progressive
interpolation (the MLP's input stays in [0, 1] at any length past the threshold), gradients, the
model invariants, compile and float64, and ``posenc verify``."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from _scheme_invariants import check_all, check_compiled, tiny_lm
from posenc.fire import FIRE

F64 = torch.float64


def ref_fire(scheme: FIRE, q_pos: list[int], k_pos: list[int]) -> torch.Tensor:
    """The paper's equations in float64, one pair at a time: [h, s_q, s_k]."""
    c = float(scheme.c.detach())
    big_l = abs(float(scheme.threshold_scale.detach()) * float(scheme.init_threshold))
    w1, b1 = scheme.mlp[0].weight.double()[:, 0], scheme.mlp[0].bias.double()  # [w], [w]
    w2, b2 = scheme.mlp[2].weight.double(), scheme.mlp[2].bias.double()  # [h, w], [h]

    def psi(x: float) -> float:
        return math.log(abs(c * x) + 1)

    out = torch.empty(scheme.num_heads, len(q_pos), len(k_pos), dtype=F64)
    for a, i in enumerate(q_pos):
        for b, j in enumerate(k_pos):
            x = psi(i - j) / (psi(max(i, big_l)) + scheme.eps)
            out[:, a, b] = w2 @ torch.relu(w1 * x + b1) + b2
    return out


def perturb(scheme) -> None:
    for p in scheme.mlp.parameters():
        p.copy_(torch.randn(p.shape))
    scheme.c.copy_(torch.tensor(0.3))
    scheme.threshold_scale.copy_(torch.tensor(0.01))  # L = 5.12: queries past it get normalised


def test_matches_the_papers_equations_in_float64():
    torch.manual_seed(0)
    scheme = FIRE(3, mlp_width=8, dtype=F64)
    with torch.no_grad():
        perturb(scheme)
    q_pos, k_pos = [0, 2, 5, 6, 40, 1000, 2**31], [0, 1, 5, 39, 999, 2**31 - 7]
    got = scheme.score_bias(torch.tensor(q_pos), torch.tensor(k_pos))
    assert got.dtype == F64 and got.shape == (1, 3, 7, 6)
    torch.testing.assert_close(got[0], ref_fire(scheme, q_pos, k_pos), rtol=1e-12, atol=1e-12)
    # the default (paper) initialisation: c = 0.1, L = 512, float32 within float32 rounding
    f32 = FIRE(2)
    assert float(f32.c.detach()) == pytest.approx(0.1)
    assert float(f32.threshold_scale.detach() * f32.init_threshold) == 512.0
    pos = list(range(0, 2000, 97))
    torch.testing.assert_close(
        f32.score_bias(torch.tensor(pos), torch.tensor(pos))[0].double(),
        ref_fire(f32, pos, pos),
        rtol=1e-5,
        atol=1e-5,
    )


def test_progressive_interpolation_and_batched_positions():
    """Past the threshold the MLP's input lies in [0, 1] whatever the length (the whole causal row
    maps onto the trained range); below it, the bias depends on the distance alone."""
    scheme = FIRE(2, init_threshold=8.0)
    for s in (16, 1000, 100000):
        x = scheme.normalized_distance(torch.tensor([s - 1]), torch.arange(0, s, max(1, s // 50))).detach()
        assert float(x.min()) >= 0 and float(x.max()) <= 1 + 1e-6
        assert float(x[0, 0, 0]) == pytest.approx(1.0, abs=1e-5)  # the farthest key: psi(i)/psi(i)
    short = scheme.score_bias(torch.arange(8), torch.arange(8))[0]
    for i in range(1, 8):  # below L: a function of i - j
        torch.testing.assert_close(short[:, i, : i + 1], short[:, 7, 7 - i :])
    pos = torch.tensor([[0, 1, 2, 3], [9, 10, 11, 12]])
    both = scheme.score_bias(pos, pos)
    for row in range(2):
        torch.testing.assert_close(both[row], scheme.score_bias(pos[row], pos[row])[0], rtol=0, atol=0)


def test_gradients_reach_every_parameter():
    scheme = FIRE(2, mlp_width=4, init_threshold=3.0, dtype=F64)
    pos = torch.arange(6)

    def bias(c, scale):
        with torch.no_grad():
            scheme.c.copy_(c), scheme.threshold_scale.copy_(scale)
        saved = scheme.c, scheme.threshold_scale
        del scheme.c, scheme.threshold_scale
        scheme.c, scheme.threshold_scale = c, scale  # plain tensors, so gradcheck differentiates them
        try:
            return scheme.score_bias(pos, pos)
        finally:
            del scheme.c, scheme.threshold_scale
            scheme.c, scheme.threshold_scale = saved

    c = torch.tensor(0.2, dtype=F64, requires_grad=True)
    scale = torch.tensor(1.3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(bias, (c, scale))
    scheme.score_bias(pos, pos).square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in scheme.parameters())


def test_model_invariants_and_float64():
    check_all("fire", perturb)


def test_compiled_model_and_hook():
    check_compiled(tiny_lm("fire", perturb))


def test_registered_validated_and_verified():
    assert "fire" in posenc.schemes()
    assert posenc.describe("fire")["optional"]["init_threshold"] == 512.0
    for key, value in (("mlp_width", 0), ("init_c", -1.0), ("init_threshold", 0.0), ("eps", float("nan"))):
        with pytest.raises(ValueError, match=key):
            posenc.build("fire", num_heads=2, **{key: value})
    from posenc.analysis import verify

    results = verify(["fire"])
    assert results and not [r for r in results if r.status == "FAIL"]
