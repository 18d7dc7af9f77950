"""The token gather of :class:`posenc.TokenEmbedding` into a buffer that does not fault per 4 KiB.

``nn.functional.embedding`` writes the gathered rows into a fresh tensor, and on CPU a large fresh
tensor pays a page fault per 4 KiB on first write (see :mod:`posenc.kernels._memory`): for
``[8, 2048]`` ids and ``d = 768`` the gather took 44 ms into fresh pages and 16 ms into a
huge-page buffer. :func:`gather` does the same gather (``index_select`` of the rows, so the values
are identical) into :func:`posenc.kernels._memory.empty`, with the same gradient as
``nn.functional.embedding`` (``embedding_dense_backward``, ``padding_idx`` rows get none).

Legend: ``V`` vocabulary size, ``d`` width, ``...`` the ids' shape (``[b, s]``).
"""

from __future__ import annotations

import torch

from . import _memory, _settings

__all__ = ["gather", "usable"]

#: below this many output bytes the plain gather is as fast (no huge pages are used anyway)
_MIN_BYTES = 4 << 20


def usable(weight: torch.Tensor, ids: torch.Tensor) -> bool:
    """Whether :func:`gather` is worth it and allowed: plain CPU tensors, big enough output, huge
    pages available, fast paths switched on, outside ``torch.compile``/tracing/functorch transforms."""
    if torch.compiler.is_compiling() or not (
        _settings.eager(ids) and _settings.eager(weight, parameters=True)
    ):
        return False
    if weight.device.type != "cpu" or ids.device.type != "cpu" or weight.dim() != 2:
        return False
    if ids.numel() * weight.shape[1] * weight.element_size() < _MIN_BYTES:
        return False
    return _settings.enabled() and _memory.hugepages_enabled()


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, ids, padding_idx):  # type: ignore[override]
        ctx.save_for_backward(ids)
        ctx.num_weights, ctx.padding_idx = weight.shape[0], padding_idx
        out = _memory.empty(*ids.shape, weight.shape[1], dtype=weight.dtype, device=weight.device)  # [..., d]
        # rows written through a [n, d] view of the same memory (n = ids.numel()); out is returned
        torch.index_select(weight, 0, ids.reshape(-1), out=out.view(-1, weight.shape[1]))
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        grad_weight = torch.ops.aten.embedding_dense_backward(grad, ids, ctx.num_weights, pad, False)
        return grad_weight, None, None


def gather(weight: torch.Tensor, ids: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """``nn.functional.embedding(ids, weight, padding_idx)`` into a huge-page buffer.

    Args:
        weight: ``[V, d]``.
        ids: integer ``[...]`` in ``[0, V)`` (checked by the caller).
        padding_idx: the row that receives no gradient, or None.

    Returns:
        ``[..., d]``, a fresh contiguous tensor.
    """
    return _Gather.apply(weight, ids, padding_idx)
