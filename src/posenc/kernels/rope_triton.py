"""RoPE on GPUs: one Triton kernel that rotates queries and keys in a single launch.

Used by :func:`posenc.apply_rotary` for CUDA tensors when Triton is installed (one tensor per call)
and by :func:`rotate_pair` (``q`` and ``k`` in one launch). It computes what the PyTorch reference
computes, in the same order and with the same roundings: each product and each sum of
``x1*cos - x2*sin`` / ``x2*cos + x1*sin`` is rounded to the tensor's dtype, as PyTorch's elementwise
ops round each result, and the compiler is told not to fuse multiplies and adds (no FMA); with
float32 tables and a bf16/fp16 tensor (:func:`posenc.apply_rotary`'s default) the products and
sums stay float32 and each output is rounded once, as the reference's rounded-once path. Pairs
are ``(i, i + r/2)`` ("half") or ``(2i, 2i + 1)`` ("interleaved"); dims ``r..d_h`` pass through
(copied when the output is a new tensor); the tables may broadcast over any of the leading dims
(shared positions ``[s, r/2]``, per-token positions ``[b, 1, s, r/2]``, packed/varlen sequences
``[total, r/2]`` with ``x`` viewed as ``[1, h, total, d_h]``). The backward pass is the rotation by
the opposite angle (``sign = -1``), the same kernel.

**Status.** Written and tested for correctness with Triton's interpreter on CPU
(``TRITON_INTERPRET=1``, tests/test_kernels_rope_triton.py, bit-identical to the reference for
float32, bfloat16 and float16). It has not yet run on a GPU: no GPU was lent to the sessions that
wrote it. On first use on a GPU it checks itself against the PyTorch reference and, on any
difference or error, warns and leaves every call to the reference path. Its speed against
Liger-Kernel and flash-attention's rotary is still to be measured on a GPU.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence, ``d_h`` head width, ``r`` rotary width.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings

import torch

from . import _settings

__all__ = ["available", "rotate", "rotate_pair", "takes", "usable"]

_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_LAYOUTS = {"half": 0, "interleaved": 1}
_BLOCK_ROWS = 16
_state: dict[str, object] = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton():
    """``(triton, kernel)`` or None when Triton is not installed."""
    if "mod" not in _state:
        _state["mod"] = None
        if importlib.util.find_spec("triton") is not None:
            try:
                _state["mod"] = _build()
            except Exception as err:  # pragma: no cover - a broken Triton install
                warnings.warn(
                    f"posenc: Triton present but unusable ({err}); RoPE uses PyTorch",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _state["mod"]


def _build():
    import triton

    from . import _rope_triton_jit  # the @triton.jit functions (module level, as Triton needs)

    return triton, _rope_triton_jit.rope_pair_kernel


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
def _as4(t: torch.Tensor) -> torch.Tensor:
    """``[..., s, n]`` with at most 4 dims -> a ``[b, h, s, n]`` view (leading 1s added)."""
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t


def _operands(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> list:
    """Pointers, sizes and element strides of one tensor's rotation, in the kernel's argument order."""
    half = cos.shape[-1]
    # tables in the dtype the arithmetic reads (float32 rounded once, else x's, as the reference
    # casts them), broadcast to x's rows without copying
    dtype = torch.float32 if _rounded_once(x, cos) else x.dtype
    c = cos.to(dtype).expand(*x.shape[:-1], half)
    s = sin.to(dtype).expand(*x.shape[:-1], half)
    if c.stride() != s.stride() or c.stride(-1) != 1:
        c, s = c.contiguous(), s.contiguous()
    x4, o4, c4 = _as4(x), _as4(out), _as4(c)
    b, h, n_s, _ = x4.shape
    return [x4, o4, c4, _as4(s), b * h * n_s, h, n_s, *x4.stride()[:3], *o4.stride()[:3], *c4.stride()[:3]]


def _rounded_once(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """Float32 tables with a bf16/fp16 ``x`` select float32 arithmetic rounded once (the default of
    :func:`posenc.apply_rotary`), as on the CPU kernel; tables in ``x``'s dtype, every operation rounded."""
    return x.dtype in (torch.bfloat16, torch.float16) and cos.dtype == torch.float32


def _launch(
    pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]], layout: str, sign: float
) -> None:
    """Rotate one or two ``(x, cos, sin, out)`` in a single launch (they share ``d_h`` and ``r``)."""
    triton, kernel = _triton()
    x, cos, _, _ = pairs[0]
    half, d = cos.shape[-1], x.shape[-1]
    first = _operands(*pairs[0])
    second = _operands(*pairs[1]) if len(pairs) > 1 else [*first[:4], 0, *first[5:]]  # no rows
    progs1 = triton.cdiv(first[4], _BLOCK_ROWS)
    grid = (progs1 + triton.cdiv(second[4], _BLOCK_ROWS),)
    copy_rest = 2 * half < d and any(o.data_ptr() != xx.data_ptr() for xx, _, _, o in pairs)
    kwargs = {} if _interpreting() else {"enable_fp_fusion": False}  # no FMA: the reference's roundings
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():  # x's GPU, not the current
        kernel[grid](
            *first,
            progs1,
            *second,
            half,
            d,
            float(sign),
            INTERLEAVED=_LAYOUTS[layout] == 1,
            ROUND=_DTYPES[x.dtype],
            ONCE=_rounded_once(x, cos),
            COPY_REST=copy_rest,
            BLOCK_ROWS=_BLOCK_ROWS,
            BLOCK_PAIRS=triton.next_power_of_2(half),
            BLOCK_REST=64,
            **kwargs,
        )


def _into(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, layout: str, sign: float
) -> torch.Tensor:
    """One tensor's rotation into ``out``."""
    _launch([(x, cos, sin, out)], layout, sign)
    return out


def _device_ok(x: torch.Tensor) -> bool:
    return x.is_cuda or (_interpreting() and x.device.type == "cpu")


def usable(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`posenc.apply_rotary` should use :func:`rotate` for these (validated) inputs:
    :func:`takes` them, and fast paths are not switched off (``POSENC_C_KERNELS=0``)."""
    return _settings.enabled() and takes(x, cos, sin)


def takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the kernel can rotate ``x``: CUDA tensors (CPU ones under ``TRITON_INTERPRET=1``) of
    dtype float32/bfloat16/float16, at most 4 dims, contiguous last dim, tables without gradients,
    outside ``torch.compile``, with Triton installed and its self-check passed on this device."""
    if torch.compiler.is_compiling() or not _settings.eager(x, cos, sin):
        return False
    if x.dtype not in _DTYPES or not _device_ok(x) or cos.device != x.device or sin.device != x.device:
        return False
    if not 2 <= x.dim() <= 4 or x.stride(-1) != 1 or x.numel() == 0 or cos.dim() > x.dim():
        return False
    if (cos.requires_grad or sin.requires_grad) and torch.is_grad_enabled():
        return False
    return available(x.device)


def available(device: torch.device | str | None = None) -> bool:
    """Whether the kernel can run here (Triton importable; on ``device``, its first-use self-check
    against the PyTorch reference passed)."""
    if _triton() is None:
        return False
    if device is None:
        return True
    key = ("checked", str(device))
    if key not in _state:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False  # no self-check inside CUDA-graph capture (it copies and syncs); try later
        _state[key] = False
        try:
            _state[key] = _self_check(torch.device(device))
        except Exception as err:  # compilation or launch failure on this device
            warnings.warn(
                f"posenc: the Triton RoPE kernel failed on {device} ({type(err).__name__}: {err}); "
                "using the PyTorch reference path",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        if not _state[key]:
            warnings.warn(
                f"posenc: the Triton RoPE kernel does not reproduce the reference on {device}; "
                "using the PyTorch reference path",
                RuntimeWarning,
                stacklevel=3,
            )
    return bool(_state[key])


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a == b`` elementwise with NaN equal to NaN (payloads may differ between implementations)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


def _self_check(device: torch.device) -> bool:
    """The kernel against posenc's reference expression, every dtype and pairing, partial rotary."""
    from .rope_reference import ROTARY_LAYOUTS  # the reference rotation

    gen = torch.Generator().manual_seed(1234)
    for dtype in _DTYPES:
        x = torch.randn(2, 3, 5, 2 * 13 + 3, generator=gen)
        x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])  # specials survive
        x = x.to(device=device, dtype=dtype)
        angles = torch.rand(5, 13, generator=gen, dtype=torch.float64) * 100
        cos, sin = angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)
        for layout in _LAYOUTS:
            out = torch.empty_like(x)
            _launch([(x, cos, sin, out)], layout, 1.0)
            want = torch.cat((ROTARY_LAYOUTS[layout](x, cos, sin, 26), x[..., 26:]), dim=-1)
            if not same_values(out, want):
                return False
            if dtype != torch.float32:  # rounded once: float32 tables, the float32 expression cast once
                c32, s32 = cos.float(), sin.float()
                _launch([(x, c32, s32, out)], layout, 1.0)
                once = ROTARY_LAYOUTS[layout](x.float(), c32, s32, 26).to(dtype)
                if not same_values(out, torch.cat((once, x[..., 26:]), dim=-1)):
                    return False
    return True


class _Rotation(torch.autograd.Function):
    """Out-of-place rotation by the Triton kernel; backward is the same kernel with the opposite
    angle (itself differentiable, so double backward works)."""

    @staticmethod
    def forward(ctx, x, cos, sin, layout, sign):  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        ctx.layout, ctx.sign = layout, sign
        return _into(x, cos, sin, torch.empty_like(x), layout, sign)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()  # the kernel reads rows
        return _Rotation.apply(grad, cos, sin, ctx.layout, -ctx.sign), None, None, None, None


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` dims of ``x`` (validated by
    :func:`posenc.apply_rotary`, :func:`usable` true).

    Args:
        x: ``[..., s, d_h]`` (at most 4 dims), last dim contiguous.
        cos, sin: ``[..., s, r/2]`` broadcastable to ``x[..., :r/2]``.
        layout: ``"half"`` or ``"interleaved"``.
        out: None (a new tensor, differentiable in ``x``), ``x`` (in place) or a tensor like ``x``.
    """
    if out is not None:
        return _into(x, cos, sin, out, layout, 1.0)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rotation.apply(x, cos, sin, layout, 1.0)
    return _into(x, cos, sin, torch.empty_like(x), layout, 1.0)


def rotate_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_q: torch.Tensor,
    sin_q: torch.Tensor,
    cos_k: torch.Tensor,
    sin_k: torch.Tensor,
    layout: str = "half",
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q [b, h, s_q, d_h]`` and ``k [b, h_kv, s_k, d_h]`` in one kernel launch (inference:
    no autograd). Tables ``[..., s, r/2]`` as for :func:`rotate`; ``inplace`` writes into q and k.

    Returns:
        ``(q_rotated, k_rotated)``.
    """
    for x, c, s in ((q, cos_q, sin_q), (k, cos_k, sin_k)):
        if not takes(x, c, s):
            raise ValueError(
                f"rotate_pair needs CUDA float32/bfloat16/float16 tensors of at most 4 dims with a "
                f"contiguous last dim and Triton installed; got {tuple(x.shape)} {x.dtype} on {x.device}"
            )
    if q.shape[-1] != k.shape[-1] or cos_q.shape[-1] != cos_k.shape[-1] or q.dtype != k.dtype:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share d_h, r and dtype")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        raise ValueError("rotate_pair is for inference: call it under torch.no_grad(), or use apply_rotary")
    out_q, out_k = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
    _launch([(q, cos_q, sin_q, out_q), (k, cos_k, sin_k, out_k)], layout, 1.0)
    return out_q, out_k
