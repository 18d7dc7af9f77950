"""Fast CPU path of :func:`posenc.apply_rotary`: one pass over memory, in place or out of place.

The reference rotation (``posenc.rotary``) is several elementwise PyTorch ops; each one reads and
writes the whole tensor and allocates a fresh temporary, so on a CPU it runs at a fraction of the
memory bandwidth (docs/performance.md). This module does the same arithmetic in one pass: a small
C kernel (built on first use, see :mod:`posenc.kernels._cbuild`) reads each row of ``x`` once and
writes the rotated row once, in place (``out is x``) or into ``out``.

**Same numbers.** Each output is computed with the reference's operations in the reference's
order, with the reference's roundings: in float32/float64 ``x1*cos - x2*sin`` is three correctly
rounded operations (the kernel is built without FMA contraction); in bfloat16 every product and
sum is rounded to bfloat16, exactly as PyTorch's bf16 elementwise ops round. The result is
bit-identical to the reference path (tests check ``torch.equal``). Float32 tables with a bfloat16
``x`` select the rounded-once arithmetic instead (the default of :func:`posenc.apply_rotary`): float32
products and sums, each output rounded to bf16 once, bit-identical to
``(x.float() * cos - ...).to(torch.bfloat16)``. NaN encodings are not part of either contract: a
NaN stays a NaN (here ``0x7FC0`` when rounded once, as c10's scalar conversion writes it).

**One way in.** The kernel is the registered operator ``posenc::rope_cpu`` (:func:`rope_op`:
one or several tensors, ``q`` and ``k`` in one kernel call, out of place) and its inference
variant ``posenc::rope_cpu_out`` (:func:`rope_out_op`: in place or into ``out``), called the
same way in eager mode and under ``torch.compile`` (also with ``fullgraph=True``; fake
implementations are registered). :func:`takes` says which inputs the op takes; whether the C
kernel runs is decided inside the op (:func:`_kernel`): where it cannot be built (no compiler, a
failed self-check) or fast paths are switched off, the op runs the reference rotation
(:func:`posenc.rotary.reference.rotate`), with the same numbers.

**Autograd.** The rotation is linear in ``x``; its gradient is the rotation by the opposite angle,
i.e. the op with ``-sin``: the op's one autograd rule, itself differentiable, so double backward
works. Gradients with respect to ``cos``/``sin`` are not provided by the op: :func:`takes` says no
when they require grad, and the reference expression runs.

Legend: ``s`` sequence length, ``d_h`` head width, ``r`` rotary width (even, ``<= d_h``), ``...``
leading dims (``[b, h]`` for attention tensors).
"""

from __future__ import annotations

import array
import ctypes
import warnings

import torch

from . import _cbuild, _memory, _settings
from ._rotation import call_rotation, call_rotations, reference_rotation, register_rotation_autograd

__all__ = ["available", "check_out", "rope_op", "rope_out_op", "rotate", "rotate_pair", "status", "takes"]

#: The kernel's C99 source (package data, compiled on first use by :mod:`._cbuild`).
_SOURCE = _cbuild.source("rope_cpu")

_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}
#: the kernel's code for a bfloat16 x with float32 tables: float32 arithmetic, rounded once
_ONCE = 3
_LAYOUTS = {"half": 0, "interleaved": 1}
_MAX_DIMS = 8
#: elements per thread, as ATen's elementwise ops split their work (``at::internal::GRAIN_SIZE``):
#: below it one thread does the work, above it ``ceil(numel / grain)`` threads at most, so posenc
#: and PyTorch's own ops use the same threads for the same size
_GRAIN = 32768
_I64 = ctypes.c_int64
_P = ctypes.c_void_p
_state: dict[str, object] = {}


def _fn():
    """The C entry point (built and self-checked on first use), or None. Nothing is cached while
    fast paths are switched off, so switching them on later builds the kernel."""
    if "fn" not in _state:
        if not _settings.enabled():
            return None
        with _settings.outside_traces():  # may run while a graph is traced: real tensors only
            _load()
    return _state["fn"]


def _load() -> None:
    """Build, load and self-check the kernel into ``_state`` (``fn`` None where it cannot be used)."""
    lib = _cbuild.load("rope_cpu", _SOURCE)
    fn = None
    if lib is not None:
        fn = lib.posenc_rope_packed
        fn.restype = ctypes.c_int
        fn.argtypes = [_P]
        pair = lib.posenc_rope_packed2
        pair.restype = ctypes.c_int
        pair.argtypes = [_P, _P]
        _state["pair"] = pair
    _state["fn"] = fn
    if fn is not None and not _self_check():
        warnings.warn(
            "posenc: the RoPE C kernel does not reproduce the reference bit for bit with this compiler; "
            "using the PyTorch reference path",
            RuntimeWarning,
            stacklevel=3,
        )
        _state["fn"] = None
        _state["self_check_failed"] = True


def _self_check() -> bool:
    """Run the kernel once per dtype (and bf16 rounded once) and layout against PyTorch's ops: the
    reference's arithmetic, written out here so that the kernel checks itself with nothing from
    above it (:func:`status` works on its own)."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for dtype, table_dtype in (*((d, d) for d in _DTYPES), (torch.bfloat16, torch.float32)):
            x = torch.randn(3, 5, 2 * 67 + 3, generator=gen, dtype=torch.float64).to(dtype)
            angles = torch.rand(5, 67, generator=gen, dtype=torch.float64) * 100
            cos, sin = angles.cos().to(table_dtype), angles.sin().to(table_dtype)
            for layout in _LAYOUTS:
                want = x.clone()
                first, second = (
                    (slice(0, 67), slice(67, 134))
                    if layout == "half"
                    else (slice(0, 134, 2), slice(1, 134, 2))
                )
                # [3, 5, 67] each; in the tables' dtype (float32 for bf16 rounded once), cast by copy_
                a, b = x[..., first].to(table_dtype), x[..., second].to(table_dtype)
                want[..., first].copy_(a * cos - b * sin)
                want[..., second].copy_(b * cos + a * sin)
                got = _launch(_state["fn"], x, cos, sin, torch.empty_like(x), layout, 1.0)
                if not torch.equal(got, want):
                    return False
    return True


def available() -> bool:
    """Whether the C kernel could be built and loaded on this machine (builds it on first call)."""
    return _fn() is not None


def status() -> str:
    """``"ok"``, ``"self-check failed"`` (built, but not bit-identical to the reference: a bug),
    or why it was not built (``"disabled"``, ``"no compiler"``); builds it on first call."""
    if _fn() is not None:
        return "ok"
    return "self-check failed" if _state.get("self_check_failed") else _cbuild.status("rope_cpu")


def takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`posenc.apply_rotary` rotates these (already validated) inputs by the op
    ``posenc::rope_cpu`` (:func:`rotate`), in eager mode and in a ``torch.compile`` graph alike.

    True for CPU tensors of dtype float32/float64/bfloat16 with a contiguous last dim and at most
    ``8`` dims, whose ``cos``/``sin`` do not require grad (the op differentiates ``x`` only), that
    are plain tensors in eager mode (no subclass, tracing or ``torch.func`` transform) or FakeTensors
    of a graph ``torch.compile`` traces (not ``torch.export``: an exported program keeps the
    reference's aten ops). Whether the C kernel itself runs is decided inside the op
    (:func:`_kernel`): where it cannot be built, or fast paths are switched off, the op runs the
    reference rotation. (Ordered so the common case costs ~1 us: this runs on every decoding step.)
    """
    if torch.compiler.is_compiling():
        if not _settings.compiled_graph():
            return False  # torch.export or a torch.func transform under compile: the reference path
    elif not _settings.eager(x, cos, sin):
        return False  # subclasses (FakeTensor, DTensor, ...), Parameters, tracing, torch.func
    if x.dtype not in _DTYPES or not (x.is_cpu and cos.is_cpu and sin.is_cpu) or x.layout != torch.strided:
        return False
    if not 2 <= x.dim() <= _MAX_DIMS or x.stride(-1) != 1 or x.numel() == 0:
        return False
    return not ((cos.requires_grad or sin.requires_grad) and torch.is_grad_enabled())


def _kernel():
    """The C entry point when fast paths are on and the kernel built and passed its self-check,
    else None: the one decision whether the kernel runs (the op's implementations ask it)."""
    return _fn() if _settings.enabled() else None


def _table_strides(shape: torch.Size, stride: tuple[int, ...], nd: int) -> list[int]:
    """Element strides of a ``[..., s, r/2]`` table (``shape``, ``stride``) over ``nd`` row dims,
    right-aligned like broadcasting; broadcast dims (size 1 or missing) get stride 0."""
    lead = len(shape) - 1  # the table's own row dims
    if lead == 1:  # [s, r/2], positions shared by every row: the common case, without a loop
        return [0] * (nd - 1) + [stride[0] if shape[0] != 1 else 0]
    strides = [0] * nd
    for k in range(min(lead, nd)):
        if shape[lead - 1 - k] != 1:
            strides[nd - 1 - k] = stride[lead - 1 - k]
    return strides


def _args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, layout: str, sign: float):
    """The kernel's packed int64 arguments for rotating ``x`` into ``out`` (``array.array``: 4x
    cheaper to build than a ctypes array), and the tables it reads (kept alive by the caller)."""
    shape, code = x.shape, _code(x, cos, sin)
    dtype = torch.float32 if code == _ONCE else x.dtype
    nd = len(shape) - 1  # row dims [..., s]: one C row per vector of d_h values
    # the tables in x's dtype (as the reference casts them; float32 for a bf16 x rounded once), last
    # dim contiguous; their row dims are walked with stride 0 where they broadcast
    c_st, s_st = cos.stride(), sin.stride()
    if cos.dtype != dtype or c_st[-1] != 1:
        cos = cos.to(dtype).contiguous()
        c_st = cos.stride()
    if sin.dtype != dtype or s_st[-1] != 1:
        sin = sin.to(dtype).contiguous()
        s_st = sin.stride()
    c_strides = _table_strides(cos.shape, c_st, nd)
    s_strides = c_strides if s_st == c_st and sin.shape == cos.shape else _table_strides(sin.shape, s_st, nd)
    x_strides = x.stride()[:nd]
    o_strides = x_strides if out is x else out.stride()[:nd]
    n = x.numel()
    nthreads = 1 if n <= _GRAIN else min(torch.get_num_threads(), -(-n // _GRAIN))
    geometry = (shape[-1], 2 * cos.shape[-1], *shape[:-1], *x_strides, *o_strides, *c_strides, *s_strides)
    head = (code, _LAYOUTS[layout], x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr())
    args = array.array("q", (*head, nd, nthreads, 1 if sign > 0 else -1, *geometry))
    return args, (cos, sin)


def _code(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """The kernel's dtype code: x's, or :data:`_ONCE` for a bfloat16 x with float32 tables."""
    if x.dtype == torch.bfloat16 and cos.dtype == torch.float32 and sin.dtype == torch.float32:
        return _ONCE
    return _DTYPES[x.dtype]


def _launch(
    fn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, layout: str, sign: float
) -> torch.Tensor:
    """``x`` rotated by ``sign`` times its angles into ``out`` by the C entry point ``fn``."""
    args, _tables = _args(x, cos, sin, out, layout, sign)
    if fn(args.buffer_info()[0]):  # pragma: no cover - takes() rules these out
        raise RuntimeError(f"posenc rope kernel rejected shape {tuple(x.shape)} dtype {x.dtype}")
    return out


def _launch_pair(q, k, q_tables, k_tables, q_out, k_out, layout: str, sign: float) -> None:
    """``q`` and ``k`` rotated into ``q_out``/``k_out`` by one kernel call (q's rows, then k's)."""
    a, _qt = _args(q, *q_tables, q_out, layout, sign)
    b, _kt = _args(k, *k_tables, k_out, layout, sign)
    if _state["pair"](a.buffer_info()[0], b.buffer_info()[0]):  # pragma: no cover - see takes()
        raise RuntimeError(f"posenc rope kernel rejected shapes {tuple(q.shape)}, {tuple(k.shape)}")


def _rotate_into(xs, coss, sins, outs, layout: str, sign: float) -> None:
    """Each ``xs[i]`` rotated by ``sign`` times its angles into ``outs[i]`` (which may be
    ``xs[i]``): by the C kernel, q and k in one call, or by the reference rotation where the kernel
    does not run (:func:`_kernel`)."""
    fn = _kernel()
    if fn is None:
        for x, cos, sin, out in zip(xs, coss, sins, outs):
            out.copy_(reference_rotation(x, cos, sin if sign > 0 else -sin, layout))
    elif len(xs) == 2:
        _launch_pair(xs[0], xs[1], (coss[0], sins[0]), (coss[1], sins[1]), outs[0], outs[1], layout, sign)
    else:
        for x, cos, sin, out in zip(xs, coss, sins, outs):
            _launch(fn, x, cos, sin, out, layout, sign)


def check_out(x: torch.Tensor, out: object) -> None:
    """Validate ``out=`` of :func:`posenc.apply_rotary`: ``x`` itself (in place) or a separate tensor
    of ``x``'s shape/dtype/device with a contiguous last dim; never under autograd."""
    if out is x:  # in place: only autograd can object
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError(
                "out= is for inference and does not record gradients, but x requires grad: drop out= when "
                "training, or call under torch.no_grad()/torch.inference_mode()"
            )
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a tensor like x (or x itself, in place), got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must match x: shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}; got shape "
            f"{tuple(out.shape)}, dtype {out.dtype}, device {out.device}"
        )
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        raise ValueError(
            "out= is for inference and does not record gradients, but x or out requires grad: drop out= "
            "when training, or call under torch.no_grad()/torch.inference_mode()"
        )
    if out.stride(-1) != 1:
        raise ValueError(f"out must have a contiguous last dim (out.stride(-1) == 1), got {out.stride()}")
    same = out is x or (out.data_ptr() == x.data_ptr() and out.stride() == x.stride())
    shared = out.device.type != "meta" and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    if shared and not same:
        raise ValueError("out shares memory with x without being x: pass out=x (in place) or another tensor")


# --------------------------------------------------------------------------------------------- the ops
# Registered through torch.library's low-level API: a Python kernel per dispatch key, so an eager
# call costs one dispatcher round trip and imports nothing of torch.compile's stack.
_lib = torch.library.Library("posenc", "FRAGMENT")
_lib.define("rope_cpu(Tensor[] xs, Tensor[] coss, Tensor[] sins, str layout, float sign) -> Tensor[]")
_lib.define("rope_cpu_out(Tensor[] xs, Tensor[] coss, Tensor[] sins, Tensor(a!)[] outs, str layout) -> ()")


def _rope_cpu(xs, coss, sins, layout: str, sign: float) -> list[torch.Tensor]:
    """``posenc::rope_cpu``, the rotation, the one way into the kernel (eager and compiled): each
    ``xs[i] [..., s, d_h]`` rotated by ``sign`` times the angles of ``coss[i]``/``sins[i]``
    ``[..., s, r/2]`` into a new tensor with ``xs[i]``'s strides, all in one kernel call (``q`` and
    ``k`` together). Its fake implementation and its one autograd rule (the rotation by the
    opposite angle, itself this op, so double backward works) are registered below."""
    outs = [_memory.empty_like(x) for x in xs]
    _rotate_into(xs, coss, sins, outs, layout, sign)
    return outs


def _rope_cpu_out(xs, coss, sins, outs, layout: str) -> None:
    """``posenc::rope_cpu_out``: the rotation for inference, written into ``outs`` (each ``xs[i]``
    itself, in place, or a tensor like it; checked by :func:`check_out`). Not differentiable."""
    _rotate_into(xs, coss, sins, outs, layout, 1.0)


_lib.impl("rope_cpu", _rope_cpu, "CPU")
_lib.impl("rope_cpu_out", _rope_cpu_out, "CPU")
torch.library.register_fake("posenc::rope_cpu", lambda xs, *_: [torch.empty_like(x) for x in xs], lib=_lib)
torch.library.register_fake("posenc::rope_cpu_out", lambda *_: None, lib=_lib)

#: ``posenc::rope_cpu`` (see :func:`_rope_cpu`)
rope_op = torch.ops.posenc.rope_cpu.default
#: ``posenc::rope_cpu_out`` (see :func:`_rope_cpu_out`)
rope_out_op = torch.ops.posenc.rope_cpu_out.default
register_rotation_autograd("posenc::rope_cpu", rope_op, _lib)


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` dims of ``x`` by the op (inputs validated by
    :func:`posenc.apply_rotary`, ``out`` by :func:`check_out`, and :func:`takes` true).

    Args:
        x: ``[..., s, d_h]`` with ``x.stride(-1) == 1``.
        cos, sin: ``[..., s, r/2]`` broadcastable to ``x[..., :r/2]``, in ``x.dtype`` (another
            dtype is cast to it first, as the reference does), or float32 with a bfloat16 ``x``:
            then the products and sums are float32 and each output is rounded to bf16 once.
        layout: ``"half"`` or ``"interleaved"``.
        out: None (a new tensor with ``x``'s strides; differentiable in ``x``), ``x`` itself (in
            place), or a tensor of ``x``'s shape and dtype to write into.

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
    call, one kernel call; inputs validated as for :func:`rotate`, :func:`takes` true for both.

    Shapes: ``q [..., s_q, d_h]``, ``k [..., s_k, d_h]``, tables ``[..., s, r/2]`` -> ``(q, k)``.
    """
    q_out, k_out = call_rotations(
        rope_op, [q, k], [q_tables[0], k_tables[0]], [q_tables[1], k_tables[1]], layout
    )
    return q_out, k_out
