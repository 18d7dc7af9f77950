"""Tests of posenc.kerple: KERPLE's log and power kernels against the paper's formulas in float64
(Chi et al. 2022, eq. for the log and power CPD kernels), the parameter bounds, distance_bias equal to
score_bias bit for bit, gradients (gradcheck), the model invariants, compile and float64, and
``posenc verify``."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from _scheme_invariants import check_all, check_compiled, tiny_lm
from posenc.kerple import KerpleLog, KerplePower

F64 = torch.float64


def ref_kerple(
    kernel: str, r1: list[float], r2: list[float], q_pos: list[int], k_pos: list[int]
) -> torch.Tensor:
    """The paper's kernels written plainly in float64: [h, s_q, s_k]."""
    out = torch.empty(len(r1), len(q_pos), len(k_pos), dtype=F64)
    for h in range(len(r1)):
        for a, i in enumerate(q_pos):
            for b, j in enumerate(k_pos):
                d = abs(i - j)
                out[h, a, b] = -r1[h] * (math.log(1 + r2[h] * d) if kernel == "log" else d ** r2[h])
    return out


def perturb(scheme) -> None:
    scheme.r1.copy_(torch.rand(scheme.r1.shape) * 2 + 0.05)
    scheme.r2.copy_(torch.rand(scheme.r2.shape) * 1.8 + 0.05)


@pytest.mark.parametrize("cls", [KerpleLog, KerplePower])
def test_matches_the_papers_formula_in_float64(cls):
    torch.manual_seed(0)
    scheme = cls(4, dtype=F64)
    with torch.no_grad():
        perturb(scheme)
    q_pos, k_pos = [0, 3, 7, 1000, 2**31], [0, 1, 5, 7, 999, 2**31 - 3]
    got = scheme.score_bias(torch.tensor(q_pos), torch.tensor(k_pos))
    assert got.dtype == F64 and got.shape == (1, 4, 5, 6)
    want = ref_kerple(cls.kernel, scheme.r1.tolist(), scheme.r2.tolist(), q_pos, k_pos)
    torch.testing.assert_close(got[0], want, rtol=1e-12, atol=1e-12)
    # float32 parameters: the bias in float32, within float32 rounding of the same formula
    f32 = cls(4)
    with torch.no_grad():
        f32.r1.copy_(scheme.r1), f32.r2.copy_(scheme.r2)
    small = f32.score_bias(torch.arange(50), torch.arange(50))
    ref = ref_kerple(
        cls.kernel, f32.r1.double().tolist(), f32.r2.double().tolist(), list(range(50)), list(range(50))
    )
    assert small.dtype == torch.float32
    torch.testing.assert_close(small[0].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [KerpleLog, KerplePower])
def test_bounds_batched_positions_and_distance_bias(cls):
    """Parameters are used clamped to [0.01, inf) (r2 <= 2 for the power kernel); [b, s] positions
    give each row its own bias; distance_bias equals score_bias bit for bit."""
    scheme = cls(2)
    with torch.no_grad():
        scheme.r1.copy_(torch.tensor([-1.0, 3.0]))
        scheme.r2.copy_(torch.tensor([0.0, 5.0]))
    r1, r2 = scheme.parameters_used()
    assert r1.tolist() == pytest.approx([0.01, 3.0])
    assert r2.tolist() == pytest.approx([0.01, 2.0 if cls is KerplePower else 5.0])
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    both = scheme.score_bias(pos, pos)  # [2, h, 4, 4]
    for row in range(2):
        assert torch.equal(both[row], scheme.score_bias(pos[row], pos[row])[0])
    distance = torch.arange(-9, 10)
    table = scheme.distance_bias(distance)  # [h, 19]
    full = scheme.score_bias(torch.arange(10), torch.arange(10))[0]  # [h, 10, 10]
    for i in range(10):
        for j in range(10):
            assert torch.equal(full[:, i, j], table[:, j - i + 9])
    assert bool((table <= 0).all()) and torch.equal(table[:, 9], torch.zeros(2))  # 0 at distance 0


@pytest.mark.parametrize("cls", [KerpleLog, KerplePower])
def test_gradients(cls):
    """gradcheck of the bias in r1 and r2 (float64), and a finite gradient at distance 0 for the power
    kernel (d^r2's derivative in r2 is d^r2 log d, 0 * -inf there without care)."""
    scheme = cls(3, dtype=F64)
    with torch.no_grad():
        perturb(scheme)
    pos = torch.arange(6)

    def bias(r1, r2):
        with torch.no_grad():
            scheme.r1.copy_(r1), scheme.r2.copy_(r2)
        return posenc.kerple.kerple_bias(
            (pos[None] - pos[:, None]).abs().to(F64), r1.clamp_min(0.01), r2.clamp(0.01, 2.0), cls.kernel
        )

    r1 = scheme.r1.detach().clone().requires_grad_()
    r2 = scheme.r2.detach().clone().clamp(0.1, 1.9).requires_grad_()
    assert torch.autograd.gradcheck(bias, (r1, r2))
    scheme.score_bias(pos, pos).sum().backward()
    assert torch.isfinite(scheme.r1.grad).all() and torch.isfinite(scheme.r2.grad).all()


@pytest.mark.parametrize("position", ["kerple_log", "kerple_power"])
def test_model_invariants_and_float64(position):
    check_all(position, perturb)


@pytest.mark.parametrize("position", ["kerple_log", "kerple_power"])
def test_compiled_model_and_hook(position):
    check_compiled(tiny_lm(position, perturb))


def test_registered_and_verified():
    assert {"kerple_log", "kerple_power"} <= set(posenc.schemes())
    assert posenc.describe("kerple_log")["required"] == ["num_heads"]
    from posenc.analysis import verify

    results = verify(["kerple_log", "kerple_power"])
    assert results and not [r for r in results if r.status == "FAIL"]
    decay = [r for r in results if r.property == "decay"]
    assert decay and all(r.status == "pass" for r in decay)
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        posenc.build("kerple_log", num_heads=0)
