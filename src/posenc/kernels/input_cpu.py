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
``posenc::input_layer_cpu_backward``), with fake implementations and one autograd rule. The ops
run the kernel, or the same layer in PyTorch ops where the kernel does not run (no compiler,
``POSENC_C_KERNELS=0``). Tracing, ``torch.export`` and ``torch.func`` transforms run the
composition of posenc's modules.

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
    """Whether :func:`input_layer` (the op ``posenc::input_layer_cpu``) takes these: float32 CPU,
    plain tensors (or parameters) in eager mode or FakeTensors of a graph ``torch.compile`` traces
    (not ``torch.export`` or ``torch.func`` transforms), ``weight`` ``[V, d]`` contiguous with ``d``
    even, ``ids`` ``[b, s]``, ``table`` None or ``[s, d]`` without gradient, LayerNorm parameters
    both ``[d]`` or both None. Whether the C kernel runs is decided inside the op (:func:`_kernel`):
    elsewhere the op runs the composition in PyTorch ops."""
    if torch.compiler.is_compiling():
        if not _settings.compiled_graph():
            return False  # torch.export or a torch.func transform under compile: the composition
    elif not (
        _settings.eager(ids, *([] if table is None else [table]))
        and _settings.eager(*[t for t in (weight, norm_weight, norm_bias) if t is not None], parameters=True)
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
    return norm_weight is None or all(
        t.dtype == torch.float32 and tuple(t.shape) == (d,) and t.stride(0) == 1 and t.device.type == "cpu"
        for t in (norm_weight, norm_bias)
    )


def _kernel():
    """``(forward, backward)`` C entry points when fast paths are on and the kernel is built, else
    None: the one decision whether the kernel runs (the ops' implementations ask it)."""
    return _fns() if _settings.enabled() else None


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
    return array.array("d", (scale, eps, _dropout_cpu.keep_scale(p, torch.float32) if p > 0 else 1.0))


# ---------------------------------------------------------------------------------------------- the ops
# Registered through torch.library's low-level API: one dispatcher round trip per eager call, and
# nothing of torch.compile's stack imported.
_lib = torch.library.Library("posenc", "FRAGMENT")
_lib.define(
    "input_layer_cpu(Tensor weight, Tensor ids, Tensor? table, Tensor? gamma, Tensor? beta, float scale, "
    "float eps, float p, Tensor seed, int padding_idx) -> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "input_layer_cpu_backward(Tensor grad, Tensor weight, Tensor ids, Tensor? table, Tensor? gamma, "
    "Tensor? beta, Tensor mean, Tensor rstd, float scale, float eps, float p, Tensor seed, int padding_idx) "
    "-> (Tensor, Tensor, Tensor)"
)


def _input_layer_cpu(weight, ids, table, gamma, beta, scale, eps, p, seed, padding_idx):
    """``posenc::input_layer_cpu``, the one way into the kernel (eager and compiled): ``(out [b, s,
    d], mean [n], rstd [n])``; ``seed`` an int64 scalar tensor, ``padding_idx`` -1 for none. A fake
    implementation and one autograd rule (``posenc::input_layer_cpu_backward``) are registered."""
    _check_ids(ids, weight.shape[0])
    fns = _kernel()
    if fns is None:
        return _composition(weight, ids, table, gamma, beta, scale, eps, p, seed)
    n, d = ids.numel(), weight.shape[1]
    nt = _threads(n)
    out = _memory.empty(*ids.shape, d, dtype=torch.float32)  # [b, s, d]
    new = torch.empty if gamma is not None else torch.zeros  # no LayerNorm: defined (unused) values
    f32 = {"dtype": torch.float32, "device": "cpu"}  # what the kernel writes, whatever the defaults
    mean, rstd = new(n, **f32), new(n, **f32)  # [n] row statistics for backward
    scratch = torch.empty(nt, 2, d, **f32)  # per-thread rows: the LayerNorm input and the mask
    args = _args(weight, ids, table, gamma, beta, out, mean, rstd, scratch, p, int(seed), nt)
    floats = _floats(scale, eps, p)  # kept alive across the call: the kernel reads its buffer
    fns[0](args.buffer_info()[0], floats.buffer_info()[0])
    return out, mean, rstd


def _input_layer_cpu_backward(
    grad, weight, ids, table, gamma, beta, mean, rstd, scale, eps, p, seed, padding_idx
):
    """``posenc::input_layer_cpu_backward``: gradients of the forward op for ``grad [b, s, d]``:
    ``(weight [V, d], gamma [d], beta [d])`` (gamma's and beta's ``[0]`` without LayerNorm). The
    LayerNorm input is rebuilt from the rows and the mask from its seed."""
    fns = _kernel()
    if fns is None:
        return _composition_backward(
            grad, weight, ids, table, gamma, beta, mean, rstd, scale, eps, p, seed, padding_idx
        )
    grad = grad.contiguous()  # [b, s, d], read row by row
    n, d = ids.numel(), weight.shape[1]
    nt = _threads(n)
    rows = _memory.empty(*ids.shape, d, dtype=torch.float32)  # d loss / d W[id], per token
    partial = torch.zeros(nt, 2, d, dtype=torch.float64, device="cpu")  # per-thread sums for gamma, beta
    scratch = torch.empty(nt, 2, d, dtype=torch.float32, device="cpu")
    args = _args(weight, ids, table, gamma, beta, grad, mean, rstd, scratch, p, int(seed), nt)
    args.extend((rows.data_ptr(), partial.data_ptr()))
    floats = _floats(scale, eps, p)  # kept alive across the call: the kernel reads its buffer
    fns[1](args.buffer_info()[0], floats.buffer_info()[0])
    grad_w = torch.ops.aten.embedding_dense_backward(rows, ids, weight.shape[0], padding_idx, False)  # [V, d]
    sums = partial.sum(0).float()  # [2, d]: float64 partials, one rounding
    if gamma is None:
        return grad_w, sums.new_empty(0), sums.new_empty(0)
    return grad_w, sums[0].clone(), sums[1].clone()


# ------------------------------------------------------------------------- without the kernel: PyTorch ops
def _normed_input(weight, ids, table, scale):
    """``weight[ids] * scale (+ table)``: the LayerNorm's input ``[b, s, d]``."""
    x = torch.nn.functional.embedding(ids, weight) * scale  # [b, s] -> [b, s, d]
    return x if table is None else x + table  # + [s, d]


def _composition(weight, ids, table, gamma, beta, scale, eps, p, seed):
    """The forward op in PyTorch ops: the same layer (LayerNorm to float32 rounding, the kernel's
    dropout mask for ``seed``), for where the kernel does not run."""
    x = _normed_input(weight, ids, table, scale)
    n, d = ids.numel(), weight.shape[1]
    if gamma is None:
        out, mean, rstd = x, x.new_zeros(n), x.new_zeros(n)
    else:
        out, mean, rstd = torch.native_layer_norm(x, [d], gamma, beta, eps)  # stats [b, s, 1]
        mean, rstd = mean.reshape(n), rstd.reshape(n)
    if p > 0:
        out = _dropout_cpu.reference_dropout(out, p, int(seed) % 2**64)
    return out.contiguous(), mean, rstd


def _composition_backward(
    grad, weight, ids, table, gamma, beta, mean, rstd, scale, eps, p, seed, padding_idx
):
    """The backward op in PyTorch ops (see :func:`_composition`): the dropout mask again from the
    seed, LayerNorm's backward on the rebuilt input, the rows' gradient scattered to the table."""
    if p > 0:
        grad = _dropout_cpu.reference_dropout(grad, p, int(seed) % 2**64)  # the same mask and scale
    if gamma is not None:
        x = _normed_input(weight, ids, table, scale)
        stats = (*ids.shape, 1)
        grad, grad_gamma, grad_beta = torch.ops.aten.native_layer_norm_backward(
            grad, x, [weight.shape[1]], mean.view(stats), rstd.view(stats), gamma, beta, [True, True, True]
        )
    else:
        grad_gamma = grad_beta = grad.new_empty(0)
    grad_w = torch.ops.aten.embedding_dense_backward(grad * scale, ids, weight.shape[0], padding_idx, False)
    return grad_w, grad_gamma, grad_beta


def _fake(weight, ids, table, gamma, beta, scale, eps, p, seed, padding_idx):
    n = ids.numel()
    return weight.new_empty(*ids.shape, weight.shape[1]), weight.new_empty(n), weight.new_empty(n)


def _fake_backward(grad, weight, ids, table, gamma, beta, mean, rstd, scale, eps, p, seed, padding_idx):
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


_lib.impl("input_layer_cpu", _input_layer_cpu, "CPU")
_lib.impl("input_layer_cpu_backward", _input_layer_cpu_backward, "CPU")
torch.library.register_fake("posenc::input_layer_cpu", _fake, lib=_lib)
torch.library.register_fake("posenc::input_layer_cpu_backward", _fake_backward, lib=_lib)
torch.library.register_autograd("posenc::input_layer_cpu", _backward, setup_context=_setup, lib=_lib)

#: ``posenc::input_layer_cpu`` (see :func:`_input_layer_cpu`)
input_layer_op = torch.ops.posenc.input_layer_cpu.default
#: ``posenc::input_layer_cpu_backward`` (see :func:`_input_layer_cpu_backward`)
input_layer_backward_op = torch.ops.posenc.input_layer_cpu_backward.default


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
    drawn = _dropout_cpu.seed_tensor(seed if p > 0 else 0)  # int64 [], drawn when None
    ids = ids if ids.dtype == torch.int64 and ids.is_contiguous() else ids.long().contiguous()
    table = None if table is None else table.contiguous()
    pad = -1 if padding_idx is None else padding_idx
    out, _, _ = input_layer_op(
        weight, ids, table, norm_weight, norm_bias, float(scale), float(eps), p, drawn, pad
    )
    return out
