"""Tests of posenc.rotary.reference, and every RoPE backend against it in one grid.

The reference rotation is checked against RoFormer's formula written plainly in float64; then each
backend (the reference itself, the C kernel, the Triton kernel in its CPU interpreter) must give the
reference's numbers bit for bit, for every dtype, layout, rotary width and table shape."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.kernels import rope_cpu
from posenc.rotary.reference import ROTARY_LAYOUTS, rotate


def formula(x: torch.Tensor, angles: torch.Tensor, layout: str) -> torch.Tensor:
    """RoFormer eq. 34 pair by pair, in float64 Python loops over the last two dims of ``x [s, d]``."""
    s = x.shape[0]
    r = 2 * angles.shape[-1]
    out = x.double().clone()
    for p in range(s):
        for i in range(r // 2):
            a, b = (i, i + r // 2) if layout == "half" else (2 * i, 2 * i + 1)
            c, sn = math.cos(float(angles[p, i])), math.sin(float(angles[p, i]))
            xa, xb = float(x[p, a]), float(x[p, b])
            out[p, a], out[p, b] = xa * c - xb * sn, xb * c + xa * sn
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("d", "r"), [(8, 8), (10, 4)])
def test_reference_is_roformers_rotation(layout, d, r):
    gen = torch.Generator().manual_seed(d * r)
    x = torch.randn(5, d, generator=gen, dtype=torch.float64)
    angles = torch.rand(5, r // 2, generator=gen, dtype=torch.float64) * 7
    got = ROTARY_LAYOUTS[layout](x, angles.cos(), angles.sin(), r)  # [5, r]: the rotated part only
    torch.testing.assert_close(got, formula(x, angles, layout)[:, :r], rtol=0, atol=1e-14)


def _reference(x, cos, sin, layout):
    """The test's own reference: the layout's pair rotation in x's dtype, the rest passed through."""
    r = 2 * cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # tables in x's dtype: every product rounded to it
    return torch.cat((ROTARY_LAYOUTS[layout](x, cos, sin, r), x[..., r:]), dim=-1)


def _public(x, cos, sin, layout):
    """posenc.rotary.reference.rotate, the function the kernels fall back to and check against."""
    return rotate(x, cos.to(x.dtype), sin.to(x.dtype), layout)


def _c_kernel(x, cos, sin, layout):
    if rope_cpu.status() != "ok":
        pytest.skip(f"C kernel {rope_cpu.status()}")
    # the tables in x's dtype: float32 tables with a bf16 x select the kernel's rounded-once
    # arithmetic instead (compute_dtype=torch.float32, tested in test_rotary_apply.py)
    return rope_cpu.rotate(x.clone(), cos.to(x.dtype), sin.to(x.dtype), layout)


def _triton(x, cos, sin, layout):
    pytest.importorskip("triton", reason="Triton is not installed (pip install 'posenc[gpu]')")
    from posenc.kernels import rope_triton

    if x.dtype == torch.float64:
        pytest.skip("the Triton kernel takes float32/bfloat16/float16")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")  # CPU tensors run in Triton's interpreter
        if not rope_triton.available("cpu"):
            pytest.skip("Triton's interpreter could not run here")
        # the tables in x's dtype, as for the C kernel (float32 tables round once)
        return rope_triton.rotate(x.clone(), cos.to(x.dtype), sin.to(x.dtype), layout)


BACKENDS = {"reference": _public, "c": _c_kernel, "triton": _triton}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("d", "r", "table"), [(16, 16, "shared"), (12, 8, "shared"), (8, 8, "per_row")])
def test_every_backend_gives_the_reference_bit_for_bit(backend, dtype, layout, d, r, table):
    gen = torch.Generator().manual_seed(d + r)
    x = torch.randn(2, 3, 7, d, generator=gen, dtype=torch.float64).to(dtype)  # [b, h, s, d_h]
    shape = (7, r // 2) if table == "shared" else (2, 1, 7, r // 2)  # [s, r/2] or [b, 1, s, r/2]
    angles = torch.rand(*shape, generator=gen, dtype=torch.float64) * 100
    cos, sin = angles.cos().float(), angles.sin().float()  # float32 tables, as posenc makes them
    want = _reference(x, cos, sin, layout)
    got = BACKENDS[backend](x, cos, sin, layout)
    assert got.dtype == dtype and torch.equal(got, want)
