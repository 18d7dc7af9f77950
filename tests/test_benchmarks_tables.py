"""Tests of posenc.benchmarks.tables: the plain and Markdown tables of a case's results."""

from __future__ import annotations

import torch

from posenc.benchmarks.harness import Case, Impl, run_case
from posenc.benchmarks.tables import case_result_from_json, format_case


def _result():
    x = torch.randn(256)
    impls = [
        Impl("mine", lambda: x * 2, "posenc", "half"),
        Impl("theirs", lambda: x + x, "peer", "half"),
        Impl("their_module", lambda: x + x, "peer", "half", form="module"),
        Impl("different", lambda: x * 3, "peer", "half", agrees="same work, different numbers: a test"),
    ]
    case = Case("t", "a case", 2048, impls, skipped={"gone": "not installed"}, reference=lambda: x * 2)
    return run_case(case, repeats=2, min_time=0.0)


def test_plain_table_shows_forms_limits_speedups_and_checks():
    table = format_case(_result())
    rows = {line.split()[0]: line for line in table.splitlines()[3:]}
    assert "% of copy" in rows["mine"] and "% of inplace" in rows["inplace"]
    assert "x (mine)" in rows["theirs"] and "agrees (max |err| 0" in rows["theirs"]
    assert "no posenc impl of this form" in rows["their_module"]
    assert "not compared: same work, different numbers: a test" in rows["different"]
    assert "skipped: not installed" in rows["gone"]


def test_markdown_table_round_trips_through_json():
    result = _result()
    again = case_result_from_json(result.to_json())
    md = format_case(again, markdown=True)
    assert md.splitlines()[2] == "| impl | form | median | IQR | GB/s | of limit | posenc speed-up | check |"
    assert "| **mine** | out of place |" in md and "| gone | skipped: not installed |" in md


def test_of_limit_shows_the_paired_quartiles_and_reads_older_runs():
    result = _result()
    r = result.results["mine"]
    r.update(of_limit=0.95, of_limit_q1=0.91, of_limit_q3=0.99)
    row = next(line for line in format_case(result).splitlines() if line.split()[0] == "mine")
    assert "95% of copy (91-99%)" in row
    copy_row = next(line for line in format_case(result).splitlines() if line.split()[0] == "copy")
    assert "100% of copy" in copy_row and "(100-100%)" not in copy_row
    r.pop("of_limit_q1"), r.pop("of_limit_q3")  # a run saved before pairing: the ratio alone
    row = next(line for line in format_case(result).splitlines() if line.split()[0] == "mine")
    assert "95% of copy" in row and "(91" not in row


def test_a_paired_comparison_shows_in_the_speedup_column():
    result = _result()
    result.results["mine"].update(versus="theirs", versus_ratio=1.04, versus_q1=1.01, versus_q3=1.06)
    row = next(line for line in format_case(result).splitlines() if line.split()[0] == "mine")
    assert "1.04x the time of theirs (1.01-1.06x), paired" in row
