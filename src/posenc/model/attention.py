"""Attention that takes any positional scheme: masks, positions, a KV cache, MHA/GQA.

The model never knows a scheme by name; it calls the scheme's hooks (``posenc.base``):

* ``score_bias(q_positions, k_positions, q)`` with the projected queries *before* rotation; the
  bias is added to the scaled logits ``q k^T / sqrt(d_h)`` (merged with the causal/padding mask
  into one float mask for ``scaled_dot_product_attention``);
* ``rotate(q, k, q_positions, k_positions)`` on queries and keys;
* ``relative_values(q_positions, k_positions)`` when the scheme has value embeddings (Shaw et al.):
  then attention takes an explicit-softmax path, ``out = P V + sum_j P_ij a^V_ij``.

Positions and masks are the same in every layer, so they are planned once per forward pass
(:func:`plan_attention` -> :class:`AttentionPlan`) and handed to every layer.

With a :class:`KVCache`, each key is rotated once, with its own position, when it enters the cache,
unless the scheme sets ``needs_unrotated_cache`` (its rotation depends on the current length,
e.g. dynamic NTK): then raw keys are cached and the whole cache is rotated at every step.

Legend: ``b`` batch, ``s`` new tokens (queries), ``s_p`` past tokens (cache or memory),
``s_k = s_p + s`` keys, ``d`` model width, ``h`` query heads, ``h_kv`` key/value heads,
``d_h`` head width, ``L`` layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..base import PositionalScheme
from ..kernels import attention_cpu as _attention_cpu
from ..positions import arange_positions, check_positions, positions_from_cu_seqlens, positions_from_mask
from .config import ModelConfig

__all__ = [
    "AttentionPlan",
    "KVCache",
    "MultiHeadAttention",
    "attend",
    "causal_mask",
    "plan_attention",
    "plan_cross_attention",
]


# ----------------------------------------------------------------------------------------------
# Masks and positions, planned once per forward pass
# ----------------------------------------------------------------------------------------------
def causal_mask(s_q: int, s_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean causal mask when the ``s_q`` queries are the *last* ``s_q`` of ``s_k`` key slots.

    Returns ``[s_q, s_k]``, True where query ``i`` (slot ``s_k - s_q + i``) may see key ``j``.
    With ``s_q == s_k`` this is the lower triangle; with a cache of ``s_p`` tokens, query ``i``
    sees the whole cache and the new keys up to itself.
    """
    q_slot = torch.arange(s_q, device=device)[:, None] + (s_k - s_q)  # [s_q, 1]
    return torch.arange(s_k, device=device)[None, :] <= q_slot  # [1, s_k] <= [s_q, 1] -> [s_q, s_k]


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
            applied one query block at a time (:meth:`bias_blocks`).
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

    def score_bias(self, scheme: PositionalScheme, q: torch.Tensor) -> torch.Tensor | None:
        """``scheme.score_bias`` for this forward's positions ``[b | 1, h, s, s_k]``; a bias that
        does not read ``q`` is computed once and reused by every layer sharing ``scheme``."""
        if scheme.score_bias_uses_query:
            return scheme.score_bias(self.q_positions, self.k_positions, q)
        if scheme not in self._biases:
            self._biases[scheme] = scheme.score_bias(self.q_positions, self.k_positions, q)
        return self._biases[scheme]

    def bias_blocks(self, scheme: PositionalScheme, q: torch.Tensor) -> _attention_cpu.BiasFn | None:
        """The scheme's bias one query block at a time, for :func:`posenc.kernels.attention_cpu.
        causal_attention_with_bias`, when this forward can take that path (a ``causal_prefix`` plan,
        CPU queries ``[b, h, s, d_h]`` of more than one block, outside ``torch.compile``: see
        :func:`~posenc.kernels.attention_cpu.usable`); else None.

        It never builds the ``[s, s_k]`` table and skips the masked future: on a CPU, ALiBi costs
        1.2-1.5x (T5 ~2x) the time of causal SDPA without a bias, against 3-5x for the full table
        (benchmarks/RESULTS.md).
        """
        if not (self.causal_prefix and _attention_cpu.usable(q)):
            return None
        if scheme.score_bias_uses_query:
            return _attention_cpu.scheme_bias_fn(scheme, self.q_positions, self.k_positions, q)
        if scheme not in self._bias_blocks:
            self._bias_blocks[scheme] = _attention_cpu.scheme_bias_fn(
                scheme, self.q_positions, self.k_positions, reuse=True
            )
        return self._bias_blocks[scheme]

    def keep(self, s_q: int, s_k: int, device: torch.device) -> torch.Tensor | None:
        """The mask as an explicit bool tensor (``[.., s, s_k]``), or None when nothing is masked."""
        if self.mask is not None:
            return self.mask
        if self.is_causal:
            return causal_mask(s_q, s_k, device)
        return None


def _check_mask(attention_mask: torch.Tensor, b: int, s: int) -> torch.Tensor:
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(
            f"attention_mask must be a bool/int tensor [b, s], got {type(attention_mask).__name__}"
        )
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(
            f"attention_mask must be bool or integer (1 = token, 0 = padding), got {attention_mask.dtype}"
        )
    if tuple(attention_mask.shape) != (b, s):
        raise ValueError(
            f"attention_mask must have shape [b, s] = {[b, s]} (one entry per new token; a KV cache "
            f"remembers the mask of the tokens it holds), got {list(attention_mask.shape)}"
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

    Returns:
        an :class:`AttentionPlan`. Padding queries attend to themselves only, so their (unused)
        outputs stay finite.
    """
    s_p = 0 if past_positions is None else past_positions.shape[-1]
    s_k = s_p + seq_len
    if cu_seqlens is not None:
        if s_p or attention_mask is not None:
            raise ValueError(
                "cu_seqlens (packed documents) cannot be combined with a KV cache, a memory or an "
                "attention_mask: packing already separates the documents"
            )
        if batch != 1:
            raise ValueError(f"packed documents (cu_seqlens) take ids of shape [1, total], got batch {batch}")
        doc_pos = positions_from_cu_seqlens(cu_seqlens).to(device)  # [total]
        if doc_pos.shape[0] != seq_len and not torch.compiler.is_compiling():
            raise ValueError(
                f"cu_seqlens[-1] = {doc_pos.shape[0]} must equal the packed length s = {seq_len}"
            )
        q_pos = doc_pos if positions is None else check_positions(positions, seq_len)
        doc = torch.searchsorted(
            cu_seqlens.to(device).long()[1:], torch.arange(seq_len, device=device), right=True
        )  # [s]: document index of each token
        keep = doc[:, None] == doc[None, :]  # [s, s] block diagonal
        if causal:
            keep = keep & causal_mask(seq_len, seq_len, device)
        return AttentionPlan(q_pos, q_pos, keep[None, None], False)  # [s, s] -> [1, 1, s, s]

    valid_new = None if attention_mask is None else _check_mask(attention_mask, batch, seq_len)
    if positions is not None:
        q_pos = check_positions(positions, seq_len)
    elif valid_new is not None:
        base = positions_from_mask(valid_new)  # [b, s], real tokens count from 0
        q_pos = base + (offset[:, None] if isinstance(offset, torch.Tensor) else offset)
    else:
        q_pos = arange_positions(seq_len, offset=offset, device=device)  # [s] or [b, s]
    k_pos = _cat_positions(past_positions, q_pos)

    if past_valid is None and valid_new is None:  # no padding anywhere
        if not causal:
            return AttentionPlan(q_pos, k_pos, None, False)
        if s_p and seq_len == 1:  # one new token that sees the whole cache
            return AttentionPlan(q_pos, k_pos, None, False, causal_prefix=True)
        if s_p == 0:
            return AttentionPlan(q_pos, k_pos, None, True, causal_prefix=True)
        mask = causal_mask(seq_len, s_k, device)[None, None]  # [s, s_k] -> [1, 1, s, s_k]
        return AttentionPlan(q_pos, k_pos, mask, False, causal_prefix=True)

    ones = torch.ones(batch, 1, dtype=torch.bool, device=device)
    past_ok = None if s_p == 0 else (past_valid if past_valid is not None else ones.expand(batch, s_p))
    new_ok = valid_new if valid_new is not None else ones.expand(batch, seq_len)
    key_ok = new_ok if past_ok is None else torch.cat((past_ok, new_ok), dim=-1)  # [b, s_k]
    keep = key_ok[:, None, None, :]  # [b, 1, 1, s_k]
    if causal:
        keep = keep & causal_mask(seq_len, s_k, device)  # -> [b, 1, s, s_k]
    # A padding query would see no key at all (softmax of all -inf = NaN): let it see itself.
    own_slot = (
        torch.arange(s_k, device=device)[None, :] == torch.arange(seq_len, device=device)[:, None] + s_p
    )
    keep = keep | (own_slot & ~new_ok[:, None, :, None])  # [s, s_k] & [b, 1, s, 1]
    return AttentionPlan(q_pos, k_pos, keep, False)


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
        return AttentionPlan(q_pos, k_pos, None, False)
    ok = _check_mask(context_mask, batch, context_len)
    return AttentionPlan(q_pos, k_pos, ok[:, None, None, :], False)  # [b, s_k] -> [b, 1, 1, s_k]


# ----------------------------------------------------------------------------------------------
# The KV cache: an explicit object the caller owns
# ----------------------------------------------------------------------------------------------
class KVCache:
    """Keys and values of past tokens for incremental decoding, per layer, with their positions.

    The caller creates it and passes it to every forward call; modules keep no hidden state::

        cache = KVCache(config.num_layers)
        logits = model(prompt, attention_mask=mask, cache=cache)   # prefill
        logits = model(next_ids, cache=cache)                      # one step, positions continue

    Attributes:
        keys, values: per layer ``[b, h_kv, s_p, d_h]`` (keys rotated, unless the scheme sets
            ``needs_unrotated_cache``), ``None`` before the first call.
        positions: ``[s_p]`` or ``[b, s_p]`` positions of the cached tokens.
        valid: ``[b, s_p]`` bool, False for padding slots; ``None`` while there is no padding.

    Under ``torch.no_grad()``/``torch.inference_mode()`` (as in ``generate``) keys and values live in
    per-layer buffers that grow by a quarter (at least 256 slots) when full, and ``keys[layer]`` /
    ``values[layer]`` are views of their first ``s_p`` slots: appending a token writes only its own
    slot (amortised O(1); concatenation copied the whole cache at every step), for at most ~25% more
    memory than the tokens need (a prefill is allocated exactly). Views handed out earlier are never
    written; keys assigned from outside (e.g. ``keys[layer] = keys[layer][:, :, :n]`` to roll back)
    are copied into new buffers. With gradients enabled the cache concatenates, so autograd, which
    may keep any of these tensors, never sees an in-place write.
    """

    def __init__(self, num_layers: int) -> None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.positions: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        # per layer: [b, h_kv, capacity, d_h] storage behind keys/values (None: not allocated), and
        # the views of it last handed out as keys[layer]/values[layer]
        self._buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self._views: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    def __len__(self) -> int:
        """``s_p``, the number of cached slots (padding included)."""
        return 0 if self.positions is None else self.positions.shape[-1]

    def offset(self) -> int | torch.Tensor:
        """Position of the next token: the number of real tokens so far, an int or ``[b]`` per row."""
        if self.valid is not None:
            return self.valid.long().sum(-1)  # [b]
        if self.positions is None:
            return 0
        return int(self.positions[..., -1].max()) + 1  # one past the last cached position

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys/values ``[b, h_kv, s, d_h]`` to ``layer``.

        Returns all of the layer's keys/values ``[b, h_kv, s_k, d_h]``.
        """
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is not None and (past_k.shape[:2] != k.shape[:2] or past_k.shape[3] != k.shape[3]):
            raise ValueError(
                f"cache layer {layer} holds keys [b, h_kv, s_p, d_h] = {list(past_k.shape)}; new keys "
                f"{list(k.shape)} must agree in b, h_kv and d_h (use a new KVCache for a new batch)"
            )
        if torch.is_grad_enabled():  # autograd may keep the keys: never write into them
            self._buffers[layer] = self._views[layer] = None
            if past_k is not None:
                k, v = torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)  # [b, h_kv, s_p + s, d_h]
            self.keys[layer], self.values[layer] = k, v
            return k, v
        s_p = 0 if past_k is None else past_k.shape[2]
        s_k = s_p + k.shape[2]
        bufs = self._buffers[layer]
        # the buffers' first s_p slots hold the past only if keys/values are still the views this
        # cache handed out; anything assigned from outside (a rollback, a window) goes to new buffers
        # so that no view someone holds is ever written
        ours = past_k is None or (
            self._views[layer] is not None
            and self._views[layer][0] is past_k
            and self._views[layer][1] is past_v
        )
        if not ours or not _fits(bufs, k, v, s_k):  # grow by a quarter (>= 256 slots), copy the past once
            old = 0 if bufs is None else bufs[0].shape[2]
            capacity = s_k if old == 0 else max(s_k, old + max(old // 4, _MIN_GROWTH))
            bufs = (_grown(k, capacity), _grown(v, capacity))  # [b, h_kv, capacity, d_h]
            if s_p:
                bufs[0][:, :, :s_p].copy_(past_k)
                bufs[1][:, :, :s_p].copy_(past_v)
            self._buffers[layer] = bufs
        bufs[0][:, :, s_p:s_k].copy_(k)  # the new tokens' slots only
        bufs[1][:, :, s_p:s_k].copy_(v)
        self.keys[layer], self.values[layer] = bufs[0][:, :, :s_k], bufs[1][:, :, :s_k]  # views
        self._views[layer] = (self.keys[layer], self.values[layer])
        return self.keys[layer], self.values[layer]

    def advance(self, plan: AttentionPlan, new_valid: torch.Tensor | None) -> None:
        """Record the new tokens' positions (and padding) once every layer has been updated."""
        batch = None if self.keys[0] is None else self.keys[0].shape[0]
        self.positions = plan.k_positions
        if new_valid is None and self.valid is None:
            return
        s_p = self.positions.shape[-1] - (plan.q_positions.shape[-1])
        old = (
            self.valid
            if self.valid is not None
            else torch.ones(batch, s_p, dtype=torch.bool, device=self.positions.device)
        )
        new = (
            new_valid.bool()
            if new_valid is not None
            else torch.ones(batch, plan.q_positions.shape[-1], dtype=torch.bool, device=self.positions.device)
        )
        self.valid = torch.cat((old, new), dim=-1)  # [b, s_k]

    def past(self) -> dict:
        """Keyword arguments for :func:`plan_attention` describing the cached tokens."""
        return {"past_positions": self.positions, "past_valid": self.valid, "offset": self.offset()}


#: slots a full KV-cache buffer grows by at least (a quarter of its size otherwise)
_MIN_GROWTH = 256


def _fits(bufs, k: torch.Tensor, v: torch.Tensor, s_k: int) -> bool:
    """Whether a layer's buffers can hold ``s_k`` slots of keys/values like ``k``/``v``."""
    if bufs is None:
        return False
    kb, vb = bufs
    if kb.is_inference() and not torch.is_inference_mode_enabled():
        return False  # filled under inference_mode, written outside it: a normal tensor is needed
    return (
        kb.shape[2] >= s_k
        and (kb.shape[:2], kb.shape[3], kb.dtype, kb.device) == (k.shape[:2], k.shape[3], k.dtype, k.device)
        and (vb.shape[:2], vb.shape[3], vb.dtype, vb.device) == (v.shape[:2], v.shape[3], v.dtype, v.device)
    )


def _grown(x: torch.Tensor, capacity: int) -> torch.Tensor:
    """An empty ``[b, h_kv, capacity, d_h]`` buffer like ``x``."""
    b, h, _, d = x.shape
    return x.new_empty(b, h, capacity, d)


# ----------------------------------------------------------------------------------------------
# The attention computation (pure)
# ----------------------------------------------------------------------------------------------
def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    plan: AttentionPlan | None = None,
    bias: torch.Tensor | None = None,
    relative_values: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d_h) + bias + mask) v`` (+ Shaw's value term), heads grouped for GQA.

    Args:
        q: ``[b, h, s, d_h]`` queries (already rotated).
        k, v: ``[b, h_kv, s_k, d_h]``; ``h_kv`` divides ``h`` (each key/value head serves
            ``h / h_kv`` query heads).
        plan: masks (causal, padding, packing); None = attend to everything.
        bias: ``[b | 1, h, s, s_k]`` additive bias on the scaled logits, cast to ``q``'s dtype.
        relative_values: ``[s, s_k, d_h]``, ``[h, s, s_k, d_h]`` or ``[b, h, s, s_k, d_h]``
            vectors ``a^V_ij`` added as ``sum_j p_ij a^V_ij`` (explicit-softmax path).
        dropout_p: dropout on the attention probabilities.

    Returns:
        ``[b, h, s, d_h]``.
    """
    s_q, s_k = q.shape[-2], k.shape[-2]
    group = q.shape[1] // k.shape[1]
    if relative_values is not None:
        return _attend_explicit(q, k, v, plan, bias, relative_values, dropout_p)
    if bias is None:
        if plan is None or (plan.mask is None and not plan.is_causal):
            attn_mask, is_causal = None, False
        else:
            attn_mask, is_causal = plan.mask, plan.mask is None and plan.is_causal
    else:
        # One float mask: the bias where attention is allowed, -inf elsewhere.
        attn_mask, is_causal = bias.to(q.dtype), False
        keep = None if plan is None else plan.keep(s_q, s_k, q.device)
        if keep is not None:
            attn_mask = attn_mask.masked_fill(~keep, float("-inf"))  # [b | 1, h, s, s_k]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=group > 1
    )


def _attend_explicit(q, k, v, plan, bias, relative_values, dropout_p):
    """Explicit softmax, for schemes whose values depend on relative position (Shaw et al. 2018)."""
    s_q, s_k = q.shape[-2], k.shape[-2]
    group = q.shape[1] // k.shape[1]
    if group > 1:  # [b, h_kv, s_k, d_h] -> [b, h, s_k, d_h], head i uses kv head i // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    # softmax in float32 at least (bf16/fp16 logits lose the small differences); float64 stays float64
    acc = torch.promote_types(q.dtype, torch.float32)
    scores = (q @ k.transpose(-2, -1)).to(acc) / math.sqrt(q.shape[-1])  # [b, h, s, s_k]
    if bias is not None:
        scores = scores + bias.to(acc)
    keep = None if plan is None else plan.keep(s_q, s_k, q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    p = F.dropout(scores.softmax(-1), dropout_p, training=dropout_p > 0).to(q.dtype)  # [b, h, s, s_k]
    out = p @ v  # [b, h, s, d_h]
    rv = relative_values.to(q.dtype)
    if rv.dim() == 3:  # [s, s_k, d_h], the same for every batch row and head
        return out + torch.einsum("bhqk,qkd->bhqd", p, rv)
    if rv.dim() == 4:  # [h, s, s_k, d_h]
        return out + torch.einsum("bhqk,hqkd->bhqd", p, rv)
    if rv.dim() == 5:  # [b | 1, h | 1, s, s_k, d_h] (batched positions): broadcast, sum over keys
        return out + (p.unsqueeze(-1) * rv).sum(-2)  # [b, h, s, s_k, 1] * [.., s, s_k, d_h] -> [b, h, s, d_h]
    raise ValueError(
        "relative_values must return [s, s_k, d_h], [h, s, s_k, d_h] or [b | 1, h | 1, s, s_k, d_h], "
        f"got {tuple(rv.shape)}"
    )


def _relative_values(
    scheme: PositionalScheme, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor | None:
    """``scheme.relative_values`` with the contract's 1-D positions; batched positions (left padding)
    are handled one row at a time and stacked to ``[b, h | 1, s, s_k, d_h]``."""
    if q_pos.dim() == 1 and k_pos.dim() == 1:
        return scheme.relative_values(q_pos, k_pos)
    b = q_pos.shape[0] if q_pos.dim() == 2 else k_pos.shape[0]
    q_pos, k_pos = q_pos.expand(b, -1), k_pos.expand(b, -1)  # [b, s], [b, s_k]
    rows = [scheme.relative_values(q_pos[i], k_pos[i]) for i in range(b)]
    if rows[0] is None:
        return None
    rows = [r if r.dim() == 4 else r[None] for r in rows]  # [s, s_k, d_h] -> [1, s, s_k, d_h]
    return torch.stack(rows)  # [b, h | 1, s, s_k, d_h]


# ----------------------------------------------------------------------------------------------
# The module
# ----------------------------------------------------------------------------------------------
class MultiHeadAttention(nn.Module):
    """Multi-head (``h_kv = h``), grouped-query (``h_kv < h``) or multi-query (``h_kv = 1``) attention.

    Args:
        config: a :class:`~posenc.model.ModelConfig` (``d_model``, ``num_heads``, ``num_kv_heads``,
            ``dropout``, ``bias``, ``qk_layout``).

    ``config.qk_layout`` is the axis order the scheme's ``rotate`` sees: ``"bhsd"`` (default,
    ``[b, h, s, d_h]``) or ``"bshd"`` (``[b, s, h, d_h]``, rotated before the transpose, as
    torchtune does). Both give the same outputs; scores, the cache and ``score_bias`` always
    use ``[b, h, s, d_h]``.

    The positional scheme is not owned here: the caller passes it to :meth:`forward`, so one
    scheme instance can serve every layer (T5-style sharing) or each layer its own.

    Shapes: ``forward(x [b, s, d], plan, scheme) -> [b, s, d]``; with ``kv [b, s_k, d]`` the keys
    and values come from ``kv`` (cross-attention, or a Transformer-XL memory followed by ``x``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.kv_heads, config.head_dim
        d, d_kv = config.d_model, config.kv_heads * config.head_dim
        self.q_proj = nn.Linear(d, d, bias=config.bias)
        self.k_proj = nn.Linear(d, d_kv, bias=config.bias)
        self.v_proj = nn.Linear(d, d_kv, bias=config.bias)
        self.o_proj = nn.Linear(d, d, bias=config.bias)
        self.dropout = config.dropout
        self.qk_layout = config.qk_layout

    def project(self, x: torch.Tensor, kv: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Queries ``[b, h, s, d_h]`` from ``x``; keys/values ``[b, h_kv, s_k, d_h]`` from ``kv`` or ``x``.
        With ``qk_layout="bshd"`` queries and keys stay ``[b, s, h, d_h]`` (values are always bhsd)."""
        b, s, _ = x.shape
        src = x if kv is None else kv
        s_k = src.shape[1]
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim)  # [b, s, d] -> [b, s, h, d_h]
        k = self.k_proj(src).view(b, s_k, self.num_kv_heads, self.head_dim)  # [b, s_k, h_kv, d_h]
        v = self.v_proj(src).view(b, s_k, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_layout == "bshd":
            return q, k, v
        return q.transpose(1, 2), k.transpose(1, 2), v  # [b, h, s, d_h]

    def _heads_first(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` from :meth:`project`'s layout to ``[b, h, s, d_h]`` (a view)."""
        return t.transpose(1, 2) if self.qk_layout == "bshd" else t

    def _rotate(self, scheme, q, k, q_pos, k_pos):
        """Rotate q/k in this module's ``qk_layout``; returns them as ``[b, h, s, d_h]``."""
        if self.qk_layout == "bhsd":
            return scheme.rotate(q, k, q_pos, k_pos)
        q, k = scheme.rotate(q, k, q_pos, k_pos, qk_layout="bshd")
        return q.transpose(1, 2), k.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        plan: AttentionPlan,
        scheme: PositionalScheme | None = None,
        *,
        kv: torch.Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """Attend from ``x`` ``[b, s, d]`` to ``kv`` (default ``x``) and the cache; returns ``[b, s, d]``.

        Args:
            x: ``[b, s, d]`` the new tokens.
            plan: positions and masks from :func:`plan_attention` (same for every layer).
            scheme: the positional scheme whose ``rotate``/``score_bias``/``relative_values`` apply;
                None for cross-attention.
            kv: ``[b, s_k, d]`` key/value source (cross-attention or memory ++ ``x``).
            cache: a :class:`KVCache`; this layer's keys/values are appended to it.
            layer: this layer's index in the cache.
        """
        b, s, d = x.shape
        q, k, v = self.project(x, kv)
        q, k, v, bias, rel = self.apply_scheme(q, k, v, plan, scheme, cache, layer, blocked=True)
        dropout_p = self.dropout if self.training else 0.0
        if callable(bias):  # a per-block bias (plan.bias_blocks): causal, no padding, CPU
            out = _attention_cpu.causal_attention_with_bias(q, k, v, bias, dropout_p=dropout_p)
        else:
            out = attend(q, k, v, plan=plan, bias=bias, relative_values=rel, dropout_p=dropout_p)
        # out: [b, h, s, d_h]
        return self.o_proj(
            out.transpose(1, 2).reshape(b, s, d)
        )  # [b, h, s, d_h] -> [b, s, h, d_h] -> [b, s, d]

    def apply_scheme(self, q, k, v, plan, scheme, cache, layer, blocked=False):
        """Run the scheme's hooks on the projections and fill the cache (see the module docstring).

        Returns ``(q, k, v, bias, relative_values)``; ``k``/``v`` cover every key, ``[b, h_kv, s_k, d_h]``;
        ``bias`` is ``[b | 1, h, s, s_k]``, or with ``blocked`` a per-query-block function
        (:meth:`AttentionPlan.bias_blocks`) where the plan allows it.
        """
        bias = rel = None
        if scheme is not None:
            rel = _relative_values(scheme, plan.q_positions, plan.k_positions)
            if "score_bias" in scheme.hooks:  # q before rotate
                qh = self._heads_first(q)
                if blocked and rel is None:
                    bias = plan.bias_blocks(scheme, qh)
                if bias is None:
                    bias = plan.score_bias(scheme, qh)
        rotates = scheme is not None and "rotate" in scheme.hooks
        if rotates and cache is None:
            q, k = self._rotate(scheme, q, k, plan.q_positions, plan.k_positions)
        elif rotates and scheme.needs_unrotated_cache:
            k, v = cache.update(layer, self._heads_first(k), v)  # raw keys in the cache, rotated below
            q, k = scheme.rotate(self._heads_first(q), k, plan.q_positions, plan.k_positions)
        elif rotates:
            s_new = k.shape[2 if self.qk_layout == "bhsd" else 1]
            new_k_pos = plan.k_positions[..., plan.k_positions.shape[-1] - s_new :]  # the new keys' positions
            q, k = self._rotate(scheme, q, k, plan.q_positions, new_k_pos)  # each key rotated once, on entry
            k, v = cache.update(layer, k, v)
        else:
            q, k = self._heads_first(q), self._heads_first(k)
            if cache is not None:
                k, v = cache.update(layer, k, v)
        return q, k, v, bias, rel

    @torch.no_grad()
    def logits(
        self, x: torch.Tensor, plan: AttentionPlan, scheme: PositionalScheme | None = None
    ) -> torch.Tensor:
        """The pre-softmax logits ``q k^T / sqrt(d_h) + bias`` ``[b, h, s, s_k]``, unmasked (for analysis).

        Content-dependent value terms (Shaw's ``a^V``) are not logits and are not included.
        """
        q, k, v = self.project(x)
        q, k, _, bias, _ = self.apply_scheme(q, k, v, plan, scheme, None, 0)
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)  # [b, h_kv, s_k, d_h] -> [b, h, s_k, d_h]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # [b, h, s, s_k]
        return scores if bias is None else scores + bias.to(scores.dtype)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
