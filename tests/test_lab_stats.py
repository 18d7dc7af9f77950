"""Tests of posenc.lab.stats: the t table against SciPy, the bootstrap against a plain reference."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.lab.stats import (
    RESOLVED_TAIL,
    T_975,
    Interval,
    bootstrap_interval,
    holm,
    paired_bootstrap,
    seed_interval,
    wilson_interval,
)


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
        assert (one.mean, one.low, one.high, one.n) == (1.5, None, None, 1) and one.half_width is None
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


# ----------------------------------------------------------------------------------------------
# The paired bootstrap: documents (and seeds) resampled, a p-value; Holm's correction
# ----------------------------------------------------------------------------------------------
def _clustered(n_docs: int, per_doc: int, doc_sd: float, seed: int = 0) -> tuple[torch.Tensor, list[int]]:
    """Windows whose values share a per-document offset: ``[n_docs * per_doc]`` and their documents."""
    g = torch.Generator().manual_seed(seed)
    doc = torch.randn(n_docs, generator=g, dtype=torch.float64) * doc_sd
    values = doc.repeat_interleave(per_doc) + 0.1 * torch.randn(
        n_docs * per_doc, generator=g, dtype=torch.float64
    )
    return values, [i // per_doc for i in range(n_docs * per_doc)]


def test_paired_bootstrap_resamples_documents_not_windows():
    """Windows of one document move together: resampling windows as if independent gives an
    interval several times too narrow; resampling documents does not."""
    values, docs = _clustered(8, 25, doc_sd=1.0)
    by_window = paired_bootstrap(values)
    by_document = paired_bootstrap(values, docs)
    assert by_window.over == "windows" and by_document.over == "documents" and by_document.n == 8
    assert by_document.half_width > 3 * by_window.half_width
    # the document means' own spread: the interval is about +-1.96 sd / sqrt(8) of them
    doc_means = values.reshape(8, 25).mean(dim=1)
    expected = 1.96 * float(doc_means.std()) / 8**0.5
    assert by_document.half_width == pytest.approx(expected, rel=0.35)


def test_paired_bootstrap_matches_a_plain_reference():
    """One resample drawn by hand in Python (documents, then seeds) gives the same statistic."""
    values = torch.tensor([[1.0, 2.0, 4.0, 8.0], [0.0, 1.0, 1.0, 3.0]], dtype=torch.float64)  # [R=2, K=4]
    docs = [0, 0, 1, 2]
    got = paired_bootstrap(values, docs, resamples=100, seed=5)
    g = torch.Generator().manual_seed(5)
    drawn = torch.randint(0, 3, (100, 3), generator=g)
    rows = torch.randint(0, 2, (100, 2), generator=g)
    means = []
    for b in range(100):
        per_seed = []
        for r in rows[b].tolist():
            picked = [v for d in drawn[b].tolist() for v, dd in zip(values[r].tolist(), docs) if dd == d]
            per_seed.append(sum(picked) / len(picked))
        means.append(sum(per_seed) / len(per_seed))
    low, high = torch.quantile(
        torch.tensor(means, dtype=torch.float64), torch.tensor([0.025, 0.975]).double()
    )
    assert got.over == "seeds and documents" and got.mean == pytest.approx(float(values.mean()))
    assert (got.low, got.high) == (pytest.approx(float(low)), pytest.approx(float(high)))
    # every resample is > 0: beyond what 100 resamples resolve, so the tail of the fitted normal,
    # never above the resampled bound
    m, sd = statistics.fmean(means), statistics.stdev(means)
    assert got.p_value == pytest.approx(min(2 * (0 + 1) / 101, math.erfc(m / (sd * math.sqrt(2)))))


def test_a_clear_difference_survives_holm_over_many_comparisons():
    """A difference 10 standard errors from 0 gets a p-value that Holm's correction over 140
    comparisons keeps below 0.05 (the resampled share alone cannot go below 2/2001)."""
    values, docs = _clustered(60, 12, doc_sd=0.05, seed=3)
    got = paired_bootstrap(values - values.mean() + 0.5, docs)
    assert got.low > 0 and got.p_value < 1e-6
    assert holm([got.p_value] * 140)[0] < 0.05
    resolved = paired_bootstrap(values - values.mean() + 0.01, docs)  # many resamples beyond 0
    assert resolved.p_value >= 2 * (RESOLVED_TAIL + 1) / 2001


def test_paired_bootstrap_p_value_tracks_the_interval():
    """p < 0.05 exactly when the interval excludes 0; a mean of 0 gives p near 1."""
    for shift in (0.0, 0.02, 0.05, 0.3):
        values, docs = _clustered(30, 5, doc_sd=0.2, seed=1)
        got = paired_bootstrap(values - values.mean() + shift, docs)
        excludes = got.low > 0 or got.high < 0
        assert (got.p_value < 0.05) == excludes, (shift, got)
    centred = paired_bootstrap(values - values.mean(), docs)
    assert centred.p_value > 0.8


def test_seed_variation_widens_the_interval():
    """Seeds that disagree (the same windows, shifted) widen the interval; identical seeds do not."""
    values, docs = _clustered(20, 5, doc_sd=0.2, seed=2)
    same = paired_bootstrap(torch.stack([values, values, values]), docs)
    apart = paired_bootstrap(torch.stack([values - 0.5, values, values + 0.5]), docs)
    assert apart.half_width > 2 * same.half_width and apart.over == "seeds and documents"


def test_paired_bootstrap_errors():
    with pytest.raises(ValueError, match="one non-negative document index per window"):
        paired_bootstrap([1.0, 2.0, 3.0], [0, 1])
    with pytest.raises(ValueError, match="must be \\[K\\] or \\[R, K\\]"):
        paired_bootstrap(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="non-finite"):
        paired_bootstrap([1.0, float("nan")])
    one = paired_bootstrap([1.0, 2.0], [0, 0])  # one document, one seed: no interval, no p-value
    assert one.low is None and one.p_value is None and one.n == 1


def test_holm_matches_its_definition():
    """Holm's adjusted p-values (checked by hand): sorted 0.01, 0.03, 0.04, 0.5 times 4, 3, 2, 1,
    made monotone."""
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.3, 0.9]) == pytest.approx([0.6, 0.9]) and holm([]) == []
    assert holm([0.5, 0.5, 0.5]) == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        holm([1.5])


def test_wilson_matches_closed_forms():
    """At 0 and n successes Wilson's bounds have closed forms, z^2 / (n + z^2) and n / (n + z^2)
    (z = 1.96); 1/10 gives the textbook [0.0179, 0.4042]."""
    z2 = 1.959963984540054**2
    cases = [(0, 50, 0.0, z2 / (50 + z2)), (1, 10, 0.0179, 0.4042), (50, 50, 50 / (50 + z2), 1.0)]
    for k, n, low, high in cases:
        got = wilson_interval(k, n)
        assert (got.low, got.high) == (pytest.approx(low, abs=6e-5), pytest.approx(high, abs=6e-5))
        assert got.mean == k / n and got.n == n
    assert wilson_interval(0, 50).format() == "0.000 [0.000, 0.071]"  # lopsided: both ends shown
    with pytest.raises(ValueError, match="successes=3 is more than n=2"):
        wilson_interval(3, 2)
    with pytest.raises(ValueError, match="n must be >= 1"):
        wilson_interval(0, 0)
