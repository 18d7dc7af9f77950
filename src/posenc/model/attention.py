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

import torch
import torch.nn.functional as F
from torch import nn

from ..base import PositionalScheme
from .biased import BiasedAttention
from .cache import KVCache
from .config import ModelConfig
from .norms import RMSNorm
from .plan import AttentionPlan

__all__ = ["MultiHeadAttention", "attend"]


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
            ``dropout``, ``bias``/``qkv_bias``/``out_bias``, ``qk_norm``, ``qk_layout``).

    With ``config.qk_norm`` each head's queries and keys pass an RMSNorm over their ``d_h`` dims
    (one weight shared by the heads) before the positional scheme, as in Qwen3.

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
        d, d_q, d_kv = config.d_model, config.num_heads * config.head_dim, config.kv_heads * config.head_dim
        qkv_bias = config.projection_bias("qkv")
        self.q_proj = nn.Linear(d, d_q, bias=qkv_bias)
        self.k_proj = nn.Linear(d, d_kv, bias=qkv_bias)
        self.v_proj = nn.Linear(d, d_kv, bias=qkv_bias)
        self.o_proj = nn.Linear(d_q, d, bias=config.projection_bias("out"))
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
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
        if self.q_norm is not None:  # per head, over d_h
            q, k = self.q_norm(q), self.k_norm(k)
        if self.qk_layout == "bshd":
            return q, k, v
        return q.transpose(1, 2), k.transpose(1, 2), v  # [b, h, s, d_h]

    def _heads_first(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` from :meth:`project`'s layout to ``[b, h, s, d_h]`` (a view)."""
        return t.transpose(1, 2) if self.qk_layout == "bshd" else t

    def _rotate(self, scheme, q, k, plan, k_pos):
        """Rotate q/k in this module's ``qk_layout`` with the tables this forward pass shares between
        layers (:meth:`AttentionPlan.rotary_tables`); returns them as ``[b, h, s, d_h]``."""
        tables = plan.rotary_tables(scheme, q, k, k_pos, self.qk_layout)
        kw = {} if tables is None else {"tables": tables}
        if self.qk_layout == "bhsd":
            return scheme.rotate(q, k, plan.q_positions, k_pos, **kw)
        q, k = scheme.rotate(q, k, plan.q_positions, k_pos, qk_layout="bshd", **kw)
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
        b, s = x.shape[:2]
        q, k, v = self.project(x, kv)
        dropout_p = self.dropout if self.training else 0.0
        q, k, v, bias, rel = self.apply_scheme(
            q, k, v, plan, scheme, cache, layer, blocked=True, dropout_p=dropout_p
        )
        if isinstance(bias, BiasedAttention) and (bias.takes_dropout or not dropout_p):
            out = bias(q, k, v, dropout_p=dropout_p)  # the bias applied inside (plan.bias_blocks)
        else:
            if isinstance(bias, BiasedAttention):  # a path without dropout, in training with dropout
                bias = bias.full_bias()  # [b | 1, h, s, s_k]
            out = attend(q, k, v, plan=plan, bias=bias, relative_values=rel, dropout_p=dropout_p)
        # out: [b, h, s, d_h]
        return self.o_proj(
            out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        )  # [b, h, s, d_h] -> [b, s, h, d_h] -> [b, s, h * d_h] -> [b, s, d]

    def apply_scheme(self, q, k, v, plan, scheme, cache, layer, blocked=False, dropout_p=0.0):
        """Run the scheme's hooks on the projections and fill the cache (see the module docstring):
        ``score_bias`` on the raw queries, ``rotate`` on queries and keys (each key once, as it enters
        the cache), then ``queries`` on the queries alone (keys and cache untouched).

        Returns ``(q, k, v, bias, relative_values)``; ``k``/``v`` cover every key, ``[b, h_kv, s_k, d_h]``;
        ``bias`` is ``[b | 1, h, s, s_k]``, or with ``blocked`` a :class:`BiasedAttention`
        (:meth:`AttentionPlan.bias_blocks`, told the attention dropout ``dropout_p``) where the plan
        allows it.
        """
        bias = rel = None
        # a bias that reads the keys (CoPE) needs them all, the cache's included: computed at the end
        keyed = scheme is not None and "score_bias" in scheme.hooks and scheme.score_bias_uses_keys
        q_raw = self._heads_first(q) if keyed else None  # q before rotate
        if scheme is not None:
            if scheme.has_relative_values:  # Shaw et al. with values: the explicit-softmax path
                rel = _relative_values(scheme, plan.q_positions, plan.k_positions)
            if "score_bias" in scheme.hooks and not keyed:  # q before rotate
                qh = self._heads_first(q)
                if blocked and rel is None:
                    bias = plan.bias_blocks(scheme, qh, dropout_p=dropout_p)
                if bias is None:
                    bias = plan.score_bias(scheme, qh)
        rotates = scheme is not None and "rotate" in scheme.hooks
        if rotates and cache is None:
            q, k = self._rotate(scheme, q, k, plan, plan.k_positions)
        elif rotates and scheme.needs_unrotated_cache:
            k, v = cache.update(layer, self._heads_first(k), v)  # raw keys in the cache, rotated below
            q, k = scheme.rotate(self._heads_first(q), k, plan.q_positions, plan.k_positions)
        elif rotates:
            s_new = k.shape[2 if self.qk_layout == "bhsd" else 1]
            new_k_pos = plan.k_positions[..., plan.k_positions.shape[-1] - s_new :]  # the new keys' positions
            q, k = self._rotate(scheme, q, k, plan, new_k_pos)  # each key rotated once, on entry
            k, v = cache.update(layer, k, v)
        else:
            q, k = self._heads_first(q), self._heads_first(k)
            if cache is not None:
                k, v = cache.update(layer, k, v)
        if scheme is not None and "queries" in scheme.hooks:  # after rotate, on q [b, h, s, d_h] alone
            q = scheme.queries(q, plan.q_positions, qk_layout="bhsd")
        if keyed:
            bias = plan.score_bias(scheme, q_raw, k)
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
