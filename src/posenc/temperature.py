"""No positions, but a query temperature that grows with the position: the layers without RoPE of
Llama 4 (``nope_temperature``).

Llama 4 interleaves attention layers without any positional encoding among RoPE layers (every
fourth layer by default) and, in those layers only, multiplies each query by a factor that grows
slowly with its position ``p`` (attention temperature tuning)::

    q_p <- q_p * (log(1 + floor((p + 1) / floor_scale)) * attn_scale + 1)

with ``floor_scale = 8192`` and ``attn_scale = 0.1`` in Llama 4.

A NoPE layer's attention spreads out as the context grows (more keys share the softmax); the factor
sharpens it again, one step per ``floor_scale`` tokens, so the layer keeps focusing at lengths far
past training. Below ``floor_scale - 1`` the factor is exactly 1: the layer is plain NoPE. Keys are
not touched and nothing rotates, so it acts through the ``queries`` hook (a transform of the queries
alone, applied after any rotation, as Llama 4 applies it after RoPE).

Positions are the queries' own (offset by a KV cache, restarting per packed document, counted over
real tokens with left padding). Hugging Face's Llama 4 counts slots instead (``arange(s)`` plus the
cache length), which is the same for unpadded, unpacked input, the case its test covers.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d_h`` head width.
"""

from __future__ import annotations

import torch

from ._precision import autocast_off
from ._validate import check_choice, check_positive_float
from .base import PositionalScheme
from .positions import resolve_positions
from .rotary.apply import QK_LAYOUTS

__all__ = ["QueryTemperature", "query_temperature"]


def query_temperature(positions: torch.Tensor, floor_scale: float, attn_scale: float, dtype: torch.dtype):
    """``log1p(floor((p + 1) / floor_scale)) * attn_scale + 1`` for integer positions ``[...]``, in
    ``dtype`` (float32, or float64; Llama 4 computes it in float32)."""
    with autocast_off(positions.device):
        p = positions.to(dtype)
        return torch.log1p(torch.floor((p + 1.0) / floor_scale)) * attn_scale + 1.0


class QueryTemperature(PositionalScheme):
    """NoPE with Llama 4's attention temperature tuning.

    Args:
        floor_scale: tokens per step of the factor (Llama 4: 8192).
        attn_scale: the factor's growth per ``log1p`` of the steps (Llama 4: 0.1).
        qk_layout: ``"bhsd"`` (default) or ``"bshd"``.

    Shapes: ``queries(q [b, h, s_q, d_h], q_positions [s_q] | [b, s_q]) -> q * factor``, shape and
    dtype unchanged (the factor in float32, or
    float64 for float64 queries, and the product rounded once to q's dtype, as Llama 4).
    """

    name = "nope_temperature"
    hooks = ("queries",)
    summary = "no positions; queries scaled by log1p(floor((p+1)/8192)) * 0.1 + 1 (Llama 4's NoPE layers)"

    def __init__(self, floor_scale: float = 8192.0, attn_scale: float = 0.1, qk_layout: str = "bhsd") -> None:
        super().__init__()
        self.floor_scale = check_positive_float(floor_scale, "floor_scale")
        self.attn_scale = check_positive_float(attn_scale, "attn_scale")
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)

    def queries(
        self,
        q: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> torch.Tensor:
        qk_layout = self.qk_layout if qk_layout is None else check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() != 4:
            what = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
            raise TypeError(f"q must be a float tensor [b, h, s, d_h] ({qk_layout}), got {what}")
        seq_axis = 2 if qk_layout == "bhsd" else 1
        pos = resolve_positions(
            q_positions, q.shape[seq_axis], q.device, name="q_positions", batch=q.shape[0]
        )
        wide = torch.promote_types(q.dtype, torch.float32)
        factor = query_temperature(pos, self.floor_scale, self.attn_scale, wide)  # [s] or [b, s]
        shape = [1, 1, 1, 1]
        if pos.dim() == 2:
            shape[0] = pos.shape[0]
        shape[seq_axis] = pos.shape[-1]
        return (q * factor.view(shape)).to(q.dtype)

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"
