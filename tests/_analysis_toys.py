"""Test-only toy schemes for the analysis tests: a RoPE-like ``rotate`` scheme and an ALiBi-like
``score_bias`` scheme, registered only inside :func:`registered` (the registry is restored after).

They are deliberately plain (written from RoFormer eq. 34 and ALiBi section 3) so that every code
path of ``posenc.analysis`` runs before the real rotary and bias schemes are merged.

Legend: ``b`` batch, ``h`` heads, ``s`` positions, ``d_h`` head width.
"""

from __future__ import annotations

import contextlib

import torch

from posenc import registry
from posenc.base import PositionalScheme


class ToyRoPE(PositionalScheme):
    """Half-layout rotary embedding, ``theta_i = base^(-2i/d_h)``: ``rotate(q [b,h,s,d_h], ...)``."""

    name = "toy_rope"
    hooks = ("rotate",)
    summary = "test-only RoPE"
    eval_variants = ("linear", "ntk")  # the scalings it takes, declared

    @classmethod
    def variant_options(cls, variant: str, factor: float, trained_len: int) -> dict:
        return {"scaling": {"rope_type": variant, "factor": factor}}

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: dict | None = None) -> None:
        super().__init__()
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        if scaling is not None and scaling.get("rope_type") not in ("linear", "ntk"):
            raise ValueError(f"toy_rope supports linear and ntk scaling only, got {scaling}")

    def inv_freq(self) -> torch.Tensor:
        d, base, factor = self.head_dim, self.base, 1.0
        if self.scaling and self.scaling["rope_type"] == "ntk":
            base = base * self.scaling["factor"] ** (d / (d - 2))
        elif self.scaling:
            factor = self.scaling["factor"]
        return base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d) / factor  # [d_h/2]

    def _rot(self, x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
        pos = torch.arange(x.shape[-2]) if pos is None else pos
        ang = pos.float()[:, None] * self.inv_freq()  # [s, d_h/2]
        cos, sin = ang.cos().repeat(1, 2), ang.sin().repeat(1, 2)  # [s, d_h]
        x1, x2 = x.float().chunk(2, -1)
        rot = torch.cat((-x2, x1), -1)  # rotate_half
        return (x.float() * cos + rot * sin).to(x.dtype)

    def rotate(self, q, k, q_positions=None, k_positions=None):
        return self._rot(q, q_positions), self._rot(k, k_positions)


class ToyALiBi(PositionalScheme):
    """ALiBi-like bias ``-slope_h |m - n|`` (``causal``: ``-slope_h (m - n)``), slopes ``2^(-8h/H)``."""

    name = "toy_alibi"
    hooks = ("score_bias",)
    summary = "test-only ALiBi"

    def __init__(self, num_heads: int, causal: bool = False) -> None:
        super().__init__()
        self.num_heads, self.causal = num_heads, causal

    def slopes(self) -> torch.Tensor:
        return 2.0 ** (-8.0 * torch.arange(1, self.num_heads + 1) / self.num_heads)  # [h]

    def score_bias(self, q_positions, k_positions, q=None):
        rel = (q_positions[:, None] - k_positions[None, :]).float()  # [m, n]
        dist = rel if self.causal else rel.abs()
        return (-self.slopes()[:, None, None] * dist)[None]  # [1, h, m, n]


class ToyLearnedBias(PositionalScheme):
    """A trainable per-head bias on clipped relative distance (T5-like at init: random values)."""

    name = "toy_learned_bias"
    hooks = ("score_bias",)
    summary = "test-only learned relative bias"

    def __init__(self, num_heads: int, max_distance: int = 16) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.table = torch.nn.Parameter(torch.randn(num_heads, 2 * max_distance + 1))

    def score_bias(self, q_positions, k_positions, q=None):
        rel = (q_positions[:, None] - k_positions[None, :]).clamp(-self.max_distance, self.max_distance)
        return self.table[:, rel + self.max_distance][None]  # [h, m, n] -> [1, h, m, n]


TOYS = (ToyRoPE, ToyALiBi, ToyLearnedBias)


@contextlib.contextmanager
def registered(*classes):
    """Register ``classes`` (default: all toys) for the duration of the block, then restore."""
    saved = dict(registry.SCHEMES)
    try:
        for cls in classes or TOYS:
            registry.register(cls)
        yield
    finally:
        registry.SCHEMES.clear()
        registry.SCHEMES.update(saved)


class ToyBF16Positions(PositionalScheme):
    """A *wrong* sinusoidal scheme that holds positions in its float buffer's dtype, so after
    ``.to(torch.bfloat16)`` neighbouring positions above 256 collapse (the bug posenc avoids)."""

    name = "toy_bf16_positions"
    hooks = ("embed",)
    summary = "test-only broken scheme"

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("one", torch.ones(()), persistent=False)

    def embed(self, x, positions=None):
        pos = torch.arange(x.shape[1]) if positions is None else positions
        p = pos.to(self.one.dtype).float()  # the bug: positions rounded to the module dtype
        w = 10000.0 ** (-torch.arange(0, self.d_model, 2).float() / self.d_model)
        ang = p[:, None] * w  # [s, d/2]
        return x + torch.stack((ang.sin(), ang.cos()), -1).flatten(-2).to(x.dtype)


class ToyContentBias(PositionalScheme):
    """Shaw-like bias ``q . a_{clip(m - n)} / sqrt(d_h)`` (linear in q: zero on average) plus a
    Transformer-XL-like ``queries`` hook that adds a global ``u`` to q (the same at every position;
    it insists on ``num_heads`` heads)."""

    name = "toy_content_bias"
    score_bias_uses_query = True
    hooks = ("queries", "score_bias")
    summary = "test-only content-dependent bias"

    def __init__(self, num_heads: int, head_dim: int, max_distance: int = 4) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.max_distance = num_heads, head_dim, max_distance
        g = torch.Generator().manual_seed(7)
        self.rel = torch.nn.Parameter(torch.randn(2 * max_distance + 1, head_dim, generator=g))
        self.u = torch.nn.Parameter(torch.randn(num_heads, head_dim, generator=g))

    def queries(self, q, q_positions=None, *, qk_layout=None):
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q must have {self.num_heads} heads, got {q.shape[1]}")
        return q + self.u[None, :, None, :]

    def score_bias(self, q_positions, k_positions, q=None):
        rel = (q_positions[:, None] - k_positions[None, :]).clamp(-self.max_distance, self.max_distance)
        a = self.rel[rel + self.max_distance]  # [m, n, d_h]
        return torch.einsum("bhmd,mnd->bhmn", q, a) / self.head_dim**0.5


class ToyAxialRoPE(ToyRoPE):
    """ToyRoPE that takes ``(row, col)`` coordinates ``[s, 2]`` and rotates by the row only."""

    name = "toy_axial_rope"
    position_dims = 2

    def rotate(self, q, k, q_positions=None, k_positions=None):
        for p in (q_positions, k_positions):
            if p is None or p.dim() != 2 or p.shape[-1] != 2:
                raise ValueError("positions must be (row, col) coordinates [s, 2]")
        return self._rot(q, q_positions[:, 0]), self._rot(k, k_positions[:, 0])
