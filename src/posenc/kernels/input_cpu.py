"""The whole input layer in one pass on CPU: gather, ``* scale``, ``+ PE``, LayerNorm, dropout.

The composition (``posenc.InputEmbedding`` on its general path) makes four passes over
``[b, s, d]`` and two fresh tensors: the gathered rows, their sum with the positional table, the
LayerNorm output, and dropout over it. This kernel (``csrc/embed_cpu.c``, built on first use)
reads each token's row of the table and its positional row once and writes the output once; the
backward pass rebuilds the LayerNorm's input from the same rows instead of storing it, and
recomputes the dropout mask from its seed. Nothing but the output (and ``[b, s]`` row statistics
saved for backward) is allocated per call.

Numbers: the LayerNorm's mean and variance are accumulated in float64, so outputs agree with
``nn.LayerNorm`` to float32 rounding (within ~1e-6, not bit for bit); the dropout mask is
:mod:`posenc.kernels.dropout_cpu`'s for the same seed, so ``Dropout`` and this kernel drop the
same elements.

Used for: float32 CPU tensors in eager mode (not under ``torch.compile``/tracing/``torch.func``:
there the composition runs), an even ``d``, a positional table that needs no gradient
(sinusoidal, or none), LayerNorm with weight and bias, or none.

Legend: ``V`` vocabulary, ``d`` width, ``b`` batch, ``s`` sequence length, ``n = b * s`` rows.
"""

from __future__ import annotations

import array
import ctypes
from importlib import resources

import torch

from . import _cbuild, _memory, _settings
from . import dropout_cpu as _dropout_cpu

__all__ = ["available", "input_layer", "usable"]

_SOURCE = (resources.files(__package__) / "csrc" / "embed_cpu.c").read_text(encoding="utf-8")
_P = ctypes.c_void_p
_state: dict[str, object] = {}
#: rows per thread below which one thread does the work (a row is d floats: ~3 KB at d = 768)
_ROWS_PER_THREAD = 64


def _fns():
    """``(forward, backward)`` C entry points (built on first use), or None."""
    if "fns" not in _state:
        if not _settings.enabled():
            return None
        lib = _cbuild.load("embed_cpu", _SOURCE)
        fns = None
        if lib is not None:
            fns = (lib.posenc_embed_forward, lib.posenc_embed_backward)
            for fn in fns:
                fn.restype, fn.argtypes = ctypes.c_int, [_P, _P]
        _state["fns"] = fns
    return _state["fns"]


def available() -> bool:
    """Whether the kernel could be built on this machine (builds it on first call)."""
    return _fns() is not None


def usable(weight, ids, table, norm_weight, norm_bias) -> bool:
    """Whether :func:`input_layer` takes these: float32 CPU, eager mode, fast paths on, ``weight``
    ``[V, d]`` contiguous with ``d`` even, ``ids`` ``[b, s]``, ``table`` None or ``[s, d]`` without
    gradient, LayerNorm parameters both ``[d]`` or both None."""
    if torch.compiler.is_compiling() or not (
        _settings.eager(ids) and _settings.eager(weight, parameters=True)
    ):
        return False
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2 or ids.dim() != 2:
        return False
    d = weight.shape[1]
    if d % 2 or not weight.is_contiguous() or ids.device.type != "cpu" or ids.numel() == 0:
        return False
    if table is not None and (
        table.requires_grad or table.dtype != torch.float32 or table.shape != (ids.shape[1], d)
    ):
        return False
    if (norm_weight is None) != (norm_bias is None):
        return False
    if norm_weight is not None and any(
        t.dtype != torch.float32 or t.shape != (d,) for t in (norm_weight, norm_bias)
    ):
        return False
    return _settings.enabled() and available()


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _args(weight, ids, table, gamma, beta, out, mean, rstd, scratch, p, seed, nthreads):
    """The kernel's int64 arguments (see ``csrc/embed_cpu.c``)."""
    ptr = _ptr
    thr = _dropout_cpu.threshold(p) if p > 0 else 0
    return array.array(
        "q",
        (
            ptr(weight), ptr(ids), ptr(table), ptr(gamma), ptr(beta), ptr(out), ptr(mean), ptr(rstd),
            ptr(scratch), ids.numel(), weight.shape[1], ids.shape[1], thr, _dropout_cpu._i64(seed), nthreads,
        ),
    )  # fmt: skip


def _threads(rows: int) -> int:
    return max(1, min(torch.get_num_threads(), rows // _ROWS_PER_THREAD))


class _InputLayer(torch.autograd.Function):
    """Forward and backward of the fused input layer (see the module docstring)."""

    @staticmethod
    def forward(ctx, weight, gamma, beta, ids, table, scale, eps, p, seed, padding_idx):  # type: ignore[override]
        n, d = ids.numel(), weight.shape[1]
        nt = _threads(n)
        out = _memory.empty(*ids.shape, d, dtype=torch.float32)  # [b, s, d]
        mean, rstd = torch.empty(n), torch.empty(n)  # [n] row statistics for backward
        scratch = torch.empty(nt, 2, d)  # per-thread rows: the LayerNorm input and the mask
        floats = array.array("d", (scale, eps, _dropout_cpu._scale(p, torch.float32) if p > 0 else 1.0))
        args = _args(weight, ids, table, gamma, beta, out, mean, rstd, scratch, p, seed, nt)
        _fns()[0](args.buffer_info()[0], floats.buffer_info()[0])
        ctx.save_for_backward(weight, gamma, beta, ids, table, mean, rstd)
        ctx.floats, ctx.p, ctx.seed, ctx.padding_idx = floats, p, seed, padding_idx
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        weight, gamma, beta, ids, table, mean, rstd = ctx.saved_tensors
        grad = grad.contiguous()  # [b, s, d], read row by row
        n, d = ids.numel(), weight.shape[1]
        nt = _threads(n)
        rows = _memory.empty(*ids.shape, d, dtype=torch.float32)  # d loss / d W[id], per token
        partial = torch.zeros(nt, 2, d, dtype=torch.float64)  # per-thread sums for gamma, beta
        scratch = torch.empty(nt, 2, d)
        args = _args(weight, ids, table, gamma, beta, grad, mean, rstd, scratch, ctx.p, ctx.seed, nt)
        args.extend((rows.data_ptr(), partial.data_ptr()))
        _fns()[1](args.buffer_info()[0], ctx.floats.buffer_info()[0])
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        grad_w = torch.ops.aten.embedding_dense_backward(rows, ids, weight.shape[0], pad, False)  # [V, d]
        sums = partial.sum(0).float()  # [2, d]: float64 partials, one rounding
        grad_gamma = sums[0] if gamma is not None and ctx.needs_input_grad[1] else None
        grad_beta = sums[1] if beta is not None and ctx.needs_input_grad[2] else None
        return grad_w, grad_gamma, grad_beta, None, None, None, None, None, None, None


def input_layer(
    weight: torch.Tensor,
    ids: torch.Tensor,
    *,
    scale: float,
    table: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    eps: float,
    p: float,
    padding_idx: int | None,
    seed: int | None = None,
) -> torch.Tensor:
    """``dropout(LayerNorm(weight[ids] * scale + table), p)`` in one pass (:func:`usable` true;
    ids checked by the caller).

    Args:
        weight: ``[V, d]`` token table. ids: ``[b, s]`` integer. table: ``[s, d]`` positional rows
            shared by the batch, or None. norm_weight, norm_bias: LayerNorm's ``[d]``, or None (no
            LayerNorm). eps: LayerNorm's. p: dropout rate (0: none). padding_idx: the token row
            that gets no gradient. seed: the dropout seed (default: drawn from PyTorch's generator).

    Returns:
        ``[b, s, d]`` float32.
    """
    if p > 0 and seed is None:
        seed = _dropout_cpu._draw_seed()
    ids = ids if ids.dtype == torch.int64 and ids.is_contiguous() else ids.long().contiguous()
    table = None if table is None else table.contiguous()
    args = (ids, table, float(scale), float(eps), p, seed or 0, padding_idx)
    return _InputLayer.apply(weight, norm_weight, norm_bias, *args)
