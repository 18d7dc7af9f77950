"""The reference rotation of RoPE, in PyTorch ops: how the ``r`` rotated dims pair up.

The bottom of the rotary stack: :func:`posenc.apply_rotary` runs these (or a kernel that is
bit-identical to them, which checks itself against them), so this module imports nothing above it.

Legend: ``s`` sequence length, ``r`` rotary width (even), ``...`` leading dims.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["ROTARY_LAYOUTS"]


def _rotate_half_layout(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, r: int) -> torch.Tensor:
    """Pairs ``(x_i, x_{i + r/2})``: GPT-NeoX, Llama in HF transformers (``rotate_half``)."""
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]  # [..., s, r/2] each
    # Same operation order as HF's q * cos + rotate_half(q) * sin, so results match it bit for bit.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # 2 x [..., s, r/2] -> [..., s, r]


def _rotate_interleaved_layout(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, r: int) -> torch.Tensor:
    """Pairs ``(x_{2i}, x_{2i+1})``: RoFormer, GPT-J, Meta's Llama reference code."""
    pairs = x[..., :r].unflatten(-1, (r // 2, 2))  # [..., s, r] -> [..., s, r/2, 2]
    x1, x2 = pairs[..., 0], pairs[..., 1]  # [..., s, r/2] each
    out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # [..., s, r/2, 2]
    return out.flatten(-2)  # [..., s, r/2, 2] -> [..., s, r]


#: layout name -> rotation of the first ``r`` dims of ``x [..., s, d_h]`` by half-width cos/sin.
ROTARY_LAYOUTS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "half": _rotate_half_layout,
    "interleaved": _rotate_interleaved_layout,
}
