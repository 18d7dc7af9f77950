"""The reference rotation of RoPE in PyTorch ops: how the ``r`` rotated dims pair up, and the
rotation of a whole ``[..., s, d_h]`` tensor.

This is the maths that :func:`posenc.apply_rotary` runs wherever no kernel applies. The kernels
reproduce it bit for bit: each checks itself against it when first built, and their registered ops
(``posenc::rope_cpu``, ``posenc::rope_triton``) run it where their kernel does not (not built,
fast paths off, a Triton variant that failed its check). The kernels sit below this package and
import nothing from it: this module hands them the rotation at import
(:func:`posenc.kernels.register_reference_rotation`).

Legend: ``s`` sequence length, ``d_h`` head width, ``r`` rotary width (even), ``...`` leading dims.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels import register_reference_rotation

__all__ = ["ROTARY_LAYOUTS", "rotate"]


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


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` dims of ``x``; dims ``r..d_h`` pass through.

    The arithmetic runs in the tables' dtype: tables in ``x``'s dtype round every product and sum
    to it (PyTorch's elementwise ops); float32 tables with a bf16/fp16 ``x`` compute in float32 and
    round each output to ``x``'s dtype once.

    Args:
        x: ``[..., s, d_h]``.
        cos, sin: ``[..., s, r/2]`` broadcastable to ``x[..., :r/2]``, in ``x``'s dtype or float32.
        layout: a key of :data:`ROTARY_LAYOUTS`.

    Returns:
        ``[..., s, d_h]`` in ``x``'s dtype, a new tensor.
    """
    r = 2 * cos.shape[-1]
    y = ROTARY_LAYOUTS[layout](x.to(cos.dtype), cos, sin, r).to(x.dtype)  # [..., s, r]
    if r < x.shape[-1]:
        y = torch.cat((y, x[..., r:]), dim=-1)  # [..., s, r] ++ [..., s, d_h - r] -> [..., s, d_h]
    return y


register_reference_rotation(rotate)  # the kernels' check and fallback (see the module doc)
