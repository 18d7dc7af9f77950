"""Intervals and tests for the lab's verdicts.

Two sources of uncertainty:

* **which text was scored**: the windows of one document are not independent (one file's style,
  identifiers and repetitions run through all of them), so the unit of resampling is the
  **document**: :func:`paired_bootstrap` resamples documents with replacement (a cluster
  bootstrap) and averages all the windows of the documents drawn;
* **which model was trained** (seeds): every seed is scored on the same windows, so across seeds
  :func:`paired_bootstrap` resamples seeds and documents independently (a two-level bootstrap)
  and its interval covers both; :func:`seed_interval` (Student's t over per-seed values) covers
  the seeds alone, for numbers without per-window values (accuracies, losses).

Every :class:`Interval` says what it covers in ``over`` (``"windows"``, ``"documents"``,
``"seeds"``, ``"seeds and documents"``). A paired difference's two-sided p-value is the
bootstrap's: twice the share of resampled means on the far side of 0 (the interval excludes 0
when ``p < 0.05``). Where fewer than :data:`RESOLVED_TAIL` resamples fall on the far side, that
share is below what the resamples resolve (2000 resamples cannot give p < 0.001, which Holm's
correction over 140 comparisons would need), so the tail is read from a normal fitted to the
resampled means instead (never above the resampled bound). :func:`holm` corrects a family of
p-values for multiplicity.

Legend: ``n`` values (windows or seeds), ``K`` windows, ``R`` seeds, ``C`` documents, ``B``
bootstrap resamples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from .._validate import check_int

__all__ = [
    "RESOLVED_TAIL",
    "T_975",
    "Interval",
    "bootstrap_interval",
    "format_interval",
    "holm",
    "paired_bootstrap",
    "seed_interval",
    "wilson_interval",
]

#: Two-sided 95% quantiles of Student's t, ``t_{0.975, df}`` for ``df = 1 .. 30`` (standard
#: tables; checked against ``scipy.stats.t.ppf`` in the tests). Past 30 the normal 1.96 is used.
T_975: tuple[float, ...] = (
    12.7062,
    4.3027,
    3.1824,
    2.7764,
    2.5706,
    2.4469,
    2.3646,
    2.3060,
    2.2622,
    2.2281,
    2.2010,
    2.1788,
    2.1604,
    2.1448,
    2.1314,
    2.1199,
    2.1098,
    2.1009,
    2.0930,
    2.0860,
    2.0796,
    2.0739,
    2.0687,
    2.0639,
    2.0595,
    2.0555,
    2.0518,
    2.0484,
    2.0452,
    2.0423,
)


@dataclass(frozen=True)
class Interval:
    """A mean with a 95% interval ``[low, high]`` over ``n`` values (``low = high = None`` when
    ``n < 2``: one value has no interval); ``over`` names the variation it covers, ``p_value``
    (paired differences) the two-sided p-value of "the mean is 0"."""

    mean: float
    low: float | None
    high: float | None
    n: int
    over: str = ""
    p_value: float | None = None

    @property
    def half_width(self) -> float | None:
        """Half the interval's width (symmetric for the t interval)."""
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (``False`` without one)."""
        return self.low is not None and self.high is not None and self.low <= value <= self.high

    def format(self, signed: bool = False) -> str:
        """``"2.345 +- 0.012"`` (``"+0.012 [-0.003, +0.020]"`` style bounds are in ``to_dict``)."""
        mean = f"{self.mean:+.3f}" if signed else f"{self.mean:.3f}"
        if self.half_width is None:
            return mean
        if self.over.endswith("(Wilson)"):  # a rate near 0 or 1: its interval is lopsided, give both ends
            return f"{mean} [{self.low:.3f}, {self.high:.3f}]"
        return f"{mean} ±{self.half_width:.3f}"

    def to_dict(self) -> dict:
        return asdict(self)


def format_interval(value: dict | None, signed: bool = False, missing: str = "-") -> str:
    """An :meth:`Interval.to_dict` as ``"2.345 ±0.012"`` (``missing`` for ``None``)."""
    return missing if value is None else Interval(**value).format(signed)


def _as_float64(values: Sequence[float] | torch.Tensor, name: str) -> torch.Tensor:
    x = torch.as_tensor(values, dtype=torch.float64).flatten()  # [n]
    if x.numel() == 0:
        raise ValueError(f"{name} is empty: an interval needs at least one value")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} has non-finite values ({x.tolist()[:8]}...); drop them first")
    return x


def bootstrap_interval(
    values: Sequence[float] | torch.Tensor, *, resamples: int = 2000, seed: int = 0
) -> Interval:
    """Percentile bootstrap 95% interval of the mean of ``values`` ``[n]``.

    Deterministic for a given ``seed`` (its own generator, no global RNG). ``n = 1`` gives no interval.
    """
    x = _as_float64(values, "values")
    check_int(resamples, "resamples", minimum=100)
    n = x.numel()
    if n < 2:
        return Interval(float(x.mean()), None, None, n, "windows")
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (resamples, n), generator=g)  # [B, n] resampled window ids
    means = x[index].mean(dim=1)  # [B]
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return Interval(float(x.mean()), low, high, n, "windows")


#: Fewer resampled means than this beyond 0 and the bootstrap's p-value is read from a fitted normal.
RESOLVED_TAIL = 10


def paired_bootstrap(
    values: Sequence[Sequence[float]] | torch.Tensor,
    clusters: Sequence[int] | None = None,
    *,
    resamples: int = 2000,
    seed: int = 0,
    unit: str | None = None,
) -> Interval:
    """Mean, 95% percentile interval and two-sided p-value of per-window values ``[R, K]``
    (``R`` seeds scored on the same ``K`` windows; ``[K]`` = one seed), resampling documents.

    Each resample draws ``C`` documents with replacement (``clusters[i]``: window ``i``'s document;
    ``None`` = every window its own) and, with ``R > 1``, ``R`` seeds with replacement; its value is
    the mean over the drawn seeds of the mean over the drawn documents' windows. Deterministic for
    a given ``seed``. ``unit`` names what the ``K`` values are when each is its own cluster (e.g.
    ``"examples"``; default ``"windows"``).

    Returns:
        an :class:`Interval` with ``n`` = documents, ``over`` = ``"documents"`` or ``"seeds and
        documents"`` (``"windows"``, or ``unit``, when each window is its own document) and ``p_value``.
    """
    shape = torch.as_tensor(values, dtype=torch.float64).shape
    if len(shape) not in (1, 2):
        raise ValueError(f"values must be [K] or [R, K] per-window values, got shape {tuple(shape)}")
    x = _as_float64(values, "values").reshape(shape if len(shape) == 2 else (1, -1))  # [R, K]
    check_int(resamples, "resamples", minimum=100)
    r, k = x.shape
    ids = torch.arange(k) if clusters is None else torch.as_tensor(list(clusters), dtype=torch.long)
    if ids.shape != (k,) or (k and int(ids.min()) < 0):
        raise ValueError(
            f"clusters must hold one non-negative document index per window ({k}), got {ids.shape}"
        )
    _, ids = torch.unique(ids, return_inverse=True)  # [K] -> 0 .. C - 1
    c = int(ids.max()) + 1
    sums = torch.zeros(r, c, dtype=torch.float64).index_add_(1, ids, x)  # [R, C]
    counts = torch.bincount(ids, minlength=c).double()  # [C]
    unit = (unit or "windows") if c == k and clusters is None else "documents"
    over = unit if r == 1 else f"seeds and {unit}"
    mean = float(x.mean())
    if c < 2 and r < 2:
        return Interval(mean, None, None, c, over)
    g = torch.Generator().manual_seed(seed)
    drawn = torch.randint(0, c, (resamples, c), generator=g)  # [B, C] documents drawn
    weight = torch.zeros(resamples, c, dtype=torch.float64).scatter_add_(
        1, drawn, torch.ones(resamples, c, dtype=torch.float64)
    )  # [B, C] how often each document was drawn
    per_seed = (weight @ sums.T) / (weight @ counts)[:, None]  # [B, R]
    if r > 1:
        rows = torch.randint(0, r, (resamples, r), generator=g)  # [B, R] seeds drawn
        per_seed = per_seed.gather(1, rows)
    means = per_seed.mean(dim=1)  # [B]
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    tail = min(int((means <= 0).sum()), int((means >= 0).sum()))
    p = min(1.0, 2 * (tail + 1) / (resamples + 1))
    if tail < RESOLVED_TAIL:  # beyond the resamples' resolution: the fitted normal's tail
        p = min(p, _normal_two_sided(float(means.mean()), float(means.std())))
    return Interval(mean, low, high, c, over, p)


def _normal_two_sided(mean: float, sd: float) -> float:
    """Two-sided p-value of 0 under a normal of this mean and standard deviation."""
    if sd == 0.0:
        return 0.0 if mean != 0.0 else 1.0
    return math.erfc(abs(mean) / (sd * math.sqrt(2.0)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values ``[m]`` (same order): the ``i``-th smallest is multiplied
    by ``m - i + 1``, made monotone and capped at 1. Rejecting adjusted ``p < alpha`` keeps the
    chance of any false claim in the family below ``alpha``."""
    m = len(p_values)
    for p in p_values:
        if not 0 <= p <= 1:
            raise ValueError(f"p-values must be in [0, 1], got {p!r}")
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def seed_interval(values: Sequence[float] | torch.Tensor) -> Interval:
    """Student's t 95% interval of the mean of per-seed values ``[n]`` (none for ``n = 1``)."""
    x = _as_float64(values, "values")
    n = x.numel()
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, None, None, n, "seeds")
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    half = t * float(x.std(unbiased=True)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, "seeds")


def wilson_interval(successes: int, n: int) -> Interval:
    """Wilson's 95% score interval of a proportion ``successes / n`` (``n`` examples): unlike the
    normal approximation it stays inside ``[0, 1]`` and is not empty at 0% or 100%."""
    check_int(n, "n")
    check_int(successes, "successes", minimum=0)
    if successes > n:
        raise ValueError(f"successes={successes} is more than n={n}")
    z = 1.959963984540054
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (no rounding residue)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, low, high, n, "examples (Wilson)")
