"""RoPE on GPUs: the registered op ``posenc::rope_triton``, one Triton kernel that rotates one
tensor, or queries and keys together, in a single launch.

**Same numbers.** The kernel computes what the PyTorch reference (:mod:`posenc.rotary.reference`)
computes, in the same order and with the same roundings: each product and each sum of
``x1*cos - x2*sin`` / ``x2*cos + x1*sin`` is rounded to the tensor's dtype, as PyTorch's elementwise
ops round each result, and the compiler is told not to fuse multiplies and adds (no FMA); with
float32 tables and a bf16/fp16 tensor (:func:`posenc.apply_rotary`'s default) the products and
sums stay float32 and each output is rounded once, as the reference's rounded-once path. Pairs
are ``(i, i + r/2)`` ("half") or ``(2i, 2i + 1)`` ("interleaved"); dims ``r..d_h`` pass through
(copied when the output is a new tensor); the tables may broadcast over any of the leading dims
(shared positions ``[s, r/2]``, per-token positions ``[b, 1, s, r/2]``, packed/varlen sequences
``[total, r/2]`` with ``x`` viewed as ``[1, h, total, d_h]``). On first use on a device the kernel
checks each variant it compiles (dtype, arithmetic, pairing, widths) against the reference; on any
difference or error it warns and the op runs the reference rotation for that variant.

**One way in.** As the CPU kernel (:mod:`posenc.kernels.rope_cpu`), the kernel is a registered
operator: ``posenc::rope_triton`` (:func:`rope_op`, out of place, one or several tensors, ``q`` and
``k`` in one launch) and ``posenc::rope_triton_out`` (:func:`rope_out_op`, in place or into
``out``), with a fake implementation, called the same way in eager mode and under
``torch.compile`` (also ``fullgraph=True``). :func:`takes` is the one decision whether
:func:`posenc.apply_rotary` calls the op; whether the Triton kernel itself runs is decided inside
the op (:func:`_kernel`: fast paths on, Triton importable, self-check passed on the device),
which otherwise runs the reference rotation, with the same numbers. The op has its own name
rather than a CUDA kernel under ``posenc::rope_cpu``: the two kernels take different inputs
(float16 here, float64 there; at most 4 dims here), and Triton's interpreter
(``TRITON_INTERPRET=1``, how it is tested without a GPU) runs it on CPU tensors, which a shared
op's CPU key would have to take away from the C kernel. Its CPU implementation runs the kernel
only under the interpreter (the reference otherwise); :func:`takes` never sends an ordinary CPU
tensor to it.

**Autograd.** The rotation is linear in ``x``; its gradient is the rotation by the opposite angle,
i.e. the op with ``-sin``: the op's one autograd rule, itself differentiable, so double backward
works. Tables that require grad are not taken (:func:`takes`): the reference expression runs.

Importing this module imports neither Triton nor ``torch._dynamo``: Triton is imported at the op's
first real launch.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence, ``d_h`` head width, ``r`` rotary width.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings

import torch

from . import _settings
from ._rotation import (
    call_rotation,
    call_rotations,
    has_reference_rotation,
    reference_rotation,
    register_rotation_autograd,
)

__all__ = ["available", "rope_op", "rope_out_op", "rotate", "rotate_pair", "same_values", "status", "takes"]

_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_LAYOUTS = {"half": 0, "interleaved": 1}
_BLOCK_ROWS = 16
_NUM_WARPS = 4
_MAX_DIMS = 4
#: whether Triton can be imported (looked up once, without importing it)
_INSTALLED = importlib.util.find_spec("triton") is not None
_state: dict[object, object] = {}


def _interpreting() -> bool:
    """Triton's interpreter is on (``TRITON_INTERPRET=1``): the kernel then runs on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton():
    """``(triton, kernel)``, imported on first use, or None when Triton is missing or broken."""
    if "mod" not in _state:
        _state["mod"] = None
        if _INSTALLED:
            try:
                import triton

                from . import _rope_triton_jit  # the @triton.jit functions (module level, as Triton needs)

                _state["mod"] = (triton, _rope_triton_jit.rope_pair_kernel)
            except Exception as err:  # pragma: no cover - a broken Triton install
                _state["error"] = f"{type(err).__name__}: {err}"
                warnings.warn(
                    f"posenc: Triton present but unusable ({err}); RoPE uses PyTorch",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _state["mod"]


# ----------------------------------------------------------------------------------- the decisions
def _fits(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """The kernel's own limits on one tensor: dtype, 2..4 dims, contiguous last dim, not empty."""
    return (
        x.dtype in _DTYPES
        and x.layout == torch.strided
        and 2 <= x.dim() <= _MAX_DIMS
        and cos.dim() <= x.dim()
        and x.stride(-1) == 1
        and x.numel() > 0
    )


def takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`posenc.apply_rotary` rotates these (already validated) inputs by the op
    ``posenc::rope_triton`` (:func:`rotate`), in eager mode and in a ``torch.compile`` graph alike:
    the one decision for this kernel.

    True, with Triton installed, for CUDA tensors (CPU ones only under ``TRITON_INTERPRET=1``) of
    dtype float32/bfloat16/float16, 2 to 4 dims, a contiguous last dim, tables on the same device
    that do not require grad (the op differentiates ``x`` only), that are plain tensors in eager
    mode (no subclass, tracing or ``torch.func`` transform) or FakeTensors of a graph
    ``torch.compile`` traces (not ``torch.export``: an exported program keeps the reference's aten
    ops). Whether the Triton kernel itself runs is decided inside the op (:func:`_kernel`)."""
    if not (x.is_cuda or (x.device.type == "cpu" and _interpreting())):  # is_cuda first: no env read
        return False  # first: CPU tensors that reach here (float16, ...) pay one check
    if torch.compiler.is_compiling():
        if not _settings.compiled_graph():
            return False  # torch.export or a torch.func transform under compile: the reference path
    elif not _settings.eager(x, cos, sin):
        return False  # subclasses (FakeTensor, DTensor, ...), Parameters, tracing, torch.func
    if cos.device != x.device or sin.device != x.device or not _fits(x, cos):
        return False
    if (cos.requires_grad or sin.requires_grad) and torch.is_grad_enabled():
        return False
    return _INSTALLED


def _variant(x: torch.Tensor, cos: torch.Tensor, layout: str) -> tuple:
    """What one compiled kernel fixes for rotating ``x`` by ``cos``'s angles: x's dtype, the
    arithmetic (rounded once or per operation), the pairing, ``d_h`` and ``r/2``."""
    return (x.dtype, _rounded_once(x, cos), layout, x.shape[-1], cos.shape[-1])


#: the variants :func:`available` and :func:`status` check: every dtype, arithmetic and pairing, on
#: an odd width (unaligned rows) with partial rotary (26 of 29 dims)
_CHECKED = tuple(
    (dtype, once, layout, 29, 13)
    for dtype in _DTYPES
    for once in ((False,) if dtype == torch.float32 else (False, True))
    for layout in _LAYOUTS
)


def _kernel(device: torch.device, variant: tuple):
    """``(triton, kernel)`` when the Triton kernel runs ``variant`` (:func:`_variant`) on
    ``device``: fast paths on, Triton importable, a CUDA device (or the CPU under the interpreter),
    the variant's first-use self-check passed there; else None, and the op runs the reference
    rotation. The op's implementations ask it."""
    if not _settings.enabled() or not (device.type == "cuda" or (device.type == "cpu" and _interpreting())):
        return None
    if device.type == "cuda" and not torch.cuda.is_available():  # a CPU-only torch: nothing to check
        return None
    mod = _triton()
    if mod is None:
        return None
    return mod if _checked(device, variant) else None


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` as the GPU it means now (``cuda:N``): a tensor's device always has its index, so
    the self-check state is kept once per GPU, whichever way the device is named."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _checked(device: torch.device, variant: tuple) -> bool:
    """Whether ``variant`` passed its self-check on ``device`` (run on first use, then remembered):
    each variant the op meets is compiled and checked once, so a model pays for what it uses."""
    device = _indexed(device)
    key = (device, variant)  # CPU devices reach here only under the interpreter
    if key not in _state:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False  # no self-check inside CUDA-graph capture (it copies and syncs): try later
        if not has_reference_rotation():
            return False  # nothing to check against before posenc.rotary is imported: try later
        _state[key] = False
        arithmetic = "rounded once" if variant[1] else "every operation rounded"
        what = f"{device} ({variant[0]}, {arithmetic}, {variant[2]} pairs)"
        try:
            with _settings.outside_traces(), torch.no_grad():  # real tensors, even while a graph is traced
                _state[key] = _self_check(device, *variant)
        except Exception as err:  # compilation or launch failure on this device
            _state[("error", str(device))] = f"{type(err).__name__}: {err}"
            warnings.warn(
                f"posenc: the Triton RoPE kernel failed on {what}: {type(err).__name__}: {err}; "
                "using the PyTorch reference path",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        if not _state[key]:
            warnings.warn(
                f"posenc: the Triton RoPE kernel does not reproduce the reference on {what}; "
                "using the PyTorch reference path",
                RuntimeWarning,
                stacklevel=3,
            )
    return bool(_state[key])


def available(device: torch.device | str | None = None) -> bool:
    """Whether the kernel runs here: fast paths on and Triton importable; with ``device``, also
    that the self-check against the PyTorch reference passes there for every dtype, arithmetic and
    pairing (run now where not yet run)."""
    if device is None:
        return _settings.enabled() and _triton() is not None
    device = torch.device(device)
    return all([_kernel(device, variant) is not None for variant in _CHECKED])  # each one checked


def status(device: torch.device | str) -> str:
    """``"ok"`` (the kernel runs on ``device``, see :func:`available`), or why not: ``"disabled"``
    (fast paths off), ``"not installed"``, ``"unusable: ..."`` (Triton fails to import), ``"not a
    CUDA device"``, ``"failed: ..."`` (compiling or launching a self-check raised), ``"self-check
    failed"``."""
    device = torch.device(device)
    if available(device):
        return "ok"
    if not _settings.enabled():
        return "disabled"
    if not _INSTALLED:
        return "not installed"
    if _triton() is None:
        return f"unusable: {_state.get('error')}"
    if not (device.type == "cuda" or (device.type == "cpu" and _interpreting())):
        return "not a CUDA device"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "CUDA not available"
    error = _state.get(("error", str(_indexed(device))))
    return f"failed: {error}" if error else "self-check failed"


# ------------------------------------------------------------------------------------- host side
def _as4(t: torch.Tensor) -> torch.Tensor:
    """``[..., s, n]`` with at most 4 dims -> a ``[b, h, s, n]`` view (leading 1s added)."""
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t


def _rounded_once(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """Float32 tables with a bf16/fp16 ``x`` select float32 arithmetic rounded once (the default of
    :func:`posenc.apply_rotary`), as on the CPU kernel; tables in ``x``'s dtype, every operation rounded."""
    return x.dtype in (torch.bfloat16, torch.float16) and cos.dtype == torch.float32


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


def _launch(
    jobs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]], layout: str, sign: float
) -> None:
    """Rotate one or two ``(x, cos, sin, out)`` in a single launch (two only where
    :func:`_together`): programs ``[0, progs1)`` take the first tensor's rows, the rest the second's."""
    triton, kernel = _triton()
    x, cos, _, _ = jobs[0]
    half, d = cos.shape[-1], x.shape[-1]
    first = _operands(*jobs[0])
    second = _operands(*jobs[1]) if len(jobs) > 1 else [*first[:4], 0, *first[5:]]  # no rows
    progs1 = triton.cdiv(first[4], _BLOCK_ROWS)
    grid = (progs1 + triton.cdiv(second[4], _BLOCK_ROWS),)
    copy_rest = 2 * half < d and any(o.data_ptr() != xx.data_ptr() for xx, _, _, o in jobs)
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
            num_warps=_NUM_WARPS,
            **kwargs,
        )


def _together(a: tuple, b: tuple) -> bool:
    """Whether two jobs ``(x, cos, sin, out)`` share what one launch fixes: device, dtype, ``d_h``,
    ``r`` and arithmetic (rounded once or not)."""
    return (
        a[0].device == b[0].device
        and a[0].dtype == b[0].dtype
        and a[0].shape[-1] == b[0].shape[-1]
        and a[1].shape[-1] == b[1].shape[-1]
        and _rounded_once(a[0], a[1]) == _rounded_once(b[0], b[1])
    )


def _rotate_into(xs, coss, sins, outs, layout: str, sign: float) -> None:
    """Each ``xs[i]`` rotated by ``sign`` times its angles into ``outs[i]`` (which may be
    ``xs[i]``): by the Triton kernel, two tensors per launch where they fit together, or by the
    reference rotation where the kernel does not run (:func:`_kernel`) or cannot take a tensor."""
    fast = []
    for job in zip(xs, coss, sins, outs):
        x, cos, sin, out = job
        if _fits(x, cos) and out.stride(-1) == 1 and _kernel(x.device, _variant(x, cos, layout)) is not None:
            fast.append(job)
        else:
            out.copy_(reference_rotation(x, cos, sin if sign > 0 else -sin, layout))
    while fast:
        launch = fast[:2] if len(fast) > 1 and _together(fast[0], fast[1]) else fast[:1]
        _launch(launch, layout, sign)
        fast = fast[len(launch) :]


# ------------------------------------------------------------------------------------- self-check
def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a == b`` elementwise with NaN equal to NaN (payloads may differ between implementations)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


def _self_check(device: torch.device, dtype: torch.dtype, once: bool, layout: str, d: int, half: int) -> bool:
    """One variant of the kernel (see :func:`_variant`) against posenc's reference rotation: a
    q-and-k launch with shapes and tables of their own (rows that fill no whole block), NaN and
    infinities, into new tensors (dims ``2 * half..d`` copied)."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(2, 3, 5, d, generator=gen)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf")])[: min(3, d)]
    x[0, 0, 0, : len(specials)] = specials  # they come out as the reference gives them
    x = x.to(device=device, dtype=dtype)
    k = torch.randn(2, 1, 7, d, generator=gen).to(device=device, dtype=dtype)
    angles = torch.rand(7, half, generator=gen, dtype=torch.float64) * 100
    table_dtype = torch.float32 if once else dtype  # float32 tables select the rounded-once arithmetic
    cos, sin = angles.cos().to(device, table_dtype), angles.sin().to(device, table_dtype)
    out, k_out = torch.empty_like(x), torch.empty_like(k)
    _launch([(x, cos[:5], sin[:5], out), (k, cos, sin, k_out)], layout, 1.0)
    return same_values(out, reference_rotation(x, cos[:5], sin[:5], layout)) and same_values(
        k_out, reference_rotation(k, cos, sin, layout)
    )


# ---------------------------------------------------------------------------------------- the ops
# Registered through torch.library's low-level API, as posenc::rope_cpu: a Python kernel per
# dispatch key, so an eager call costs one dispatcher round trip and imports nothing of
# torch.compile's stack.
_lib = torch.library.Library("posenc", "FRAGMENT")
_lib.define("rope_triton(Tensor[] xs, Tensor[] coss, Tensor[] sins, str layout, float sign) -> Tensor[]")
_lib.define("rope_triton_out(Tensor[] xs, Tensor[] coss, Tensor[] sins, Tensor(a!)[] outs, str layout) -> ()")


def _rope_triton(xs, coss, sins, layout: str, sign: float) -> list[torch.Tensor]:
    """``posenc::rope_triton``, the one way into the kernel (eager and compiled): each
    ``xs[i] [..., s, d_h]`` rotated by ``sign`` times the angles of ``coss[i]``/``sins[i]``
    ``[..., s, r/2]`` into a new tensor like ``xs[i]`` (``q`` and ``k`` in one launch). Its fake
    implementation and its one autograd rule (the rotation by the opposite angle, itself this op,
    so double backward works) are registered below."""
    outs = [torch.empty_like(x) for x in xs]
    _rotate_into(xs, coss, sins, outs, layout, sign)
    return outs


def _rope_triton_out(xs, coss, sins, outs, layout: str) -> None:
    """``posenc::rope_triton_out``: the rotation for inference, written into ``outs`` (each
    ``xs[i]`` itself, in place, or a tensor like it; checked by :func:`posenc.apply_rotary`)."""
    _rotate_into(xs, coss, sins, outs, layout, 1.0)


# CUDA, and CPU for Triton's interpreter (the reference rotation there otherwise, see _kernel)
for _key in ("CUDA", "CPU"):
    _lib.impl("rope_triton", _rope_triton, _key)
    _lib.impl("rope_triton_out", _rope_triton_out, _key)
torch.library.register_fake("posenc::rope_triton", lambda xs, *_: [torch.empty_like(x) for x in xs], lib=_lib)
torch.library.register_fake("posenc::rope_triton_out", lambda *_: None, lib=_lib)

#: ``posenc::rope_triton`` (see :func:`_rope_triton`)
rope_op = torch.ops.posenc.rope_triton.default
#: ``posenc::rope_triton_out`` (see :func:`_rope_triton_out`)
rope_out_op = torch.ops.posenc.rope_triton_out.default
register_rotation_autograd("posenc::rope_triton", rope_op, _lib)


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` dims of ``x`` by the op (inputs validated by
    :func:`posenc.apply_rotary`, ``out`` checked there, and :func:`takes` true).

    Args:
        x: ``[..., s, d_h]`` (2 to 4 dims), last dim contiguous.
        cos, sin: ``[..., s, r/2]`` broadcastable to ``x[..., :r/2]``, in ``x.dtype``, or float32
            with a bf16/fp16 ``x``: then the products and sums are float32 and each output is
            rounded once.
        layout: ``"half"`` or ``"interleaved"``.
        out: None (a new tensor, differentiable in ``x``), ``x`` (in place) or a tensor like ``x``.

    Returns:
        ``[..., s, d_h]``: the new tensor, or ``out``.
    """
    return call_rotation(rope_op, rope_out_op, x, cos, sin, layout, out)


def rotate_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    q_tables: tuple[torch.Tensor, torch.Tensor],
    k_tables: tuple[torch.Tensor, torch.Tensor],
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rotate` of ``q`` and of ``k`` (out of place, each by its own ``(cos, sin)``) in one op
    call, one kernel launch where they share dtype, ``d_h`` and ``r``; inputs validated as for
    :func:`rotate`, :func:`takes` true for both. Differentiable in ``q`` and ``k``.

    Shapes: ``q [..., s_q, d_h]``, ``k [..., s_k, d_h]``, tables ``[..., s, r/2]`` -> ``(q, k)``.
    """
    q_out, k_out = call_rotations(
        rope_op, [q, k], [q_tables[0], k_tables[0]], [q_tables[1], k_tables[1]], layout
    )
    return q_out, k_out
