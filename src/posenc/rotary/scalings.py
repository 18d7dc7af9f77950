"""RoPE's frequencies: the scaling registry (:data:`ROPE_SCALINGS`: ``default``, ``linear``, ``ntk``,
``dynamic``, ``yarn``, ``llama3``, ``longrope``, ``proportional``), :func:`rope_frequencies`,
:func:`rope_cos_sin` and :func:`document_lengths`.

Legend: ``b`` batch, ``s`` sequence length, ``r`` rotary width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._precision import angle_dtype, autocast_off, position_angles
from .._validate import check_int, check_positive_float
from ..absolute import sinusoidal_frequencies
from .apply import describe_value


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
    validate: Callable[[dict[str, Any]], None] | None = None  # the rule's own checks of its params


def _freq_dtype(device: torch.device | str | None) -> torch.dtype:
    return torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64


def default_inv_freq(r: int, base: float, device: torch.device | str | None) -> torch.Tensor:
    """``base^(-2i/r)``, i.e. the Vaswani sinusoidal frequencies of width ``r``: ``[r/2]``."""
    return sinusoidal_frequencies(r, base, "vaswani", dtype=_freq_dtype(device), device=device)


def _default(r, base, p, seq_len, device):
    return default_inv_freq(r, base, device), 1.0


def _linear(r, base, p, seq_len, device):
    # Position interpolation (Chen et al. 2023): position m is read as m / factor.
    return default_inv_freq(r, base, device) / p["factor"], 1.0


def _ntk_scale(r: int, ratio: torch.Tensor | float, device) -> torch.Tensor | float:
    """``(base * ratio^(r/(r-2)))^(-2i/r) / base^(-2i/r) = ratio^(-2i/(r-2))``: [r/2] (1 where ratio = 1)."""
    if r == 2:  # one pair, exponent 0: the base change does nothing
        return 1.0
    i2 = torch.arange(0, r, 2, dtype=_freq_dtype(device), device=device)  # [r/2]: 2i
    return torch.pow(ratio, -i2 / (r - 2))


def _ntk(r, base, p, seq_len, device):
    # NTK-aware scaling (bloc97, 2023): base' = base * factor^(r/(r-2)); the lowest frequency is
    # divided by exactly `factor`, the highest is kept.
    return default_inv_freq(r, base, device) * _ntk_scale(r, float(p["factor"]), device), 1.0


def _dynamic(r, base, p, seq_len, device):
    # Dynamic NTK (emozilla, 2023; HF `_compute_dynamic_ntk_parameters`): NTK with the factor
    # grown with the current length L = max(seq_len, original): base' = base * (f L / L0 - (f - 1))^(r/(r-2)).
    f, l0 = float(p["factor"]), p["original_max_position_embeddings"]
    inv = default_inv_freq(r, base, device)
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
    inv = default_inv_freq(r, base, device)
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
    inv = default_inv_freq(r, base, device)
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
    inv = default_inv_freq(r, base, device)
    short = inv / torch.tensor(p["short_factor"], dtype=inv.dtype, device=device)
    if seq_len is None:
        return short, float(scale)
    long = inv / torch.tensor(p["long_factor"], dtype=inv.dtype, device=device)
    return torch.where(torch.as_tensor(seq_len, device=device) > l0, long, short), float(scale)


def _proportional(r, base, p, seq_len, device):
    # Proportional RoPE (Gemma 4; HF `_compute_proportional_rope_parameters`): the pairs span the whole
    # width r, (i, i + r/2); the first int(fraction * r // 2) pairs turn at base^(-2i/r) (exponents over
    # the whole width, unlike partial rotary's over the rotated part) and the others not at all (angle
    # 0: cos 1, sin 0, the dims pass unchanged); every frequency is divided by `factor`.
    inv = default_inv_freq(r, base, device)
    turning = int(p["partial_rotary_factor"] * r // 2)  # HF's rounding, float floor division then int
    pair = torch.arange(r // 2, device=device)
    return torch.where(pair < turning, inv, torch.zeros_like(inv)) / p["factor"], 1.0


#: The key of a scaling rule's trained length (Hugging Face's name).
ORIGINAL_LENGTH = "original_max_position_embeddings"


def _check_llama3(params: dict[str, Any]) -> None:
    if params["high_freq_factor"] <= params["low_freq_factor"]:
        raise ValueError(
            f"scaling['high_freq_factor'] ({params['high_freq_factor']}) must be > "
            f"scaling['low_freq_factor'] ({params['low_freq_factor']})"
        )


def _check_proportional(params: dict[str, Any]) -> None:
    if params["partial_rotary_factor"] > 1:
        raise ValueError(
            f"scaling['partial_rotary_factor'] must be in (0, 1] (the fraction of pairs that turn), got "
            f"{params['partial_rotary_factor']}"
        )


def _check_longrope(params: dict[str, Any]) -> None:
    if params["factor"] is None and params["max_position_embeddings"] is None:
        raise ValueError(
            "RoPE scaling 'longrope' needs 'factor' or 'max_position_embeddings' (factor = "
            "max_position_embeddings / original_max_position_embeddings) for its attention factor"
        )


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
        ("factor", ORIGINAL_LENGTH),
        {},
        True,
        "dynamic NTK (emozilla 2023): NTK with s grown from the current length; needs an unrotated KV cache",
    ),
    "yarn": RopeScaling(
        _yarn,
        ("factor", ORIGINAL_LENGTH),
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
        ("factor", "low_freq_factor", "high_freq_factor", ORIGINAL_LENGTH),
        {},
        False,
        "Meta Llama 3.1: interpolate long wavelengths, keep short ones, blend between",
        _check_llama3,
    ),
    "longrope": RopeScaling(
        _longrope,
        ("short_factor", "long_factor", ORIGINAL_LENGTH),
        {"factor": None, "attention_factor": None, "max_position_embeddings": None},
        True,
        "Ding et al. 2024 (LongRoPE, Phi-3): per-pair factors, short/long by current length",
        _check_longrope,
    ),
    "proportional": RopeScaling(
        _proportional,
        ("partial_rotary_factor",),  # without it (HF's default 1.0) the rule is `linear`
        {"factor": 1.0},
        False,
        "Gemma 4 (proportional): the first fraction of pairs over the whole head turn at base^(-2i/d_h), "
        "the rest not; all / factor",
        _check_proportional,
    ),
}


def check_scaling(scaling: Any, r: int) -> tuple[str, dict[str, Any]]:
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
        if key in (ORIGINAL_LENGTH, "max_position_embeddings"):
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
    if rule.validate is not None:
        rule.validate(params)
    return name, params


def resolve_rotary_dim(head_dim: int, rotary_dim: int | None, partial_rotary_factor: float | None) -> int:
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
    r = resolve_rotary_dim(head_dim, rotary_dim, partial_rotary_factor)
    name, params = check_scaling(scaling, r)
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
            f"positions must be an integer tensor, got {describe_value(positions)}: float positions lose "
            "precision (bf16 cannot tell 257 from 256); pass e.g. positions.long()"
        )
    adt = angle_dtype(dtype)
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
