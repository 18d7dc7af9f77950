"""CoPE (Golovneva et al. 2024): contextual positions, counted by gates the keys' content opens,
added to the attention logits (the ``score_bias`` hook, reading the queries and the keys).

A position here is not a token index but a count of the tokens that matter to a query: each key
``t`` gets a gate from its logit, and the position of key ``j`` seen from query ``i`` is the sum of
the gates of the keys from ``j`` to ``i``::

    g_it    = sigmoid(q_i . k_t / sqrt(d_h))             (0 for keys the mask hides)
    p_ij    = sum_{t=j..i} g_it,  clamped to max_pos - 1   (fractional: between two integers)
    z_i[n]  = q_i . e[n]                                  (e: max_pos learned vectors, shared by heads)
    bias_ij = (1 - w) z_i[floor(p_ij)] + w z_i[ceil(p_ij)],  w = p_ij - floor(p_ij)

So a query can attend to "the 3rd sentence back" when the gates open on sentence ends, which token
positions cannot express; the paper reports gains on counting and selective copying. The gates use
the scaled logits and the embeddings the raw queries, as the paper's code and x-transformers' ``CoPE``
(whose numbers posenc reproduces with copied weights).

CoPE is defined for causal attention (a position counts the keys between a key and its query), so
it declares ``bidirectional_ok = False`` and an encoder refuses it. In a model the gates follow the
attention mask, so a KV cache (all keys so far), packed documents (keys of other documents
hidden) and left padding (padding keys hidden) give the same biases as each sequence alone. Token
positions are used only without a mask: then keys after a query (``k_pos > q_pos``) are closed.

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key heads, ``s_q``/``s_k`` query/key lengths,
``d_h`` head width, ``n`` positions (``max_pos``).
"""

from __future__ import annotations

import torch
from torch import nn

from ._alloc import factory_kwargs
from ._precision import autocast_off
from ._validate import check_int
from .base import PositionalScheme
from .bias import relative_positions

__all__ = ["CoPE"]


class CoPE(PositionalScheme):
    """Contextual position encoding (Golovneva et al. 2024).

    Args:
        head_dim: ``d_h``, the width of the position vectors.
        num_heads: ``h``, the query heads (the vectors are shared by all of them, as in the paper).
        max_pos: ``n``, how many integer positions have a vector; counts past ``n - 1`` share the
            last one (the paper's ``npos_max``).

    Parameters: ``pos_emb [n, d_h]`` (zeros at init, as the paper's code).

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k],
    q [b, h, s_q, d_h], *, k=[b, h_kv, s_k, d_h], keep=[b | 1, 1 | h, s_q, s_k] bool | None)
    -> [b, h, s_q, s_k]`` in float32 (float64 for float64 ``q``). ``keep``: True where attention may
    look (the model's mask); ``None``: keys with ``k_pos <= q_pos``. Without ``k`` the keys take the
    first query's content at every position (the positional kernel's fixed content).
    """

    name = "cope"
    hooks = ("score_bias",)
    score_bias_uses_query = True
    score_bias_uses_keys = True
    bidirectional_ok = False
    summary = "contextual positions: gated key counts index learned vectors (Golovneva et al. 2024)"

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        max_pos: int = 64,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_int(head_dim, "head_dim")
        self.num_heads = check_int(num_heads, "num_heads")
        self.max_pos = check_int(max_pos, "max_pos", minimum=2)
        self.pos_emb = nn.Parameter(torch.zeros(self.max_pos, self.head_dim, **factory_kwargs(device, dtype)))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.pos_emb)

    def _check(self, q: object, k: object) -> None:
        for name, t, heads in (("q", q, self.num_heads), ("k", k, None)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 4:
                what = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"cope: {name} must be a float tensor [b, h, s, {self.head_dim}], got {what}")
            if t.shape[-1] != self.head_dim or (heads is not None and t.shape[1] != heads):
                raise ValueError(
                    f"cope: {name} must have shape [b, {heads or 'h_kv'}, s, {self.head_dim}], "
                    f"got {tuple(t.shape)}"
                )
        kv_heads, batches = k.shape[1], (q.shape[0], k.shape[0])  # type: ignore[union-attr]
        if self.num_heads % kv_heads:
            raise ValueError(
                f"cope: k has {kv_heads} heads, which must divide the {self.num_heads} query heads"
            )
        if batches[0] != batches[1]:
            raise ValueError(
                f"cope: q and k must have the same batch size, got {batches[0]} and {batches[1]}"
            )

    def positions(self, q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The contextual positions ``p_ij`` ``[b, h, s_q, s_k]`` (float, ``0 .. max_pos - 1``) of
        queries ``q [b, h, s_q, d_h]`` and keys ``k [b, h_kv, s_k, d_h]`` where ``keep`` is True."""
        acc = torch.promote_types(q.dtype, torch.float32)
        group = self.num_heads // k.shape[1]
        k = (
            k.repeat_interleave(group, dim=1) if group > 1 else k
        )  # [b, h, s_k, d_h]: head i <- kv head i // group
        logits = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * self.head_dim**-0.5  # [b, h, s_q, s_k]
        gates = torch.where(keep, torch.sigmoid(logits), torch.zeros_like(logits))
        counted = gates.flip(-1).cumsum(-1).flip(-1)  # sum over t >= j of g_it (later keys are closed)
        return counted.clamp(max=self.max_pos - 1)

    def score_bias(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        q: torch.Tensor | None = None,
        *,
        k: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if q is None:
            raise ValueError("cope.score_bias needs the queries: pass q=[b, h, s_q, d_h] (projected)")
        rel = relative_positions(q_positions, k_positions)  # [b|1, s_q, s_k] = j - i; checks the positions
        if k is None:  # the fixed content of a positional kernel: every key is the first query
            k = q[:, :, :1].expand(-1, -1, rel.shape[-1], -1)
        self._check(q, k)
        if keep is None:
            keep = (rel <= 0)[:, None]  # [b|1, 1, s_q, s_k]: keys at or before the query
        elif (
            not isinstance(keep, torch.Tensor)
            or keep.dtype != torch.bool
            or keep.shape[-2:] != rel.shape[-2:]
            or keep.dim() > 4
        ):
            what = (
                f"{keep.dtype} {tuple(keep.shape)}" if isinstance(keep, torch.Tensor) else type(keep).__name__
            )
            raise ValueError(
                "cope: keep must be a bool mask [b | 1, 1 | h, s_q, s_k] with s_q, s_k = "
                f"{tuple(rel.shape[-2:])} (True where attention may look), got {what}"
            )
        with autocast_off(q.device):
            pos = self.positions(q, k, keep)  # [b, h, s_q, s_k]
            acc = pos.dtype
            z = q.to(acc) @ self.pos_emb.to(acc).t()  # [b, h, s_q, d_h] @ [d_h, n] -> [b, h, s_q, n]
            low, high = pos.floor(), pos.ceil()
            w = pos - low
            z_low = z.gather(-1, low.long())  # [b, h, s_q, s_k]
            z_high = z.gather(-1, high.long())
            return z_high * w + z_low * (1 - w)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, max_pos={self.max_pos}"
