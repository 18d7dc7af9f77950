"""The attention plan: positions, masks and the kernel choice, made once per forward pass and handed
to every layer (:func:`plan_attention`, :func:`plan_cross_attention` -> :class:`AttentionPlan`).

Legend: ``b`` batch, ``s`` new tokens (queries), ``s_p`` past tokens (cache or memory),
``s_k = s_p + s`` keys.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .._validate import check_int, defining_class
from ..base import PositionalScheme
from ..positions import arange_positions, check_positions, positions_from_cu_seqlens, positions_from_mask
from . import blocked, flex
from .biased import BiasedAttention


# ----------------------------------------------------------------------------------------------
# Masks and positions, planned once per forward pass
# ----------------------------------------------------------------------------------------------
def causal_mask(
    s_q: int, s_k: int, device: torch.device | str | None = None, window: int | None = None
) -> torch.Tensor:
    """Boolean causal mask when the ``s_q`` queries are the *last* ``s_q`` of ``s_k`` key slots.

    Returns ``[s_q, s_k]``, True where query ``i`` (slot ``s_k - s_q + i``) may see key ``j``.
    With ``s_q == s_k`` this is the lower triangle; with a cache of ``s_p`` tokens, query ``i``
    sees the whole cache and the new keys up to itself. With ``window`` ``W`` (an int >= 1), only
    the slots ``slot - W + 1 .. slot`` (a band: sliding-window attention, as HF's
    ``sliding_window``); a window of ``s_k`` or more hides nothing.
    """
    if window is not None:
        window = min(check_int(window, "window"), s_k)  # wider than the keys: the plain mask
    q_slot = torch.arange(s_q, device=device)[:, None] + (s_k - s_q)  # [s_q, 1]
    k_slot = torch.arange(s_k, device=device)[None, :]  # [1, s_k]
    keep = k_slot <= q_slot  # [1, s_k] <= [s_q, 1] -> [s_q, s_k]
    return keep if window is None else keep & (k_slot > q_slot - window)


@dataclass
class AttentionPlan:
    """Positions and mask shared by every layer of one forward pass.

    Attributes:
        q_positions: ``[s]`` or ``[b, s]`` integer positions of the queries (the new tokens).
        k_positions: ``[s_k]`` or ``[b, s_k]`` positions of all keys (past, then new).
        mask: ``[b | 1, 1, s, s_k]`` bool, True = may attend; ``None`` = no masking beyond
            ``is_causal``.
        is_causal: use the plain causal mask (``s == s_k``, no padding): SDPA's fast path.
        causal_prefix: the mask is exactly "query ``i`` sees keys ``0 .. s_k - s + i``" (causal,
            after a cache or memory of ``s_k - s`` keys, no padding, no packing), so a bias can be
            applied one query block at a time on a CPU (:meth:`bias_blocks`).
    """

    q_positions: torch.Tensor
    k_positions: torch.Tensor
    mask: torch.Tensor | None
    is_causal: bool
    causal_prefix: bool = False
    # content-free biases (and block-bias builders) made in this forward, one per scheme instance
    # (layers sharing a scheme share them); they live and die with the plan, never on a module
    _biases: dict = field(default_factory=dict, repr=False, compare=False)
    _bias_blocks: dict = field(default_factory=dict, repr=False, compare=False)
    _block_masks: dict = field(default_factory=dict, repr=False, compare=False)
    _rotary_tables: dict = field(default_factory=dict, repr=False, compare=False)

    def rotary_tables(self, scheme: PositionalScheme, q, k, k_positions: torch.Tensor, qk_layout: str):
        """``scheme.rotary_tables`` for this forward's query positions and ``k_positions`` (all keys,
        or the new keys entering a cache), built once and shared by every layer that uses ``scheme``
        with the same dtypes; None for a scheme with nothing to share."""
        cls = type(scheme)
        if defining_class(cls, "rotate") is not defining_class(cls, "rotary_tables"):
            return None  # rotate overridden without its tables: it may not take tables=
        key = (scheme, q.dtype, k.dtype, q.device, k_positions.shape[-1], qk_layout)
        if key not in self._rotary_tables:
            self._rotary_tables[key] = scheme.rotary_tables(
                q, k, self.q_positions, k_positions, qk_layout=qk_layout
            )
        return self._rotary_tables[key]

    def score_bias(
        self, scheme: PositionalScheme, q: torch.Tensor, k: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """``scheme.score_bias`` for this forward's positions ``[b | 1, h, s, s_k]``; a bias that
        does not read ``q`` is computed once and reused by every layer sharing ``scheme``. A scheme
        that reads the keys (``score_bias_uses_keys``) gets ``k`` ``[b, h_kv, s_k, d_h]`` (every key)
        and this plan's mask as ``keep``."""
        if scheme.score_bias_uses_keys:
            if k is None:
                raise ValueError(f"scheme {scheme.name!r} reads the keys: pass k=[b, h_kv, s_k, d_h]")
            keep = self.keep(q.shape[-2], k.shape[-2], q.device)
            return scheme.score_bias(self.q_positions, self.k_positions, q, k=k, keep=keep)
        if scheme.score_bias_uses_query:
            return scheme.score_bias(self.q_positions, self.k_positions, q)
        if scheme not in self._biases:
            self._biases[scheme] = scheme.score_bias(self.q_positions, self.k_positions, q)
        return self._biases[scheme]

    def bias_blocks(
        self, scheme: PositionalScheme, q: torch.Tensor, *, dropout_p: float = 0.0
    ) -> BiasedAttention | None:
        """Attention that applies ``scheme``'s bias inside, block by block, where this forward can
        take such a path; None: the caller adds the full ``[b | 1, h, s, s_k]`` bias
        (:meth:`score_bias`) to SDPA's mask. The one place the path is chosen, by device and by what
        the scheme declares:

        * CUDA (:func:`posenc.model.flex.usable`: eager float32, >= 128 queries, no attention
          dropout, which FlexAttention does not have): FlexAttention
          (:class:`~posenc.model.flex.FlexBiasedAttention`) with the scheme's distance table or its
          materialised bias as ``score_mod`` and this plan's mask (causal, padding, packing) as a
          block mask;
        * CPU, a ``causal_prefix`` plan, more than one block of queries
          (:func:`posenc.model.blocked.usable`): the blocked path
          (:class:`~posenc.model.blocked.BlockedAttention`), which never builds the ``[s, s_k]``
          table and skips the masked future: ALiBi costs 1.2-1.5x (T5 ~2x) the time of causal SDPA
          without a bias, against 3-5x for the full table (benchmarks/RESULTS.md).

        A bias that reads the keys (``score_bias_uses_keys``) is never applied here.

        Args:
            scheme: the scheme with the ``score_bias`` hook.
            q: ``[b, h, s, d_h]`` queries before rotation.
            dropout_p: the attention dropout of this call (training): FlexAttention has none, so it
                is not built then.
        """
        if scheme.score_bias_uses_keys:
            return None
        full = functools.partial(self.score_bias, scheme, q)
        if flex.usable(q) and not dropout_p:
            return flex.FlexBiasedAttention(self._flex_score_mod(scheme, q), self._flex_block_mask(q), full)
        if not (self.causal_prefix and blocked.usable(q)):
            return None
        if scheme.score_bias_uses_query:
            return blocked.BlockedAttention(
                blocked.scheme_bias_fn(scheme, self.q_positions, self.k_positions, q), full
            )
        if scheme not in self._bias_blocks:
            self._bias_blocks[scheme] = blocked.scheme_bias_fn(
                scheme, self.q_positions, self.k_positions, reuse=True
            )
        return blocked.BlockedAttention(self._bias_blocks[scheme], full)

    def _flex_score_mod(self, scheme: PositionalScheme, q: torch.Tensor):
        """:func:`posenc.model.flex.score_mod` for this forward, shared by the layers that share a
        content-free ``scheme``."""
        if scheme.score_bias_uses_query:
            return flex.score_mod(scheme, self.q_positions, self.k_positions, q)
        key = (scheme, "flex")
        if key not in self._bias_blocks:
            self._bias_blocks[key] = flex.score_mod(scheme, self.q_positions, self.k_positions)
        return self._bias_blocks[key]

    def _flex_block_mask(self, q: torch.Tensor):
        """:func:`posenc.model.flex.block_mask` of this plan, built once per forward."""
        s_q, s_k = q.shape[-2], self.k_positions.shape[-1]
        key = (s_q, s_k, q.device)
        if key not in self._block_masks:
            keep = None if self.causal_prefix else self.mask
            self._block_masks[key] = flex.block_mask(keep, self.causal_prefix, s_q, s_k, q.device)
        return self._block_masks[key]

    def keep(self, s_q: int, s_k: int, device: torch.device) -> torch.Tensor | None:
        """The mask as an explicit bool tensor (``[.., s, s_k]``), or None when nothing is masked."""
        if self.mask is not None:
            return self.mask
        if self.is_causal:
            return causal_mask(s_q, s_k, device)
        return None


def _check_mask(
    attention_mask: torch.Tensor, b: int, s: int, name: str = "attention_mask", what: str | None = None
) -> torch.Tensor:
    """``attention_mask`` ``[b, s]`` as bool; errors name the argument (``name``) and what ``s``
    counts (``what``)."""
    what = what or "one entry per new token; a KV cache remembers the mask of the tokens it holds"
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool/int tensor [b, s], got {type(attention_mask).__name__}")
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(
            f"{name} must be bool or integer (1 = token, 0 = padding), got {attention_mask.dtype}"
        )
    if tuple(attention_mask.shape) != (b, s):
        raise ValueError(
            f"{name} must have shape [b, s] = {[b, s]} ({what}), got {list(attention_mask.shape)}"
        )
    return attention_mask.bool()


def _cat_positions(past: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """``[s_p] | [b, s_p]`` ++ ``[s] | [b, s]`` -> ``[s_k]`` or ``[b, s_k]``."""
    if past is None:
        return new
    if past.dim() != new.dim():
        b = new.shape[0] if new.dim() == 2 else past.shape[0]
        past, new = (
            past.expand(b, -1) if past.dim() == 1 else past,
            new.expand(b, -1) if new.dim() == 1 else new,
        )
    return torch.cat((past, new), dim=-1)


def plan_attention(
    batch: int,
    seq_len: int,
    device: torch.device,
    *,
    causal: bool,
    positions: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    past_positions: torch.Tensor | None = None,
    past_valid: torch.Tensor | None = None,
    offset: int | torch.Tensor = 0,
    sliding_window: int | None = None,
) -> AttentionPlan:
    """Plan self-attention for ``s`` new tokens after ``s_p`` past ones (a KV cache or a memory).

    Args:
        batch, seq_len: ``b`` and ``s`` of the new tokens.
        causal: a decoder (each token sees itself and earlier slots) or an encoder (sees all).
        positions: ``[s]`` or ``[b, s]`` explicit positions of the new tokens. Default: counted
            from ``offset``, skipping padding (``attention_mask``) or restarting per document
            (``cu_seqlens``).
        attention_mask: ``[b, s]`` 1 = real token, 0 = padding (left padding for generation).
        cu_seqlens: ``[n + 1]`` cumulative document lengths of a packed batch (``b`` must be 1):
            attention is block-diagonal, positions restart at 0 in each document.
        past_positions: ``[s_p]`` or ``[b, s_p]`` positions of past keys.
        past_valid: ``[b, s_p]`` bool, False for padding among the past keys (None = all real).
        offset: the position of the first new token: an int, or ``[b]`` per row.
        sliding_window: ``W`` (causal only): each token sees the ``W`` key slots ending at its own
            (:func:`causal_mask`); slots count padding and documents as HF's cache positions do.

    Returns:
        an :class:`AttentionPlan`. Padding queries attend to themselves only, so their (unused)
        outputs stay finite.
    """
    _check_window(sliding_window, causal)
    s_p = 0 if past_positions is None else past_positions.shape[-1]
    if cu_seqlens is not None:
        if s_p or attention_mask is not None:
            raise ValueError(
                "cu_seqlens (packed documents) cannot be combined with a KV cache, a memory or an "
                "attention_mask: packing already separates the documents"
            )
        return _plan_packed(batch, seq_len, device, causal, positions, cu_seqlens, sliding_window)
    valid_new = None if attention_mask is None else _check_mask(attention_mask, batch, seq_len)
    if positions is not None:
        q_pos = check_positions(positions, seq_len)
    elif valid_new is not None:
        base = positions_from_mask(valid_new)  # [b, s], real tokens count from 0
        q_pos = base + (offset[:, None] if isinstance(offset, torch.Tensor) else offset)
    else:
        q_pos = arange_positions(seq_len, offset=offset, device=device)  # [s] or [b, s]
    k_pos = _cat_positions(past_positions, q_pos)
    if past_valid is None and valid_new is None:
        return _plan_unpadded(q_pos, k_pos, seq_len, s_p, device, causal, sliding_window)
    return _plan_padded(
        q_pos, k_pos, batch, seq_len, s_p, device, causal, past_valid, valid_new, sliding_window
    )


def _check_window(window: int | None, causal: bool) -> None:
    """``sliding_window``: None, or an int >= 1 with causal attention."""
    if window is not None:
        check_int(window, "sliding_window")
        if not causal:
            raise ValueError(f"sliding_window={window} needs causal attention (a decoder)")


def _plan_packed(batch, seq_len, device, causal, positions, cu_seqlens, window=None) -> AttentionPlan:
    """Packed documents: block-diagonal attention, positions restarting at 0 in each document."""
    if batch != 1:
        raise ValueError(f"packed documents (cu_seqlens) take ids of shape [1, total], got batch {batch}")
    doc_pos = positions_from_cu_seqlens(cu_seqlens).to(device)  # [total]
    if doc_pos.shape[0] != seq_len and not torch.compiler.is_compiling():
        raise ValueError(f"cu_seqlens[-1] = {doc_pos.shape[0]} must equal the packed length s = {seq_len}")
    q_pos = doc_pos if positions is None else check_positions(positions, seq_len)
    doc = torch.searchsorted(
        cu_seqlens.to(device).long()[1:], torch.arange(seq_len, device=device), right=True
    )  # [s]: document index of each token
    keep = doc[:, None] == doc[None, :]  # [s, s] block diagonal
    if causal:
        keep = keep & causal_mask(seq_len, seq_len, device, window)
    return AttentionPlan(q_positions=q_pos, k_positions=q_pos, mask=keep[None, None], is_causal=False)


def _plan_unpadded(q_pos, k_pos, seq_len: int, s_p: int, device, causal: bool, window=None) -> AttentionPlan:
    """No padding anywhere: no mask (encoder), SDPA's causal flag, or a causal mask after a cache;
    a band where a sliding window hides some keys (never the blocked bias path: not a prefix)."""
    if not causal:
        return AttentionPlan(q_positions=q_pos, k_positions=k_pos, mask=None, is_causal=False)
    if window is not None and s_p + seq_len > window:
        mask = causal_mask(seq_len, s_p + seq_len, device, window)[None, None]  # [s, s_k] -> [1, 1, s, s_k]
        return AttentionPlan(q_positions=q_pos, k_positions=k_pos, mask=mask, is_causal=False)
    if s_p and seq_len == 1:  # one new token that sees the whole cache
        return AttentionPlan(
            q_positions=q_pos, k_positions=k_pos, mask=None, is_causal=False, causal_prefix=True
        )
    if s_p == 0:
        return AttentionPlan(
            q_positions=q_pos, k_positions=k_pos, mask=None, is_causal=True, causal_prefix=True
        )
    mask = causal_mask(seq_len, s_p + seq_len, device)[None, None]  # [s, s_k] -> [1, 1, s, s_k]
    return AttentionPlan(q_positions=q_pos, k_positions=k_pos, mask=mask, is_causal=False, causal_prefix=True)


def _plan_padded(
    q_pos, k_pos, batch, seq_len, s_p, device, causal, past_valid, valid_new, window=None
) -> AttentionPlan:
    """Padding among the past or the new tokens: an explicit ``[b, 1, s, s_k]`` mask."""
    s_k = s_p + seq_len
    ones = torch.ones(batch, 1, dtype=torch.bool, device=device)
    past_ok = None if s_p == 0 else (past_valid if past_valid is not None else ones.expand(batch, s_p))
    new_ok = valid_new if valid_new is not None else ones.expand(batch, seq_len)
    key_ok = new_ok if past_ok is None else torch.cat((past_ok, new_ok), dim=-1)  # [b, s_k]
    keep = key_ok[:, None, None, :]  # [b, 1, 1, s_k]
    if causal:
        keep = keep & causal_mask(seq_len, s_k, device, window)  # -> [b, 1, s, s_k]
    # A padding query would see no key at all (softmax of all -inf = NaN): let it see itself.
    own_slot = (
        torch.arange(s_k, device=device)[None, :] == torch.arange(seq_len, device=device)[:, None] + s_p
    )
    keep = keep | (own_slot & ~new_ok[:, None, :, None])  # [s, s_k] & [b, 1, s, 1]
    return AttentionPlan(q_positions=q_pos, k_positions=k_pos, mask=keep, is_causal=False)


def plan_cross_attention(
    batch: int, seq_len: int, context_len: int, device: torch.device, context_mask: torch.Tensor | None = None
) -> AttentionPlan:
    """Plan cross-attention of ``s`` decoder tokens to ``s_k`` encoder outputs.

    Positional schemes do not act on cross-attention (as in Vaswani et al. and T5): positions are
    ``arange`` placeholders. ``context_mask`` ``[b, s_k]`` hides encoder padding.
    """
    q_pos = torch.arange(seq_len, device=device)
    k_pos = torch.arange(context_len, device=device)
    if context_mask is None:
        return AttentionPlan(q_positions=q_pos, k_positions=k_pos, mask=None, is_causal=False)
    ok = _check_mask(context_mask, batch, context_len, "context_mask", "one entry per encoder output")
    mask = ok[:, None, None, :]  # [b, s_k] -> [b, 1, 1, s_k]
    return AttentionPlan(q_positions=q_pos, k_positions=k_pos, mask=mask, is_causal=False)
