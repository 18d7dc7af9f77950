"""Intervals for the lab's verdicts: a bootstrap over evaluation windows, a t interval over seeds.

Two sources of uncertainty, two intervals:

* **which text was scored** (one trained model): :func:`bootstrap_interval` resamples the
  evaluation windows with replacement (targets inside one window are correlated, so the window is
  the unit) and reports the 2.5th and 97.5th percentiles of the resampled means;
* **which model was trained** (seeds): :func:`seed_interval` is Student's t interval of the
  per-seed values, ``mean +- t_{0.975, n-1} * sd / sqrt(n)``.

Legend: ``n`` values (windows or seeds), ``B`` bootstrap resamples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from .._validate import check_int

__all__ = ["T_975", "Interval", "bootstrap_interval", "format_interval", "seed_interval"]

#: Two-sided 95% quantiles of Student's t, ``t_{0.975, df}`` for ``df = 1 .. 30`` (standard
#: tables; checked against ``scipy.stats.t.ppf`` in the tests). Past 30 the normal 1.96 is used.
T_975: tuple[float, ...] = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip


@dataclass(frozen=True)
class Interval:
    """A mean with a 95% interval ``[low, high]`` over ``n`` values (``low = high = None`` when
    ``n < 2``: one value has no interval)."""

    mean: float
    low: float | None
    high: float | None
    n: int

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
        return mean if self.half_width is None else f"{mean} ±{self.half_width:.3f}"

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
        return Interval(float(x.mean()), None, None, n)
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (resamples, n), generator=g)  # [B, n] resampled window ids
    means = x[index].mean(dim=1)  # [B]
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return Interval(float(x.mean()), low, high, n)


def seed_interval(values: Sequence[float] | torch.Tensor) -> Interval:
    """Student's t 95% interval of the mean of per-seed values ``[n]`` (none for ``n = 1``)."""
    x = _as_float64(values, "values")
    n = x.numel()
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, None, None, n)
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    half = t * float(x.std(unbiased=True)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)
