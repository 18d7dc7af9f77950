"""Tests of posenc.benchmarks.harness: byte counts, GB/s, the memory
baselines, limits and like-for-like speed-up ratios, impl kinds/forms and allocators. No timing
assertions: speed depends on the machine and its load and is never asserted."""

from __future__ import annotations

import pytest
import torch

from posenc.benchmarks.harness import (
    ALLOCATORS,
    Case,
    CaseResult,
    Impl,
    gbps,
    run_case,
    set_allocator,
    tensor_bytes,
)


def test_tensor_bytes_and_gbps():
    a = torch.empty(4, 32, 2048, 128)  # 33554432 float32 = 134217728 bytes
    b = torch.empty(10, dtype=torch.bfloat16)
    assert tensor_bytes(a) == 4 * 32 * 2048 * 128 * 4 == 134217728
    assert tensor_bytes(a, b) == 134217728 + 20
    # RoPE on q and k: both read and both written
    assert gbps(2 * tensor_bytes(a, a), 0.016) == pytest.approx(536870912 / 0.016 / 1e9)
    with pytest.raises(ValueError, match="seconds must be > 0"):
        gbps(10, 0.0)
    with pytest.raises(TypeError, match="tensor_bytes takes tensors"):
        tensor_bytes([1, 2])


def _fake_result():
    results = {
        "copy": {"kind": "baseline", "form": "out of place", "layout": None, "median_s": 0.010, "gbps": 10.0},
        "mine": {"kind": "posenc", "form": "out of place", "layout": "half", "median_s": 0.020, "gbps": 5.0},
        "theirs": {"kind": "peer", "form": "out of place", "layout": "half", "median_s": 0.100, "gbps": 1.0},
        "other": {"kind": "peer", "form": "module", "layout": "half", "median_s": 0.100, "gbps": 1.0},
    }
    for r in results.values():
        r.update(note="", q1_s=r["median_s"], q3_s=r["median_s"], check="baseline")
    return CaseResult("fake", "a fake case", 100_000_000, {}, results, {"gone": "not installed"}, None, None)


def test_speedups_compare_only_the_same_form():
    result = _fake_result()
    assert result.speedups() == {"mine": {"theirs": pytest.approx(5.0)}}  # "other" is a module call
    assert result.copy_gbps == 10.0 and result.clone_gbps is None


def test_run_case_bytes_baselines_limits_and_ratios():
    x = torch.randn(1000)
    y = torch.empty_like(x)
    impls = [
        Impl("mine", lambda: torch.mul(x, 2, out=y), "posenc"),
        Impl("theirs", lambda: x * 2, "peer"),
        Impl("mine_inplace", lambda: y.mul_(1), "posenc", form="in place", output=lambda: x * 2),
    ]
    case = Case("tiny", "x * 2", 2 * tensor_bytes(x), impls, reference=lambda: x * 2)
    result = run_case(case, repeats=3, min_time=0.0)
    assert list(result.results) == ["copy", "inplace", "clone", "mine", "theirs", "mine_inplace"]
    for r in result.results.values():
        assert r["gbps"] == pytest.approx(8000 / r["median_s"] / 1e9)
        assert r["q1_s"] <= r["median_s"] <= r["q3_s"]
    res = result.results
    assert res["copy"]["of_limit"] == pytest.approx(1.0) and res["inplace"]["of_limit"] == pytest.approx(1.0)
    # out-of-place work is measured against the copy, in-place work against the in-place pass
    assert res["mine"]["limit"] == "copy" and res["mine_inplace"]["limit"] == "inplace"
    medians = res["copy"]["median_s"] / res["mine"]["median_s"]
    assert res["mine"]["of_limit_medians"] == pytest.approx(medians)
    # "of limit" is paired: the median of per-round ratios, between its quartiles
    assert res["mine"]["of_limit_q1"] <= res["mine"]["of_limit"] <= res["mine"]["of_limit_q3"]
    assert res["copy"]["of_limit_q1"] == res["copy"]["of_limit_q3"] == 1.0
    assert res["mine"]["check"].startswith("agrees (max |err| 0")
    ratio = res["theirs"]["median_s"] / res["mine"]["median_s"]
    assert result.speedups() == {"mine": {"theirs": pytest.approx(ratio)}, "mine_inplace": {}}
    with pytest.raises(ValueError, match="duplicate implementation names"):
        run_case(Case("dup", "", 8, [Impl("copy", lambda: None, "posenc")]), repeats=1)
    with pytest.raises(ValueError, match="limit 'sdpa' is not one of its implementations"):
        run_case(Case("lim", "", 8, [Impl("a", lambda: None, "posenc")], limit="sdpa"), repeats=1)


def test_a_case_may_name_its_own_limit():
    x = torch.randn(100)
    impls = [Impl("yardstick", lambda: x * 2, "peer"), Impl("mine", lambda: x + x, "posenc")]
    case = Case("own", "", 800, impls, reference=lambda: x * 2, limit="yardstick", baselines=False)
    res = run_case(case, repeats=2, min_time=0.0).results
    assert list(res) == ["yardstick", "mine"] and res["mine"]["limit"] == "yardstick"
    # paired with the case's own limit: the ratio of each round, between its quartiles
    assert res["mine"]["of_limit_q1"] <= res["mine"]["of_limit"] <= res["mine"]["of_limit_q3"]
    assert res["yardstick"]["of_limit"] == 1.0
    one = run_case(case, repeats=1, min_time=0.0).results["mine"]  # one round: one ratio
    assert one["of_limit_q1"] == one["of_limit"] == one["of_limit_q3"]


def test_an_implementation_may_be_timed_next_to_another():
    x = torch.randn(100)
    impls = [
        Impl("function", lambda: x * 2, "posenc"),
        Impl("module", lambda: x + x, "posenc", form="module", versus="function"),
    ]
    case = Case("vs", "", 800, impls, reference=lambda: x * 2)
    res = run_case(case, repeats=3, min_time=0.0).results
    mod = res["module"]
    assert mod["versus"] == "function" and mod["versus_q1"] <= mod["versus_ratio"] <= mod["versus_q3"]
    assert "versus" not in res["function"]
    bad = Case(
        "vs", "", 800, [Impl("module", lambda: x * 2, "posenc", versus="gone")], reference=lambda: x * 2
    )
    with pytest.raises(ValueError, match="'module' is compared with 'gone'"):
        run_case(bad, repeats=1)


def test_impl_kind_and_allocator_errors():
    with pytest.raises(ValueError, match="unknown impl kind 'mine'"):
        Impl("x", lambda: None, "mine")
    with pytest.raises(ValueError, match="unknown impl form 'inplace'; valid: in place, out of place"):
        Impl("x", lambda: None, "posenc", form="inplace")
    with pytest.raises(ValueError, match="unknown allocator 'jemalloc'; valid: system, keep"):
        set_allocator("jemalloc")
    assert set(ALLOCATORS) == {"system", "keep"}


def test_keep_hands_mallopt_values_that_fit_its_int(monkeypatch):
    """mallopt takes C ints: ctypes would silently cut 2^40 to 0 (trim on every free, the opposite
    of keeping memory). keep sets M_MMAP_MAX = 0 and M_TRIM_THRESHOLD = -1 (glibc: never trim)."""
    import ctypes

    from posenc.benchmarks import harness

    calls = []

    class FakeMallopt:
        argtypes = restype = None

        def __call__(self, param, value):
            assert self.argtypes == [ctypes.c_int, ctypes.c_int]
            assert -(2**31) <= value < 2**31
            calls.append((param, value))
            return 1

    class FakeLibc:
        mallopt = FakeMallopt()

    monkeypatch.setattr(harness.ctypes.util, "find_library", lambda name: "libc.so.6")
    monkeypatch.setattr(harness.ctypes, "CDLL", lambda name: FakeLibc())
    monkeypatch.setattr(harness.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setitem(harness._allocator_state, "setting", "system")
    assert set_allocator("keep") == "keep"
    assert calls == [(harness._M_MMAP_MAX, 0), (harness._M_TRIM_THRESHOLD, -1)]
