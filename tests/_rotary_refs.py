"""Float64 references for the rotary tests, written plainly from the papers (no posenc, no HF).

* RoFormer's block-diagonal rotation matrix (:func:`ref_rotate`);
* each scaling rule's frequencies (:func:`ref_inv_freq`): Chen et al.'s interpolation, the NTK base
  change, dynamic NTK, YaRN's official ramp, Llama 3.1's rule, LongRoPE;
* xPos's zeta (:func:`ref_xpos`).

Tolerances for float32 comparisons come from float32 angle rounding: an angle ``m * w`` carries
an error of at most a few units of ``m * 2^-24``, see :func:`angle_tol`.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

F64 = torch.float64


def ref_pairs(r: int, layout: str) -> list[tuple[int, int]]:
    """The dims rotated together: (2i, 2i+1) in RoFormer/GPT-J, (i, i + r/2) in GPT-NeoX/HF Llama."""
    return [(2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + r // 2) for i in range(r // 2)]


def ref_rotate(x: torch.Tensor, angles: torch.Tensor, layout: str, scale: torch.Tensor | float = 1.0):
    """RoFormer eq. (13)-(15): y = R_Theta,m x with R block-diagonal 2x2 rotations, built explicitly.

    x: [..., s, d_h] float64; angles: [..., s, r/2] (broadcastable); scale multiplies each pair.
    """
    r = 2 * angles.shape[-1]
    x = x.to(F64)
    shape = torch.broadcast_shapes(x.shape[:-1], angles.shape[:-1])
    R = torch.zeros(*shape, r, r, dtype=F64)
    c, s = angles.cos() * scale, angles.sin() * scale
    c, s = c.expand(*shape, r // 2), s.expand(*shape, r // 2)
    for i, (a, b) in enumerate(ref_pairs(r, layout)):
        R[..., a, a], R[..., a, b] = c[..., i], -s[..., i]
        R[..., b, a], R[..., b, b] = s[..., i], c[..., i]
    rot = (R @ x[..., :r, None].expand(*shape, r, 1))[..., 0]
    return torch.cat((rot, x.expand(*shape, x.shape[-1])[..., r:]), dim=-1)


def ref_inv_freq(r: int, base: float, rule: str = "default", p: dict | None = None, seq_len=None):
    """Each scaling rule's frequencies in float64, from its paper / reference code."""
    p = p or {}
    i = torch.arange(r // 2, dtype=F64)
    theta = base ** (-2 * i / r)  # RoFormer: theta_i = base^(-2(i-1)/d), i from 1
    if rule == "default":
        return theta, 1.0
    if rule == "linear":  # Chen et al. 2023: f(x, m) = f(x, m / s)
        return theta / p["factor"], 1.0
    if rule == "ntk":  # bloc97: base' = base * s^(d/(d-2))
        return (base * p["factor"] ** (r / (r - 2))) ** (-2 * i / r), 1.0
    if rule == "dynamic":  # emozilla / HF: s' = (s L / L0) - (s - 1), L = max(L, L0)
        f, l0 = p["factor"], p["original_max_position_embeddings"]
        length = max(seq_len or l0, l0)
        return (base * (f * length / l0 - (f - 1)) ** (r / (r - 2))) ** (-2 * i / r), 1.0
    if rule == "yarn":  # YaRN reference code: linear ramp over dim index between the beta_fast/slow dims
        f, l0 = p["factor"], p["original_max_position_embeddings"]
        bf, bs = p.get("beta_fast", 32), p.get("beta_slow", 1)
        lo = math.floor(r * math.log(l0 / (bf * 2 * math.pi)) / (2 * math.log(base)))
        hi = math.ceil(r * math.log(l0 / (bs * 2 * math.pi)) / (2 * math.log(base)))
        lo, hi = max(lo, 0), min(hi, r - 1)
        gamma = ((i - lo) / (hi - lo if hi != lo else 0.001)).clamp(0, 1)  # 0: keep, 1: interpolate
        inv = theta * (1 - gamma) + theta / f * gamma

        def m(s, k=1.0):
            return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1  # sqrt(1/t) = 0.1 ln s + 1

        if p.get("mscale") and p.get("mscale_all_dim"):
            return inv, m(f, p["mscale"]) / m(f, p["mscale_all_dim"])
        return inv, m(f)
    if rule == "llama3":
        f, l0 = p["factor"], p["original_max_position_embeddings"]
        lo, hi = p["low_freq_factor"], p["high_freq_factor"]
        out = []
        for t in theta.tolist():
            wl = 2 * math.pi / t
            if wl < l0 / hi:
                out.append(t)
            elif wl > l0 / lo:
                out.append(t / f)
            else:
                sm = (l0 / wl - lo) / (hi - lo)
                out.append((1 - sm) * t / f + sm * t)
        return torch.tensor(out, dtype=F64), 1.0
    if rule == "longrope":  # Ding et al. 2024: theta_i / lambda_i, lambda from the short or long list
        l0 = p["original_max_position_embeddings"]
        lam = p["long_factor"] if seq_len and seq_len > l0 else p["short_factor"]
        f = p.get("factor") or p["max_position_embeddings"] / l0
        return theta / torch.tensor(lam, dtype=F64), math.sqrt(1 + math.log(f) / math.log(l0))
    if rule == "proportional":  # Gemma 4: the first floor(p r / 2) pairs turn at theta_i, the rest stay
        turning = math.floor(p["partial_rotary_factor"] * r / 2)
        return torch.where(i < turning, theta, torch.zeros_like(theta)) / p.get("factor", 1.0), 1.0
    raise AssertionError(rule)


def angle_tol(max_pos: int, ulps: float = 4.0) -> float:
    """Worst float32 error of an angle m * w with |w| <= 1 and 0 <= m <= max_pos, in radians:
    rounding of w (|w| 2^-24 relative, times m) and of the product (half an ulp of m w)."""
    return ulps * max(max_pos, 1) * 2.0**-24


def scaling_for(rule: str, r: int, factor: float = 4.0, l0: int = 1024) -> dict | None:
    """A valid scaling dict for each rule (longrope factors are a deterministic ramp)."""
    return {
        "default": None,
        "linear": {"rope_type": "linear", "factor": factor},
        "ntk": {"rope_type": "ntk", "factor": factor},
        "dynamic": {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": l0},
        "yarn": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": l0},
        "llama3": {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": l0,
        },
        "longrope": {
            "rope_type": "longrope",
            "original_max_position_embeddings": l0,
            "factor": factor,
            "short_factor": [1.0 + 0.02 * j for j in range(r // 2)],
            "long_factor": [1.0 + factor * j / (r // 2) for j in range(r // 2)],
        },
        "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": factor},
    }[rule]


def ref_xpos(x, pos, d, sign, layout, base=10000.0, gamma=512.0):
    """Sun et al. 2022: RoPE times zeta_i^(sign * n / gamma), zeta_i = (2i/d + 0.4) / 1.4."""
    i = torch.arange(d // 2, dtype=F64)
    zeta = (2 * i / d + 0.4) / 1.4
    angles = pos.to(F64)[:, None] * base ** (-2 * i / d)
    return ref_rotate(x, angles, layout, scale=zeta ** (sign * pos.to(F64)[:, None] / gamma))


#: head widths the hypothesis properties draw from
vec_dims = st.sampled_from([8, 16, 32])
