"""FIRE (Li et al., ICLR 2024): a learned function of the log-scaled relative distance, normalised by
the query position, added to the attention logits (the ``score_bias`` hook).

For a query at position ``i`` and a key at position ``j`` (``i >= j`` in a decoder)::

    psi(x)        = log(|c x| + 1)                      (c > 0 learned; init 0.1)
    L             = |l * L0|                            (L0 the initial threshold, l learned; init 1)
    bias_h(i, j)  = f_theta( psi(i - j) / (psi(max(i, L)) + eps) )_h

``f_theta`` is an MLP ``1 -> w -> h`` with a ReLU (``w = 32`` in the paper), one output per head.
The normaliser makes the input lie in ``[0, 1]`` for every query past the threshold ``L``, so a
longer input reuses the range the MLP saw in training (progressive interpolation) instead of
extrapolating to unseen distances; below ``L`` the normaliser is fixed and the bias is a function
of the distance alone. The paper shows FIRE can represent T5's buckets, ALiBi and KERPLE.

The bias depends on the query's position, not only on ``j - i``, so FIRE answers no
``distance_bias``; it runs at any length, with a KV cache (offset positions), packed documents
(positions restart at 0, so ``i`` is the position within the document) and left padding
(positions from the mask). An encoder reads ``|i - j|`` (the ``|.|`` in ``psi``).

Legend: ``b`` batch, ``h`` heads, ``s_q``/``s_k`` query/key lengths, ``w`` the MLP's width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._alloc import factory_kwargs
from ._precision import autocast_off
from ._validate import check_int, check_positive_float
from .base import PositionalScheme
from .bias import relative_positions

__all__ = ["FIRE"]


class FIRE(PositionalScheme):
    """Functional Interpolation for Relative Positions (Li et al. 2024).

    Args:
        num_heads: ``h``, outputs of the MLP.
        mlp_width: ``w``, its hidden width (the paper: 32).
        init_c: the initial ``c`` of ``psi(x) = log(|c x| + 1)`` (the paper: 0.1).
        init_threshold: ``L0``, the initial threshold below which the normaliser stays fixed (the
            paper: 512); the learned multiplier ``l`` starts at 1.
        eps: added to the normaliser (the paper: 1e-6).

    Parameters: ``mlp`` (``Linear(1, w)``, ReLU, ``Linear(w, h)``; PyTorch's default init), ``c``
    (0-d), ``threshold_scale`` (0-d, ``l``); buffer ``init_threshold`` (0-d, ``L0``).

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k])
    -> [b | 1, h, s_q, s_k]`` in float32 (float64 for float64 parameters). The MLP's hidden
    activations are ``[b | 1, s_q, s_k, w]``: a model on CPU builds them one block of queries at a
    time.
    """

    name = "fire"
    hooks = ("score_bias",)
    #: the normaliser reads the query's position, so FIRE is translation invariant only below the
    #: threshold, and a learned MLP need not decay: what it promises is a finite bias at any length
    promises = ("beyond_length",)
    summary = "learned MLP of log distance / log query position on the logits (Li et al. 2024)"

    def __init__(
        self,
        num_heads: int,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_threshold: float = 512.0,
        eps: float = 1e-6,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = factory_kwargs(device, dtype)
        self.num_heads = check_int(num_heads, "num_heads")
        self.mlp_width = check_int(mlp_width, "mlp_width")
        self.eps = check_positive_float(eps, "eps")
        self._init_c = check_positive_float(init_c, "init_c")
        self.mlp = nn.Sequential(
            nn.Linear(1, self.mlp_width, **factory),
            nn.ReLU(),
            nn.Linear(self.mlp_width, self.num_heads, **factory),
        )
        self.c = nn.Parameter(torch.empty((), **factory))
        self.threshold_scale = nn.Parameter(torch.empty((), **factory))
        threshold = check_positive_float(init_threshold, "init_threshold")
        self.register_buffer("init_threshold", torch.tensor(threshold, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.c.fill_(self._init_c)
            self.threshold_scale.fill_(1.0)
        for layer in (self.mlp[0], self.mlp[2]):
            layer.reset_parameters()

    def normalized_distance(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The MLP's input ``psi(i - j) / (psi(max(i, L)) + eps)``: ``[b | 1, s_q, s_k]`` in the
        compute dtype (float32, or float64 for float64 parameters)."""
        rel = relative_positions(q_positions, k_positions)  # [b|1, s_q, s_k] = j - i, exact int64
        qp = q_positions if q_positions.dim() == 2 else q_positions[None]  # [b|1, s_q]
        dtype = torch.promote_types(self.c.dtype, torch.float32)
        c = self.c.to(dtype)
        threshold = (self.threshold_scale.to(dtype) * self.init_threshold.to(dtype)).abs()  # L
        distance = torch.log1p((c * rel.to(dtype)).abs())  # psi(i - j): |.| makes the sign irrelevant
        normalizer = torch.log1p((c * torch.maximum(qp.to(dtype), threshold)).abs()) + self.eps
        return distance / normalizer[..., None]  # [b|1, s_q, s_k] / [b|1, s_q, 1]

    def score_bias(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, q: torch.Tensor | None = None
    ) -> torch.Tensor:
        with autocast_off(
            q_positions.device if isinstance(q_positions, torch.Tensor) else torch.device("cpu")
        ):
            x = self.normalized_distance(q_positions, k_positions)  # [b|1, s_q, s_k]
            first, last = self.mlp[0], self.mlp[2]
            hidden = F.relu(F.linear(x[..., None], first.weight.to(x.dtype), first.bias.to(x.dtype)))
            out = F.linear(hidden, last.weight.to(x.dtype), last.bias.to(x.dtype))  # [b|1, s_q, s_k, h]
        return out.permute(0, 3, 1, 2)  # [b|1, s_q, s_k, h] -> [b|1, h, s_q, s_k]

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, mlp_width={self.mlp_width}"
