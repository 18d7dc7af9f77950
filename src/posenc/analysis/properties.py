"""Property checks for any positional scheme: a registry of measurable claims.

Each entry of :data:`PROPERTIES` measures one number for a scheme (through its hooks and the
positional kernel, never by scheme name), compares it with a threshold, and says whether the
property applies to that scheme and whether the scheme *promises* it:

==================  ===========================================================  ====================
property            measured value                                               passes when
==================  ===========================================================  ====================
``distinct_fp32``   min over p != p' of ``|e(p) - e(p')| / median |e|``          ``> 0``
                    (also ``distinct_bf16``, ``distinct_fp16`` after ``.to``)
``bounded``         embed: ``max |PE(p)_i|``; rotate: ``max ||R_p x|/|x| - 1|``   ``<= 1``; ``<= 1e-5``
``relative_linear`` residual of the least-squares fit ``e(p + k) ~ M_k e(p)``    ``<= 1e-4``
``translation_inv`` ``max |K(m+t, n+t) - K(m, n)| / max |K|``                     ``<= 1e-5 + 8 eps P``
``decay``           bias: largest rise of ``K`` with distance / ``max |K|``;     ``<= 1e-6``;
                    rotate: RoFormer bound far / near; embed: ``|K|`` far/near   ``< 0.5``
``symmetry``        ``max |K - K^T| / max |K|``                                  ``<= 1e-6`` (info)
``beyond_length``   fraction of finite kernel values at positions near ``4L``    ``>= 1``
``wavelengths``     longest wavelength ``2 pi / theta_min`` over context ``L``    ``> 1``
==================  ===========================================================  ====================

``e(p)`` is :func:`~posenc.analysis.kernel.encodings` (``PE(p)``, or ``R_p u`` for rotations),
``K`` the positional kernel, ``L`` the nominal length (``max_len`` or the context's), ``P`` the
largest position used, ``eps = 2^-24`` (float32 rounding).

**Promises.** ``posenc verify`` fails (exit 1) only when a scheme breaks a property it promises.
A scheme class may declare ``promises = ("decay", ...)``; otherwise the rules are: every scheme
with a per-position vector promises distinct positions; formula schemes without a finite table
(``max_len is None``) promise the relative-position properties (``relative_linear``,
``translation_inv``, ``beyond_length``); schemes without trainable parameters promise
``bounded`` (rotations: when one step preserves norms) and ``wavelengths``; rotations and
fixed biases without trainable parameters promise ``decay``; ``symmetry`` is informational.
A learned table at init breaks translation invariance, and the report says so without failing.

Legend: ``s`` positions, ``d`` width, ``h`` heads, ``r`` relative distance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .._validate import check_choice
from ..base import PositionalScheme
from ..registry import schemes as registered_schemes
from .kernel import (
    Probe,
    display_kernel,
    encodings,
    kernel_curve,
    make_probe,
    positional_kernel,
    rotation_frequencies,
)

__all__ = [
    "PROPERTIES",
    "Property",
    "PropertyResult",
    "check",
    "fit_shift_map",
    "roformer_bound",
    "scheme_frequencies",
    "verify",
]

EPS32 = 2.0**-24


@dataclass(frozen=True)
class PropertyResult:
    """The outcome of one property check on one scheme.

    Attributes:
        scheme: the scheme's name.
        property: the property's name (a key of :data:`PROPERTIES`).
        applies: whether the property makes sense for this scheme; ``reason`` says why not.
        value: the measured number (``None`` when it does not apply).
        threshold: what ``value`` is compared with, using ``comparison`` (``<=``, ``<``, ``>``, ``>=``).
        passed: ``value comparison threshold`` (``None`` when it does not apply).
        promised: whether the scheme promises the property (a failure then fails ``posenc verify``).
        reason: why it does not apply, or what was measured and how.
        data: extra numbers (curves, fitted slopes) for plots and tests.
    """

    scheme: str
    property: str
    applies: bool
    value: float | None
    threshold: float | None
    comparison: str
    passed: bool | None
    promised: bool
    reason: str
    data: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def broken_promise(self) -> bool:
        """True when the scheme promises the property and the measurement fails it."""
        return self.applies and self.promised and self.passed is False

    @property
    def status(self) -> str:
        """``"n/a"``, ``"pass"``, ``"FAIL"`` (a broken promise) or ``"no"`` (fails, not promised)."""
        if not self.applies:
            return "n/a"
        if self.passed:
            return "pass"
        return "FAIL" if self.promised else "no"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (without the bulky ``data``)."""
        out = asdict(self)
        out.pop("data")
        out["status"] = self.status
        return out


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda v, t: v <= t,
    "<": lambda v, t: v < t,
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
}


@dataclass(frozen=True)
class Measurement:
    value: float
    threshold: float
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


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
        promised: the default rule ``probe -> bool`` (a class attribute ``promises`` overrides it).
    """

    name: str
    title: str
    formula: str
    comparison: str
    applies: Callable[[Probe], str | None]
    measure: Callable[[Probe], Measurement]
    promised: Callable[[Probe], bool]


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


def _lstsq(x: torch.Tensor, ys: list[torch.Tensor], rcond: float = 1e-10) -> list[torch.Tensor]:
    """Minimum-norm least-squares ``B`` with ``x B ~ y`` for each ``y``, from one SVD of ``x [n, d]``.

    Singular values below ``rcond * max`` are dropped (rank-deficient trajectories: constant or
    duplicated dimensions). LAPACK's ``gelsy`` mis-estimates the rank on exact duplicates.
    """
    u, sv, vh = torch.linalg.svd(x, full_matrices=False)  # [n, r], [r], [r, d]
    inv = torch.where(sv > rcond * sv.max(), 1.0 / sv, torch.zeros_like(sv))  # [r]
    return [vh.T @ (inv[:, None] * (u.T @ y)) for y in ys]  # [d, r] @ [r, d'] -> [d, d']


def _fit_shifts(enc: torch.Tensor, shifts: list[int]) -> dict[int, tuple[torch.Tensor, float]]:
    """:func:`fit_shift_map` for several shifts on the same starting rows ``e(0..s-1-max(k))``."""
    e = enc.double()
    top = max(shifts)
    x = e[: e.shape[0] - top]  # [s - K, d]: e(p)
    ys = [e[k : e.shape[0] - top + k] for k in shifts]  # [s - K, d] each: e(p + k)
    out = {}
    for k, y, sol in zip(shifts, ys, _lstsq(x, ys)):
        resid = torch.linalg.norm(y - x @ sol) / torch.linalg.norm(y).clamp_min(1e-300)
        out[k] = (sol.T, float(resid))
    return out


def fit_shift_map(enc: torch.Tensor, shift: int) -> tuple[torch.Tensor, float]:
    """Least-squares linear map ``M`` with ``e(p + k) ~ M e(p)`` and its relative residual.

    Args:
        enc: ``[s, d]`` encodings of positions ``0..s-1``.
        shift: ``k`` >= 1, less than ``s``.

    Returns:
        ``(M [d, d], residual)`` with ``residual = |E_{+k} - E M^T|_F / |E_{+k}|_F`` (float64),
        the minimum-norm solution when ``E`` is rank-deficient.
    """
    if not 1 <= shift < enc.shape[0]:
        raise ValueError(
            f"shift must be in [1, {enc.shape[0] - 1}] for {enc.shape[0]} positions, got {shift}"
        )
    return _fit_shifts(enc, [shift])[shift]


def scheme_frequencies(probe: Probe) -> tuple[torch.Tensor, str]:
    """Angular frequencies ``theta_i`` (rad/position, high to low) of a scheme, and how they were found.

    ``rotate``: exact eigen-angles of the one-step rotation (:func:`rotation_frequencies`).
    ``embed``: eigen-angles of the one-step map ``M_1`` fitted by least squares on pairs
    ``(PE(p), PE(p+1))`` for ``p`` spread over ``[0, 131072)`` (every 64th), so that wavelengths up to
    ~1.3e5 positions complete a period inside the fit. Valid when ``relative_linear`` holds;
    eigenvalues far from the unit circle (directions the fit cannot determine) are dropped and
    their pairs reported as ``nan``.

    Returns:
        (float64 ``[d/2]``, ``"exact"`` or ``"fitted"``); ``0`` for dimensions that never move.
    """
    if "frequencies" not in probe.cache:
        probe.cache["frequencies"] = _frequencies(probe)
    return probe.cache["frequencies"]


def _frequencies(probe: Probe) -> tuple[torch.Tensor, str]:
    if probe.rotates:
        return rotation_frequencies(probe), "exact"
    if "embed" not in probe.hooks:
        raise ValueError(f"scheme {probe.name!r} has no per-position vector to read frequencies from")
    # [n] starting points: the whole table, or every 64th position of [0, 131072)
    pos = torch.arange(probe.nominal_len - 1) if probe.bounded_length else torch.arange(0, 131072, 64)
    x, y = encodings(probe, pos).double(), encodings(probe, pos + 1).double()  # [n, d] each
    m = _lstsq(x, [y])[0].T  # [d, d]: y ~ x M^T
    eig = torch.linalg.eigvals(m)  # [d]
    keep = (eig.abs() - 1).abs() < 0.05  # a rotation's eigenvalues lie on the unit circle
    angles = torch.sort(eig[keep].angle().abs(), descending=True).values[0::2]  # one per +-pair
    half = x.shape[-1] // 2
    out = torch.full((half,), float("nan"), dtype=torch.float64)
    out[: min(half, angles.numel())] = angles[:half]
    return out, "fitted"


def roformer_bound(inv_freq: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """RoFormer's long-term decay curve (Su et al. 2021, section 3.4.3, eq. 37).

    ``B(r) = (1 / (d/2)) sum_{j=1}^{d/2} |S_j(r)|`` with ``S_j(r) = sum_{i<j} e^{i r theta_i}``;
    ``|q^T R_r k| <= max_i |h_{i+1} - h_i| * (d/2) * B(r)``, so ``B`` bounds how much a relative
    distance ``r`` can contribute.

    Args:
        inv_freq: ``theta`` ``[d/2]`` in RoFormer's order (``theta_0 = 1`` first).
        distances: ``[r]`` relative distances.

    Returns:
        float64 ``[r]``.
    """
    theta = inv_freq.double()
    phase = distances.double()[:, None] * theta[None, :]  # [r, d/2]
    re, im = torch.cos(phase).cumsum(-1), torch.sin(phase).cumsum(-1)  # S_j for j = 1..d/2: [r, d/2]
    return torch.sqrt(re**2 + im**2).mean(-1)  # [r]


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
    from .kernel import _rotate_rows

    rq, rk = _rotate_rows(probe, x, pos, None)  # [1, s, d_h] each
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
        from .kernel import _rotate_rows

        x = torch.randn(1, probe.head_dim, generator=torch.Generator().manual_seed(1))
        rq, rk = _rotate_rows(probe, x, torch.tensor([1]), None)
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
    resid = {k: r for k, (_, r) in _fit_shifts(enc, shifts).items()}
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
    try:
        k = positional_kernel(probe, pos)
    except (ValueError, IndexError, RuntimeError) as err:
        return Measurement(
            0.0,
            1.0,
            f"positions {far - 32}..{far - 1} (4x nominal length {probe.nominal_len}) "
            f"raise: {str(err).splitlines()[0]}",
        )
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

# the rotate/embed decay ratios are "<" a threshold, the bias rise "<=": one comparison per probe
_DECAY_CMP = {"score_bias": "<=", "rotate": "<", "embed": "<"}


def _comparison(prop: Property, probe: Probe) -> str:
    if prop.name == "decay":
        hook = next(h for h in ("score_bias", "rotate", "embed") if h in probe.hooks)
        return _DECAY_CMP[hook]
    return prop.comparison


# ---------------------------------------------------------------------------------------------- running
def _promised(prop: Property, probe: Probe) -> bool:
    declared = getattr(type(probe.scheme), "promises", None)
    if declared is not None:
        return prop.name in declared
    return prop.promised(probe)


_ERRORS = (ValueError, TypeError, RuntimeError, IndexError)


def _run_one(prop: Property, probe: Probe) -> PropertyResult:
    """One check. A scheme whose hooks raise while being probed fails the check (with the error
    as the reason): the analysis must be able to call every hook it relies on."""
    try:
        reason = prop.applies(probe)
        if reason is not None:
            return PropertyResult(
                probe.name, prop.name, False, None, None, prop.comparison, None, False, reason
            )
        cmp, promised = _comparison(prop, probe), _promised(prop, probe)
        m = prop.measure(probe)
    except _ERRORS as err:
        return PropertyResult(
            probe.name,
            prop.name,
            True,
            None,
            None,
            prop.comparison,
            False,
            True,
            f"measurement raised {type(err).__name__}: {str(err).splitlines()[0]}",
        )
    passed = math.isfinite(m.value) and _COMPARE[cmp](m.value, m.threshold)
    return PropertyResult(
        probe.name, prop.name, True, m.value, m.threshold, cmp, passed, promised, m.reason, m.data
    )


def _select(properties: list[str] | tuple[str, ...] | None) -> list[Property]:
    if properties is None:
        return list(PROPERTIES.values())
    return [PROPERTIES[check_choice(p, "property", PROPERTIES)] for p in properties]


def check(
    scheme: str | PositionalScheme | Probe,
    properties: list[str] | tuple[str, ...] | None = None,
    *,
    context: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> list[PropertyResult]:
    """Run property checks on one scheme.

    Args:
        scheme: a registry name, a module or a :class:`~posenc.analysis.kernel.Probe`.
        properties: names from :data:`PROPERTIES` (default: all).
        context: model sizes used to build a named scheme (see :func:`~posenc.analysis.kernel.make_probe`).
        config: the scheme's own options (only with a name).

    Returns:
        One :class:`PropertyResult` per property, in registry order.
    """
    props = _select(properties)
    probe = scheme if isinstance(scheme, Probe) else make_probe(scheme, context, config)
    return [_run_one(p, probe) for p in props]


def verify(
    names: list[str] | tuple[str, ...] | None = None,
    properties: list[str] | tuple[str, ...] | None = None,
    *,
    context: dict[str, Any] | None = None,
) -> list[PropertyResult]:
    """:func:`check` every named scheme (default: every registered scheme).

    A scheme that cannot be built from the context gets one ``n/a`` row per property with the
    build error as the reason.
    """
    names = list(registered_schemes()) if not names else list(names)
    registered = set(registered_schemes())
    for n in names:
        check_choice(n, "scheme", sorted(registered))
    props = _select(properties)
    out: list[PropertyResult] = []
    for n in names:
        try:
            probe = make_probe(n, context)
        except (ValueError, TypeError) as err:
            out += [
                PropertyResult(
                    n,
                    p.name,
                    False,
                    None,
                    None,
                    p.comparison,
                    None,
                    False,
                    f"cannot build from the context: {err}",
                )
                for p in props
            ]
            continue
        out += check(probe, [p.name for p in props])
    return out
