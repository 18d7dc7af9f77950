"""Benchmark harness: checked outputs, like-for-like timing, medians, and ratios to the limit.

The hot paths of posenc are memory-bound, so every figure is reported next to what the machine's
memory system does *in the same run*, on the same number of bytes:

* ``copy``    -- ``dst.copy_(src)`` into an existing buffer: the limit of out-of-place and
  streaming work (a fresh allocation costs page faults the allocator can avoid: not a limit);
* ``inplace`` -- ``x.mul_(1)`` on a buffer of the case's dtype: the limit of in-place work (it
  reads and writes the same memory, as an in-place kernel does);
* ``clone``   -- ``src.clone()``: a fresh allocation, shown for information only.

A case may name its own limit instead (``Case.limit``: causal SDPA without a bias for biased
attention). Each implementation declares its ``form`` (:data:`FORMS`: in place, out of place,
module, ...) and speed-ups compare only implementations of the same form (and layout, where given).

Before anything is timed, :func:`~posenc.benchmarks.checks.check_case` runs every implementation
once and compares its outputs with the case's reference: a disagreement stops the run.
Implementations are timed round-robin (:mod:`.timing`: a new shuffled order every round), each one
right next to one more measurement of its limit; ``of limit`` is the median over rounds of the
limit's time over the implementation's in the same pair (1.0 = at the limit), with its quartiles,
so that the machine's drift between minutes stays out of it. Medians of each implementation's
times are reported with their interquartile range.

Terms: ``impl`` an implementation of a case; ``kind`` ``"posenc"``, ``"peer"`` or ``"baseline"``;
``speedup[p][q] = median(q) / median(p)`` for a posenc impl ``p`` and a peer ``q`` of the same
form (> 1: posenc faster).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .timing import Timings, time_interleaved, time_rounds

__all__ = [
    "ALLOCATORS",
    "FORMS",
    "Case",
    "CaseResult",
    "Impl",
    "environment",
    "gbps",
    "no_grad_case",
    "run_case",
    "set_allocator",
    "tensor_bytes",
    "time_interleaved",
]

KINDS = ("posenc", "peer", "baseline")

#: what an implementation's call does -> the memory baseline that is its limit
FORMS: dict[str, str] = {
    "in place": "inplace",  # overwrites its input
    "out of place": "copy",  # writes a new result (tables prepared outside the timing)
    "module": "copy",  # what a model calls: the module's own method, tables included
    "table": "copy",  # builds a table
    "training": "copy",  # a training step (compute-bound: read the times)
}


# ----------------------------------------------------------------------------------------------
# Bytes and bandwidth
# ----------------------------------------------------------------------------------------------
def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Total bytes of ``tensors`` (``numel * element_size`` each; broadcast views count once per
    element of the view, so pass the tensors actually read or written)."""
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor_bytes takes tensors, got {type(t).__name__}")
        total += t.numel() * t.element_size()
    return total


def gbps(nbytes: int, seconds: float) -> float:
    """Effective bandwidth in GB/s (10^9 bytes per second): ``nbytes / seconds / 1e9``."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return nbytes / seconds / 1e9


# ----------------------------------------------------------------------------------------------
# Allocator
# ----------------------------------------------------------------------------------------------
# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4

#: allocator setting -> what it does. ``keep`` is what ``MALLOC_MMAP_MAX_=0
#: MALLOC_TRIM_THRESHOLD_=<large>`` in the environment does, applied from inside the process.
ALLOCATORS: dict[str, str] = {
    "system": "the allocator as the process started (glibc default: large blocks are fresh mmap pages)",
    "keep": "glibc mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1): freed memory is kept and reused, "
    "so large temporaries stop paying page faults",
}

_allocator_state = {"setting": "system"}


def set_allocator(setting: str) -> str:
    """Apply an allocator setting from :data:`ALLOCATORS` to this process (glibc only).

    Call it before the large tensors of a benchmark exist. ``"system"`` changes nothing (glibc
    cannot go back once memory was kept). Returns the setting in force.

    Raises:
        ValueError: an unknown setting, or ``"keep"`` where glibc's ``mallopt`` is not available.
    """
    if setting not in ALLOCATORS:
        raise ValueError(f"unknown allocator {setting!r}; valid: {', '.join(ALLOCATORS)}")
    if setting == "keep":
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
        if mallopt is None or platform.libc_ver()[0] != "glibc":
            raise ValueError("allocator 'keep' needs glibc's mallopt; set MALLOC_* variables instead")
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int  # mallopt(int, int)
        # -1: never trim (glibc's documented value; a large number would not fit the int)
        ok = mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, -1)
        if not ok:
            raise ValueError("glibc mallopt refused M_MMAP_MAX/M_TRIM_THRESHOLD")
        _allocator_state["setting"] = "keep"
    return _allocator_state["setting"]


# ----------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment() -> dict[str, Any]:
    """What a figure depends on: CPU model, cores, torch version and threads, allocator, load."""
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "allocator": _allocator_state["setting"],
        "malloc_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")},
        "loadavg": _load(),
    }


def environment_line(env: dict[str, Any] | None = None) -> str:
    """One line for a table header."""
    e = env or environment()
    malloc = " ".join(f"{k}={v}" for k, v in e["malloc_env"].items()) or "none"
    load = "/".join(str(x) for x in e["loadavg"]) if e["loadavg"] else "?"
    return (
        f"{e['cpu']}, {e['cores']} cores ({e['cpu_capability']}), torch {e['torch']}, "
        f"{e['threads']} threads, allocator {e['allocator']} (MALLOC_* env: {malloc}), load {load}"
    )


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------
@dataclass
class Impl:
    """One implementation of a case: ``fn()`` does the whole operation once.

    ``layout`` (optional) groups implementations that compute the same thing the same way (e.g. the
    RoPE pairing); ``form`` (a key of :data:`FORMS`) says what kind of call it is. Speed-ups are
    read only between implementations of the same form and layout.

    ``output()`` returns what the check compares with the case's reference (default: ``fn()``;
    an in-place implementation gives a function that works on fresh copies). ``agrees`` is None
    for an implementation that must agree with the reference, or the reason it is not compared
    ("same work, different numbers: ..."). ``tolerance`` overrides the case's ``(atol, rtol)``
    for this implementation. ``versus`` names another implementation of the case that this one is
    timed next to in every round (a module and the function it wraps): ``versus_ratio`` is the
    median of the per-round ratios of this one's time over that one's.
    """

    name: str
    fn: Callable[[], object]
    kind: str = "peer"
    layout: str | None = None
    note: str = ""
    form: str = "out of place"
    output: Callable[[], object] | None = None
    agrees: str | None = None
    tolerance: tuple[float, float] | None = None  # (atol, rtol) instead of the case's
    versus: str | None = None  # another implementation, timed next to this one

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown impl kind {self.kind!r}; valid: {', '.join(KINDS)}")
        if self.form not in FORMS:
            raise ValueError(f"unknown impl form {self.form!r}; valid: {', '.join(FORMS)}")


@dataclass
class Case:
    """A benchmark case: what it measures, the bytes it moves and its implementations.

    ``nbytes`` is the traffic of the operation (bytes read + bytes written by an ideal
    implementation), the same for every implementation. ``skipped`` maps an implementation that
    could not run (peer not installed, ...) to the reason. ``reference()`` returns the outputs
    every implementation must match within ``atol + rtol * |ref|``. ``limit`` names the
    implementation that is every form's limit (e.g. causal SDPA without a bias), instead of the
    memory baselines; ``dtype`` is the element type of the in-place baseline; ``memory`` asks for
    each implementation's peak memory, measured in a fresh process (:mod:`.memory`).
    """

    name: str
    description: str
    nbytes: int
    impls: list[Impl]
    params: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    baselines: bool = True
    reference: Callable[[], object] | None = None
    atol: float = 0.0
    rtol: float = 0.0
    limit: str | None = None
    dtype: torch.dtype = torch.float32
    memory: bool = False  # also measure each implementation's peak memory (benchmarks.memory)


@dataclass
class CaseResult:
    """Measured medians of one case, ready for a table or JSON."""

    name: str
    description: str
    nbytes: int
    params: dict[str, Any]
    results: dict[str, dict[str, Any]]
    skipped: dict[str, str]
    load_before: list[float] | None
    load_after: list[float] | None

    @property
    def copy_gbps(self) -> float | None:
        r = self.results.get("copy")
        return None if r is None else r["gbps"]

    @property
    def clone_gbps(self) -> float | None:
        r = self.results.get("clone")
        return None if r is None else r["gbps"]

    def speedups(self) -> dict[str, dict[str, float]]:
        """``{posenc impl: {peer impl: peer median / posenc median}}`` for peers of the same form
        (and the same layout where both declare one)."""
        mine = {n: r for n, r in self.results.items() if r["kind"] == "posenc"}
        peers = {n: r for n, r in self.results.items() if r["kind"] == "peer"}
        return {
            p: {q: qr["median_s"] / pr["median_s"] for q, qr in peers.items() if like_for_like(pr, qr)}
            for p, pr in mine.items()
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.name,
            "description": self.description,
            "params": self.params,
            "bytes": self.nbytes,
            "results": self.results,
            "copy_gbps": self.copy_gbps,
            "clone_gbps": self.clone_gbps,
            "speedup": self.speedups(),
            "skipped": self.skipped,
            "loadavg_before": self.load_before,
            "loadavg_after": self.load_after,
        }


def like_for_like(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two results (``run_case``'s entries) are the same kind of call: same form, and the
    same layout where both declare one."""
    if a.get("form") != b.get("form"):
        return False
    return a.get("layout") is None or b.get("layout") is None or a["layout"] == b["layout"]


def no_grad_case(build: Callable[[], Case]) -> Callable[[], Case]:
    """Wrap a case builder so that every implementation runs under ``torch.no_grad()``."""

    def call(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()

        return run

    def wrapped() -> Case:
        case = build()
        for impl in case.impls:
            impl.fn = call(impl.fn)
            if impl.output is not None:  # the check runs what is timed, in the same grad mode
                impl.output = call(impl.output)
        return case

    return wrapped


def _baselines(nbytes: int, dtype: torch.dtype) -> list[Impl]:
    """``copy``, ``inplace`` and ``clone`` of ``nbytes / 2`` bytes: ``nbytes`` of traffic each, half
    read, half written (``inplace`` on elements of ``dtype``)."""
    n = max(1, nbytes // 2)
    src = torch.empty(n, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src).fill_(0)  # touched: no page faults in the timed copies
    size = torch.empty((), dtype=dtype).element_size()
    buf = torch.ones(max(1, n // size), dtype=dtype)  # touched; mul_(1) keeps it all ones
    return [
        Impl("copy", lambda: dst.copy_(src), "baseline", note="dst.copy_(src), existing buffer"),
        Impl(
            "inplace", lambda: buf.mul_(1), "baseline", note=f"x.mul_(1), {str(dtype)[6:]}", form="in place"
        ),
        Impl(
            "clone", lambda: src.clone(), "baseline", note="src.clone(), fresh allocation (for information)"
        ),
    ]


def _quantiles(xs: Sequence[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def run_case(case: Case, *, repeats: int = 7, warmup: int = 1, min_time: float = 0.005) -> CaseResult:
    """Check every implementation of ``case`` against its reference, then time them (and the memory
    baselines) in one interleaved run.

    Raises:
        BenchmarkMismatchError: an implementation disagrees with the reference (nothing is timed).
        ValueError: duplicate implementation names, or a ``limit`` that is not an implementation.
    """
    from .checks import check_case

    impls = (_baselines(case.nbytes, case.dtype) if case.baselines else []) + list(case.impls)
    names = _check_names(case, impls)
    checks = check_case(case)
    limits = {i.name: _limit_of(i.form, case.limit, names) for i in impls}
    load_before = _load()
    timings = time_rounds(
        {i.name: i.fn for i in impls},
        limits={n: lim for n, lim in limits.items() if lim is not None},
        versus={i.name: i.versus for i in impls if i.versus is not None},
        repeats=repeats,
        warmup=warmup,
        min_time=min_time,
    )
    load_after = _load()
    results = {impl.name: _result(impl, case.nbytes, timings, checks) for impl in impls}
    _add_limits(results, limits, timings)
    return CaseResult(
        case.name,
        case.description,
        case.nbytes,
        dict(case.params),
        results,
        dict(case.skipped),
        load_before,
        load_after,
    )


def _check_names(case: Case, impls: list[Impl]) -> list[str]:
    """The implementations' names, unique, with the case's limit and every ``versus`` among them."""
    names = [i.name for i in impls]
    if len(set(names)) != len(names):
        raise ValueError(f"case {case.name!r} has duplicate implementation names: {names}")
    if case.limit is not None and case.limit not in names:
        raise ValueError(
            f"case {case.name!r}: limit {case.limit!r} is not one of its implementations {names}"
        )
    for impl in impls:
        if impl.versus is not None and impl.versus not in names:
            raise ValueError(
                f"case {case.name!r}: {impl.name!r} is compared with {impl.versus!r}, which is not one "
                f"of its implementations {names}"
            )
    return names


def _result(impl: Impl, nbytes: int, timings: Timings, checks: dict[str, Any]) -> dict[str, Any]:
    """One implementation's entry of :class:`CaseResult` (limits are added afterwards)."""
    xs = timings.samples[impl.name]
    med = statistics.median(xs)
    q1, q3 = _quantiles(xs)
    return {
        "kind": impl.kind,
        "form": impl.form,
        "layout": impl.layout,
        "note": impl.note,
        "median_s": med,
        "q1_s": q1,
        "q3_s": q3,
        "gbps": gbps(nbytes, med) if nbytes else None,
        **checks.get(impl.name, {"check": "baseline", "max_abs_err": None}),
        **_versus(impl.versus, timings.versus(impl.name)),
    }


def _versus(other: str | None, ratios: list[float]) -> dict[str, Any]:
    """``versus`` (the implementation compared with) and the median and quartiles of the per-round
    ratios of the two times (1.1: 10% slower than ``other``); empty without one."""
    if other is None or not ratios:
        return {}
    q1, q3 = _quantiles(ratios)
    return {"versus": other, "versus_ratio": statistics.median(ratios), "versus_q1": q1, "versus_q3": q3}


def _limit_of(form: str, case_limit: str | None, names: list[str]) -> str | None:
    """The implementation that is the limit of a call of ``form``: the case's own, else the memory
    baseline of the form; None where the case has no such implementation."""
    name = case_limit or FORMS[form]
    return name if name in names else None


def _add_limits(results: dict[str, dict[str, Any]], limits: dict[str, str | None], timings: Timings) -> None:
    """Each result's ``limit``; ``of_limit`` with ``of_limit_q1``/``of_limit_q3``: the median and
    quartiles over rounds of the limit's time measured next to it over its own (1.0 for the limit
    itself); ``of_limit_medians``: the ratio of the two medians (drift between minutes included);
    ``copy_fraction``: GB/s over the copy's."""
    copy = results.get("copy")
    for name, r in results.items():
        lim = limits[name]
        r["limit"] = lim
        ratios = [1.0] if lim == name else timings.ratios(name) if lim is not None else []
        r["of_limit"] = statistics.median(ratios) if ratios else None
        r["of_limit_q1"], r["of_limit_q3"] = _quantiles(ratios) if ratios else (None, None)
        r["of_limit_medians"] = None if lim is None else results[lim]["median_s"] / r["median_s"]
        r["copy_fraction"] = None if copy is None or r["gbps"] is None else r["gbps"] / copy["gbps"]
