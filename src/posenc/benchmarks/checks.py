"""Output checks: before a case is timed, every implementation must compute what posenc's reference
computes, within the case's stated tolerance, or the run stops.

A speed ratio between two functions that compute different things means nothing, so
:func:`check_case` runs each implementation once on the case's inputs and compares its outputs with
the case's ``reference()``. An implementation that does the same work with different numbers on
purpose (another parametrisation of the same scheme, a different random stream) is not compared
but labelled: its ``Impl.agrees`` holds the reason, printed next to its time.

Outputs may be a tensor or nested tuples/lists of tensors; ``None`` entries are skipped on both
sides. A reference may also be a dict keyed by layout: each implementation is compared with the
entry of its ``layout`` (RoPE's two pairings compute different numbers from the same tables).
The comparison is elementwise ``|out - ref| <= atol + rtol * |ref|`` in float64 (NaN equals
NaN, infinities must match).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BenchmarkMismatchError", "check_case", "compare_outputs", "flatten_outputs"]


class BenchmarkMismatchError(RuntimeError):
    """An implementation's outputs disagree with the case's reference: its timing would compare
    different computations."""


def flatten_outputs(out: object) -> list[torch.Tensor]:
    """The tensors of ``out`` (a tensor, or nested tuples/lists of them; ``None`` skipped), in order."""
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flatten_outputs(item)]
    raise TypeError(f"benchmark outputs must be tensors or tuples/lists of tensors, got {type(out).__name__}")


def compare_outputs(out: object, ref: object, atol: float, rtol: float) -> tuple[bool, float, str]:
    """``(agree, max |out - ref|, why not)`` for two output structures (see the module docstring)."""
    got, want = flatten_outputs(out), flatten_outputs(ref)
    if len(got) != len(want):
        return False, float("inf"), f"{len(got)} output tensors, the reference has {len(want)}"
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape:
            return (
                False,
                float("inf"),
                f"output {i} has shape {tuple(a.shape)}, the reference {tuple(b.shape)}",
            )
        a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()  # float64: the error itself is exact
        both_nan = a64.isnan() & b64.isnan()
        same_inf = a64.isinf() & (a64 == b64)
        one_inf = (a64.isinf() | b64.isinf()) & ~same_inf  # an infinity on one side only: never close
        diff = (a64 - b64).abs().masked_fill(both_nan | same_inf, 0.0)
        bound = atol + rtol * b64.abs().masked_fill(b64.isinf() | b64.isnan(), 0.0)
        if diff.numel():
            bad = (diff > bound) | diff.isnan() | one_inf
            worst = max(worst, float(diff.nan_to_num(float("inf")).max()))
            if bool(bad.any()):
                return (
                    False,
                    worst,
                    f"output {i}: {int(bad.sum())} of {diff.numel()} elements outside the tolerance",
                )
    return True, worst, ""


def check_case(case: Any) -> dict[str, dict[str, Any]]:
    """Run each implementation of ``case`` (a :class:`~posenc.benchmarks.harness.Case`; the harness
    imports this module, not the reverse) once and compare it with ``case.reference()``.

    Returns:
        ``{impl name: {"check": text, "max_abs_err": float | None}}`` for every implementation.

    Raises:
        BenchmarkMismatchError: an implementation (not labelled by ``Impl.agrees``) disagrees, or
            the case has implementations but no reference.
    """
    out: dict[str, dict[str, Any]] = {}
    checked = [i for i in case.impls if i.agrees is None]
    if checked and case.reference is None:
        raise BenchmarkMismatchError(
            f"case {case.name!r} has no reference() to check its implementations against"
        )
    ref = case.reference() if checked else None
    for impl in case.impls:
        atol, rtol = impl.tolerance or (case.atol, case.rtol)
        tol = f"atol {atol:.2g}, rtol {rtol:.2g}"
        if impl.agrees is not None:
            out[impl.name] = {"check": f"not compared: {impl.agrees}", "max_abs_err": None}
            continue
        run: Callable[[], object] = impl.output or impl.fn
        want = ref[impl.layout] if isinstance(ref, dict) else ref
        ok, err, why = compare_outputs(run(), want, atol, rtol)
        if not ok:
            raise BenchmarkMismatchError(
                f"benchmark case {case.name!r}: {impl.name} disagrees with the reference ({why}; max |err| "
                f"{err:.3g}, tolerance {tol}); its time would not measure the same computation"
            )
        out[impl.name] = {"check": f"agrees (max |err| {err:.2g}; {tol})", "max_abs_err": err}
    return out
