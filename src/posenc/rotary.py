"""Rotary position embeddings (RoPE) and their family: every long-context scaling, xPos, axial 2D RoPE.

RoPE (Su et al. 2021, "RoFormer") rotates each pair of query/key dimensions ``(x_{2i}, x_{2i+1})``
(or ``(x_i, x_{i + r/2})``, see layouts) by the angle ``m * w_i`` for a token at position ``m``::

    [y_a]   [cos(m w_i)  -sin(m w_i)] [x_a]        w_i = base^(-2i/r),  i = 0 .. r/2 - 1
    [y_b] = [sin(m w_i)   cos(m w_i)] [x_b]

so that ``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on positions only through ``n - m``.

The maths is in pure functions:

* :func:`rope_frequencies` -- ``(inv_freq [r/2], attention_scale)`` for a scaling rule from
  :data:`ROPE_SCALINGS` (``default``, ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``);
* :func:`rope_cos_sin` -- ``cos``/``sin`` of ``positions * inv_freq`` (float32 angles, autocast off);
* :func:`apply_rotary` -- the rotation itself, in the ``"half"`` (Llama/NeoX/HF) or ``"interleaved"``
  (GPT-J/Meta/RoFormer) layout, with partial rotary;
* :func:`permute_qk_weights` -- moves q/k projection weights between the two layouts.

The modules :class:`RotaryEmbedding` (``"rope"``), :class:`XPos` (``"xpos"``) and :class:`Rope2D`
(``"rope_2d"``) hold configuration only: no buffers, no cache. Frequencies are recomputed from the
configuration in every call (a few ops on ``r/2`` numbers), so ``module.to(torch.bfloat16)`` cannot
degrade them, a meta-device build materialises correctly, and forward never mutates state.

Convention for ``cos``/``sin``: **half width**, one value per rotated pair: ``[..., s, r/2]``,
broadcastable against ``x[..., s, :r/2]``. Positions ``[s]`` give ``[s, r/2]`` (shared by the batch
and heads); positions ``[b, s]`` give ``[b, 1, s, r/2]`` for ``x`` of shape ``[b, h, s, d_h]``.
The attention scale of a rule (YaRN's ``0.1 ln s + 1``, LongRoPE's factor) multiplies both ``cos``
and ``sin`` exactly as Hugging Face transformers does, so q and k are each scaled by it and the
logits by its square.

Axis order of queries and keys (``qk_layout``): ``"bhsd"`` = ``[b, h, s, d_h]`` (the default: what
``scaled_dot_product_attention`` takes) or ``"bshd"`` = ``[b, s, h, d_h]`` (flash-attention,
torchtune, most fused kernels). It is always an explicit argument, never guessed from shapes.

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s`` sequence length
(``s_q``/``s_k`` for queries/keys), ``d_h`` head width, ``r`` rotary width (``r <= d_h``, even).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ._precision import autocast_off, position_angles
from ._validate import check_choice, check_int, check_positive_float
from .absolute import _angle_dtype, sinusoidal_frequencies
from .base import PositionalScheme
from .kernels import rope_cpu as _rope_cpu
from .kernels import rope_triton as _rope_triton
from .positions import resolve_positions

__all__ = [
    "QK_LAYOUTS",
    "ROPE_SCALINGS",
    "ROTARY_LAYOUTS",
    "Rope2D",
    "RopeScaling",
    "RotaryEmbedding",
    "XPos",
    "apply_rotary",
    "hf_rope_config",
    "permute_qk_weights",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_from_hf",
]


# ----------------------------------------------------------------------------------------------
# Layouts: how the r rotated dims pair up
# ----------------------------------------------------------------------------------------------
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


#: axis orders of queries and keys: ``"bhsd"`` ``[b, h, s, d_h]`` (default), ``"bshd"`` ``[b, s, h, d_h]``
QK_LAYOUTS = ("bhsd", "bshd")


def _seq_axis(qk_layout: str) -> int:
    """The sequence axis of q/k in ``qk_layout``, counted from the end (``-2`` or ``-3``)."""
    return -2 if qk_layout == "bhsd" else -3


def _seq_mismatch(count: int, x: torch.Tensor, qk_layout: str, xname: str = "x") -> str:
    """Where ``count`` positions fail to match ``x``'s sequence axis in ``qk_layout``, and the fix."""
    axis = _seq_axis(qk_layout)
    form = "[b, h, s, d_h]" if qk_layout == "bhsd" else "[b, s, h, d_h]"
    msg = (
        f"{xname} {tuple(x.shape)} has s = {x.shape[axis]} along its sequence axis (dim "
        f"{x.dim() + axis}: qk_layout={qk_layout!r} reads {xname} as {form})"
    )
    other = "bshd" if qk_layout == "bhsd" else "bhsd"
    if x.dim() >= 3 and x.shape[_seq_axis(other)] == count:
        msg += f"; if {xname} is laid out the other way, pass qk_layout={other!r}"
    return msg


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    out: torch.Tensor | None = None,
    qk_layout: str = "bhsd",
) -> torch.Tensor:
    """Rotate the first ``r`` dims of ``x`` pairwise by the angles whose cos/sin are given.

    Args:
        x: ``[..., s, d_h]`` queries or keys, e.g. ``[b, h, s, d_h]``; with ``qk_layout="bshd"``
            ``[..., s, h, d_h]``, e.g. ``[b, s, h, d_h]``.
        cos, sin: ``[..., s, r/2]`` half-width tables (one value per pair), broadcastable against
            ``x[..., s, :r/2]`` without growing it: ``[s, r/2]`` for shared positions,
            ``[b, 1, s, r/2]`` for per-token positions. With ``qk_layout="bshd"``: ``[s, r/2]``
            (shared; the head axis is added) or ``[b, s, 1, r/2]``. Cast to ``x.dtype`` before use.
        layout: ``"half"`` pairs dims ``(i, i + r/2)`` (HF Llama, GPT-NeoX); ``"interleaved"``
            pairs ``(2i, 2i + 1)`` (RoFormer, GPT-J, Meta). See :func:`permute_qk_weights`.
        rotary_dim: ``r``; default ``2 * cos.shape[-1]``. Dims ``r..d_h`` are returned bit-identical.
        out: for inference, where to write the result: ``x`` itself (in place, no new memory) or a
            tensor of ``x``'s shape and dtype. Not differentiable (``ValueError`` if ``x`` requires
            grad while grad mode is on).
        qk_layout: ``"bhsd"`` (default, sequence axis ``-2``) or ``"bshd"`` (sequence axis ``-3``).

    Returns:
        ``[..., s, d_h]``, same dtype as ``x`` (``out`` when given). Linear in ``x``, so gradients
        flow to ``x`` (and to ``cos``/``sin``).

    On CPU (float32/float64/bfloat16) the rotation runs as one pass over memory in a small C kernel
    (:mod:`posenc.kernels.rope_cpu`), bit-identical to the PyTorch expression below, which runs
    everywhere else (GPU, ``torch.compile``, other dtypes).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor [..., s, d_h], got {_describe(x)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor [..., s, r/2], got {_describe(t)}")
    rotate = ROTARY_LAYOUTS[check_choice(layout, "layout", ROTARY_LAYOUTS)]
    check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if x.dim() < 2 or cos.dim() < 1:
        raise ValueError(
            f"x must be [..., s, d_h] and cos [..., s, r/2]; got x {tuple(x.shape)}, cos {tuple(cos.shape)}"
        )
    r = 2 * cos.shape[-1]
    if rotary_dim is not None and check_int(rotary_dim, "rotary_dim", minimum=2, even=True) != r:
        raise ValueError(
            f"rotary_dim={rotary_dim} does not match cos/sin, which are half width (r/2 = {cos.shape[-1]}, "
            f"so r = {r}); build them for {rotary_dim // 2} pairs or drop rotary_dim"
        )
    if r < 2 or r > x.shape[-1]:
        raise ValueError(
            f"cos/sin cover r = {r} dims (r/2 = {cos.shape[-1]} pairs) but x has d_h = {x.shape[-1]}; "
            "cos/sin are half width: [..., s, r/2] with 2 <= r <= d_h"
        )
    if qk_layout == "bshd":
        if x.dim() < 3:
            raise ValueError(f"qk_layout='bshd' needs x [..., s, h, d_h], got x {tuple(x.shape)}")
        if cos.dim() == 2:  # [s, r/2] -> [s, 1, r/2]: shared positions, one head axis
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    # broadcasts to x[..., :r/2] without growing it (plain Python: torch.broadcast_shapes costs
    # ~50 us); [s, r/2] tables, the common case, first
    cs, xs = cos.shape, x.shape
    if len(cs) == 2 and cs[0] in (1, xs[-2]):
        fits = True  # cs[1] == r/2 by definition of r
    else:
        target = (*xs[:-1], r // 2)
        fits = len(cs) <= len(target) and all(c in (1, t) for c, t in zip(reversed(cs), reversed(target)))
    if not fits:
        axis = _seq_axis(qk_layout)
        if len(cs) >= -axis and cs[axis] not in (1, xs[axis]):
            raise ValueError(
                f"cos/sin {tuple(cs)} hold {cs[axis]} positions but " + _seq_mismatch(cs[axis], x, qk_layout)
            )
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x[..., :r/2] of shape {target}; use "
            "[s, r/2] for positions [s] or [b, 1, s, r/2] for positions [b, s] with x [b, h, s, d_h]"
        )
    if out is not None:
        _rope_cpu.check_out(x, out)
    if _rope_cpu.usable(x, cos, sin):
        return _rope_cpu.rotate(x, cos, sin, layout, out)  # one pass, same numbers as below
    if x.is_cuda and _rope_triton.usable(x, cos, sin):
        return _rope_triton.rotate(x, cos, sin, layout, out)  # Triton, same numbers (self-checked)
    y = rotate(x, cos.to(x.dtype), sin.to(x.dtype), r)  # [..., s, r]
    if r < x.shape[-1]:
        y = torch.cat((y, x[..., r:]), dim=-1)  # [..., s, r] ++ [..., s, d_h - r] -> [..., s, d_h]
    return y if out is None else out.copy_(y)


def _is_integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _describe(obj: object) -> str:
    if isinstance(obj, torch.Tensor):
        return f"tensor of dtype {obj.dtype}"
    return type(obj).__name__


# ----------------------------------------------------------------------------------------------
# Frequencies and the scaling registry
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeScaling:
    """One RoPE scaling rule.

    ``compute(r, base, params, seq_len, device)`` returns ``(inv_freq [r/2], attention_scale)``;
    ``inv_freq`` in float64 (float32 on devices without float64). ``seq_len`` is ``None`` (the
    trained length), an int, or a 0-d integer tensor (inside a model, so ``torch.compile`` can trace it).
    """

    compute: Callable[..., tuple[torch.Tensor, float]]
    required: tuple[str, ...]
    optional: Mapping[str, Any]
    length_dependent: bool  # the frequencies change with the current length: cache raw keys
    reference: str


def _freq_dtype(device: torch.device | str | None) -> torch.dtype:
    return torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64


def _default_inv_freq(r: int, base: float, device: torch.device | str | None) -> torch.Tensor:
    """``base^(-2i/r)``, i.e. the Vaswani sinusoidal frequencies of width ``r``: ``[r/2]``."""
    return sinusoidal_frequencies(r, base, "vaswani", dtype=_freq_dtype(device), device=device)


def _default(r, base, p, seq_len, device):
    return _default_inv_freq(r, base, device), 1.0


def _linear(r, base, p, seq_len, device):
    # Position interpolation (Chen et al. 2023): position m is read as m / factor.
    return _default_inv_freq(r, base, device) / p["factor"], 1.0


def _ntk_scale(r: int, ratio: torch.Tensor | float, device) -> torch.Tensor | float:
    """``(base * ratio^(r/(r-2)))^(-2i/r) / base^(-2i/r) = ratio^(-2i/(r-2))``: [r/2] (1 where ratio = 1)."""
    if r == 2:  # one pair, exponent 0: the base change does nothing
        return 1.0
    i2 = torch.arange(0, r, 2, dtype=_freq_dtype(device), device=device)  # [r/2]: 2i
    return torch.pow(ratio, -i2 / (r - 2))


def _ntk(r, base, p, seq_len, device):
    # NTK-aware scaling (bloc97, 2023): base' = base * factor^(r/(r-2)); the lowest frequency is
    # divided by exactly `factor`, the highest is kept.
    return _default_inv_freq(r, base, device) * _ntk_scale(r, float(p["factor"]), device), 1.0


def _dynamic(r, base, p, seq_len, device):
    # Dynamic NTK (emozilla, 2023; HF `_compute_dynamic_ntk_parameters`): NTK with the factor
    # grown with the current length L = max(seq_len, original): base' = base * (f L / L0 - (f - 1))^(r/(r-2)).
    f, l0 = float(p["factor"]), p["original_max_position_embeddings"]
    inv = _default_inv_freq(r, base, device)
    if seq_len is None:
        return inv, 1.0
    length = torch.as_tensor(seq_len, dtype=inv.dtype, device=device)
    ratio = torch.clamp(f * length / l0 - (f - 1.0), min=1.0)  # exactly 1 at or below the trained length
    return inv * _ntk_scale(r, ratio, device), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(r, base, p, seq_len, device):
    # YaRN (Peng et al. 2023): per-pair blend of interpolation (low frequencies, inv/f) and
    # extrapolation (high frequencies, inv) with a linear ramp between the dims that turn beta_slow
    # and beta_fast times over the trained length; attention factor 0.1 ln f + 1.
    f, l0 = float(p["factor"]), p["original_max_position_embeddings"]
    beta_fast, beta_slow = float(p["beta_fast"]), float(p["beta_slow"])

    def correction_dim(rotations: float) -> float:  # the dim whose wavelength fits `rotations` times in l0
        return r * math.log(l0 / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    inv = _default_inv_freq(r, base, device)
    ramp = torch.clamp((torch.arange(r // 2, dtype=inv.dtype, device=device) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency; 0: interpolate by f
    inv = (inv / f) * (1 - extrapolation) + inv * extrapolation
    scale = p["attention_factor"]
    if scale is None:
        mscale, mscale_all_dim = p["mscale"], p["mscale_all_dim"]
        if mscale and mscale_all_dim:  # DeepSeek-V2/V3
            scale = _yarn_mscale(f, mscale) / _yarn_mscale(f, mscale_all_dim)
        else:
            scale = _yarn_mscale(f)
    return inv, float(scale)


def _llama3(r, base, p, seq_len, device):
    # Llama 3.1: wavelengths longer than L0/low_freq_factor are interpolated by `factor`, shorter than
    # L0/high_freq_factor kept, and a smooth blend in between.
    f, l0 = float(p["factor"]), p["original_max_position_embeddings"]
    lo, hi = float(p["low_freq_factor"]), float(p["high_freq_factor"])
    inv = _default_inv_freq(r, base, device)
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > l0 / lo, inv / f, inv)
    smooth = (l0 / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / f + smooth * scaled
    medium = (wavelen >= l0 / hi) & (wavelen <= l0 / lo)
    return torch.where(medium, blended, scaled), 1.0


def _longrope(r, base, p, seq_len, device):
    # LongRoPE (Ding et al. 2024; Phi-3): per-pair searched divisors, "short" within the trained
    # length and "long" beyond it; attention factor sqrt(1 + ln f / ln L0).
    l0 = p["original_max_position_embeddings"]
    f = p["factor"]
    if f is None:
        f = p["max_position_embeddings"] / l0
    scale = p["attention_factor"]
    if scale is None:
        scale = 1.0 if f <= 1.0 else math.sqrt(1 + math.log(f) / math.log(l0))
    inv = _default_inv_freq(r, base, device)
    short = inv / torch.tensor(p["short_factor"], dtype=inv.dtype, device=device)
    if seq_len is None:
        return short, float(scale)
    long = inv / torch.tensor(p["long_factor"], dtype=inv.dtype, device=device)
    return torch.where(torch.as_tensor(seq_len, device=device) > l0, long, short), float(scale)


_L0 = "original_max_position_embeddings"

#: scaling rule name -> :class:`RopeScaling`. Keys of a ``scaling`` dict besides ``rope_type``
#: follow Hugging Face's ``rope_parameters`` names.
ROPE_SCALINGS: dict[str, RopeScaling] = {
    "default": RopeScaling(_default, (), {}, False, "Su et al. 2021 (RoFormer): w_i = base^(-2i/r)"),
    "linear": RopeScaling(
        _linear, ("factor",), {}, False, "Chen et al. 2023 (position interpolation): m -> m/s"
    ),
    "ntk": RopeScaling(_ntk, ("factor",), {}, False, "NTK-aware (bloc97 2023): base -> base * s^(r/(r-2))"),
    "dynamic": RopeScaling(
        _dynamic,
        ("factor", _L0),
        {},
        True,
        "dynamic NTK (emozilla 2023): NTK with s grown from the current length; needs an unrotated KV cache",
    ),
    "yarn": RopeScaling(
        _yarn,
        ("factor", _L0),
        {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "attention_factor": None,
            "mscale": None,
            "mscale_all_dim": None,
            "truncate": True,
        },
        False,
        "Peng et al. 2023 (YaRN): ramped interpolation, attention factor 0.1 ln s + 1",
    ),
    "llama3": RopeScaling(
        _llama3,
        ("factor", "low_freq_factor", "high_freq_factor", _L0),
        {},
        False,
        "Meta Llama 3.1: interpolate long wavelengths, keep short ones, blend between",
    ),
    "longrope": RopeScaling(
        _longrope,
        ("short_factor", "long_factor", _L0),
        {"factor": None, "attention_factor": None, "max_position_embeddings": None},
        True,
        "Ding et al. 2024 (LongRoPE, Phi-3): per-pair factors, short/long by current length",
    ),
}


def _check_scaling(scaling: Any, r: int) -> tuple[str, dict[str, Any]]:
    """Validate a ``scaling`` argument; return ``(rule name, params with defaults filled)``."""
    if scaling is None:
        return "default", {}
    if isinstance(scaling, str):
        scaling = {"rope_type": scaling}
    if not isinstance(scaling, Mapping):
        raise TypeError(
            f"scaling must be None, a rule name or a dict like {{'rope_type': 'linear', 'factor': 4.0}}, "
            f"got {type(scaling).__name__}"
        )
    if "rope_type" not in scaling:
        raise ValueError(
            f"scaling dict needs a 'rope_type' key naming the rule; valid rules: {', '.join(ROPE_SCALINGS)}"
        )
    name = scaling["rope_type"]
    if name not in ROPE_SCALINGS:
        raise ValueError(f"unknown RoPE scaling rule {name!r}; valid rules: {', '.join(ROPE_SCALINGS)}")
    rule = ROPE_SCALINGS[name]
    params = {k: v for k, v in scaling.items() if k != "rope_type"}
    valid = (*rule.required, *rule.optional)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} for RoPE scaling {name!r}; valid keys: {', '.join(valid) or '(none)'}"
        )
    missing = [k for k in rule.required if params.get(k) is None]
    if missing:
        raise ValueError(f"RoPE scaling {name!r} needs key(s) {missing}; it takes {', '.join(valid)}")
    params = {**rule.optional, **params}
    for key, value in params.items():
        if value is None or key == "truncate":
            continue
        if key in (_L0, "max_position_embeddings"):
            check_int(value, f"scaling[{key!r}]")
        elif key in ("short_factor", "long_factor"):
            if not isinstance(value, (list, tuple)) or len(value) != r // 2:
                raise ValueError(
                    f"scaling[{key!r}] must be a list of r/2 = {r // 2} numbers (one per rotated pair), "
                    f"got {len(value) if isinstance(value, (list, tuple)) else type(value).__name__}"
                )
            params[key] = tuple(check_positive_float(v, f"scaling[{key!r}] entry") for v in value)
        else:
            params[key] = check_positive_float(value, f"scaling[{key!r}]")
    if not isinstance(params.get("truncate", True), bool):
        raise TypeError(f"scaling['truncate'] must be a bool, got {params['truncate']!r}")
    if name == "llama3" and params["high_freq_factor"] <= params["low_freq_factor"]:
        raise ValueError(
            f"scaling['high_freq_factor'] ({params['high_freq_factor']}) must be > "
            f"scaling['low_freq_factor'] ({params['low_freq_factor']})"
        )
    if name == "longrope" and params["factor"] is None and params["max_position_embeddings"] is None:
        raise ValueError(
            "RoPE scaling 'longrope' needs 'factor' or 'max_position_embeddings' (factor = "
            "max_position_embeddings / original_max_position_embeddings) for its attention factor"
        )
    return name, params


def _resolve_rotary_dim(head_dim: int, rotary_dim: int | None, partial_rotary_factor: float | None) -> int:
    check_int(head_dim, "head_dim", minimum=2, even=rotary_dim is None and partial_rotary_factor is None)
    if rotary_dim is not None and partial_rotary_factor is not None:
        raise ValueError(
            f"give rotary_dim ({rotary_dim}) or partial_rotary_factor ({partial_rotary_factor}), not both"
        )
    if partial_rotary_factor is not None:
        frac = check_positive_float(partial_rotary_factor, "partial_rotary_factor")
        if frac > 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {frac}")
        rotary_dim = int(head_dim * frac)  # HF's rounding: int(head_dim * partial_rotary_factor)
        hint = f" (= int(head_dim {head_dim} * partial_rotary_factor {frac}))"
    else:
        hint = ""
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
    check_int(rotary_dim, "rotary_dim", minimum=2, even=True, hint=hint)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim ({head_dim}), got {rotary_dim}")
    return rotary_dim


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | str | None = None,
    rotary_dim: int | None = None,
    partial_rotary_factor: float | None = None,
    seq_len: int | torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies and attention scale for a scaling rule.

    Args:
        head_dim: ``d_h``.
        base: ``rope_theta`` (10000 in RoFormer and Llama 2, 500000 in Llama 3, 1e6 in Qwen2).
        scaling: ``None`` (plain RoPE), a rule name, or a dict ``{"rope_type": rule, ...}`` with the
            rule's keys (HF ``rope_parameters`` names); rules in :data:`ROPE_SCALINGS`.
        rotary_dim / partial_rotary_factor: ``r`` directly, or ``int(d_h * fraction)`` (HF's rounding);
            default ``r = d_h``.
        seq_len: the current length, for length-dependent rules (``dynamic``, ``longrope``);
            ``None`` = the trained length. Ignored by the others.
        dtype, device: of the result. Computed in float64, then cast.

    Returns:
        ``(inv_freq [r/2], attention_scale)``: radians per position for each pair, and the factor
        multiplying ``cos`` and ``sin`` (so the logits scale by its square).

    Raises:
        ValueError: unknown rule or key (lists the valid ones), a missing key, bad dims.
    """
    r = _resolve_rotary_dim(head_dim, rotary_dim, partial_rotary_factor)
    name, params = _check_scaling(scaling, r)
    base = check_positive_float(base, "base")
    if seq_len is not None and not isinstance(seq_len, torch.Tensor):
        check_int(seq_len, "seq_len")
    inv, scale = ROPE_SCALINGS[name].compute(r, base, params, seq_len, "cpu")
    return inv.to(device=device, dtype=dtype), scale


def rope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    attention_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width ``cos``/``sin`` tables of ``positions * inv_freq``, times ``attention_scale``.

    Args:
        positions: integer tensor ``[...]`` (``[s]`` or ``[b, s]``); never a float tensor.
        inv_freq: ``[r/2]`` from :func:`rope_frequencies`.
        attention_scale: multiplies both tables (HF's ``attention_scaling``).
        dtype: of the result. Angles are float32 (float64 when ``dtype`` is float64) with autocast
            off; the positions and ``inv_freq`` are converted to that, never to bf16/fp16.

    Returns:
        ``(cos, sin)``, each ``positions.shape + (r/2,)``.
    """
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.is_complex():
        raise TypeError(
            f"positions must be an integer tensor, got {_describe(positions)}: float positions lose "
            "precision (bf16 cannot tell 257 from 256); pass e.g. positions.long()"
        )
    adt = _angle_dtype(dtype)
    with autocast_off(positions.device):
        angles = position_angles(positions, inv_freq, adt)  # [...] x [r/2] -> [..., r/2], any position
        cos, sin = torch.cos(angles), torch.sin(angles)
        if attention_scale != 1.0:
            cos, sin = cos * attention_scale, sin * attention_scale
    return cos.to(dtype), sin.to(dtype)


def document_lengths(positions: torch.Tensor) -> torch.Tensor:
    """The current length of each position's sequence, as a length-dependent RoPE rule (dynamic
    NTK, LongRoPE) uses it: ``[s]`` -> ``[s]``, ``[b, s]`` -> ``[b, 1]``, int64.

    ``[b, s]`` positions (left padding, per-row cache offsets): each row's largest position + 1.
    ``[s]`` positions: each document's largest position + 1, where a document starts at every 0
    after the first position (packed documents restart at 0; a plain or offset range is one
    document, so its length is the largest position + 1 as in Hugging Face's dynamic NTK).
    """
    if positions.dim() == 2:
        return positions.amax(dim=-1, keepdim=True) + 1  # [b, 1]
    start = torch.cat((torch.ones_like(positions[:1], dtype=torch.bool), positions[1:] == 0))  # [s]
    document = start.long().cumsum(0) - 1  # [s] document index
    top = torch.full_like(positions, torch.iinfo(torch.int64).min, dtype=torch.int64)  # [s]
    top = top.scatter_reduce(0, document, positions.long(), reduce="amax")  # [s] max per document
    return top[document] + 1  # [s]


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------
def _check_qk(q: torch.Tensor, k: torch.Tensor, head_dim: int, qk_layout: str = "bhsd") -> None:
    form = f"[b, h, s, {head_dim}]" if qk_layout == "bhsd" else f"[b, s, h, {head_dim}]"
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor {form}, got {_describe(t)}")
        if t.dim() != 4 or t.shape[-1] != head_dim:
            raise ValueError(f"{name} must have shape {form}, got {tuple(t.shape)} (qk_layout={qk_layout!r})")


def _check_seq(positions: torch.Tensor | None, x: torch.Tensor, qk_layout: str, name: str, xname: str):
    """A clear error when ``positions`` ``[s]``/``[b, s]`` cannot match ``x``'s sequence axis."""
    if not isinstance(positions, torch.Tensor) or positions.dim() not in (1, 2):
        return  # the type and rank are checked by resolve_positions
    if positions.shape[-1] != x.shape[_seq_axis(qk_layout)]:
        raise ValueError(
            f"{name} must have shape [s] or [b, s] with s = {x.shape[_seq_axis(qk_layout)]}, got "
            f"{tuple(positions.shape)}: " + _seq_mismatch(positions.shape[-1], x, qk_layout, xname)
        )


def _for_heads(t: torch.Tensor, positions: torch.Tensor, qk_layout: str = "bhsd") -> torch.Tensor:
    """Tables for positions ``[b, s]`` are ``[b, s, r/2]``: add the head axis -> ``[b, 1, s, r/2]``
    (``"bshd"``: ``[b, s, 1, r/2]``). Tables for ``[s]`` stay ``[s, r/2]``."""
    if positions.dim() != 2:
        return t
    return t.unsqueeze(-3) if qk_layout == "bhsd" else t.unsqueeze(-2)


class RotaryEmbedding(PositionalScheme):
    """Rotary position embedding (Su et al. 2021) with any scaling rule from :data:`ROPE_SCALINGS`.

    Args:
        head_dim: ``d_h``.
        base: ``rope_theta``.
        rotary_dim / partial_rotary_factor: rotate only the first ``r`` dims (GPT-NeoX 0.25, Phi-2 0.4,
            GPT-J ``rotary_dim=64``); the rest pass through bit-identical.
        layout: ``"half"`` (HF Llama/NeoX/Mistral/Qwen) or ``"interleaved"`` (GPT-J, Meta, RoFormer).
        scaling: ``None`` or ``{"rope_type": ..., ...}`` as in :func:`rope_frequencies`.
        qk_layout: axis order of q and k: ``"bhsd"`` (default) or ``"bshd"`` (flash-attention,
            torchtune); each call may override it.

    Shapes: ``rotate(q [b, h, s_q, d_h], k [b, h_kv, s_k, d_h], q_positions [s_q] | [b, s_q],
    k_positions [s_k] | [b, s_k]) -> (q, k)`` of the same shapes and dtypes; with ``"bshd"``
    ``q [b, s_q, h, d_h]``, ``k [b, s_k, h_kv, d_h]``. ``rope(q, k)`` is ``rope.rotate(q, k)``.

    For length-dependent rules (``dynamic``, ``longrope``) the current length is
    ``max(q_positions, k_positions) + 1`` and ``needs_unrotated_cache`` is ``True`` on the instance:
    a model must cache raw keys and rotate the whole key cache every step, so old and new keys share
    one base (HF #25104). Other rules rotate each key once.
    """

    name = "rope"
    hooks = ("rotate",)
    summary = "rotary (Su 2021): half/interleaved, partial, scalings linear/ntk/dynamic/yarn/llama3/longrope"
    #: the scalings that need nothing but the factor and the trained length
    eval_variants = tuple(
        rule for rule, spec in ROPE_SCALINGS.items()
        if rule != "default" and set(spec.required) <= {"factor", _L0}
    )  # fmt: skip

    @classmethod
    def variant_options(cls, variant: str, factor: float, trained_len: int) -> dict[str, Any]:
        """``{"scaling": {"rope_type": variant, "factor": factor, ...}}``, with
        ``original_max_position_embeddings = trained_len`` for the rules that need it (YaRN, dynamic)."""
        if variant not in cls.eval_variants:
            return super().variant_options(variant, factor, trained_len)
        scaling: dict[str, Any] = {"rope_type": variant, "factor": float(factor)}
        if _L0 in ROPE_SCALINGS[variant].required:
            scaling[_L0] = trained_len
        return {"scaling": scaling}

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        layout: str = "half",
        scaling: Mapping[str, Any] | str | None = None,
        qk_layout: str = "bhsd",
    ) -> None:
        super().__init__()
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        self.head_dim = check_int(head_dim, "head_dim", minimum=2)
        self.rotary_dim = _resolve_rotary_dim(head_dim, rotary_dim, partial_rotary_factor)
        self.base = check_positive_float(base, "base")
        self.layout = check_choice(layout, "layout", ROTARY_LAYOUTS)
        self.scaling_rule, self.scaling_params = _check_scaling(scaling, self.rotary_dim)
        # An instance attribute: only length-dependent rules need the model to cache raw keys.
        self.needs_unrotated_cache = ROPE_SCALINGS[self.scaling_rule].length_dependent

    def frequencies(
        self, seq_len: int | torch.Tensor | None = None, *, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, float]:
        """``(inv_freq [r/2] float64 (float32 on MPS), attention_scale)`` from the configuration."""
        rule = ROPE_SCALINGS[self.scaling_rule]
        return rule.compute(self.rotary_dim, self.base, self.scaling_params, seq_len, device)

    def cos_sin(
        self,
        positions: torch.Tensor,
        *,
        dtype: torch.dtype = torch.float32,
        seq_len: int | torch.Tensor | None = None,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for integer ``positions`` ``[s]`` -> ``[s, r/2]``, ``[b, s]`` -> ``[b, 1, s, r/2]``
        (``"bshd"``: ``[b, s, 1, r/2]``), ready for :func:`apply_rotary` with the same ``qk_layout``."""
        qk_layout = self._qk_layout(qk_layout)
        inv, scale = self.frequencies(seq_len, device=positions.device)
        cos, sin = rope_cos_sin(positions, inv, attention_scale=scale, dtype=dtype)
        return _for_heads(cos, positions, qk_layout), _for_heads(sin, positions, qk_layout)

    def _qk_layout(self, qk_layout: str | None) -> str:
        return self.qk_layout if qk_layout is None else check_choice(qk_layout, "qk_layout", QK_LAYOUTS)

    def _positions(self, q, k, q_positions, k_positions, qk_layout: str = "bhsd"):
        _check_seq(q_positions, q, qk_layout, "q_positions", "q")
        _check_seq(k_positions, k, qk_layout, "k_positions", "k")
        axis = _seq_axis(qk_layout)
        qp = resolve_positions(q_positions, q.shape[axis], q.device, name="q_positions")
        kp = resolve_positions(k_positions, k.shape[axis], k.device, name="k_positions")
        return qp, kp

    def _lengths(self, qp: torch.Tensor, kp: torch.Tensor):
        """The lengths queries and keys are rotated for under a length-dependent rule
        (``[..., s, 1]`` or ``[b, 1, 1]``, :func:`document_lengths`; each side from its own
        positions: in every model path the queries are the last keys, so both agree), or
        ``None, None`` for rules whose frequencies do not depend on the length."""
        if not self.needs_unrotated_cache or (qp.numel() == 0 and kp.numel() == 0):
            return None, None
        return (None if qp.numel() == 0 else document_lengths(qp)[..., None],
                None if kp.numel() == 0 else document_lengths(kp)[..., None])  # fmt: skip

    def _tables(self, q, k, q_positions, k_positions, qk_layout: str = "bhsd"):
        """cos/sin for q and for k (frequencies per document under a length-dependent rule)."""
        qp, kp = self._positions(q, k, q_positions, k_positions, qk_layout)
        len_q, len_k = self._lengths(qp, kp)
        inv, scale = self.frequencies(len_q, device=q.device)  # [r/2], or [..., s_q, r/2] per document
        cq, sq = rope_cos_sin(qp, inv, attention_scale=scale, dtype=q.dtype)
        if q_positions is None and k_positions is None and qp.shape == kp.shape and k.dtype == q.dtype:
            ck, sk = cq, sq  # same default positions: one table
        else:
            if self.needs_unrotated_cache:  # the keys' own lengths
                inv, scale = self.frequencies(len_k, device=q.device)  # [..., s_k, r/2]
            ck, sk = rope_cos_sin(kp, inv, attention_scale=scale, dtype=k.dtype)
        fq, fk = (lambda t: _for_heads(t, qp, qk_layout)), (lambda t: _for_heads(t, kp, qk_layout))
        return (fq(cq), fq(sq)), (fk(ck), fk(sk)), (qp, kp)

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q [b, h, s_q, d_h]`` and ``k [b, h_kv, s_k, d_h]`` by their positions (default
        ``arange``; a KV-cache step passes offset positions, packing/left padding pass ``[b, s]``).
        With ``qk_layout="bshd"`` (default: the module's) q and k are ``[b, s, h, d_h]``."""
        qk_layout = self._qk_layout(qk_layout)
        _check_qk(q, k, self.head_dim, qk_layout)
        (cq, sq), (ck, sk), _ = self._tables(q, k, q_positions, k_positions, qk_layout)
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim, "qk_layout": qk_layout}
        return apply_rotary(q, cq, sq, **kw), apply_rotary(k, ck, sk, **kw)

    def extra_repr(self) -> str:
        scaling = "" if self.scaling_rule == "default" else f", scaling={self.scaling_rule!r}"
        qk = "" if self.qk_layout == "bhsd" else f", qk_layout={self.qk_layout!r}"
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"layout={self.layout!r}{scaling}{qk}"
        )


class XPos(RotaryEmbedding):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE times a per-pair decay.

    Pair ``i`` of a query at position ``n`` is scaled by ``zeta_i^(n/gamma)`` and of a key at ``m`` by
    ``zeta_i^(-m/gamma)``, ``zeta_i = (2i/r + 0.4) / 1.4``, ``gamma = scale_base`` (512), so the logit
    gains ``zeta_i^((n-m)/gamma)``: it decays with distance for causal attention (``n >= m``).
    Scales use absolute positions (no re-centring), so a key's scale never changes once cached and
    KV-cache offsets are exact. The price: ``zeta_0^(-m/gamma)`` overflows past
    ``m ~ gamma * ln(max) / |ln zeta_0|`` (about 36k positions in float32/bf16, 4.5k in fp16);
    longer positions raise ``ValueError`` rather than return inf.

    Args:
        head_dim, base, rotary_dim, partial_rotary_factor, layout: as :class:`RotaryEmbedding`.
        scale_base: ``gamma``.

    Shapes: as :class:`RotaryEmbedding`.
    """

    name = "xpos"
    eval_variants = ()  # no scaling argument: xPos's own decay is its answer to long inputs
    summary = "RoPE with an exponential per-pair decay (Sun et al. 2022), causal, KV-cache exact"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        layout: str = "half",
        scale_base: float = 512.0,
        qk_layout: str = "bhsd",
    ) -> None:
        super().__init__(head_dim, base, rotary_dim, partial_rotary_factor, layout, qk_layout=qk_layout)
        self.scale_base = check_positive_float(scale_base, "scale_base")

    def log_zeta(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``ln zeta_i`` for the ``r/2`` pairs, float32: ``zeta_i = (2i/r + 0.4) / 1.4``."""
        i2 = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64, device=device)  # [r/2]: 2i
        return torch.log((i2 / self.rotary_dim + 0.4) / 1.4).float()

    def max_position(self, dtype: torch.dtype) -> int:
        """Largest ``|position|`` whose scale neither overflows nor underflows ``dtype``."""
        info = torch.finfo(dtype)
        limit = min(math.log(info.max), -math.log(info.tiny))
        return int(self.scale_base * limit / abs(math.log(0.4 / 1.4)))

    def _check_range(self, positions: torch.Tensor, dtype: torch.dtype, name: str) -> None:
        if torch.compiler.is_compiling() or not positions.numel() or positions.device.type == "meta":
            return  # data-dependent: only in eager mode on real data
        top, limit = int(positions.abs().max()), self.max_position(dtype)
        if top > limit:
            raise ValueError(
                f"{name} reach {top} but xPos scales zeta^(+-m/{self.scale_base:g}) leave the range of "
                f"{dtype} past |m| = {limit}; use float32/bf16 (not fp16), a larger scale_base, or rope"
            )

    def _scale(self, positions: torch.Tensor, sign: float) -> torch.Tensor:
        """``zeta^(sign * m / gamma)``: ``[..., s, r/2]`` float32."""
        with autocast_off(positions.device):
            power = positions.float()[..., None] * (sign / self.scale_base)  # [..., s, 1]
            return torch.exp(power * self.log_zeta(positions.device))  # [..., s, 1] * [r/2] -> [..., s, r/2]

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`RotaryEmbedding.rotate`, with the xPos scales on q (``zeta^(n/gamma)``) and k
        (``zeta^(-m/gamma)``)."""
        qk_layout = self._qk_layout(qk_layout)
        _check_qk(q, k, self.head_dim, qk_layout)
        qp, kp = self._positions(q, k, q_positions, k_positions, qk_layout)
        self._check_range(qp, q.dtype, "q_positions")
        self._check_range(kp, k.dtype, "k_positions")
        inv, _ = self.frequencies(device=q.device)
        out = []
        for x, pos, sign in ((q, qp, 1.0), (k, kp, -1.0)):
            cos, sin = rope_cos_sin(pos, inv)  # float32 [..., s, r/2]
            scale = self._scale(pos, sign)
            cos, sin = (cos * scale).to(x.dtype), (sin * scale).to(x.dtype)
            cos, sin = _for_heads(cos, pos, qk_layout), _for_heads(sin, pos, qk_layout)
            out.append(self._rotate_one(x, cos, sin, qk_layout))
        return out[0], out[1]

    def _rotate_one(self, x, cos, sin, qk_layout):
        return apply_rotary(x, cos, sin, layout=self.layout, rotary_dim=self.rotary_dim, qk_layout=qk_layout)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", scale_base={self.scale_base}"


class Rope2D(RotaryEmbedding):
    """Axial 2D RoPE for image patches (Heo et al. 2024, "Rotary Position Embedding for Vision
    Transformer"; the axial form of EVA-02/FiT): half the rotated pairs turn with the row, half with
    the column, each with RoPE frequencies of width ``r/2``.

    Pairs ``0 .. r/4-1`` (in the chosen layout's pairing) use the row coordinate, pairs
    ``r/4 .. r/2-1`` the column, so ``<R_p q, R_p' k>`` depends only on ``p' - p`` per axis.

    Args:
        head_dim, base, rotary_dim, partial_rotary_factor, layout: as :class:`RotaryEmbedding`;
            ``r`` must be a multiple of 4.
        grid: ``(rows, cols)``; when given, positions default to the row-major patch coordinates
            (``s = rows * cols``). Otherwise positions are required.

    Shapes: ``rotate(q [b, h, s_q, d_h], k [b, h_kv, s_k, d_h], q_positions [s_q, 2] | [b, s_q, 2],
    k_positions [s_k, 2] | [b, s_k, 2])``; coordinates are integer ``(row, col)``.
    """

    name = "rope_2d"
    eval_variants = ()  # grids, not sequences
    position_dims = 2
    summary = "axial 2D RoPE for image patches: half the rotary pairs per axis (row, column)"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        layout: str = "half",
        grid: tuple[int, int] | None = None,
        qk_layout: str = "bhsd",
    ) -> None:
        super().__init__(head_dim, base, rotary_dim, partial_rotary_factor, layout, qk_layout=qk_layout)
        if self.rotary_dim % 4:
            raise ValueError(
                f"rope_2d splits the rotary dims between two axes, so rotary_dim must be a multiple of 4, "
                f"got {self.rotary_dim}"
            )
        if grid is not None:
            if not isinstance(grid, (tuple, list)) or len(grid) != 2:
                raise TypeError(f"grid must be a (rows, cols) pair of ints, got {grid!r}")
            grid = (check_int(grid[0], "grid[0]"), check_int(grid[1], "grid[1]"))
        self.grid = grid

    def coords(
        self, positions: torch.Tensor | None, seq_len: int, device: torch.device, name: str
    ) -> torch.Tensor:
        """Validated integer coordinates ``[s, 2]`` or ``[b, s, 2]`` (default: the grid, row-major)."""
        if positions is None:
            if self.grid is None or self.grid[0] * self.grid[1] != seq_len:
                raise ValueError(
                    f"{name} is None and the sequence has {seq_len} patches, which does not match "
                    f"grid={self.grid}; pass {name} as integer (row, col) coordinates [s, 2] or build "
                    "rope_2d with grid=(rows, cols)"
                )
            rows, cols = torch.meshgrid(
                torch.arange(self.grid[0], device=device),
                torch.arange(self.grid[1], device=device),
                indexing="ij",
            )  # [rows, cols] each
            return torch.stack((rows, cols), dim=-1).reshape(seq_len, 2)  # [rows, cols, 2] -> [s, 2]
        if not isinstance(positions, torch.Tensor) or not _is_integer(positions):
            raise TypeError(
                f"{name} must be an integer tensor [s, 2] or [b, s, 2], got {_describe(positions)}"
            )
        if positions.dim() not in (2, 3) or positions.shape[-1] != 2 or positions.shape[-2] != seq_len:
            raise ValueError(
                f"{name} must have shape [s, 2] or [b, s, 2] with s = {seq_len}, got {tuple(positions.shape)}"
            )
        return positions.long()

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32, seq_len=None, qk_layout=None
    ):
        """Tables for coordinates ``[s, 2]`` -> ``[s, r/2]``, ``[b, s, 2]`` -> ``[b, 1, s, r/2]``
        (``"bshd"``: ``[b, s, 1, r/2]``)."""
        qk_layout = self._qk_layout(qk_layout)
        inv = _default_inv_freq(self.rotary_dim // 2, self.base, positions.device)  # [r/4], per axis
        (cos_r, sin_r), (cos_c, sin_c) = (rope_cos_sin(positions[..., a], inv, dtype=dtype) for a in (0, 1))
        cos = torch.cat((cos_r, cos_c), dim=-1)  # row [..., s, r/4] ++ column [..., s, r/4] -> [..., s, r/2]
        sin = torch.cat((sin_r, sin_c), dim=-1)
        return _for_heads(cos, positions[..., 0], qk_layout), _for_heads(sin, positions[..., 0], qk_layout)

    def rotate(self, q, k, q_positions=None, k_positions=None, *, qk_layout=None):
        """Rotate by 2D patch coordinates (see the class docstring for shapes; ``qk_layout`` as
        :meth:`RotaryEmbedding.rotate`)."""
        qk_layout = self._qk_layout(qk_layout)
        _check_qk(q, k, self.head_dim, qk_layout)
        out = []
        for x, pos, name in ((q, q_positions, "q_positions"), (k, k_positions, "k_positions")):
            coords = self.coords(pos, x.shape[_seq_axis(qk_layout)], x.device, name)
            cos, sin = self.cos_sin(coords, dtype=x.dtype, qk_layout=qk_layout)
            kw = {"layout": self.layout, "rotary_dim": self.rotary_dim, "qk_layout": qk_layout}
            out.append(apply_rotary(x, cos, sin, **kw))
        return out[0], out[1]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", grid={self.grid}"


# ----------------------------------------------------------------------------------------------
# Interop: Hugging Face configs, checkpoint layouts
# ----------------------------------------------------------------------------------------------
#: HF ``model_type`` values whose attention uses the interleaved layout (GPT-J's rotate_every_two).
HF_INTERLEAVED_MODEL_TYPES = ("gptj", "codegen")
_HF_DROP = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def hf_rope_config(config: Any, *, layout: str | None = None) -> dict[str, Any]:
    """The :func:`posenc.build` arguments of ``"rope"`` that reproduce a Hugging Face config.

    Args:
        config: a ``config.json`` dict or a ``transformers`` config object. Read: ``rope_parameters``
            (transformers >= 5) or ``rope_scaling`` (older), ``rope_theta``, ``partial_rotary_factor``
            (or GPT-NeoX's ``rotary_pct``, GPT-J's ``rotary_dim``), ``max_position_embeddings``,
            ``original_max_position_embeddings``, ``head_dim`` or ``hidden_size / num_attention_heads``,
            ``model_type`` and DeepSeek's ``rope_interleave`` (for the layout), DeepSeek's
            ``qk_rope_head_dim``.
        layout: override the layout (default: ``"interleaved"`` for GPT-J/CodeGen and configs with
            ``rope_interleave=True``, else ``"half"``).

    Returns:
        ``{"head_dim", "base", "rotary_dim" | "partial_rotary_factor", "layout", "scaling"}``.
    """
    # DeepSeek-V2/V3 (MLA) rotate only the qk_rope_head_dim part of each head
    head_dim = _get(config, "qk_rope_head_dim", _get(config, "head_dim"))
    if head_dim is None:
        hidden, heads = _get(config, "hidden_size"), _get(config, "num_attention_heads")
        if hidden is None or heads is None:
            raise ValueError("config needs head_dim, or hidden_size and num_attention_heads, to size RoPE")
        head_dim = hidden // heads
    params = dict(_get(config, "rope_parameters") or _get(config, "rope_scaling") or {})
    if any(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(
            f"config has per-layer-type rope_parameters ({sorted(params)}); pass one entry, e.g. "
            "rope_from_hf({**config, 'rope_parameters': config['rope_parameters']['full_attention']})"
        )
    rule = params.get("rope_type", params.get("type", "default"))
    if rule not in ROPE_SCALINGS:
        raise ValueError(f"unsupported HF rope_type {rule!r}; posenc supports: {', '.join(ROPE_SCALINGS)}")
    base = params.get("rope_theta", _get(config, "rope_theta", _get(config, "rotary_emb_base", 10000.0)))
    out: dict[str, Any] = {"head_dim": head_dim, "base": float(base)}
    partial = params.get(
        "partial_rotary_factor", _get(config, "partial_rotary_factor", _get(config, "rotary_pct"))
    )
    if _get(config, "model_type") in HF_INTERLEAVED_MODEL_TYPES and _get(config, "rotary_dim") is not None:
        out["rotary_dim"] = _get(config, "rotary_dim")
    elif partial is not None and partial != 1.0:
        out["partial_rotary_factor"] = float(partial)
    if layout is None:
        model_type = _get(config, "model_type")
        interleaved = model_type in HF_INTERLEAVED_MODEL_TYPES or bool(_get(config, "rope_interleave"))
        layout = "interleaved" if interleaved else "half"
    out["layout"] = layout
    if rule == "default":
        out["scaling"] = None
        return out
    rule_keys = (*ROPE_SCALINGS[rule].required, *ROPE_SCALINGS[rule].optional)
    scaling = {k: v for k, v in params.items() if k not in _HF_DROP and k in rule_keys}
    max_pos = _get(config, "max_position_embeddings")
    if rule == "dynamic":  # HF's dynamic NTK measures growth against max_position_embeddings
        scaling[_L0] = max_pos
    elif rule in ("yarn", "llama3", "longrope"):
        # As HF: a top-level original_max_position_embeddings (Phi-3) wins, then the rope dict's, max_pos.
        top = _get(config, _L0)
        scaling[_L0] = top if top is not None else params.get(_L0, max_pos)
        if rule == "yarn" and scaling.get("factor") is None:
            scaling["factor"] = max_pos / scaling[_L0]
        if rule == "longrope":
            scaling["max_position_embeddings"] = max_pos
    out["scaling"] = {"rope_type": rule, **scaling}
    return out


def rope_from_hf(config: Any, *, layout: str | None = None) -> RotaryEmbedding:
    """A :class:`RotaryEmbedding` that rotates exactly as the HF model with this config.

    Args:
        config: a ``config.json`` dict or a ``transformers`` config object (see :func:`hf_rope_config`).
        layout: override the layout; default from ``model_type``.
    """
    return RotaryEmbedding(**hf_rope_config(config, layout=layout))


_PERMUTE_TARGETS = ("interleaved", "half")


def permute_qk_weights(
    weight: torch.Tensor, num_heads: int, *, to: str = "half", rotary_dim: int | None = None
) -> torch.Tensor:
    """Reorder q/k projection rows between the interleaved and half RoPE layouts.

    ``to="half"`` is the permutation of HF's ``convert_llama_weights_to_hf.py`` (Meta -> HF): within
    each head, row ``2j + c`` moves to row ``c * r/2 + j``. ``to="interleaved"`` is its inverse.
    With permuted weights, half-layout RoPE gives the same q/k (up to this same row permutation of
    the head dims) and the same attention logits as interleaved RoPE with the original weights.

    Args:
        weight: ``[h * d_h, d_in]`` (an ``nn.Linear`` weight) or ``[h * d_h]`` (its bias).
        num_heads: ``h``, the heads of this projection (``num_key_value_heads`` for k with GQA).
        to: ``"half"`` or ``"interleaved"``, the target layout.
        rotary_dim: ``r``, only the first ``r`` rows of each head are permuted (partial rotary);
            default ``d_h``.

    Returns:
        A new tensor of the same shape.
    """
    check_choice(to, "to", _PERMUTE_TARGETS)
    check_int(num_heads, "num_heads")
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (1, 2):
        shape = f" of shape {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else ""
        raise ValueError(
            f"weight must be a tensor [h * d_h, d_in] or a bias [h * d_h], got {_describe(weight)}{shape}"
        )
    out_features = weight.shape[0]
    if out_features % num_heads:
        raise ValueError(f"weight has {out_features} rows, not a multiple of num_heads={num_heads}")
    d_h = out_features // num_heads
    r = d_h if rotary_dim is None else check_int(rotary_dim, "rotary_dim", minimum=2, even=True)
    if r > d_h or r % 2:
        raise ValueError(f"rotary_dim must be even and <= d_h = {d_h}, got {r}")
    w = weight.reshape(num_heads, d_h, -1)  # [h * d_h, d_in] -> [h, d_h, d_in]
    rot, rest = w[:, :r], w[:, r:]  # [h, r, d_in], [h, d_h - r, d_in]
    if to == "half":
        rot = rot.unflatten(1, (r // 2, 2)).transpose(1, 2)  # [h, r/2 pairs, 2] -> [h, 2, r/2]
    else:
        rot = rot.unflatten(1, (2, r // 2)).transpose(1, 2)  # [h, 2 halves, r/2] -> [h, r/2, 2]
    w = torch.cat((rot.flatten(1, 2), rest), dim=1)  # [h, r, d_in] ++ [h, d_h - r, d_in] -> [h, d_h, d_in]
    return w.reshape(weight.shape)
