"""Causal attention with a positional bias (ALiBi, T5, ...), built and applied one query block at a time.

The direct way -- build the ``[b | 1, h, s, s]`` bias, mask the future with ``-inf``, hand it to
``scaled_dot_product_attention`` -- costs three things on a CPU: the ``s^2`` table itself (built by
several full-size ops, each a fresh allocation), and SDPA with an explicit mask cannot skip the
masked upper triangle, so it does twice the work of ``is_causal=True``.

Here queries are taken ``block_size`` at a time: the block ``[q0, q1)`` sees keys ``[0, k1)`` only
(``k1 = q1 + s_k - s_q``), so the bias is built for that rectangle alone and the future keys past
``k1`` are never computed. Summed over blocks this is about half the attention work (plus the
diagonal blocks). A bias that depends only on the distance (the scheme answers ``distance_bias``:
ALiBi, T5, KERPLE) is one table of ``h x (s_q + s_k - 1)`` values, and each block's bias and
causal mask is a strided view of it: memory O(h s), nothing built per block. Other biases are
built per block (at most one block's bias alive at a time). The numbers are those of the
full-table path up to float rounding: every query sees the same keys with the same bias; only
SDPA's internal blocking of the key axis differs.

A bias reaches :func:`causal_attention_with_bias` as a :class:`BlockBias` object, which declares
what its blocks are (a view of one table with the causal mask in it, in reverse query order, or a
fresh tensor per block); the attention plan (:meth:`posenc.model.plan.AttentionPlan.bias_blocks`)
decides when a model takes this path (CPU tensors; FlexAttention takes its place on CUDA).

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q``/``s_k`` query/key
lengths (``s_k >= s_q``: a KV-cache prefix of ``s_k - s_q`` keys precedes the queries), ``d_h``
head width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from .._validate import defining_class
from ..base import PositionalScheme
from ..kernels import eager, empty, enabled
from .biased import BiasedAttention

__all__ = [
    "BLOCK_SIZE",
    "LONG_BLOCK_SIZE",
    "LONG_QUERIES",
    "BlockBias",
    "BlockedAttention",
    "DistanceBlocks",
    "PerBlockBias",
    "SchemeBlocks",
    "causal_attention_with_bias",
    "scheme_bias_fn",
    "usable",
]


@runtime_checkable
class BlockBias(Protocol):
    """The bias of :func:`causal_attention_with_bias`, one block of queries at a time, with what it
    declares about its results.

    ``bias(q0, q1, k1) -> [b | 1, h, q1 - q0, k1]``: the additive bias (on the scaled logits) of
    queries ``q0..q1-1`` against keys ``0..k1-1``, read-only for the caller unless
    ``returns_scratch``.
    """

    #: True: the result is a buffer the bias rewrites on its next call; the caller may overwrite it
    #: and must copy it to keep it
    returns_scratch: bool
    #: True: the bias already holds ``-inf`` on future keys
    masks_future: bool
    #: True: its rows are the block's queries in reverse order
    reversed_rows: bool
    #: False: its biases never need a gradient
    bias_requires_grad: bool

    def __call__(self, q0: int, q1: int, k1: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class PerBlockBias:
    """A :class:`BlockBias` from a function ``fn(q0, q1, k1) -> [b | 1, h, q1 - q0, k1]`` and its
    declarations (by default: a fresh, read-only bias in query order, without the causal mask,
    that may need a gradient)."""

    fn: Callable[[int, int, int], torch.Tensor]
    returns_scratch: bool = False
    masks_future: bool = False
    reversed_rows: bool = False
    bias_requires_grad: bool = True

    def __call__(self, q0: int, q1: int, k1: int) -> torch.Tensor:
        return self.fn(q0, q1, k1)


#: queries per block of :func:`causal_attention_with_bias` below :data:`LONG_QUERIES` queries
BLOCK_SIZE = 256
#: queries per block from :data:`LONG_QUERIES` queries on. PyTorch's CPU flash attention tiles the
#: queries of a call by 256 once the call has >= 768 of them (by 64 below), and the larger tiles
#: reread keys and values 4x less; on long inputs that outweighs the larger masked triangle of each
#: block (L=8192, ALiBi, 2 threads: 1.03-1.12x causal SDPA without bias against 1.26-1.30x with
#: blocks of 256; at L=2048 and 3072 blocks of 256 stay ahead). Not where the bias itself needs a
#: gradient (a trainable T5 table): its backward grows with the masked triangle (L=4096, forward
#: and backward: 3.5-3.8 s against 2.9-3.1 s with blocks of 256 in the same runs).
LONG_BLOCK_SIZE = 768
#: query count from which blocks of :data:`LONG_BLOCK_SIZE` are used
LONG_QUERIES = 4096


def usable(q: torch.Tensor) -> bool:
    """Whether a model should take this path for queries ``q`` ``[b, h, s_q, d_h]``: plain CPU
    tensors with more than one block of queries (``s_q > BLOCK_SIZE``; a single block skips no
    future keys, and the full-table path then shares one bias between layers), outside
    ``torch.compile``/tracing (a compiled graph fuses the full-table path itself) and ``torch.func``
    transforms, and fast paths not switched off (``POSENC_C_KERNELS=0`` runs every reference path)."""
    if torch.compiler.is_compiling() or not eager(q):  # scratch buffers need real storage
        return False
    return q.device.type == "cpu" and q.shape[-2] > BLOCK_SIZE and enabled()


def unit_steps(positions: torch.Tensor) -> bool:
    """Whether ``positions`` is ``[s]`` counting up by one (``p0, p0 + 1, ...``): a plain sequence or
    a cache offset, where ``k_pos - q_pos`` is a fixed shift of ``j - i``."""
    if positions.dim() != 1 or positions.numel() == 0:
        return False
    first = int(positions[0])
    return int(positions[-1]) - first == positions.numel() - 1 and bool(
        torch.equal(positions, torch.arange(first, first + positions.numel(), device=positions.device))
    )


def distance_speaks_for_bias(scheme: PositionalScheme) -> bool:
    """Whether the scheme's ``distance_bias`` may stand for its ``score_bias``: both come from the
    same class (a subclass that overrides ``score_bias`` alone keeps its own bias). Whether the
    scheme has a distance table at all is its ``distance_bias``'s answer (``None``: no)."""
    cls = type(scheme)
    return defining_class(cls, "score_bias") is defining_class(cls, "distance_bias")


def distance_table(
    scheme: PositionalScheme, q_positions: torch.Tensor, k_positions: torch.Tensor, *, future: float = 0.0
) -> torch.Tensor | None:
    """The scheme's bias per distance for queries and keys in unit steps (:func:`unit_steps`):
    ``[h, s_q + s_k - 1]``, entry ``t`` the bias of query slot ``i`` and key slot ``j`` with
    ``j - i = t - (s_q - 1)``; with ``future=-inf`` the distances of keys after the query's slot
    ``i + s_k - s_q`` hold ``-inf`` (the causal mask). None: the scheme declares no distance bias
    (``distance_bias`` answers None, or its ``score_bias`` is its own; see
    :func:`distance_speaks_for_bias`)."""
    if not distance_speaks_for_bias(scheme):
        return None
    s_q, s_k = q_positions.numel(), k_positions.numel()
    shift = int(k_positions[0]) - int(q_positions[0])  # k_pos - q_pos = shift + (j - i)
    rel = torch.arange(-(s_q - 1), s_k, device=q_positions.device)  # [s_q + s_k - 1]: every j - i
    table = scheme.distance_bias(rel + shift)  # [h, s_q + s_k - 1]
    if table is None or future == 0.0:
        return table
    return table.masked_fill(rel > s_k - s_q, future)  # key slot j after query slot i + (s_k - s_q)


class DistanceBlocks:
    """A bias that depends only on ``k_pos - q_pos`` (the scheme's ``distance_bias``), for positions
    in unit steps: one table of ``h x (s_q + s_k - 1)`` values, one per distance, with ``-inf`` at
    the distances of future keys, so that each block's bias and causal mask is a *view* of it.

    For the block ``[q0, q1)`` x keys ``[0, k1)`` the entry ``(i, j)`` is ``table[j - i + s_q - 1]``:
    a stride of +1 along ``j`` and of -1 along ``i``. Strides cannot be negative, so the view takes
    the block's queries in reverse order (``r = q1 - 1 - i``: strides ``(width, 1, 1)``), which
    :func:`causal_attention_with_bias` honours by flipping the block's queries and output
    (``reversed_rows``). Nothing is built per block; the view is differentiable (a trainable T5
    table gets its gradient through it).

    Args:
        table: ``[h, s_q + s_k - 1]`` from :func:`distance_table` with ``future=-inf``.
        s_q: the number of queries.
    """

    returns_scratch = False  # views of one table, read-only
    masks_future = True  # the table holds the causal -inf: nothing to add per block
    reversed_rows = True  # each block's bias is for its queries in reverse order

    def __init__(self, table: torch.Tensor, s_q: int) -> None:
        self.table = table.contiguous()  # [h, s_q + s_k - 1]
        self.s_q = s_q

    @property
    def bias_requires_grad(self) -> bool:
        """Whether the views it hands out need a gradient (a trainable table)."""
        return self.table.requires_grad

    def __call__(self, q0: int, q1: int, k1: int) -> torch.Tensor:
        h, width = self.table.shape
        offset = self.table.storage_offset() + self.s_q - q1
        # [1, h, n, k1], row r = query q1 - 1 - r: entry (r, j) = table[j + r + s_q - q1]
        return self.table.as_strided((1, h, q1 - q0, k1), (0, width, 1, 1), offset)


@dataclass
class SchemeBlocks:
    """A :class:`BlockBias` that calls ``scheme.score_bias`` on each block's positions (and queries).

    Args:
        scheme: a scheme with the ``score_bias`` hook.
        q_positions: ``[s_q]`` or ``[b, s_q]``; k_positions: ``[s_k]`` or ``[b, s_k]``.
        q: ``[b, h, s_q, d_h]`` queries before rotation, for a bias that reads them; None otherwise.
        reuse: the object serves several attention calls (the layers of one forward that share
            ``scheme``): a content-free bias (``q`` None) is kept per block and handed out again
            (about half the ``[s_q, s_k]`` table in all, the part attention uses) instead of being
            recomputed for every call.
    """

    scheme: PositionalScheme
    q_positions: torch.Tensor
    k_positions: torch.Tensor
    q: torch.Tensor | None = None
    reuse: bool = False
    kept: dict[tuple[int, int, int], torch.Tensor] = field(default_factory=dict, repr=False)
    returns_scratch = False
    masks_future = False
    reversed_rows = False
    bias_requires_grad = True

    def __call__(self, q0: int, q1: int, k1: int) -> torch.Tensor:
        if (q0, q1, k1) in self.kept:
            return self.kept[q0, q1, k1]
        qb = None if self.q is None else self.q[..., q0:q1, :]  # [b, h, q1 - q0, d_h]
        out = self.scheme.score_bias(self.q_positions[..., q0:q1], self.k_positions[..., :k1], qb)
        if self.reuse and self.q is None:
            self.kept[q0, q1, k1] = out
        return out


def scheme_bias_fn(
    scheme: PositionalScheme,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    q: torch.Tensor | None = None,
    *,
    reuse: bool = False,
) -> BlockBias:
    """A :class:`BlockBias` from a scheme's ``score_bias`` hook (``posenc.base`` contract).

    A content-free bias (``q`` None) from a scheme that declares a distance table
    (:func:`distance_table`: ALiBi, T5, KERPLE), with positions ``[s]`` in unit steps, gets
    :class:`DistanceBlocks` (each block's bias and causal mask is a view of the table). Every other
    scheme gets :class:`SchemeBlocks` (``score_bias`` on each block's positions and queries).

    Args:
        scheme: a positional scheme with the ``score_bias`` hook (``alibi``, ``t5``, ``shaw``, ...).
        q_positions: ``[s_q]`` or ``[b, s_q]`` integer positions of the queries.
        k_positions: ``[s_k]`` or ``[b, s_k]`` integer positions of the keys.
        q: ``[b, h, s_q, d_h]`` queries before rotation, for content-dependent biases.
        reuse: see :class:`SchemeBlocks`.
    """
    if q is None and unit_steps(q_positions) and unit_steps(k_positions):
        table = distance_table(scheme, q_positions, k_positions, future=float("-inf"))
        if table is not None:
            return DistanceBlocks(table, q_positions.numel())
    return SchemeBlocks(scheme, q_positions, k_positions, q, reuse)


@dataclass(frozen=True)
class BlockedAttention(BiasedAttention):
    """Causal attention under a :class:`BlockBias`, as a model calls it:
    ``attention(q [b, h, s_q, d_h], k, v [b, h_kv, s_k, d_h], dropout_p=...) -> [b, h, s_q, d_h]``
    (:func:`causal_attention_with_bias`).

    Attributes:
        bias: the bias, one block of queries at a time.
        full_bias: the same bias as one ``[b | 1, h, s_q, s_k]`` tensor (unused here: this path
            takes dropout itself).
    """

    bias: BlockBias
    full_bias: Callable[[], torch.Tensor]
    takes_dropout = True

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0
    ) -> torch.Tensor:
        return causal_attention_with_bias(q, k, v, self.bias, dropout_p=dropout_p)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise ValueError(f"{name} must be a float tensor [b, h, s, d_h], got {getattr(t, 'shape', t)!r}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree on [b, h_kv, s_k], got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must share b and d_h, and h_kv must divide h"
        )
    if k.shape[2] < q.shape[2]:
        raise ValueError(f"causal attention needs s_k >= s_q, got s_q={q.shape[2]}, s_k={k.shape[2]}")
    if q.shape[2] == 0:
        raise ValueError("q must hold at least one query (s_q >= 1), got s_q=0")
    sized = isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 1
    if block_size is not None and not sized:
        raise ValueError(f"block_size must be None (automatic) or an int >= 1, got {block_size!r}")


def _block_bounds(s_q: int, block_size: int | None, grad_bias: bool = False) -> list[int]:
    """Query block boundaries ``[0, ..., s_q]``: every ``block_size`` queries; automatic (None):
    :data:`BLOCK_SIZE` below :data:`LONG_QUERIES` queries or for a bias that needs a gradient
    (``grad_bias``), else :data:`LONG_BLOCK_SIZE` with the remainder first (the remainder block
    sees the fewest keys)."""
    if block_size is None and s_q >= LONG_QUERIES and not grad_bias:
        first = s_q % LONG_BLOCK_SIZE
        return [0, *range(first or LONG_BLOCK_SIZE, s_q + 1, LONG_BLOCK_SIZE)]
    size = block_size or BLOCK_SIZE
    return [*range(0, s_q, size), s_q]


def _writable(t: torch.Tensor) -> bool:
    """Whether ``masked_fill_`` may write into ``t``: no autograd history to protect, no aliased
    (stride-0) elements."""
    return not t.requires_grad and all(st or n == 1 for st, n in zip(t.stride(), t.shape))


def _future_triangle(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[n, n]``: 0 on and below the diagonal, ``-inf`` above. A block's future keys all lie in its
    last ``n`` columns, where ``j > i`` is this triangle; it is added (``x + -inf = -inf``,
    ``x + 0 = x`` exactly): a vectorized add, cheaper than ``masked_fill_``."""
    tri = torch.zeros(n, n, dtype=dtype, device=device)
    return tri.masked_fill_(torch.ones_like(tri, dtype=torch.bool).triu_(1), float("-inf"))


def _block_mask(bias, dtype, tri, n: int, scratch: bool, saves_mask: bool) -> torch.Tensor:
    """The block's float mask: ``bias`` in ``dtype`` with ``-inf`` on future keys (``tri[:n, :n]``
    added to the last ``n`` columns; ``tri`` None: the bias holds them already).

    The mask may be written in place, and SDPA keeps it for the backward pass, so a bias is written
    into only when it is ours: a fresh dtype conversion, or bias_fn's scratch buffer while nothing
    keeps it (bias_fn rewrites its scratch next block). Anything else bias_fn returned may be the
    scheme's own tensor or carry autograd history: copied first."""
    mask = bias.to(dtype)
    if tri is None:  # read only, never written here
        return mask.clone() if mask is bias and scratch and saves_mask else mask
    ours = _writable(mask) if mask is not bias else (scratch and not saves_mask)
    if not ours:
        mask = mask.clone()
    mask[..., -n:].add_(tri[:n, :n])  # -inf on future keys, in place
    return mask


def _head_chunks(h: int, h_kv: int, n: int) -> list[tuple[int, int]]:
    """Query-head ranges ``[h0, h1)``, one SDPA call each, for a block of ``n`` queries: all heads up
    to :data:`BLOCK_SIZE` queries; a longer block splits its heads into up to ``ceil(n / BLOCK_SIZE)``
    calls of whole groups of query heads per key/value head, so that each call holds about
    ``BLOCK_SIZE x h`` query rows when there are enough key/value heads (peak memory)."""
    group = h // h_kv
    calls = min(h_kv, -(-n // BLOCK_SIZE))  # ceil(n / BLOCK_SIZE), at most one per kv head
    per = -(-h_kv // calls) * group  # query heads per call
    return [(h0, min(h0 + per, h)) for h0 in range(0, h, per)]


def _block_bias(bias_fn: BlockBias, q0: int, q1: int, k1: int) -> torch.Tensor:
    """``bias_fn(q0, q1, k1)``, checked: ``[b | 1, h, q1 - q0, k1]``."""
    bias = bias_fn(q0, q1, k1)
    if bias.shape[-2:] != (q1 - q0, k1):
        raise ValueError(
            f"bias_fn({q0}, {q1}, {k1}) returned shape {tuple(bias.shape)}, "
            f"expected [b | 1, h, {q1 - q0}, {k1}]"
        )
    return bias


def _chunk_outputs(q, k, v, mask, span, chunks, reversed_rows: bool, dropout_p: float):
    """For each head range ``(h0, h1)`` of ``chunks``: ``(h0, h1, o)``, ``o`` ``[b, h', n, d_v]`` the
    attention of queries ``span = (q0, q1, k1)``'s block (reversed with ``reversed_rows``) on keys
    ``0..k1-1`` under ``mask`` ``[b | 1, h | 1, n, k1]``."""
    q0, q1, k1 = span
    group = q.shape[1] // k.shape[1]  # query heads per key/value head
    for h0, h1 in chunks:
        qb = q[:, h0:h1, q0:q1].flip(2) if reversed_rows else q[:, h0:h1, q0:q1]  # [b, h', n, d_h]
        kv = slice(h0 // group, h1 // group)  # the key/value heads of query heads h0..h1-1
        o = F.scaled_dot_product_attention(
            qb,
            k[:, kv, :k1],
            v[:, kv, :k1],
            attn_mask=_heads(mask, h0, h1),
            dropout_p=dropout_p,
            enable_gqa=group > 1,
        )  # [b, h', n, d_v]
        del qb  # freed before the caller writes o (peak memory)
        yield h0, h1, o
        del o  # the caller has written it: freed before the next call


def _heads(mask: torch.Tensor, h0: int, h1: int) -> torch.Tensor:
    """Heads ``h0..h1-1`` of a block mask ``[..., h | 1, n, k1]`` (one shared by every head as is)."""
    return mask if mask.dim() < 3 or mask.shape[-3] == 1 else mask[..., h0:h1, :, :]


def _write_block(out: torch.Tensor, o: torch.Tensor, q0: int, q1: int, reversed_rows: bool) -> None:
    """Block output ``o`` ``[b, h', n, d_v]`` into rows ``q0..q1-1`` of ``out`` ``[b, s_q, h', d_v]``;
    with ``reversed_rows`` row ``r`` of ``o`` is query ``q1 - 1 - r`` (written in place, no flipped copy)."""
    if reversed_rows:
        rows = torch.arange(q1 - 1, q0 - 1, -1, device=o.device)  # [n]
        out.index_copy_(1, rows, o.transpose(1, 2))  # [b, h, n, d_v] -> [b, n, h, d_v] rows
    else:
        out[:, q0:q1].copy_(o.transpose(1, 2))  # [b, h, n, d_v] -> [b, n, h, d_v]


def causal_attention_with_bias(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias_fn: BlockBias | Callable[[int, int, int], torch.Tensor],
    *,
    block_size: int | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d_h) + bias + causal mask) v``, one block of queries at a time.

    Args:
        q: ``[b, h, s_q, d_h]`` queries (rotated already, if the scheme rotates).
        k, v: ``[b, h_kv, s_k, d_h]``, ``s_k >= s_q``; query ``i`` sits at key index
            ``i + s_k - s_q`` and sees keys up to and including it.
        bias_fn: a :class:`BlockBias` (:func:`scheme_bias_fn`), or a plain function read as a
            :class:`PerBlockBias`. Called once per block.
        block_size: queries per block. Smaller blocks skip more of the masked future but call SDPA
            more often. None (default): :data:`BLOCK_SIZE` (256), or :data:`LONG_BLOCK_SIZE` (768,
            the remainder block first) from :data:`LONG_QUERIES` (4096) queries on, measured
            fastest on CPUs; 256 whenever grad mode is on and ``bias_fn`` does not declare
            ``bias_requires_grad = False``.
        dropout_p: attention dropout (training).

    Returns:
        ``[b, h, s_q, d_h]``, dtype of ``q`` (a ``[b, s_q, h, d_h]`` buffer seen through a transpose,
        the layout SDPA itself returns on CPU).
    """
    _check(q, k, v, block_size)
    b, h, s_q, _ = q.shape
    s_k = k.shape[2]
    offset = s_k - s_q
    h_kv = k.shape[1]
    saves_mask = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    bias_fn = bias_fn if isinstance(bias_fn, BlockBias) else PerBlockBias(bias_fn)  # a plain function
    scratch, masks_future = bias_fn.returns_scratch, bias_fn.masks_future
    reversed_rows = bias_fn.reversed_rows
    grad_bias = torch.is_grad_enabled() and bias_fn.bias_requires_grad
    bounds = _block_bounds(s_q, block_size, grad_bias)
    longest = max(hi - lo for lo, hi in pairwise(bounds))
    tri = None if masks_future else _future_triangle(longest, q.dtype, q.device)  # [n, n]
    out = None
    for q0, q1 in pairwise(bounds):
        n, k1 = q1 - q0, q1 + offset  # block length; keys visible to the block's last query
        bias = _block_bias(bias_fn, q0, q1, k1)  # [b | 1, h, n, k1]
        mask = _block_mask(bias, q.dtype, tri, n, scratch, saves_mask)
        # autograd keeps every call's inputs and outputs anyway: split heads only to save memory
        chunks = [(0, h)] if saves_mask else _head_chunks(h, h_kv, n)
        for h0, h1, o in _chunk_outputs(q, k, v, mask, (q0, q1, k1), chunks, reversed_rows, dropout_p):
            if n == s_q and len(chunks) == 1:
                return o.flip(2) if reversed_rows else o  # a single block (in query order)
            if out is None:
                out = empty(b, s_q, h, o.shape[-1], dtype=o.dtype, device=o.device)  # SDPA's layout
            _write_block(out[:, :, h0:h1], o, q0, q1, reversed_rows)
            del o  # freed before the next call makes its own (peak memory)
        del bias, mask
    return out.transpose(1, 2)  # [b, s_q, h, d_v] -> [b, h, s_q, d_v]
