"""Applying RoPE: :func:`apply_rotary` (one op on the fast paths, the reference otherwise) and the
query/key axis orders.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d_h`` head width, ``r`` rotary width.
"""

from __future__ import annotations

import torch

from .._validate import check_choice, check_int
from ..kernels import rope_cpu as _rope_cpu
from ..kernels import rope_triton as _rope_triton
from . import reference as _rope_reference
from .reference import ROTARY_LAYOUTS

#: axis orders of queries and keys: ``"bhsd"`` ``[b, h, s, d_h]`` (default), ``"bshd"`` ``[b, s, h, d_h]``
QK_LAYOUTS = ("bhsd", "bshd")


def seq_axis(qk_layout: str) -> int:
    """The sequence axis of q/k in ``qk_layout``, counted from the end (``-2`` or ``-3``)."""
    return -2 if qk_layout == "bhsd" else -3


def _seq_mismatch(count: int, x: torch.Tensor, qk_layout: str, xname: str = "x") -> str:
    """Where ``count`` positions fail to match ``x``'s sequence axis in ``qk_layout``, and the fix."""
    axis = seq_axis(qk_layout)
    form = "[b, h, s, d_h]" if qk_layout == "bhsd" else "[b, s, h, d_h]"
    msg = (
        f"{xname} {tuple(x.shape)} has s = {x.shape[axis]} along its sequence axis (dim "
        f"{x.dim() + axis}: qk_layout={qk_layout!r} reads {xname} as {form})"
    )
    other = "bshd" if qk_layout == "bhsd" else "bhsd"
    if x.dim() >= 3 and x.shape[seq_axis(other)] == count:
        msg += f"; if {xname} is laid out the other way, pass qk_layout={other!r}"
    return msg


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    out: torch.Tensor | None = None,
    qk_layout: str = "bhsd",
    compute_dtype: torch.dtype | str | None = None,
) -> torch.Tensor:
    """Rotate the first ``r`` dims of ``x`` pairwise by the angles whose cos/sin are given.

    Args:
        x: ``[..., s, d_h]`` queries or keys, e.g. ``[b, h, s, d_h]``; with ``qk_layout="bshd"``
            ``[..., s, h, d_h]``, e.g. ``[b, s, h, d_h]``.
        cos, sin: ``[..., s, r/2]`` half-width tables (one value per pair), broadcastable against
            ``x[..., s, :r/2]`` without growing it: ``[s, r/2]`` for shared positions,
            ``[b, 1, s, r/2]`` for per-token positions. With ``qk_layout="bshd"``: ``[s, r/2]``
            (shared; the head axis is added) or ``[b, s, 1, r/2]``. Cast to float32 for a bf16/fp16
            ``x`` (to ``x.dtype`` with ``compute_dtype="input"``, and for float32/float64 ``x``).
        layout: ``"half"`` pairs dims ``(i, i + r/2)`` (HF Llama, GPT-NeoX); ``"interleaved"``
            pairs ``(2i, 2i + 1)`` (RoFormer, GPT-J, Meta). See :func:`permute_qk_weights`.
        rotary_dim: ``r``; default ``2 * cos.shape[-1]``. Dims ``r..d_h`` are returned bit-identical.
        out: for inference, where to write the result: ``x`` itself (in place, no new memory) or a
            tensor of ``x``'s shape and dtype. Not differentiable (``ValueError`` if ``x`` requires
            grad while grad mode is on).
        qk_layout: ``"bhsd"`` (default, sequence axis ``-2``) or ``"bshd"`` (sequence axis ``-3``).
        compute_dtype: how a bf16/fp16 ``x`` is rotated (a float32 or float64 ``x`` is rotated
            in its own dtype either way). ``torch.float32`` (default; also ``"float32"`` or
            ``None``): the tables in float32, products and sums in float32, each output rounded to
            ``x``'s dtype once (torchtune's, Meta's and flash-attention's arithmetic): within one
            rounding of the exact rotation, and on CPU the faster path. ``"input"``: the arithmetic
            in ``x``'s own dtype, every product and sum rounded as PyTorch's ops round it, which
            gives Hugging Face transformers' bits (for parity with a model trained that way).

    Returns:
        ``[..., s, d_h]``, same dtype as ``x`` (``out`` when given). Linear in ``x``, so gradients
        flow to ``x`` (and to ``cos``/``sin``).

    On CPU (float32/float64/bfloat16) the rotation is the registered op ``posenc::rope_cpu``, in
    eager mode and in a ``torch.compile`` graph alike: one pass over memory in a small C kernel
    (:mod:`posenc.kernels.rope_cpu`), bit-identical to the PyTorch expression. On CUDA
    (float32/bfloat16/float16, Triton installed) it is the op ``posenc::rope_triton``, a Triton
    kernel (:mod:`posenc.kernels.rope_triton`), bit-identical likewise. The PyTorch expression runs
    everywhere else (``torch.export``, ``torch.func`` transforms, other dtypes, tables that need a
    gradient).
    """
    check_choice(layout, "layout", ROTARY_LAYOUTS)
    r = _check_args(x, cos, sin, qk_layout, rotary_dim)
    wide = _wide(x, compute_dtype)
    cos, sin = _fit_tables(x, *_in_dtype(x, cos, sin, wide), r, qk_layout)
    if out is not None:
        _rope_cpu.check_out(x, out)
    if _rope_cpu.takes(x, cos, sin):
        return _rope_cpu.rotate(x, cos, sin, layout, out)  # the op posenc::rope_cpu: same numbers as below
    if _rope_triton.takes(x, cos, sin):
        return _rope_triton.rotate(x, cos, sin, layout, out)  # the op posenc::rope_triton: same numbers
    y = _rope_reference.rotate(x, cos, sin, layout)  # [..., s, d_h], in the tables' arithmetic
    return y if out is None else out.copy_(y)


def apply_rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None = None,
    k_sin: torch.Tensor | None = None,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    qk_layout: str = "bhsd",
    compute_dtype: torch.dtype | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys in one call: :func:`apply_rotary` of ``q`` by ``(cos, sin)`` and of
    ``k`` by ``(k_cos, k_sin)`` (default: the same tables), out of place.

    On the CPU and CUDA fast paths both rotations run in one kernel call, q's rows then k's (and
    their backward likewise); the numbers are :func:`apply_rotary`'s, bit for bit.

    Args:
        q: ``[b, h, s_q, d_h]`` (``"bshd"``: ``[b, s_q, h, d_h]``).
        k: ``[b, h_kv, s_k, d_h]`` (``"bshd"``: ``[b, s_k, h_kv, d_h]``).
        cos, sin: the queries' tables ``[..., s_q, r/2]`` as for :func:`apply_rotary`.
        k_cos, k_sin: the keys' tables ``[..., s_k, r/2]``; both or neither.
        layout, rotary_dim, qk_layout, compute_dtype: as for :func:`apply_rotary`.

    Returns:
        ``(q, k)`` rotated, shapes and dtypes unchanged.
    """
    if (k_cos is None) != (k_sin is None):
        raise ValueError("pass both k_cos and k_sin (the keys' own tables), or neither (the queries' tables)")
    k_cos, k_sin = (cos, sin) if k_cos is None else (k_cos, k_sin)
    check_choice(layout, "layout", ROTARY_LAYOUTS)
    rq = _check_args(q, cos, sin, qk_layout, rotary_dim)
    rk = _check_args(k, k_cos, k_sin, qk_layout, rotary_dim)
    if rq != rk:
        raise ValueError(
            f"the queries' tables cover r = {rq} dims but the keys' r = {rk}: build both for one r"
        )
    wq, wk = _wide(q, compute_dtype), _wide(k, compute_dtype)
    q_tables = _fit_tables(q, *_in_dtype(q, cos, sin, wq), rq, qk_layout)
    k_tables = _fit_tables(k, *_in_dtype(k, k_cos, k_sin, wk), rk, qk_layout)
    if _rope_cpu.takes(q, *q_tables) and _rope_cpu.takes(k, *k_tables):
        return _rope_cpu.rotate_pair(q, k, q_tables, k_tables, layout)  # one op call, one kernel call
    if _rope_triton.takes(q, *q_tables) and _rope_triton.takes(k, *k_tables):
        return _rope_triton.rotate_pair(q, k, q_tables, k_tables, layout)  # one op call, one launch
    kw = {"layout": layout, "qk_layout": qk_layout, "compute_dtype": compute_dtype}
    return apply_rotary(q, *q_tables, **kw), apply_rotary(k, *k_tables, **kw)


def _check_args(x, cos, sin, qk_layout: str, rotary_dim: int | None) -> int:
    """Validate :func:`apply_rotary`'s arguments; return ``r``, the rotated width."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor [..., s, d_h], got {describe_value(x)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor [..., s, r/2], got {describe_value(t)}")
    check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if x.dim() < 2 or cos.dim() < 1:
        raise ValueError(
            f"x must be [..., s, d_h] and cos [..., s, r/2]; got x {tuple(x.shape)}, cos {tuple(cos.shape)}"
        )
    r = 2 * cos.shape[-1]
    full = _FULL_WIDTH.format(w=cos.shape[-1])
    if rotary_dim is not None and check_int(rotary_dim, "rotary_dim", minimum=2, even=True) != r:
        raise ValueError(
            f"rotary_dim={rotary_dim} does not match cos/sin, which are half width (r/2 = {cos.shape[-1]}, "
            f"so r = {r}); build them for {rotary_dim // 2} pairs or drop rotary_dim"
            + (full if cos.shape[-1] == rotary_dim else "")
        )
    if r < 2 or r > x.shape[-1]:
        raise ValueError(
            f"cos/sin cover r = {r} dims (r/2 = {cos.shape[-1]} pairs) but x has d_h = {x.shape[-1]}; "
            "cos/sin are half width: [..., s, r/2] with 2 <= r <= d_h"
            + (full if 2 <= cos.shape[-1] <= x.shape[-1] and cos.shape[-1] % 2 == 0 else "")
        )
    return r


_FULL_WIDTH = (
    "; tables with {w} values per position look full width (Hugging Face's cos/sin hold each value "
    "twice): convert them with posenc.half_width_tables(cos, sin, layout='half') (or "
    "layout='interleaved' for GPT-J/Meta tables)"
)


def half_width_tables(
    cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half", check: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width tables (each angle's value twice, as Hugging Face's rotary modules return them)
    -> posenc's half width (one value per rotated pair), views, no copy.

    Args:
        cos, sin: ``[..., s, r]``. ``layout="half"``: HF Llama/NeoX's ``cat((c, c), -1)``, read as
            ``[..., :r/2]``; ``"interleaved"``: GPT-J/Meta's ``repeat_interleave(c, 2, -1)``, read
            as ``[..., ::2]``.
        check: verify that the two copies agree (one comparison pass); ``ValueError`` otherwise
            (the tables are then not full width in this layout).

    Returns:
        ``(cos, sin)`` ``[..., s, r/2]`` each, for :func:`apply_rotary` with the same ``layout``.
    """
    check_choice(layout, "layout", ROTARY_LAYOUTS)
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor [..., s, r], got {describe_value(t)}")
        if t.dim() < 1 or t.shape[-1] % 2:
            raise ValueError(f"{name} must be [..., s, r] with r even, got {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    half = cos.shape[-1] // 2
    pairs = []
    for name, t in (("cos", cos), ("sin", sin)):
        a, b = (t[..., :half], t[..., half:]) if layout == "half" else (t[..., 0::2], t[..., 1::2])
        if check and not torch.equal(a, b):
            other = "interleaved" if layout == "half" else "half"
            raise ValueError(
                f"{name} {tuple(t.shape)} does not hold each value twice in layout={layout!r}: it is not "
                f"a full-width table in that layout (try layout={other!r}, or pass half-width tables as "
                "they are)"
            )
        pairs.append(a)
    return pairs[0], pairs[1]


#: The values ``compute_dtype`` takes once checked: float32 arithmetic rounded once (the default),
#: or the input's own dtype with PyTorch's rounding after every operation (Hugging Face's bits).
COMPUTE_DTYPES = ("float32", "input")


def check_compute_dtype(compute_dtype: object) -> str:
    """``compute_dtype`` as ``"float32"`` (``None``, ``torch.float32`` or ``"float32"``) or
    ``"input"``; ``TypeError``/``ValueError`` naming it otherwise."""
    if compute_dtype is None or compute_dtype == torch.float32:
        return "float32"
    if isinstance(compute_dtype, str) and compute_dtype in COMPUTE_DTYPES:
        return compute_dtype
    if not isinstance(compute_dtype, (torch.dtype, str)):
        raise TypeError(f'compute_dtype must be torch.float32 or "input", got {type(compute_dtype).__name__}')
    raise ValueError(
        f'compute_dtype must be torch.float32 (default: float32 arithmetic, rounded once) or "input" '
        "(the input's own dtype, rounded after every operation as Hugging Face's code is), "
        f"got {compute_dtype!r}"
    )


def _wide(x: torch.Tensor, compute_dtype: object) -> bool:
    """Whether ``x`` is rotated in float32 and rounded once: a narrower ``x`` (bf16, fp16) unless
    ``compute_dtype="input"``; a float32 or float64 ``x`` keeps its own dtype."""
    rounded_once = check_compute_dtype(compute_dtype) == "float32"  # checked whatever x's dtype
    return rounded_once and x.dtype in (torch.bfloat16, torch.float16)


def _in_dtype(x, cos, sin, wide: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables in the dtype the rotation reads them in: float32 when ``wide``, else ``x``'s."""
    dtype = torch.float32 if wide else x.dtype
    if cos.dtype == dtype and sin.dtype == dtype:  # the common case: no call (a decode step is ~50 us)
        return cos, sin
    return cos.to(dtype), sin.to(dtype)


def _fit_tables(x, cos, sin, r: int, qk_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``/``sin`` shaped to broadcast against ``x[..., :r/2]`` (a head axis for ``bshd``), or a
    ``ValueError`` saying which axis does not match."""
    if qk_layout == "bshd":
        if x.dim() < 3:
            raise ValueError(f"qk_layout='bshd' needs x [..., s, h, d_h], got x {tuple(x.shape)}")
        if cos.dim() == 2:  # [s, r/2] -> [s, 1, r/2]: shared positions, one head axis
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    # broadcasts to x[..., :r/2] without growing it (plain Python: torch.broadcast_shapes costs
    # ~50 us); [s, r/2] tables, the common case, first
    cs, xs = cos.shape, x.shape
    if len(cs) == 2 and cs[0] in (1, xs[-2]):
        fits = True  # cs[1] == r/2 by definition of r
    else:
        target = (*xs[:-1], r // 2)
        fits = len(cs) <= len(target) and all(c in (1, t) for c, t in zip(reversed(cs), reversed(target)))
    if not fits:
        axis = seq_axis(qk_layout)
        if len(cs) >= -axis and cs[axis] not in (1, xs[axis]):
            raise ValueError(
                f"cos/sin {tuple(cs)} hold {cs[axis]} positions but " + _seq_mismatch(cs[axis], x, qk_layout)
            )
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x[..., :r/2] of shape {target}; use "
            "[s, r/2] for positions [s] or [b, 1, s, r/2] for positions [b, s] with x [b, h, s, d_h]"
        )
    return cos, sin


def is_integer_dtype(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def describe_value(obj: object) -> str:
    if isinstance(obj, torch.Tensor):
        return f"tensor of dtype {obj.dtype}"
    return type(obj).__name__
