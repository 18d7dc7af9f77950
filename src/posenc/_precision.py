"""Precision helpers: positional tables are computed with autocast off, in float32 or better."""

from __future__ import annotations

import contextlib
import math
import struct

import torch


def autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """A context that disables autocast on ``device`` (a no-op where autocast does not exist, e.g.
    meta, or is off already: entering ``torch.autocast`` costs ~3 us per table).

    While ``torch.compile`` traces, the availability check is skipped: TorchDynamo before torch
    2.13 cannot trace ``torch.amp.is_autocast_available`` (a graph break, an error under
    ``fullgraph=True``), and a traced tensor is on a device with autocast (CPU, CUDA, ...)."""
    if not torch.compiler.is_compiling() and not torch.amp.is_autocast_available(device.type):
        return contextlib.nullcontext()
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


#: Angles below this many radians take the plain product in the angle dtype (the common float32
#: form, so small positions give the same bits as other libraries); larger ones are split.
ANGLE_SPLIT = 4096
#: Columns whose largest angle reaches this (just below ANGLE_SPLIT: float32's rounding of the
#: plain product) are computed in both forms and chosen per angle.
_COLUMN_SPLIT = ANGLE_SPLIT * (1 - 2.0**-20)
_TWO_PI = 2 * math.pi
#: The largest ``|position|`` whose angles :func:`position_angles` computes within ~1.4e-3 rad;
#: past it the float64 product ``hi * f`` and the float64 value of 2 pi themselves round (0.01 rad
#: at 2^48, 3 rad at 2^62), so larger positions are refused where they can be seen (CPU, eager).
MAX_POSITION = 2**44


def check_position_reach(reach: int, name: str = "positions") -> None:
    """``ValueError`` naming ``name`` when ``reach`` (the largest ``|position|``) passes
    :data:`MAX_POSITION`."""
    if reach > MAX_POSITION:
        raise ValueError(
            f"{name} reach |{reach}| but positional angles are exact only up to |position| = 2^44 = "
            f"{MAX_POSITION:,}; pass smaller positions (rotary and relative schemes depend only on "
            "differences: subtract the first position)"
        )


def angle_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype positional angles and tables are computed in for a result of ``dtype``: float64
    for float64 (its range reaches further), else float32 (bf16/fp16 would merge positions)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def wide_dtype(device: torch.device | str) -> torch.dtype:
    """float64, or float32 on devices without float64 (Apple's MPS): for frequencies and angles."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def _reach(positions: torch.Tensor) -> int:
    """The largest ``|position|`` (0 for no positions): one reduction over ``[...]``."""
    if positions.numel() <= 1:  # a decode step: one host read, no reductions
        return abs(int(positions.item())) if positions.numel() else 0
    return max(abs(int(positions.min())), abs(int(positions.max())))


def gather_kept(rows: torch.Tensor, positions: torch.Tensor, dim: int = 0) -> torch.Tensor | None:
    """Rows of a table kept for positions ``0..n-1`` along ``dim`` (``precompute``), gathered for
    explicit integer ``positions`` ``[...]``: ``[..., n, ...]`` -> the positions' shape in place of
    ``n``, a new tensor. None where the rows may not serve: a compiled or traced graph (the range
    check reads the host and would be baked in), rows or positions off the CPU, no positions, or a
    position outside ``0..n-1``. Since each angle depends only on its own position, the gathered
    rows are the numbers a call computes for these positions in eager mode."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None
    if rows.device.type != "cpu" or positions.device.type != "cpu" or positions.numel() == 0:
        return None
    if positions.numel() == 1:  # a decode step: one host read
        lo = hi = int(positions.item())
    else:
        lo, hi = int(positions.min()), int(positions.max())  # two host reads
    if not 0 <= lo <= hi < rows.shape[dim]:
        return None
    picked = rows.index_select(dim, positions.reshape(-1))  # [..., n, ...] -> [..., numel, ...]
    dim %= rows.dim()
    return picked.reshape(*rows.shape[:dim], *positions.shape, *rows.shape[dim + 1 :])  # numel -> positions


def position_angles(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``positions * inv_freq`` as angles in ``dtype`` (float32 or float64), right for large positions.

    A float32 product loses the position past about 2^20 (at 2^24 neighbouring positions get the
    same angle). Where ``|p f|`` can reach 4096, each position is split as ``p = hi + lo`` with
    ``lo = p mod 4096``: ``hi * f`` is multiplied in float64 (``hi`` is an exact integer there) and
    reduced modulo ``2 pi``, then the small ``lo * f`` is added in ``dtype``. The angle differs from
    ``p * f`` by a multiple of ``2 pi`` (cos and sin are unchanged) and, for frequencies ``|f| <= 1``
    (the sinusoidal table's, and RoPE's with a base >= 1 and scaling factors >= 1; a larger ``f``
    makes ``lo * f`` itself large), stays within about ``5e-4`` rad of the exact angle for every
    position up to ``2^40`` (about ``1.4e-3`` at ``2^44``; past that the float64 product ``hi * f``
    itself rounds: ``0.01-0.02`` rad at ``2^48``). Positions past ``2^44`` (:data:`MAX_POSITION`)
    raise ``ValueError`` on CPU in eager mode, float64 angles included; on other devices and in
    compiled or traced graphs they are not checked (the check would read the device from the host).

    Each angle is chosen by its own plain product: split where ``|fl(p) fl(f)| >= 4096``, the plain
    product (the same bits as other libraries) elsewhere. So a position's angles do not depend on
    the other positions of the call: a decode step, a prefill and precomputed rows give the same
    bits. On CPU in eager mode only the frequencies that reach 4096 rad somewhere are split at
    all; GPUs (no host sync) and compiled graphs compute both forms for every frequency.

    Args:
        positions: integer tensor ``[...]``.
        inv_freq: ``[r]`` frequencies, or ``[..., r]`` per position (length-dependent RoPE
            scalings); float64 for exact angles at large positions (a float32 frequency is itself
            off by ~6e-8 relative: a radian at 2^24).
        dtype: float32 or float64, the angles' dtype.

    Returns:
        ``[..., r]`` angles.
    """
    f = inv_freq.to(positions.device, dtype)  # [r]
    unseen = torch.compiler.is_compiling() or positions.device.type != "cpu" or torch.jit.is_tracing()
    if dtype == torch.float64:  # float64 holds every position below 2^53 exactly: the plain product
        if not unseen:
            check_position_reach(_reach(positions))
        return positions.to(dtype)[..., None] * f
    if torch.compiler.is_compiling() or positions.device.type != "cpu":
        return _chosen(positions.to(dtype)[..., None] * f, _split_angles(positions, inv_freq, dtype))
    # one position (a decode step); not while tracing, which would keep this p as a constant
    if positions.numel() == 1 and inv_freq.dim() == 1 and not torch.jit.is_tracing():
        p = int(positions.item())
        check_position_reach(abs(p))
        return _one_position(p, inv_freq, f).reshape(*positions.shape, -1)
    angles = positions.to(dtype)[..., None] * f  # [..., 1] * [r] -> [..., r], the plain product
    reach = _reach(positions)
    if not torch.jit.is_tracing():
        check_position_reach(reach)
    cols = _reaching(inv_freq, reach)  # [k] column indices
    if cols and cols[-1] - cols[0] + 1 == len(cols):  # a range (decreasing f)
        a, b = cols[0], cols[-1] + 1
        split = _split_angles(positions, inv_freq[..., a:b], dtype)  # [..., k]
        angles[..., a:b] = _chosen(angles[..., a:b], split)  # in place
    elif cols:
        angles[..., cols] = _chosen(angles[..., cols], _split_angles(positions, inv_freq[..., cols], dtype))
    return angles


def _chosen(plain: torch.Tensor, split: torch.Tensor) -> torch.Tensor:
    """Each angle's form (:func:`position_angles`): ``split`` where the plain product reaches
    4096 rad, ``plain`` elsewhere. Shapes: ``[..., k]`` both -> ``[..., k]``."""
    return torch.where(plain.abs() >= ANGLE_SPLIT, split, plain)


def _one_position(p: int, inv_freq: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """:func:`position_angles` of one position ``p`` (a decode step, CPU eager): the same numbers
    from host integers (``p``, ``hi``, ``lo`` are exact as float64 scalars below 2^53; a tensor times
    a Python float multiplies in the tensor's dtype) in a few ops instead of the general path's
    twenty. Shapes: ``inv_freq`` ``[r]`` (any float dtype), ``f`` ``[r]`` in the angle dtype -> ``[r]``."""
    angles = f * float(p)  # [r]: float32(p) * f, the plain product
    # The angles _chosen would split, decided on the host: a product of two float32 values is exact
    # in float64, and it rounds to >= 4096 in float32 exactly when it is >= 4096 - 2^-13.
    p32, reach = struct.unpack("f", struct.pack("f", float(p)))[0], ANGLE_SPLIT - 2.0**-13  # float32(p)
    cols = [i for i, g in enumerate(f.tolist()) if abs(g * p32) >= reach]  # f: the float32 frequencies
    if cols:
        lo = p % ANGLE_SPLIT  # in [0, 4096) also for negative p, as torch.remainder
        at = slice(cols[0], cols[-1] + 1) if cols[-1] - cols[0] + 1 == len(cols) else cols
        f_wide = inv_freq[at].to(f.device, wide_dtype(f.device))  # [k], where the angles are
        far = torch.remainder(f_wide * float(p - lo), _TWO_PI).to(f.dtype)  # [k]: hi f mod 2 pi
        angles[at] = far + f[at] * float(lo)  # [k]
    return angles


def _reaching(inv_freq: torch.Tensor, reach: int) -> list[int]:
    """The frequencies (last-dim indices of ``inv_freq`` ``[r]`` or ``[..., r]``) whose angles may
    reach 4096 rad at position ``reach`` in some row (a margin below 4096 for float32's rounding of
    the product): float32 loses them there. ``[r]`` frequencies are compared on the host (one read
    instead of a chain of small ops; the same float64 products)."""
    if inv_freq.dim() == 1:
        return [i for i, f in enumerate(inv_freq.tolist()) if abs(f) * reach >= _COLUMN_SPLIT]
    reaches = inv_freq.abs().double() * reach >= _COLUMN_SPLIT  # [..., r]
    return reaches.reshape(-1, reaches.shape[-1]).any(0).nonzero().flatten().tolist()  # over any row


def _split_angles(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(hi f mod 2 pi) + lo f`` with ``p = hi + lo``, ``lo = p mod 4096``.

    ``hi f mod 2 pi`` depends on ``q = hi / 4096`` only: in eager mode on CPU, when the positions span
    fewer blocks of 4096 than there are positions (any dense range), it is computed once per block
    and gathered (the same float64 numbers, one float32 pass instead of several float64 ones).

    Shapes: positions ``[...]``, inv_freq ``[r]`` -> ``[..., r]``."""
    lo = torch.remainder(positions, ANGLE_SPLIT)  # [...] in [0, 4096), also for negative positions
    q = torch.div(positions - lo, ANGLE_SPLIT, rounding_mode="floor")  # [...] block index, exact
    wide = wide_dtype(positions.device)
    f_wide = inv_freq.to(positions.device, wide)  # [r]
    near = lo.to(dtype)[..., None] * inv_freq.to(positions.device, dtype)  # [..., r]
    if (
        not torch.compiler.is_compiling()
        and positions.device.type == "cpu"
        and positions.numel()
        and inv_freq.dim() == 1
    ):
        q0, q1 = int(q.min()), int(q.max())  # a host reduction: CPU only (no GPU sync, no meta)
        if q1 - q0 < positions.numel():  # few blocks: a [blocks, r] table, gathered
            blocks = torch.arange(q0, q1 + 1, device=positions.device).to(wide) * ANGLE_SPLIT  # [u]
            table = torch.remainder(blocks[:, None] * f_wide, _TWO_PI).to(dtype)  # [u, r]
            rows = table.index_select(0, (q - q0).reshape(-1))  # [numel, r]: faster than table[q - q0]
            return rows.reshape(*q.shape, -1) + near  # [..., r]
    far = torch.remainder((q * ANGLE_SPLIT).to(wide)[..., None] * f_wide, _TWO_PI)  # [..., r]
    return far.to(dtype) + near
