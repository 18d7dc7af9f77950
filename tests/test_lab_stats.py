"""Tests of posenc.lab.stats: the t table against SciPy, the bootstrap against a plain reference."""

from __future__ import annotations

import random
import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.lab.stats import T_975, Interval, bootstrap_interval, seed_interval


def test_t_table_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df, t in enumerate(T_975, start=1):
        assert t == pytest.approx(float(stats.t.ppf(0.975, df)), abs=6e-5)


def test_seed_interval_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    values = [2.61, 2.70, 2.66, 2.81]
    got = seed_interval(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=statistics.mean(values), scale=stats.sem(values))
    assert got.mean == pytest.approx(statistics.mean(values), rel=1e-12)
    assert (got.low, got.high) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))
    assert got.n == 4 and got.half_width == pytest.approx((high - low) / 2, abs=1e-4)


def test_one_value_has_no_interval():
    for make in (seed_interval, bootstrap_interval):
        one = make([1.5])
        assert one == Interval(1.5, None, None, 1) and one.half_width is None
        assert one.format() == "1.500" and not one.contains(1.5)


def test_bootstrap_matches_a_plain_reference():
    """The same resamples drawn one by one in Python give the same percentiles."""
    values = [0.3, -0.1, 0.25, 0.0, 0.4, 0.05, -0.2, 0.15]
    got = bootstrap_interval(values, resamples=500, seed=7)
    g = torch.Generator().manual_seed(7)
    index = torch.randint(0, len(values), (500, len(values)), generator=g).tolist()
    means = sorted(sum(values[i] for i in row) / len(values) for row in index)

    def quantile(q):  # linear interpolation between order statistics, as torch.quantile
        pos = q * (len(means) - 1)
        lo = int(pos)
        return means[lo] + (means[min(lo + 1, len(means) - 1)] - means[lo]) * (pos - lo)

    assert got.low == pytest.approx(quantile(0.025), abs=1e-12)
    assert got.high == pytest.approx(quantile(0.975), abs=1e-12)
    assert got.mean == pytest.approx(statistics.mean(values), abs=1e-12)
    assert bootstrap_interval(values, resamples=500, seed=7) == got  # deterministic


@given(st.lists(st.floats(-5, 5), min_size=2, max_size=40), st.integers(0, 100))
def test_intervals_contain_the_mean(values, seed):
    for iv in (bootstrap_interval(values, resamples=200, seed=seed), seed_interval(values)):
        assert iv.low <= iv.mean + 1e-9 and iv.mean <= iv.high + 1e-9


def test_bootstrap_narrows_with_more_windows():
    rng = random.Random(0)
    few = [rng.gauss(0, 1) for _ in range(10)]
    many = [rng.gauss(0, 1) for _ in range(1000)]
    assert bootstrap_interval(many).half_width < bootstrap_interval(few).half_width / 4


def test_interval_errors():
    with pytest.raises(ValueError, match="values is empty"):
        seed_interval([])
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="resamples must be >= 100"):
        bootstrap_interval([1.0, 2.0], resamples=10)


def test_format():
    assert Interval(0.0123, -0.01, 0.0346, 3).format(signed=True) == "+0.012 ±0.022"
    assert Interval(2.5, 2.4, 2.6, 3).format() == "2.500 ±0.100"


def test_format_interval_reads_an_interval_dict():
    from posenc.lab.stats import format_interval

    assert format_interval({"mean": 0.1234, "low": 0.1, "high": 0.15, "n": 3}, signed=True) == "+0.123 ±0.025"
    assert format_interval({"mean": 2.0, "low": None, "high": None, "n": 1}) == "2.000"
    assert format_interval(None, missing="n/a") == "n/a"
