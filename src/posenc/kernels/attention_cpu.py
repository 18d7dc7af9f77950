"""Causal attention with a positional bias (ALiBi, T5, ...), built and applied one query block at a time.

The direct way -- build the ``[b | 1, h, s, s]`` bias, mask the future with ``-inf``, hand it to
``scaled_dot_product_attention`` -- costs three things on a CPU: the ``s^2`` table itself (built by
several full-size ops, each a fresh allocation), and SDPA with an explicit mask cannot skip the
masked upper triangle, so it does twice the work of ``is_causal=True``.

Here queries are taken ``block_size`` at a time: the block ``[q0, q1)`` sees keys ``[0, k1)`` only
(``k1 = q1 + s_k - s_q``), so the bias is built for that rectangle alone and the future keys past
``k1`` are never computed. Summed over blocks this is about half the full table and half the
attention work (plus the diagonal blocks), and at most one block's bias is alive at a time.
The numbers are those of the full-table path up to float rounding: every query sees the same keys
with the same bias; only SDPA's internal blocking of the key axis differs.

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q``/``s_k`` query/key
lengths (``s_k >= s_q``: a KV-cache prefix of ``s_k - s_q`` keys precedes the queries), ``d_h``
head width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["BiasFn", "causal_attention_with_bias", "scheme_bias_fn"]

#: ``bias_fn(q0, q1, k1) -> [b | 1, h, q1 - q0, k1]``: the additive bias (on the scaled logits) of
#: queries ``q0..q1-1`` against keys ``0..k1-1``.
BiasFn = Callable[[int, int, int], torch.Tensor]


def scheme_bias_fn(
    scheme: torch.nn.Module,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    q: torch.Tensor | None = None,
) -> BiasFn:
    """A :data:`BiasFn` from a scheme's ``score_bias`` hook (``posenc.base`` contract).

    Args:
        scheme: a positional scheme with the ``score_bias`` hook (``alibi``, ``t5``, ``shaw``, ...).
        q_positions: ``[s_q]`` or ``[b, s_q]`` integer positions of the queries.
        k_positions: ``[s_k]`` or ``[b, s_k]`` integer positions of the keys.
        q: ``[b, h, s_q, d_h]`` queries before rotation, for content-dependent biases.
    """

    def bias(q0: int, q1: int, k1: int) -> torch.Tensor:
        qb = None if q is None else q[..., q0:q1, :]  # [b, h, q1 - q0, d_h]
        return scheme.score_bias(q_positions[..., q0:q1], k_positions[..., :k1], qb)

    return bias


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> None:
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
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")


def causal_attention_with_bias(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias_fn: BiasFn,
    *,
    block_size: int = 256,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d_h) + bias + causal mask) v``, one block of queries at a time.

    Args:
        q: ``[b, h, s_q, d_h]`` queries (rotated already, if the scheme rotates).
        k, v: ``[b, h_kv, s_k, d_h]``, ``s_k >= s_q``; query ``i`` sits at key index
            ``i + s_k - s_q`` and sees keys up to and including it.
        bias_fn: see :data:`BiasFn`; e.g. :func:`scheme_bias_fn`. Called once per block.
        block_size: queries per block. Smaller blocks skip more of the masked future but call SDPA
            more often; 256 suits CPUs.
        dropout_p: attention dropout (training).

    Returns:
        ``[b, h, s_q, d_h]``, dtype of ``q``.
    """
    _check(q, k, v, block_size)
    s_q, s_k = q.shape[2], k.shape[2]
    offset = s_k - s_q
    gqa = q.shape[1] != k.shape[1]
    outs = []
    for q0 in range(0, s_q, block_size):
        q1 = min(q0 + block_size, s_q)
        k1 = q1 + offset  # keys visible to the block's last query
        bias = bias_fn(q0, q1, k1)  # [b | 1, h, q1 - q0, k1]
        if bias.shape[-2:] != (q1 - q0, k1):
            raise ValueError(f"bias_fn({q0}, {q1}, {k1}) returned shape {tuple(bias.shape)}, "
                             f"expected [b | 1, h, {q1 - q0}, {k1}]")
        # future keys of the block's earlier queries: key j > i + offset, all in the last q1-q0 columns
        rows = torch.arange(q0, q1, device=q.device)[:, None] + offset  # [q1 - q0, 1]
        future = torch.arange(k1, device=q.device)[None, :] > rows  # [q1 - q0, k1]
        mask = bias.to(q.dtype).masked_fill(future, float("-inf"))  # [b | 1, h, q1 - q0, k1]
        outs.append(F.scaled_dot_product_attention(
            q[:, :, q0:q1], k[:, :, :k1], v[:, :, :k1], attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa,
        ))  # [b, h, q1 - q0, d_h]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # blocks along s_q -> [b, h, s_q, d_h]
