"""The interface of attention that applies a positional bias itself (:class:`BiasedAttention`),
chosen per forward pass by :meth:`posenc.model.plan.AttentionPlan.bias_blocks`: the blocked path on
CPU (:class:`posenc.model.blocked.BlockedAttention`), FlexAttention on CUDA
(:class:`posenc.model.flex.FlexBiasedAttention`).

A base class rather than a ``typing.Protocol``: the model asks ``isinstance(bias, BiasedAttention)``
inside ``torch.compile`` graphs, which TorchDynamo answers for a class but not for a protocol with
data members.

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q``/``s_k`` query/key
lengths, ``d_h`` head width.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch

__all__ = ["BiasedAttention"]


class BiasedAttention(abc.ABC):
    """``attention(q [b, h, s_q, d_h], k, v [b, h_kv, s_k, d_h], dropout_p=...) -> [b, h, s_q, d_h]``
    (``q`` rotated, ``k``/``v`` every key, the cache's included).

    Attributes:
        takes_dropout: False where the path has no attention dropout: a model that needs dropout
            calls ``full_bias()`` and SDPA instead.
        full_bias: the bias as ``[b | 1, h, s_q, s_k]`` (:meth:`AttentionPlan.score_bias`).
    """

    takes_dropout: bool
    full_bias: Callable[[], torch.Tensor]

    @abc.abstractmethod
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0
    ) -> torch.Tensor: ...
