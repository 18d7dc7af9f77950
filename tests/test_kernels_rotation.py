"""Tests of posenc.kernels._rotation: the one backward of the rotation ops (rotation by the
opposite angle) passes gradcheck and gradgradcheck through the registered CPU op."""

from __future__ import annotations

import torch

from posenc.kernels import rope_cpu


def test_the_rotation_backward_is_the_opposite_rotation():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    angles = torch.rand(5, 4, dtype=torch.float64, generator=gen) * 10
    cos, sin = angles.cos(), angles.sin()

    def rotate(t):
        return rope_cpu.rope_op([t], [cos], [sin], "half", 1.0)[0]

    assert torch.autograd.gradcheck(rotate, (x,))
    assert torch.autograd.gradgradcheck(rotate, (x,))
    (grad,) = torch.autograd.grad(rotate(x).sum(), x)
    back = rope_cpu.rope_op([torch.ones_like(x)], [cos], [sin], "half", -1.0)[0]
    torch.testing.assert_close(grad, back, rtol=0, atol=0)
