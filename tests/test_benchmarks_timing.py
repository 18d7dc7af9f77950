"""Tests of posenc.benchmarks.timing: calls per round, the order of a pair, the paired ratios and
bad limits. Clocks are faked where a value is asserted; real speed is never asserted."""

from __future__ import annotations

import pytest

from posenc.benchmarks import timing
from posenc.benchmarks.timing import Timings, time_interleaved, time_rounds


def _counting(log: list[str], name: str):
    def fn():
        log.append(name)

    return fn


def test_time_interleaved_counts_calls():
    log: list[str] = []
    samples = time_interleaved(
        {"a": _counting(log, "a"), "b": _counting(log, "b")}, repeats=4, warmup=2, min_time=0.0
    )
    assert {k: len(v) for k, v in samples.items()} == {"a": 4, "b": 4}
    assert all(t >= 0 for v in samples.values() for t in v)
    assert log.count("a") == log.count("b") == 2 + 1 + 4  # warmup, calibration, repeats
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        time_interleaved({"a": _counting(log, "a")}, repeats=0)


def test_each_paired_measurement_sits_next_to_its_limit_alternating_sides():
    log: list[str] = []
    fns = {name: _counting(log, name) for name in ("lim", "a", "b")}
    out = time_rounds(fns, limits={"a": "lim", "b": "lim", "lim": "lim"}, repeats=6, warmup=0, min_time=0.0)
    timed = log[3:]  # after one calibration call each
    assert len(timed) == 6 * 5  # each round: lim alone, a with lim, b with lim
    assert {k: len(v) for k, v in out.samples.items()} == {"lim": 6, "a": 6, "b": 6}
    assert {k: len(v) for k, v in out.partner.items()} == {"a": 6, "b": 6}  # the limit pairs with nobody
    rounds = [timed[i * 5 : (i + 1) * 5] for i in range(6)]
    for r, calls in enumerate(rounds):
        for name in ("a", "b"):
            i = calls.index(name)
            neighbour = calls[i - 1] if r % 2 == 0 else calls[i + 1]
            assert neighbour == "lim", (r, calls)  # the limit first in even rounds, second in odd


def test_ratios_are_per_round_limit_over_time(monkeypatch):
    # a fake clock: every call of "lim" takes 1 s, of "half" 2 s, so every pair says 50%
    now = [0.0]
    cost = {"lim": 1.0, "half": 2.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def make(name):
        def fn():
            now[0] += cost[name]

        return fn

    out = time_rounds({n: make(n) for n in cost}, limits={"half": "lim"}, repeats=3, warmup=0, min_time=0.5)
    assert out.samples == {"lim": [1.0] * 3, "half": [2.0] * 3}
    assert out.ratios("half") == [0.5] * 3 and out.ratios("lim") == []


def test_ratios_follow_the_drift_a_ratio_of_medians_misses():
    # the machine halves its speed after round 1: pairs still say 50%, medians mix the two speeds
    t = Timings({"lim": [1.0, 2.0, 2.0], "x": [2.0, 2.0, 4.0]}, {"x": [1.0, 1.0, 2.0]})
    assert t.ratios("x") == [0.5, 0.5, 0.5]


def test_limits_must_name_functions():
    with pytest.raises(ValueError, match="limits pairs 'a' with 'nope'"):
        time_rounds({"a": lambda: None}, limits={"a": "nope"}, repeats=1)


def test_versus_sits_on_the_other_side_of_the_limit(monkeypatch):
    # fake clock: "lim" 1 s, "fn" 2 s, "mod" 3 s per call; mod's pairs say 1.5x fn and 33% of lim
    now = [0.0]
    cost = {"lim": 1.0, "fn": 2.0, "mod": 3.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    log: list[str] = []

    def make(name):
        def fn():
            log.append(name)
            now[0] += cost[name]

        return fn

    out = time_rounds(
        {n: make(n) for n in cost},
        limits={"mod": "lim"},
        versus={"mod": "fn"},
        repeats=2,
        warmup=0,
        min_time=0.5,
    )
    assert out.versus("mod") == [1.5, 1.5] and out.ratios("mod") == pytest.approx([1 / 3, 1 / 3])
    assert out.versus("fn") == []
    timed = log[3:]
    first, second = timed[:5], timed[5:]
    i, j = first.index("mod"), second.index("mod")
    assert (first[i - 1], first[i + 1]) == ("lim", "fn")  # even round: limit before, versus after
    assert (second[j - 1], second[j + 1]) == ("fn", "lim")  # odd round: the other way round
    with pytest.raises(ValueError, match="versus pairs 'mod' with 'nope'"):
        time_rounds({"mod": lambda: None}, versus={"mod": "nope"}, repeats=1)
