"""Tests of posenc.benchmarks.checks: every case checks its implementations against a reference
before timing them, and a disagreement stops the run."""

from __future__ import annotations

import pytest
import torch

from posenc.benchmarks import GROUPS, all_cases
from posenc.benchmarks.checks import BenchmarkMismatchError, check_case, compare_outputs
from posenc.benchmarks.harness import Case, Impl, run_case


def test_compare_outputs():
    a = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare_outputs(a, a.clone(), 0.0, 0.0)[0]
    ok, err, why = compare_outputs(a + torch.tensor([1e-3, 0, 0]), a, 1e-4, 0.0)
    assert not ok and err == pytest.approx(1e-3, rel=1e-4) and "1 of 3 elements" in why
    assert compare_outputs((a, None, [a]), (a, [a]), 0.0, 0.0)[0]  # None skipped, nesting flattened
    inf = torch.tensor([float("-inf"), 1.0])
    assert not compare_outputs(torch.tensor([0.0, 1.0]), inf, 1e-6, 0.0)[0]  # finite vs -inf
    assert not compare_outputs(torch.tensor([0.0, 1.0]), inf, 1e-6, 1e-6)[0]
    assert not compare_outputs(inf, torch.tensor([0.0, 1.0]), 1e-6, 1e-6)[0]  # -inf vs finite
    assert "2 output tensors" in compare_outputs((a, a), a, 0, 0)[2]
    assert "shape (2,)" in compare_outputs(a[:2], a, 0, 0)[2]
    with pytest.raises(TypeError, match="tensors or tuples/lists of tensors"):
        compare_outputs("x", a, 0, 0)


def test_a_nan_on_one_side_only_never_agrees():
    """NaN against a number (either side, any tolerance) is a disagreement: NaN > bound is False, so
    a check that only compared the difference with the tolerance would pass it."""
    nan, num = torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0])
    for out, ref in ((nan, num), (num, nan)):
        for atol, rtol in ((0.0, 0.0), (1e3, 1e3)):
            ok, err, why = compare_outputs(out, ref, atol, rtol)
            assert not ok and err == float("inf") and "1 of 2 elements" in why
    assert compare_outputs(nan, nan.clone(), 0.0, 0.0)[0]  # NaN where the reference has NaN: agreed


def test_a_wrong_implementation_stops_the_run_before_timing():
    x = torch.randn(64)
    timed = []

    def wrong():
        timed.append(1)
        return x * 2 + 1e-3

    case = Case("c", "", 512, [Impl("wrong", wrong, "peer")], reference=lambda: x * 2, atol=1e-4)
    with pytest.raises(BenchmarkMismatchError, match=r"'c': wrong disagrees .* max \|err\| 0.001"):
        run_case(case, repeats=3, min_time=0.0)
    assert len(timed) == 1  # run once by the check, never timed


def test_labelled_and_layout_keyed_references():
    x = torch.randn(8)
    impls = [
        Impl("a", lambda: x * 2, "posenc", "two"),
        Impl("b", lambda: x * 3, "peer", "three"),
        Impl("c", lambda: x * 5, "peer", "two", agrees="same work, different numbers: test"),
    ]
    out = check_case(Case("c", "", 64, impls, reference=lambda: {"two": x * 2, "three": x * 3}))
    assert out["a"]["max_abs_err"] == 0 and out["b"]["max_abs_err"] == 0
    assert out["c"] == {"check": "not compared: same work, different numbers: test", "max_abs_err": None}
    with pytest.raises(BenchmarkMismatchError, match="no reference"):
        check_case(Case("n", "", 64, impls[:1]))


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_quick_case_agrees_with_its_reference(group):
    """Every shipped case (quick shapes) runs its check: the implementations agree with posenc's
    reference within the stated tolerance, or are labelled as computing different numbers."""
    for name, build in all_cases(True, [group]).items():
        case = build()
        result = check_case(case)
        assert set(result) == {i.name for i in case.impls}, name
        assert all(r["check"].startswith(("agrees", "not compared: ")) for r in result.values())
