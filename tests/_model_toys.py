"""Small test-only positional schemes that exercise every code path of posenc.model.

They are written against the contract in ``posenc.base`` only, so the model tests cover the
rotate / score_bias (with and without query content) / relative_values / unrotated-cache paths
before the real rotary and bias schemes are merged. ``toy_schemes()`` registers them for the
duration of a test (``monkeypatch.setitem`` on the registry), so other test files never see them.

Legend: ``b`` batch, ``h`` heads, ``s_q``/``s_k`` query/key lengths, ``d_h`` head width.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc.base import PositionalScheme


def _rel(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """``q - k`` as ``[1, 1, s_q, s_k]`` (1-D positions) or ``[b, 1, s_q, s_k]`` (2-D)."""
    rel = q_positions[..., :, None] - k_positions[..., None, :]  # [(b,) s_q, s_k]
    return rel[None, None] if rel.dim() == 2 else rel[:, None]


def _rotate_half(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i + d/2}) of ``x`` ``[b, h, s, d_h]`` by ``position * inv_freq_i``."""
    ang = positions.float()[..., :, None] * inv_freq  # [(b,) s, d_h/2]
    ang = ang[None, None] if ang.dim() == 2 else ang[:, None]  # -> [b | 1, 1, s, d_h/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class ToyRotate(PositionalScheme):
    """Rotate q and k by their positions (a plain RoPE): logits depend on m - n only."""

    name = "toy_rotate"
    hooks = ("rotate",)

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    def inv_freq(self, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
        return (
            1.0
            / (100.0 ** (torch.arange(self.head_dim // 2, dtype=torch.float32) * 2 / self.head_dim))
            / scale
        )

    def rotate(self, q, k, q_positions=None, k_positions=None):
        q_positions = torch.arange(q.shape[-2]) if q_positions is None else q_positions
        k_positions = torch.arange(k.shape[-2]) if k_positions is None else k_positions
        f = self.inv_freq().to(q.device)
        return _rotate_half(q, q_positions, f), _rotate_half(k, k_positions, f)


class ToyDynamic(ToyRotate):
    """Rotation whose frequencies shrink once the keys reach past ``original_len`` (like dynamic NTK),
    so the rotation of a cached key depends on the current length: needs an unrotated cache."""

    name = "toy_dynamic"
    needs_unrotated_cache = True

    def __init__(self, head_dim: int, original_len: int = 6) -> None:
        super().__init__(head_dim)
        self.nominal = original_len  # the model tests run past it, so the scaling is exercised

    def rotate(self, q, k, q_positions=None, k_positions=None):
        q_positions = torch.arange(q.shape[-2]) if q_positions is None else q_positions
        k_positions = torch.arange(k.shape[-2]) if k_positions is None else k_positions
        length = k_positions.max() + 1  # the current length, from the (whole) key cache
        f = self.inv_freq(torch.clamp(length / self.nominal, min=1.0)).to(q.device)
        return _rotate_half(q, q_positions, f), _rotate_half(k, k_positions, f)


class ToyAlibi(PositionalScheme):
    """ALiBi-like: ``-slope_h * |m - n|`` with slopes ``2^-(h+1)``."""

    name = "toy_alibi"
    hooks = ("score_bias",)

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads

    def score_bias(self, q_positions, k_positions, q=None):
        slopes = 2.0 ** -(torch.arange(self.num_heads, dtype=torch.float32) + 1)  # [h]
        rel = _rel(q_positions, k_positions).abs().float()  # [b | 1, 1, s_q, s_k]
        return -slopes.to(rel.device)[None, :, None, None] * rel  # [b | 1, h, s_q, s_k]


class ToyContent(PositionalScheme):
    """Shaw-like content-dependent bias ``q_i . r_clip(i - j) / sqrt(d_h)`` with a learned table,
    optionally with relative value vectors (then the model takes its explicit-softmax path)."""

    name = "toy_content"
    score_bias_uses_query = True
    hooks = ("score_bias",)

    def __init__(self, head_dim: int, clip: int = 3, values: bool = False) -> None:
        super().__init__()
        self.clip, self.head_dim = clip, head_dim
        self.rel_k = nn.Parameter(torch.randn(2 * clip + 1, head_dim))
        self.rel_v = nn.Parameter(torch.randn(2 * clip + 1, head_dim)) if values else None

    def _index(self, q_positions, k_positions):
        rel = q_positions[..., :, None] - k_positions[..., None, :]  # [(b,) s_q, s_k]
        return rel.clamp(-self.clip, self.clip) + self.clip

    def score_bias(self, q_positions, k_positions, q=None):
        r = self.rel_k[self._index(q_positions, k_positions)]  # [(b,) s_q, s_k, d_h]
        if r.dim() == 3:
            r = r[None]  # [1, s_q, s_k, d_h]
        return (
            torch.einsum("bhqd,bqkd->bhqk", q, r.to(q.dtype).expand(q.shape[0], -1, -1, -1))
            / self.head_dim**0.5
        )

    @property
    def has_relative_values(self):
        return self.rel_v is not None

    def relative_values(self, q_positions, k_positions):
        if self.rel_v is None:
            return None
        # The contract gives 1-D positions here; the model splits batched (left-padded) positions.
        assert q_positions.dim() == 1 and k_positions.dim() == 1, "relative_values takes [s] positions"
        return self.rel_v[self._index(q_positions, k_positions)]  # [s_q, s_k, d_h]


class ToyShaw(ToyContent):
    """:class:`ToyContent` with relative values on."""

    name = "toy_shaw"

    def __init__(self, head_dim: int, clip: int = 3) -> None:
        super().__init__(head_dim, clip, values=True)


class ToyBidirectional(ToyAlibi):
    """A scheme without a causal form (for the construction errors)."""

    name = "toy_bidir"
    causal_ok = False


TOYS = {cls.name: cls for cls in (ToyRotate, ToyDynamic, ToyAlibi, ToyContent, ToyShaw, ToyBidirectional)}
CAUSAL_TOYS = [n for n, c in TOYS.items() if c.causal_ok]


def register_toys(monkeypatch) -> None:
    """Register every toy scheme for the current test only."""
    from posenc import registry

    for name, cls in TOYS.items():
        monkeypatch.setitem(registry.SCHEMES, name, cls)
