"""The one autograd rule of posenc's rotation ops (``posenc::rope_cpu``, ``posenc::rope_triton``):
a rotation is linear in ``x`` with an orthogonal matrix, so the gradient of ``x`` is the incoming
gradient rotated by the opposite angle (``sign -> -sign``), by the same op (itself differentiable,
so double backward works). The tables get no gradient: each op's ``takes`` refuses tables that
need one.

Legend: ``n`` tensors rotated in one call (``q`` alone, or ``q`` and ``k``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["register_rotation_autograd"]


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
