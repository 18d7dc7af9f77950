"""Timing loops of the benchmarks: calibrated, round-robin, and paired with each call's limit.

A shared or virtual machine changes speed from minute to minute (on the 2-core VM behind
benchmarks/RESULTS.md a copy of the same bytes took 13 ms in one minute and 27 ms in another), so
a ratio of two medians taken seconds apart mixes the two calls with the machine's drift. Each
round therefore times every implementation that has a limit *next to* that limit (the limit first
in even rounds, second in odd ones), and the ratio of the pair is a sample of "of limit": its
median and quartiles over the rounds are what the tables show. An implementation may also name
another one to be timed next to (``versus``: a module and the function it wraps), on its other
side.

Terms: a *measurement* is ``number`` back-to-back calls timed together (``number`` calibrated so a
measurement lasts at least ``min_time``), reported as seconds per call; a *round* measures every
function once, in a new (seeded) shuffled order.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["Timings", "time_interleaved", "time_rounds"]


@dataclass
class Timings:
    """What :func:`time_rounds` measured.

    ``samples[name]``: seconds per call, one per round. ``partner[name]``: the seconds per call of
    ``name``'s limit measured next to it in the same rounds (empty for a name without a limit);
    ``partner[name][r] / samples[name][r]`` is round ``r``'s "of limit". ``other[name]``: the same
    for the implementation ``name`` is compared with (``versus``)."""

    samples: dict[str, list[float]]
    partner: dict[str, list[float]] = field(default_factory=dict)
    other: dict[str, list[float]] = field(default_factory=dict)

    def versus(self, name: str) -> list[float]:
        """Per-round ``name / other`` times (1.1: ``name`` takes 10% longer); empty without one."""
        other = self.other.get(name)
        if not other:
            return []
        return [t / o for t, o in zip(self.samples[name], other, strict=True)]

    def ratios(self, name: str) -> list[float]:
        """Per-round ``limit / name`` times (1.0: as fast as the limit); empty without a limit."""
        partner = self.partner.get(name)
        if not partner:
            return []
        return [lim / t for lim, t in zip(partner, self.samples[name], strict=True)]


def _calibrate(fn: Callable[[], object], min_time: float) -> int:
    """Calls per measurement so that one measurement takes at least ``min_time`` seconds."""
    number = 1
    while True:
        dt = _measure(fn, number) * number
        if dt >= min_time or number >= 1 << 20:
            return number
        number *= 2 if dt <= 0 else max(2, min(10, int(min_time / dt) + 1))


def _measure(fn: Callable[[], object], number: int) -> float:
    """Seconds per call over ``number`` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def time_rounds(
    fns: Mapping[str, Callable[[], object]],
    *,
    limits: Mapping[str, str] | None = None,
    versus: Mapping[str, str] | None = None,
    repeats: int = 7,
    warmup: int = 1,
    min_time: float = 0.005,
) -> Timings:
    """Seconds per call of each function, round-robin, each one paired with its limit.

    Each function is warmed up (``warmup`` calls, then calibrated so that one measurement lasts at
    least ``min_time``). Then ``repeats`` rounds each measure every function once, in an order
    shuffled every round (seeded: reproducible), so that no function always follows the same
    neighbour (one that frees a lot of memory changes what the next allocation costs). A function
    ``name`` with ``limits[name]`` (another key of ``fns``) is measured right next to one more
    measurement of its limit, the limit first in even rounds and second in odd ones (with an odd
    ``repeats`` it goes first once more); with ``versus[name]``, one more measurement of that one
    sits on its other side. The garbage collector is off while timing.

    Raises:
        ValueError: ``repeats < 1``, or a limit or ``versus`` that is not one of ``fns``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    limits = {n: lim for n, lim in (limits or {}).items() if lim != n}
    versus = {n: v for n, v in (versus or {}).items() if v != n}
    for what, pairs in (("limits", limits), ("versus", versus)):
        for name, lim in pairs.items():
            if name not in fns or lim not in fns:
                raise ValueError(f"{what} pairs {name!r} with {lim!r}; both must be among {sorted(fns)}")
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    number = {name: _calibrate(fns[name], min_time) for name in names}
    out = Timings({name: [] for name in names}, {name: [] for name in limits}, {name: [] for name in versus})
    gc.collect()
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats):
            order = list(names)
            random.Random(r).shuffle(order)  # a new order each round (seeded: reproducible)
            for name in order:
                # [limit, name, versus] in even rounds, reversed in odd ones: each beside name
                sides = [(limits.get(name), out.partner), (versus.get(name), out.other)]
                before, after = sides if r % 2 == 0 else sides[::-1]
                if before[0] is not None:
                    before[1][name].append(_measure(fns[before[0]], number[before[0]]))
                out.samples[name].append(_measure(fns[name], number[name]))
                if after[0] is not None:
                    after[1][name].append(_measure(fns[after[0]], number[after[0]]))
    finally:
        if gc_was_on:
            gc.enable()
    return out


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    repeats: int = 7,
    warmup: int = 1,
    min_time: float = 0.005,
) -> dict[str, list[float]]:
    """:func:`time_rounds` without limits: ``{name: [seconds per call] * repeats}``."""
    return time_rounds(fns, repeats=repeats, warmup=warmup, min_time=min_time).samples
