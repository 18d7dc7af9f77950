"""The whole input layer in one pass on CPU: gather, ``* scale``, ``+ PE``, LayerNorm, dropout.

The composition (``posenc.InputEmbedding`` on its general path) makes four passes over
``[b, s, d]`` and two fresh tensors: the gathered rows, their sum with the positional table, the
LayerNorm output, and dropout over it. This kernel (``csrc/embed_cpu.c``, built on first use)
reads each token's row of the table and its positional row once and writes the output once; the
backward pass rebuilds the LayerNorm's input from the same rows instead of storing it, and
recomputes the dropout mask from its seed. Nothing but the output (and ``[b, s]`` row statistics
saved for backward) is allocated per call.

Numbers: the LayerNorm's mean and variance are summed in 16 float32 lanes, the lanes in float64
(and the gamma/beta gradients in float64), so outputs agree with ``nn.LayerNorm`` to float32
rounding (within ~1e-6, not bit for bit); the dropout mask is
:mod:`posenc.kernels.dropout_cpu`'s for the same seed, so ``Dropout`` and this kernel drop the
same elements.

Used for: float32 CPU tensors, an even ``d``, a positional table that needs no gradient
(sinusoidal, or none), LayerNorm with weight and bias, or none; in eager mode and in compiled
graphs alike through the registered operators ``posenc::input_layer_cpu`` (and its backward,
``posenc::input_layer_cpu_backward``), with fake implementations. Tracing, ``torch.export`` and
``torch.func`` transforms run the composition.

Legend: ``V`` vocabulary, ``d`` width, ``b`` batch, ``s`` sequence length, ``n = b * s`` rows.
"""

from __future__ import annotations

import array
import ctypes

import torch

from . import _cbuild, _memory, _settings
from . import dropout_cpu as _dropout_cpu

__all__ = ["available", "input_layer", "usable"]

_SOURCE = _cbuild.source("embed_cpu")
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
    """Whether :func:`input_layer` takes these: float32 CPU, fast paths on, outside tracing and
    ``torch.func`` transforms (under ``torch.compile`` the op ``posenc::input_layer_cpu`` goes into
    the graph), ``weight`` ``[V, d]`` contiguous with ``d`` even, ``ids`` ``[b, s]``, ``table``
    None or ``[s, d]`` without gradient, LayerNorm parameters both ``[d]`` or both None."""
    compiling = torch.compiler.is_compiling()
    if compiling and not _settings.compiled_graph():
        return False  # torch.export or a torch.func transform under compile: the composition
    params = [t for t in (weight, norm_weight, norm_bias) if t is not None]
    if not compiling and not (
        _settings.eager(ids, *([] if table is None else [table]))
        and _settings.eager(*params, parameters=True)
    ):
        return False
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2 or ids.dim() != 2:
        return False
    d = weight.shape[1]
    if d % 2 or not weight.is_contiguous() or ids.device.type != "cpu" or ids.numel() == 0:
        return False
    if table is not None and (
        table.requires_grad or table.dtype != torch.float32 or tuple(table.shape) != (ids.shape[1], d)
    ):
        return False
    if (norm_weight is None) != (norm_bias is None):
        return False
    if norm_weight is not None and any(
        t.dtype != torch.float32 or tuple(t.shape) != (d,) or t.stride(0) != 1 or t.device.type != "cpu"
        for t in (norm_weight, norm_bias)
    ):
        return False
    return _available_when_compiled() if compiling else _settings.enabled() and available()


@torch.compiler.assume_constant_result
def _available_when_compiled() -> bool:
    """Switched on and :func:`available`, evaluated once while torch.compile traces."""
    return _settings.enabled() and available()


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


def _args(weight, ids, table, gamma, beta, out, mean, rstd, scratch, p, seed, nthreads):
    """The kernel's int64 arguments (see ``csrc/embed_cpu.c``)."""
    thr = _dropout_cpu.threshold(p) if p > 0 else 0
    ptrs = (_ptr(t) for t in (weight, ids, table, gamma, beta, out, mean, rstd, scratch))
    return array.array("q", (*ptrs, ids.numel(), weight.shape[1], ids.shape[1], thr, seed, nthreads))


def _check_ids(ids: torch.Tensor, vocab: int) -> None:
    """Every id in ``[0, V)``: the kernel reads ``W + id * d`` unchecked (callers check in eager
    mode; a compiled graph reaches here without that check)."""
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"token id {bad} is outside the vocabulary [0, {vocab}); check the tokenizer matches vocab_size"
        )


def _threads(rows: int) -> int:
    return max(1, min(torch.get_num_threads(), rows // _ROWS_PER_THREAD))


def _floats(scale: float, eps: float, p: float) -> array.array:
    return array.array("d", (scale, eps, _dropout_cpu._scale(p, torch.float32) if p > 0 else 1.0))


# ---------------------------------------------------------------------------------------------- the ops
@torch.library.custom_op("posenc::input_layer_cpu", mutates_args=(), device_types="cpu")
def input_layer_op(
    weight: torch.Tensor,
    ids: torch.Tensor,
    table: torch.Tensor | None,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    scale: float,
    eps: float,
    p: float,
    seed: torch.Tensor,
    padding_idx: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward kernel as a registered operator (eager and compiled): ``(out [b, s, d], mean [n],
    rstd [n])``; ``seed`` an int64 scalar tensor, ``padding_idx`` -1 for none. A fake
    implementation and an autograd formula (:func:`input_layer_backward_op`) are registered."""
    n, d = ids.numel(), weight.shape[1]
    nt = _threads(n)
    out = _memory.empty(*ids.shape, d, dtype=torch.float32)  # [b, s, d]
    _check_ids(ids, weight.shape[0])
    new = torch.empty if gamma is not None else torch.zeros  # no LayerNorm: defined (unused) values
    f32 = {"dtype": torch.float32, "device": "cpu"}  # what the kernel writes, whatever the defaults
    mean, rstd = new(n, **f32), new(n, **f32)  # [n] row statistics for backward
    scratch = torch.empty(nt, 2, d, **f32)  # per-thread rows: the LayerNorm input and the mask
    args = _args(weight, ids, table, gamma, beta, out, mean, rstd, scratch, p, int(seed), nt)
    floats = _floats(scale, eps, p)  # kept alive across the call: the kernel reads its buffer
    _fns()[0](args.buffer_info()[0], floats.buffer_info()[0])
    return out, mean, rstd


@input_layer_op.register_fake
def _(weight, ids, table, gamma, beta, scale, eps, p, seed, padding_idx):
    n = ids.numel()
    return weight.new_empty(*ids.shape, weight.shape[1]), weight.new_empty(n), weight.new_empty(n)


@torch.library.custom_op("posenc::input_layer_cpu_backward", mutates_args=(), device_types="cpu")
def input_layer_backward_op(
    grad: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    table: torch.Tensor | None,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    scale: float,
    eps: float,
    p: float,
    seed: torch.Tensor,
    padding_idx: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`input_layer_op` for ``grad [b, s, d]``: ``(weight [V, d], gamma [d],
    beta [d])`` (gamma's and beta's ``[0]`` without LayerNorm). The LayerNorm input is rebuilt
    from the rows and the mask from its seed."""
    grad = grad.contiguous()  # [b, s, d], read row by row
    n, d = ids.numel(), weight.shape[1]
    nt = _threads(n)
    rows = _memory.empty(*ids.shape, d, dtype=torch.float32)  # d loss / d W[id], per token
    partial = torch.zeros(nt, 2, d, dtype=torch.float64, device="cpu")  # per-thread sums for gamma, beta
    scratch = torch.empty(nt, 2, d, dtype=torch.float32, device="cpu")
    args = _args(weight, ids, table, gamma, beta, grad, mean, rstd, scratch, p, int(seed), nt)
    args.extend((rows.data_ptr(), partial.data_ptr()))
    floats = _floats(scale, eps, p)  # kept alive across the call: the kernel reads its buffer
    _fns()[1](args.buffer_info()[0], floats.buffer_info()[0])
    grad_w = torch.ops.aten.embedding_dense_backward(rows, ids, weight.shape[0], padding_idx, False)  # [V, d]
    sums = partial.sum(0).float()  # [2, d]: float64 partials, one rounding
    if gamma is None:
        return grad_w, sums.new_empty(0), sums.new_empty(0)
    return grad_w, sums[0].clone(), sums[1].clone()


@input_layer_backward_op.register_fake
def _(grad, weight, ids, table, gamma, beta, mean, rstd, scale, eps, p, seed, padding_idx):
    d = weight.shape[1] if gamma is not None else 0
    return torch.empty_like(weight), weight.new_empty(d), weight.new_empty(d)


def _setup(ctx, inputs, output) -> None:
    weight, ids, table, gamma, beta, scale, eps, p, seed, padding_idx = inputs
    _, mean, rstd = output
    ctx.save_for_backward(weight, ids, table, gamma, beta, mean, rstd, seed)
    ctx.scale, ctx.eps, ctx.p, ctx.padding_idx = scale, eps, p, padding_idx
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, grad, _grad_mean, _grad_rstd):
    weight, ids, table, gamma, beta, mean, rstd, seed = ctx.saved_tensors
    grads = input_layer_backward_op(
        grad, weight, ids, table, gamma, beta, mean, rstd, ctx.scale, ctx.eps, ctx.p, seed, ctx.padding_idx
    )
    grad_w, grad_gamma, grad_beta = grads
    if gamma is None:
        grad_gamma = grad_beta = None
    return grad_w, None, None, grad_gamma, grad_beta, None, None, None, None, None


input_layer_op.register_autograd(_backward, setup_context=_setup)


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
    if p > 0 and seed is None and torch.compiler.is_compiling():  # a graph value, drawn per call
        drawn = torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)
    else:
        seed = (_dropout_cpu._draw_seed() if seed is None else seed) if p > 0 else 0
        drawn = torch.tensor(_dropout_cpu._i64(seed % 2**64), dtype=torch.int64)
    ids = ids if ids.dtype == torch.int64 and ids.is_contiguous() else ids.long().contiguous()
    table = None if table is None else table.contiguous()
    pad = -1 if padding_idx is None else padding_idx
    out, _, _ = input_layer_op(
        weight, ids, table, norm_weight, norm_bias, float(scale), float(eps), p, drawn, pad
    )
    return out
