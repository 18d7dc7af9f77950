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
A scheme class may declare ``promises = ("decay", ...)`` (:class:`~posenc.base.PositionalScheme`);
otherwise the rules are: every scheme
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

from .._validate import check_choice
from ..base import PositionalScheme
from ..registry import schemes as registered_schemes
from .kernel import Probe, make_probe
from .measures import PROPERTIES, Property
from .spectrum import fit_shift_map, roformer_bound, scheme_frequencies

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


@dataclass(frozen=True, kw_only=True)
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


# ---------------------------------------------------------------------------------------------- running
def _promised(prop: Property, probe: Probe) -> bool:
    declared = probe.scheme.promises
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
            return _not_applicable(probe.name, prop, reason)
        cmp, promised = prop.comparison_of(probe), _promised(prop, probe)
        m = prop.measure(probe)
    except _ERRORS as err:
        return PropertyResult(
            scheme=probe.name,
            property=prop.name,
            applies=True,
            value=None,
            threshold=None,
            comparison=prop.comparison,
            passed=False,
            promised=True,
            reason=f"measurement raised {type(err).__name__}: {str(err).splitlines()[0]}",
        )
    passed = math.isfinite(m.value) and _COMPARE[cmp](m.value, m.threshold)
    return PropertyResult(
        scheme=probe.name,
        property=prop.name,
        applies=True,
        value=m.value,
        threshold=m.threshold,
        comparison=cmp,
        passed=passed,
        promised=promised,
        reason=m.reason,
        data=m.data,
    )


def _not_applicable(scheme: str, prop: Property, reason: str) -> PropertyResult:
    return PropertyResult(
        scheme=scheme,
        property=prop.name,
        applies=False,
        value=None,
        threshold=None,
        comparison=prop.comparison,
        passed=None,
        promised=False,
        reason=reason,
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
            out += [_not_applicable(n, p, f"cannot build from the context: {err}") for p in props]
            continue
        out += check(probe, [p.name for p in props])
    return out
