"""The measurements behind :data:`~posenc.analysis.properties.PROPERTIES`: one function per
property (``probe -> Measurement``), when each applies (``probe -> reason or None``) and the
default rules of what a scheme promises (``probe -> bool``), plus the maths they share: the
least-squares shift map, a scheme's frequencies and RoFormer's decay bound.

Everything reads a scheme through its hooks and the positional kernel, never by name.

Legend: ``s`` positions, ``d`` width, ``h`` heads, ``r`` relative distance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .kernel import (
    Probe,
    display_kernel,
    encodings,
    kernel_curve,
    positional_kernel,
    rotation_frequencies,
)
from .spectrum import fit_shift_maps, roformer_bound, scheme_frequencies

__all__ = ["PROPERTIES", "Measurement", "Property"]

EPS32 = 2.0**-24


@dataclass(frozen=True)
class Measurement:
    """One measured number, the threshold it is compared with, how it was measured, extra data."""

    value: float
    threshold: float
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- helpers
def _no_hooks(probe: Probe) -> str | None:
    return None if probe.hooks else "no positional hooks: the scheme adds no position information"


def _needs_vectors(probe: Probe) -> str | None:
    if not probe.hooks:
        return _no_hooks(probe)
    if not probe.has_vectors:
        return "a bias has no per-position vector, only a value per (query, key) distance"
    return None


def _vector_positions(probe: Probe, cap: int = 2048) -> int:
    """How many positions to probe: the whole table, or 4x the nominal length (capped)."""
    return probe.nominal_len if probe.bounded_length else min(4 * probe.nominal_len, cap)


# ---------------------------------------------------------------------------------------------- measures
def _distinct(dtype: torch.dtype) -> Callable[[Probe], Measurement]:
    def measure(probe: Probe) -> Measurement:
        n = _vector_positions(probe)
        enc = encodings(probe, n, dtype=dtype).float()  # [s, d], exact copy of the low-precision values
        dist = torch.cdist(enc, enc)  # [s, s]
        dist.fill_diagonal_(float("inf"))
        scale = float(enc.norm(dim=-1).median()) or 1.0
        i, j = divmod(int(dist.argmin()), n)
        collisions = int((dist == 0).sum()) // 2
        return Measurement(
            float(dist.min()) / scale,
            0.0,
            f"{n} positions in {str(dtype).removeprefix('torch.')}; closest pair ({i}, {j}); "
            f"{collisions} identical pair(s)",
        )

    return measure


def _bounded(probe: Probe) -> Measurement:
    n = _vector_positions(probe)
    if probe.bounded_length:
        pos = torch.arange(n)
    else:  # dense near 0, then sparse out to 16 L
        pos = torch.unique(
            torch.cat([torch.arange(n), torch.linspace(0, 16 * probe.nominal_len, 512).long()])
        )
    if "embed" in probe.hooks:
        top = float(encodings(probe, pos).abs().max())
        return Measurement(top, 1.0, f"max |PE(p)_i| over {pos.numel()} positions up to {int(pos.max())}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, probe.head_dim, generator=g)  # [1, d_h]
    from .kernel import rotate_rows

    rq, rk = rotate_rows(probe, x, pos, None)  # [1, s, d_h] each
    ratio = torch.cat([rq, rk], 0).double().norm(dim=-1) / x.double().norm()  # [2, s]
    dev = float((ratio - 1).abs().max())
    return Measurement(
        dev,
        1e-5,
        f"max | |R_p x| / |x| - 1 | for q and k over {pos.numel()} positions up to {int(pos.max())}",
    )


def _bounded_promised(probe: Probe) -> bool:
    if probe.trainable:
        return False
    if probe.rotates:  # promised when one step is a pure rotation
        from .kernel import rotate_rows

        x = torch.randn(1, probe.head_dim, generator=torch.Generator().manual_seed(1))
        rq, rk = rotate_rows(probe, x, torch.tensor([1]), None)
        return bool(
            torch.allclose(rq.norm(), x.norm(), rtol=1e-5) and torch.allclose(rk.norm(), x.norm(), rtol=1e-5)
        )
    return True


def _relative_linear_applies(probe: Probe) -> str | None:
    reason = _needs_vectors(probe)
    if reason:
        return reason
    width = probe.d_model if "embed" in probe.hooks else probe.head_dim
    if probe.bounded_length and probe.nominal_len < 2 * width + 50:
        return (
            f"only {probe.nominal_len} positions for a {width}-dim map: a linear fit would be trivially "
            f"exact; needs max_len >= {2 * width + 50}"
        )
    return None


def _relative_linear(probe: Probe) -> Measurement:
    if "relative_linear" not in probe.cache:
        probe.cache["relative_linear"] = _relative_linear_fit(probe)
    return probe.cache["relative_linear"]


def _relative_linear_fit(probe: Probe) -> Measurement:
    width = probe.d_model if "embed" in probe.hooks else probe.head_dim
    n = probe.nominal_len if probe.bounded_length else max(4 * width, probe.nominal_len)
    enc = encodings(probe, n)
    shifts = [k for k in (1, 7, 50) if k < n - 2 * width]
    resid = {k: r for k, (_, r) in fit_shift_maps(enc, shifts).items()}
    worst = max(resid, key=resid.get)
    return Measurement(
        resid[worst],
        1e-4,
        f"least-squares M_k over {n} positions, k in {shifts}; worst k={worst}",
        {"residuals": resid},
    )


def _translation(probe: Probe) -> Measurement:
    n = min(probe.nominal_len // 2, 256) if probe.bounded_length else min(probe.nominal_len, 256)
    shifts = [1, 17, n] if probe.bounded_length else [1, 17, n, 8 * probe.nominal_len]
    shifts = [t for t in shifts if not probe.bounded_length or t + n <= probe.nominal_len]
    base = positional_kernel(probe, n)  # [h, n, n]
    scale = float(base.abs().max())
    diffs = {}
    for t in shifts:
        shifted = positional_kernel(probe, torch.arange(t, t + n))
        diffs[t] = float((shifted - base).abs().max()) / max(scale, 1e-30)
    worst = max(diffs, key=diffs.get)
    top = max(shifts) + n
    return Measurement(
        diffs[worst] if scale > 0 else 0.0,
        1e-5 + 8 * EPS32 * top,
        f"{n} x {n} kernel vs shifted by t in {shifts}; worst t={worst}; threshold = float32 angle "
        f"rounding at position {top}",
        {"diffs": diffs},
    )


def _decay(probe: Probe) -> Measurement:
    n = min(probe.nominal_len, 512)
    if "score_bias" in probe.hooks:
        kern, content = display_kernel(probe, n)
        r, curve = kernel_curve(kern)  # [2n-1], [h, 2n-1]
        past = curve[:, r >= 0]  # [h, n]: keys at distance 0..n-1 before the query
        rise = float((past[:, 1:] - past[:, :-1]).max())
        dist = torch.arange(n, dtype=torch.float64)
        slope = ((past - past.mean(-1, keepdim=True)) * (dist - dist.mean())).sum(-1) / (
            (dist - dist.mean()) ** 2
        ).sum()
        scale = float(past.abs().max()) or 1.0
        return Measurement(
            rise / scale,
            1e-6,
            "largest rise of the mean bias from one key distance to the next (relative to max |bias|), "
            f"keys 0..{n - 1} before the query ({content} content)",
            {"distance": dist.tolist(), "curve": past.tolist(), "slopes": slope.tolist()},
        )
    if probe.rotates:
        theta = rotation_frequencies(probe)
        moving = theta[theta > 1e-9]  # pairs that rotate (partial rotary, the other axis of 2-D RoPE)
        dist = torch.arange(n + 1)
        bound = roformer_bound(moving, dist)
        far = float(bound[n // 2 :].mean() / bound[0])
        return Measurement(
            far,
            0.5,
            f"RoFormer bound B(r) = mean_j |sum_(i<j) e^(i r theta_i)| over the {moving.numel()} rotating "
            f"pairs: mean over r in [{n // 2}, {n}] / B(0)",
            {"distance": dist.tolist(), "bound": bound.tolist()},
        )
    r, curve = kernel_curve(display_kernel(probe, n)[0])
    past = curve[0, r >= 0]  # [n]
    far = float(past[n // 2 :].abs().mean() / past[0].abs().clamp_min(1e-30))
    return Measurement(
        far,
        0.5,
        f"mean |K(r)| over r in [{n // 2}, {n}) / |K(0)|",
        {"distance": list(range(n)), "curve": past.tolist()},
    )


def _symmetry(probe: Probe) -> Measurement:
    n = min(probe.nominal_len, 128)
    k, content = display_kernel(probe, n)
    scale = float(k.abs().max())
    asym = float((k - k.transpose(-1, -2)).abs().max()) / scale if scale > 0 else 0.0
    return Measurement(
        asym, 1e-6, f"max |K(m, n) - K(n, m)| / max |K| over {n} positions ({content} content)"
    )


def _beyond(probe: Probe) -> Measurement:
    far = 4 * probe.nominal_len
    pos = torch.arange(far - 32, far)
    if probe.bounded_length and far > probe.scheme.max_len:  # declared: no encoding past max_len
        return Measurement(
            0.0,
            1.0,
            f"positions {far - 32}..{far - 1} (4x nominal length {probe.nominal_len}) are past the "
            f"scheme's max_len={probe.scheme.max_len}: it has no encoding there",
        )
    k = positional_kernel(probe, pos)
    frac = float(torch.isfinite(k).double().mean())
    return Measurement(
        frac,
        1.0,
        f"fraction of finite kernel values at positions {far - 32}..{far - 1} "
        f"(4x nominal length {probe.nominal_len})",
    )


def _wavelengths_applies(probe: Probe) -> str | None:
    reason = _needs_vectors(probe)
    if reason:
        return reason
    if not probe.rotates:
        lin = _relative_linear_applies(probe)
        if lin:
            return lin
        if _relative_linear(probe).value > 1e-4:
            return (
                "PE(p+1) is not a fixed linear map of PE(p) (relative_linear fails): no frequencies to read"
            )
    return None


def _wavelengths(probe: Probe) -> Measurement:
    theta, how = scheme_frequencies(probe)
    moving = theta[torch.isfinite(theta) & (theta > 1e-9)]  # drop constant and unresolved pairs
    if moving.numel() == 0:
        raise ValueError("no dimension changes with position along this axis")
    lam = 2 * math.pi / moving  # [pairs]
    ctx = probe.nominal_len
    inside = int((lam <= ctx).sum())
    still = int((theta <= 1e-9).sum())
    unresolved = int(torch.isnan(theta).sum())
    extra = (f"; {still} constant pair(s)" if still else "") + (
        f"; {unresolved} unresolved" if unresolved else ""
    )
    return Measurement(
        float(lam.max()) / ctx,
        1.0,
        f"{inside} of {theta.numel()} frequency pairs complete a period within L={ctx}; longest wavelength "
        f"{float(lam.max()):.4g} positions ({how} frequencies){extra}",
        {"theta": theta.tolist(), "wavelength": (2 * math.pi / theta).tolist(), "inside": inside},
    )


def _formula(probe: Probe) -> bool:
    return not probe.trainable


def _decay_promised(probe: Probe) -> bool:
    """Rotations (RoFormer's bound is a theorem) and fixed biases (ALiBi) promise decay; an added
    encoding's kernel need not decay (a 2-D encoding probed along one axis has constant dims)."""
    return not probe.trainable and (probe.rotates or "score_bias" in probe.hooks)


def _functional(probe: Probe) -> bool:
    return not probe.bounded_length


def _never(probe: Probe) -> bool:
    return False


def _always(probe: Probe) -> bool:
    return True


def _decay_comparison(probe: Probe) -> str:
    """The bias rise passes at ``<=`` its threshold, the rotate/embed decay ratios at ``<``."""
    return "<=" if "score_bias" in probe.hooks else "<"


# ---------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Property:
    """One entry of the registry.

    Attributes:
        name: registry key.
        title: a short human title.
        formula: what is measured, for the report (plain text / Unicode maths).
        comparison: how ``value`` is compared with the threshold.
        applies: ``probe -> None`` when it applies, else the reason it does not.
        measure: ``probe -> Measurement``.
        promised: the default rule ``probe -> bool`` (a scheme's declared ``promises`` overrides it).
        comparison_for: ``probe -> comparison`` where it depends on the scheme (``None``: always
            ``comparison``).
    """

    name: str
    title: str
    formula: str
    comparison: str
    applies: Callable[[Probe], str | None]
    measure: Callable[[Probe], Measurement]
    promised: Callable[[Probe], bool]
    comparison_for: Callable[[Probe], str] | None = None

    def comparison_of(self, probe: Probe) -> str:
        """How this property compares its value with the threshold for ``probe``."""
        return self.comparison if self.comparison_for is None else self.comparison_for(probe)


PROPERTIES: dict[str, Property] = {}


def _register(p: Property) -> None:
    PROPERTIES[p.name] = p


for _dt, _nm in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
    _register(
        Property(
            f"distinct_{_nm}",
            f"distinct positions ({_nm})",
            f"min over p≠p' of |e(p) − e(p')| / median |e(p)|, module cast to {_nm}",
            ">",
            _needs_vectors,
            _distinct(_dt),
            _always,
        )
    )
_register(
    Property(
        "bounded",
        "bounded values",
        "embed: max |PE(p)ᵢ| ≤ 1; rotate: |R_p x| = |x| (max relative change)",
        "<=",
        _needs_vectors,
        _bounded,
        _bounded_promised,
    )
)
_register(
    Property(
        "relative_linear",
        "PE(p+k) = M_k PE(p)",
        "relative residual of the least-squares fit e(p+k) ≈ M_k e(p), k ∈ {1, 7, 50}",
        "<=",
        _relative_linear_applies,
        _relative_linear,
        _functional,
    )
)
_register(
    Property(
        "translation_inv",
        "translation invariance",
        "max |K(m+t, n+t) − K(m, n)| / max |K|: the kernel depends only on m − n",
        "<=",
        _no_hooks,
        _translation,
        _functional,
    )
)
_register(
    Property(
        "decay",
        "decay with distance",
        "bias: largest rise of K(r) with r; rotate: RoFormer bound B(far)/B(0); "
        "embed: mean |K(far)| / |K(0)|",
        "<=",
        _no_hooks,
        _decay,
        _decay_promised,
        _decay_comparison,
    )
)
_register(
    Property(
        "symmetry",
        "symmetry",
        "max |K(m, n) − K(n, m)| / max |K| (informational)",
        "<=",
        _no_hooks,
        _symmetry,
        _never,
    )
)
_register(
    Property(
        "beyond_length",
        "defined beyond nominal length",
        "fraction of finite K at positions around 4L",
        ">=",
        _no_hooks,
        _beyond,
        _functional,
    )
)
_register(
    Property(
        "wavelengths",
        "wavelengths vs context",
        "longest wavelength 2π/θ_min over the context length L; how many pairs wrap within L",
        ">",
        _wavelengths_applies,
        _wavelengths,
        _formula,
    )
)
