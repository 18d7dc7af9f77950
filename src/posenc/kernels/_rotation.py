"""What posenc's two rotation ops (``posenc::rope_cpu``, ``posenc::rope_triton``) share: one way
to call them (:func:`call_rotation`, :func:`call_rotations`), the reference rotation they check
their kernels against and run where a kernel does not (:func:`reference_rotation`, handed down by
:mod:`posenc.rotary.reference` through :func:`register_reference_rotation`: the maths lives with
RoPE, above the kernels), and one autograd rule (:func:`register_rotation_autograd`):
a rotation is linear in ``x`` with an orthogonal matrix, so the gradient of ``x`` is the incoming
gradient rotated by the opposite angle (``sign -> -sign``), by the same op (itself differentiable,
so double backward works). The tables get no gradient: each op's ``takes`` refuses tables that
need one.

Legend: ``n`` tensors rotated in one call (``q`` alone, or ``q`` and ``k``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _settings

__all__ = [
    "call_rotation",
    "call_rotations",
    "has_reference_rotation",
    "reference_rotation",
    "register_reference_rotation",
    "register_rotation_autograd",
]

#: ``posenc.rotary.reference.rotate``, once that module is imported (``import posenc`` does it)
_reference: list[Callable] = []


def register_reference_rotation(rotate: Callable) -> None:
    """Hand the kernels the reference rotation ``rotate(x, cos, sin, layout) -> [..., s, d_h]``
    (called once, by :mod:`posenc.rotary.reference` at import; a second call replaces the first)."""
    _reference[:] = [rotate]


def has_reference_rotation() -> bool:
    """Whether :mod:`posenc.rotary.reference` has handed the kernels their reference rotation
    (every posenc entry point to RoPE imports it; a kernel module imported alone has not)."""
    return bool(_reference)


def reference_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """The reference rotation of ``x [..., s, d_h]`` by tables ``[..., s, r/2]`` (a new tensor).

    Raises:
        RuntimeError: nothing registered it: ``posenc.rotary`` was never imported.
    """
    if not _reference:
        raise RuntimeError(
            "posenc's reference rotation is not registered yet: import posenc.rotary (any of posenc's "
            "RoPE entry points does) before calling a rotation kernel's op directly"
        )
    return _reference[0](x, cos, sin, layout)


def register_rotation_autograd(name: str, op: Callable, lib: torch.library.Library) -> None:
    """Register the backward of the op ``name`` (schema ``(xs, coss, sins, layout, sign) -> xs``,
    each a list of ``n``), computed by calling ``op`` with ``-sign``."""

    def setup(ctx, inputs, output) -> None:
        _, coss, sins, layout, sign = inputs
        ctx.save_for_backward(*coss, *sins)
        ctx.layout, ctx.sign = layout, sign

    def backward(ctx, grads):
        tables = ctx.saved_tensors
        n = len(tables) // 2
        grads = [g if g.stride(-1) == 1 else g.contiguous() for g in grads]  # the kernels read rows
        dxs = op(grads, list(tables[:n]), list(tables[n:]), ctx.layout, -ctx.sign)
        return dxs, [None] * n, [None] * n, None, None

    torch.library.register_autograd(name, backward, setup_context=setup, lib=lib)


def call_rotation(op: Callable, out_op: Callable, x, cos, sin, layout: str, out=None) -> torch.Tensor:
    """``x`` rotated by the op ``op`` (a new tensor, differentiable in ``x``), or by ``out_op`` into
    ``out`` (``x`` itself, in place, or a tensor like it: inference)."""
    if out is None:
        return call_rotations(op, [x], [cos], [sin], layout)[0]
    out_op([x], [cos], [sin], [out], layout)
    return out


def call_rotations(op: Callable, xs: list, coss: list, sins: list, layout: str) -> list[torch.Tensor]:
    """Each ``xs[i]`` rotated by ``(coss[i], sins[i])`` in one call of the op ``op`` (``q`` and ``k``
    together), out of place; with nothing for autograd to record, the call records nothing."""
    below = _settings.records_nothing(*xs)
    if below is None:
        return op(xs, coss, sins, layout, 1.0)
    with below:
        return op(xs, coss, sins, layout, 1.0)
