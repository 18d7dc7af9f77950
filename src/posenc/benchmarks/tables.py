"""Tables of benchmark results: plain text for the terminal, Markdown for ``benchmarks/RESULTS.md``.

Columns: the implementation, its form (what kind of call), the median and interquartile range,
effective GB/s, ``of limit`` (the limit's time over this one's, measured next to each other in every
round: the median and quartiles over rounds; 100% = at the limit; the limit is the memory baseline
of its form or the case's own), the speed-up of the best
posenc implementation of the same form and layout over each peer, and the output check (with the
peak memory of one call, where the case measures it).
"""

from __future__ import annotations

from typing import Any

from .harness import CaseResult, like_for_like

__all__ = ["case_result_from_json", "format_case"]


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _speedup(result: CaseResult, name: str, r: dict[str, Any]) -> str:
    """``"3.10x (posenc_impl)"``: the best posenc impl of the same form/layout against peer ``name``;
    for an implementation timed next to another one (``versus``), its time over that one's."""
    if r.get("versus_ratio") is not None:
        q1, q3 = r["versus_q1"], r["versus_q3"]
        return f"{r['versus_ratio']:.2f}x the time of {r['versus']} ({q1:.2f}-{q3:.2f}x), paired"
    if r["kind"] != "peer":
        return ""
    speed = result.speedups()
    same = [p for p, pr in result.results.items() if pr["kind"] == "posenc" and like_for_like(pr, r)]
    if not same:
        return "no posenc impl of this form"
    best = min(same, key=lambda p: result.results[p]["median_s"])
    return f"{speed[best][name]:.2f}x ({best})"


def _limit(r: dict[str, Any]) -> str:
    """``"95% of copy (91-99%)"``: the paired median with its quartiles over rounds."""
    if r.get("of_limit") is None:  # results saved before limits existed: the copy fraction
        frac = r.get("copy_fraction")
        return "" if frac is None else f"{frac * 100:.0f}% of copy"
    text = f"{r['of_limit'] * 100:.0f}% of {r['limit']}"
    q1, q3 = r.get("of_limit_q1"), r.get("of_limit_q3")
    if q1 is None or q3 is None or q1 == q3:
        return text  # the limit itself, one round, or a run saved before pairing (ratio of medians)
    return f"{text} ({q1 * 100:.0f}-{q3 * 100:.0f}%)"


def _rows(result: CaseResult) -> list[tuple[str, ...]]:
    rows = []
    for name, r in result.results.items():
        rate = "" if r["gbps"] is None else f"{r['gbps']:.2f}"
        check = r.get("check", "")
        if r.get("peak_mb") is not None:
            check = f"peak {r['peak_mb']:.0f} MB; " + check
        rows.append(
            (
                name,
                r["kind"],
                r.get("form", ""),
                _fmt_time(r["median_s"]),
                _fmt_time(r["q1_s"]) + "–" + _fmt_time(r["q3_s"]),
                rate,
                _limit(r),
                _speedup(result, name, r),
                "" if check == "baseline" else check,
            )
        )
    return rows


def format_case(result: CaseResult, markdown: bool = False) -> str:
    """A table of one case (see the module docstring); plain text, or Markdown."""
    load = "/".join(map(str, result.load_before or [])) + " -> " + "/".join(map(str, result.load_after or []))
    moved = f"{result.nbytes / 1e6:.1f} MB moved per call" if result.nbytes else "no byte count"
    rows = _rows(result)
    if markdown:
        params = ", ".join(f"{k}={v}" for k, v in result.params.items())
        lines = [
            f"**{result.name}** — {result.description}; {params}; {moved}; load {load}",
            "",
            "| impl | form | median | IQR | GB/s | of limit | posenc speed-up | check |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, kind, form, med, iqr, rate, lim, vs, check in rows:
            label = f"**{name}**" if kind == "posenc" else name
            lines.append(f"| {label} | {form} | {med} | {iqr} | {rate} | {lim} | {vs} | {check} |")
        lines += [f"| {name} | skipped: {why} | | | | | | |" for name, why in result.skipped.items()]
        return "\n".join(lines)
    lines = [f"== {result.name}: {result.description}", f"   {moved}; load {load}"]
    width = max(len(n) for n in result.results)
    head = (
        f"{'form':<12}  {'median':>10}  {'IQR':>21}  {'GB/s':>7}  {'of limit':>26}  posenc speed-up / check"
    )
    lines.append(f"   {'impl':<{width}}  {head}")
    for name, _, form, med, iqr, rate, lim, vs, check in rows:
        tail = "; ".join(x for x in (vs, check) if x)
        lines.append(f"   {name:<{width}}  {form:<12}  {med:>10}  {iqr:>21}  {rate:>7}  {lim:>26}  {tail}")
    for name, why in result.skipped.items():
        lines.append(f"   {name:<{width}}  skipped: {why}")
    return "\n".join(lines)


def case_result_from_json(case: dict[str, Any]) -> CaseResult:
    """The :class:`CaseResult` of one entry of a report's ``cases`` (to re-render a saved run)."""
    return CaseResult(
        case["case"],
        case["description"],
        case["bytes"],
        case["params"],
        case["results"],
        case["skipped"],
        case.get("loadavg_before"),
        case.get("loadavg_after"),
    )
