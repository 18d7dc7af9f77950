"""Tests of posenc.kernels._rotation: the reference rotation the ops run where their kernel does not,
and the one backward of the rotation ops (rotation by the
opposite angle) passes gradcheck and gradgradcheck through the registered CPU op."""

from __future__ import annotations

import torch

import posenc.rotary  # noqa: F401  (hands the kernels their reference rotation)
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


def test_the_ops_fall_back_to_the_rotary_reference_handed_down_at_import():
    # the reference maths lives in posenc.rotary; the kernels get it at import and never import it
    import posenc.kernels._rotation as rotation
    from posenc.kernels import set_enabled
    from posenc.rotary import reference

    assert rotation._reference == [reference.rotate]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 10, generator=gen)
    angles = torch.rand(5, 4, generator=gen) * 10
    cos, sin = angles.cos(), angles.sin()
    set_enabled(False)  # the op runs the reference, not the C kernel
    try:
        got = rope_cpu.rope_op([x], [cos], [sin], "interleaved", -1.0)[0]
    finally:
        set_enabled(None)
    assert torch.equal(got, reference.rotate(x, cos, -sin, "interleaved"))


def test_without_the_reference_the_ops_say_what_to_import_and_triton_checks_nothing_yet(monkeypatch):
    import pytest

    import posenc.kernels._rotation as rotation
    from posenc.kernels import rope_triton

    monkeypatch.setattr(rotation, "_reference", [])
    monkeypatch.setattr(rope_triton, "_state", {})  # nothing checked yet in this process
    with pytest.raises(RuntimeError, match=r"import posenc\.rotary"):
        rotation.reference_rotation(torch.zeros(2, 4), torch.ones(2, 2), torch.zeros(2, 2), "half")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = (torch.float32, False, "half", 8, 4)
    assert rope_triton._checked(torch.device("cpu"), variant) is False
    assert (torch.device("cpu"), variant) not in rope_triton._state  # nothing remembered: checked later
