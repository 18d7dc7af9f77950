"""Dropout whose random bits cost almost nothing: a counter-based generator in a one-pass C kernel.

PyTorch's CPU dropout draws one Bernoulli sample per element from a stateful generator
(``bernoulli_``) into a float noise tensor, then multiplies: on an input embedding of
``[8, 2048, 768]`` the mask generation alone took 73 of 173 ms (docs/performance.md). Here the
keep/drop decision of element ``i`` is a pure function of ``(seed, i)``::

    u_i = SplitMix64(seed + (i // 2 + 1) * 0x9E3779B97F4A7C15)  -> two 32-bit halves, one per element
    keep_i = u_i >= t,  t = round(p * 2^32)

so the forward pass computes and applies it in the same pass over ``x``, and
:func:`reference_dropout` computes the very same mask with PyTorch integer ops where the kernel
cannot run (no compiler, ``POSENC_C_KERNELS=0``): a seed gives one mask on every machine,
and the backward pass recomputes it from the seed instead of storing a mask (no saved tensor).
The seed is drawn from PyTorch's default generator on every call, so ``torch.manual_seed`` makes
runs reproducible (the masks differ from ``nn.Dropout``'s, which uses another generator, but not
between machines: see :func:`reference_dropout`).

**A correct dropout.** Each element is kept with probability ``1 - t / 2^32``, i.e. ``p`` is
quantized to a multiple of ``2^-32`` (at most ``1.2e-10`` away), and kept elements are scaled by
``1 / (1 - p)``, computed and applied exactly as ``torch.nn.functional.dropout`` does
(``x * (1 / (1 - p))`` with the scale rounded to ``x``'s dtype): given the same mask, the output is
bit-identical to PyTorch's, including signed zeros and NaN propagation. SplitMix64 is the
generator Java's ``SplittableRandom`` uses; its outputs pass BigCrush.

**One way in.** Eager calls and compiled graphs alike call the registered op
``posenc::dropout_cpu`` (:data:`dropout_op`: fake implementation, one autograd rule); the op runs
the kernel, or :func:`reference_dropout`'s PyTorch ops where the kernel does not run.

Legend: ``n`` number of elements of ``x`` (any shape; the mask follows the contiguous order).
"""

from __future__ import annotations

import ctypes

import torch

from . import _cbuild, _memory, _settings

__all__ = [
    "available",
    "draw_seed",
    "dropout",
    "dropout_op",
    "keep_mask",
    "keep_scale",
    "reference_dropout",
    "reference_keep_mask",
    "seed_tensor",
    "usable",
]

#: The kernel's C99 source (package data, compiled on first use by :mod:`._cbuild`).
_SOURCE = _cbuild.source("dropout_cpu")

_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}
_SERIAL_NUMEL = 1 << 20
_state: dict[str, object] = {}


def _fn():
    """The C entry point (built on first use), or None; nothing cached while switched off."""
    if "fn" not in _state:
        if not _settings.enabled():
            return None
        with _settings.outside_traces():  # may run while a graph is traced
            lib = _cbuild.load("dropout_cpu", _SOURCE)
        fn = None
        if lib is not None:
            fn = lib.posenc_dropout
            fn.restype = ctypes.c_int
            fn.argtypes = [
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_uint32,
                ctypes.c_double,
                ctypes.c_uint64,
                ctypes.c_int,
            ]
        _state["fn"] = fn
    return _state["fn"]


def available() -> bool:
    """Whether the C kernel could be built and loaded on this machine."""
    return _fn() is not None


def status() -> str:
    """``"ok"``, or why the kernel is not in use (``"disabled"``, ``"no compiler"``)."""
    return "ok" if _fn() is not None else _cbuild.status("dropout_cpu")


def usable(x: torch.Tensor) -> bool:
    """Whether :func:`dropout` takes ``x`` (the op ``posenc::dropout_cpu``, eager and compiled): a
    strided CPU tensor of dtype float32/float64/bfloat16 with elements, a plain tensor in eager mode
    (no subclass, tracing or ``torch.func`` transform) or a FakeTensor of a graph ``torch.compile``
    traces (not ``torch.export``). Whether the C kernel runs is decided inside the op
    (:func:`_kernel`): elsewhere it draws the same mask with PyTorch ops."""
    if torch.compiler.is_compiling():
        if not _settings.compiled_graph():
            return False  # torch.export or a torch.func transform under compile: the reference path
    elif not _settings.eager(x):
        return False  # subclasses, Parameters, tracing, torch.func transforms: the reference path
    return x.device.type == "cpu" and x.layout == torch.strided and x.dtype in _DTYPES and x.numel() > 0


def _kernel():
    """The C entry point when fast paths are on and the kernel is built, else None: the one
    decision whether the kernel runs (the op's implementation asks it)."""
    return _fn() if _settings.enabled() else None


def threshold(p: float) -> int:
    """``round(p * 2^32)``: an element is dropped when its 32-bit draw is below it."""
    return min(round(p * 2.0**32), 2**32 - 1)


def keep_scale(p: float, dtype: torch.dtype) -> float:
    """``1 / (1 - p)`` computed as PyTorch's dropout computes its noise value: in ``dtype``."""
    return (torch.ones((), dtype=dtype) / (1 - p)).item()


def _launch(x: torch.Tensor, out: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    n = x.numel()
    nthreads = 1 if n < _SERIAL_NUMEL else torch.get_num_threads()
    scale = keep_scale(p, x.dtype)
    err = _fn()(_DTYPES[x.dtype], x.data_ptr(), out.data_ptr(), n, threshold(p), scale, seed, nthreads)
    if err:  # pragma: no cover - usable() and _kernel() rule this out
        raise RuntimeError(f"posenc dropout kernel rejected dtype {x.dtype}")
    return out


def draw_seed() -> int:
    """A 64-bit seed from PyTorch's default CPU generator (advances it, like any random op)."""
    return int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)) % 2**64


# --------------------------------------------------------------------------------------------- the op
# Registered through torch.library's low-level API: one dispatcher round trip per eager call, and
# nothing of torch.compile's stack imported.
_lib = torch.library.Library("posenc", "FRAGMENT")
_lib.define("dropout_cpu(Tensor x, float p, Tensor seed) -> Tensor")


def _dropout_cpu(x: torch.Tensor, p: float, seed: torch.Tensor) -> torch.Tensor:
    """``posenc::dropout_cpu``, the one way into the kernel (eager and compiled): ``x`` with the
    mask of ``seed`` (an int64 scalar tensor, read as unsigned) applied, into a new contiguous
    tensor; where the kernel does not run (:func:`_kernel`), the same mask drawn with PyTorch ops.
    A fake implementation and one autograd rule (the same mask on the gradient) are registered."""
    u = int(seed) % 2**64
    if _kernel() is None:
        return reference_dropout(x, p, u).contiguous()
    x = x.contiguous()  # the mask follows the contiguous order
    return _launch(x, _memory.empty_like(x), p, u)


def _dropout_setup(ctx, inputs, output) -> None:
    _, p, seed = inputs
    ctx.save_for_backward(seed)
    ctx.p = p


def _dropout_backward(ctx, grad):
    (seed,) = ctx.saved_tensors
    return dropout_op(grad, ctx.p, seed), None, None


_lib.impl("dropout_cpu", _dropout_cpu, "CPU")
torch.library.register_fake(
    "posenc::dropout_cpu",
    lambda x, p, seed: torch.empty_like(x, memory_format=torch.contiguous_format),
    lib=_lib,
)
torch.library.register_autograd(
    "posenc::dropout_cpu", _dropout_backward, setup_context=_dropout_setup, lib=_lib
)

#: ``posenc::dropout_cpu`` (see :func:`_dropout_cpu`)
dropout_op = torch.ops.posenc.dropout_cpu.default


def dropout(x: torch.Tensor, p: float, *, inplace: bool = False, seed: int | None = None) -> torch.Tensor:
    """Training-mode dropout of ``x`` by the op ``posenc::dropout_cpu`` (call only when :func:`usable`).

    Args:
        x: any shape.
        p: drop probability in ``(0, 1)``.
        inplace: write the result into ``x`` and return ``x`` (it must not be needed by anything
            else); the op computes into a new tensor that is then copied into ``x``.
        seed: the 64-bit stream to use; default a fresh one from PyTorch's generator.

    Returns:
        ``x`` scaled by ``1 / (1 - p)`` where kept, zero where dropped; differentiable in ``x``.
    """
    y = dropout_op(x, p, seed_tensor(seed))
    return x.copy_(y) if inplace else y


def seed_tensor(seed: int | None) -> torch.Tensor:
    """The op's ``seed`` argument: ``seed`` (any int, read modulo ``2^64``) as an int64 scalar
    tensor with the same 64 bits, or one drawn from PyTorch's generator when None (in a compiled
    graph a graph value, drawn per call)."""
    if seed is None and torch.compiler.is_compiling():
        return torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)
    return torch.tensor(_i64((draw_seed() if seed is None else seed) % 2**64), dtype=torch.int64)


def keep_mask(shape: tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """The boolean keep-mask that the C kernel applies for ``seed`` (for tests and inspection)."""
    ones = torch.ones(shape, dtype=torch.float64)
    return _launch(ones, ones, p, seed % 2**64) != 0


# ----------------------------------------------------------------------------------------------
# Reference: the same counter-based mask in PyTorch integer ops
# ----------------------------------------------------------------------------------------------
def _i64(u: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return u - 2**64 if u >= 2**63 else u


_GOLDEN, _M1, _M2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _srl(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical shift right of int64 bits (``>>`` on int64 is arithmetic: clear the sign copies)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def reference_keep_mask(n: int, p: float, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The kernel's keep/drop decision for elements ``0..n-1``: bool ``[n]``, True = kept.

    Pair ``j`` (elements ``2j`` and ``2j + 1``) draws ``r = SplitMix64(seed + (j + 1) * golden)``;
    element ``2j`` keeps when the low 32 bits are ``>= t``, ``2j + 1`` when the high 32 bits are
    (``t = round(p * 2^32)``). int64 products wrap exactly as the C kernel's uint64 ones.
    """
    j = torch.arange((n + 1) // 2, dtype=torch.int64, device=device)  # [n/2] pair index
    z = (j + 1) * _GOLDEN + _i64(seed % 2**64)  # [n/2], wrapping
    z = (z ^ _srl(z, 30)) * _M1
    z = (z ^ _srl(z, 27)) * _M2
    z = z ^ _srl(z, 31)
    draws = torch.stack((z & 0xFFFFFFFF, _srl(z, 32)), dim=-1).flatten()[:n]  # [n/2, 2] -> [n] 32-bit draws
    return draws >= threshold(p)


def reference_dropout(x: torch.Tensor, p: float, seed: int | None = None) -> torch.Tensor:
    """What :func:`dropout` computes, without the kernel: the same mask for the same ``seed`` (drawn
    from PyTorch's generator the same way when None), the same scale rounded to ``x``'s dtype.

    Shapes: ``x [...]`` (any layout; the mask follows the contiguous order) -> ``[...]``.
    """
    seed = draw_seed() if seed is None else seed % 2**64
    keep = reference_keep_mask(x.numel(), p, seed, x.device).view(x.shape)  # [...] in contiguous order
    scale = torch.tensor(keep_scale(p, x.dtype), dtype=x.dtype, device=x.device)  # 1/(1-p) in x's dtype
    return x * torch.where(keep, scale, torch.zeros((), dtype=x.dtype, device=x.device))
