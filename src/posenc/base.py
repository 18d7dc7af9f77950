"""The one interface every positional scheme has: up to three hooks on attention.

A scheme acts in one or more of three places (DESIGN.md section 2):

============  ===========================================  =====================================
hook          acts on                                      schemes
============  ===========================================  =====================================
``embed``     input embeddings ``[b, s, d]`` (added)       sinusoidal, learned, scaled sinusoidal
``rotate``    queries and keys ``[b, h, s, d_h]``          RoPE and its scalings, xPos
``score_bias``attention logits ``[b | 1, h, s_q, s_k]``    ALiBi, T5, Shaw, Transformer-XL
============  ===========================================  =====================================

A hook a scheme does not use is the identity (``embed`` returns ``x``, ``rotate`` returns
``(q, k)``, ``score_bias`` returns ``None``), so a model can call all three unconditionally;
``scheme.hooks`` says which ones do something, so a model can also skip the rest.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``h`` heads, ``d_h`` head width,
``s_q``/``s_k`` query/key lengths. Positions are integer tensors ``[s]`` or ``[b, s]``; ``None``
means ``arange(s)``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

__all__ = ["HOOKS", "PositionalScheme"]

HOOKS = ("embed", "rotate", "score_bias")


class PositionalScheme(nn.Module):
    """Base class of every positional scheme.

    Class attributes a scheme sets:
        name: the registry name (``"sinusoidal"``).
        hooks: the hooks it uses, a subset of ``("embed", "rotate", "score_bias")``.
        summary: one line for ``posenc list``.
        max_len: the longest input it can encode, or ``None`` when positions are unbounded.
        causal_ok: whether the scheme can run in a causal decoder (with a KV cache).
    """

    name: ClassVar[str] = "base"
    hooks: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""
    causal_ok: ClassVar[bool] = True
    max_len: int | None = None

    def embed(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Add the positional part to input embeddings.

        Args:
            x: ``[b, s, d]`` token embeddings.
            positions: ``[s]`` or ``[b, s]`` integer positions, default ``arange(s)``.

        Returns:
            ``[b, s, d]``, same dtype as ``x``. The identity for schemes without this hook.
        """
        return x

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply the positional transform to queries and keys.

        Args:
            q: ``[b, h, s_q, d_h]`` queries.
            k: ``[b, h_kv, s_k, d_h]`` keys.
            q_positions: ``[s_q]`` or ``[b, s_q]``, default ``arange(s_q)``.
            k_positions: ``[s_k]`` or ``[b, s_k]``, default ``arange(s_k)``.

        Returns:
            ``(q, k)`` with the same shapes and dtypes. The identity for schemes without this hook.
        """
        return q, k

    def score_bias(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        q: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Additive bias on the attention logits.

        Args:
            q_positions: ``[s_q]`` or ``[b, s_q]`` integer positions.
            k_positions: ``[s_k]`` or ``[b, s_k]`` integer positions.
            q: ``[b, h, s_q, d_h]`` queries, for schemes whose bias depends on content
                (Shaw, Transformer-XL); ignored by the others.

        Returns:
            ``[b | 1, h, s_q, s_k]`` float bias, or ``None`` for schemes without this hook.
        """
        return None

    def extra_repr(self) -> str:
        return f"hooks={list(self.hooks)}"
