"""Tests of posenc._validate: the shared argument checks return the value or raise a TypeError /
ValueError that names the argument, the value and the fix (and the closest valid name)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from posenc._validate import (
    check_choice,
    check_fields,
    check_int,
    check_positive_float,
    check_probability,
    did_you_mean,
)


def test_check_int():
    assert check_int(3, "n") == 3
    assert check_int(0, "n", minimum=0) == 0
    assert check_int(4, "d", even=True) == 4
    with pytest.raises(TypeError, match=r"n must be an int, got bool \(True\)"):
        check_int(True, "n")  # a bool is not a count
    with pytest.raises(TypeError, match=r"n must be an int, got float \(2.0\)"):
        check_int(2.0, "n")
    with pytest.raises(ValueError, match="n must be >= 1, got 0; try 1"):
        check_int(0, "n", hint="; try 1")
    with pytest.raises(
        ValueError, match=r"d must be even \(the encoding pairs dimensions as sin/cos\), got 5; use 6 or 4"
    ):
        check_int(5, "d", even=True)


def test_check_positive_float():
    assert check_positive_float(2, "base") == 2.0 and type(check_positive_float(2, "base")) is float
    assert check_positive_float(1e-9, "base") == 1e-9
    with pytest.raises(TypeError, match=r"base must be a number, got str \('1'\)"):
        check_positive_float("1", "base")
    with pytest.raises(TypeError, match="base must be a number, got bool"):
        check_positive_float(True, "base")
    for bad in (0, -1.5, math.inf, math.nan):
        with pytest.raises(ValueError, match="base must be a finite number > 0"):
            check_positive_float(bad, "base")


def test_did_you_mean():
    assert did_you_mean("rop", ["rope", "alibi"]) == "; did you mean 'rope'?"
    assert did_you_mean("alibii", ("alibi", "alibi_2")) == "; did you mean 'alibi' or 'alibi_2'?"
    assert did_you_mean("zzz", ["rope"]) == ""
    assert did_you_mean(3, ["rope"]) == ""  # only strings are matched


def test_check_choice():
    assert check_choice("half", "layout", ("half", "interleaved")) == "half"
    assert check_choice("pre", "norm", {"pre": 1, "post": 2}) == "pre"  # a dict's keys are the choices
    with pytest.raises(
        ValueError, match="unknown layout 'halv'; valid values: 'half', 'interleaved'; did you mean 'half'"
    ):
        check_choice("halv", "layout", ("half", "interleaved"))
    with pytest.raises(ValueError, match=r"unknown layout 'x'; valid values: 'half', 'interleaved'$"):
        check_choice("x", "layout", ["half", "interleaved"])


def test_check_probability():
    assert check_probability(0, "dropout") == 0.0 and check_probability(0.5, "dropout") == 0.5
    with pytest.raises(TypeError, match=r"dropout must be a number in \[0, 1\), got str"):
        check_probability("0.1", "dropout")
    with pytest.raises(TypeError, match="got bool"):
        check_probability(False, "dropout")
    for bad in (1, 1.0, -0.1):
        with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got"):
            check_probability(bad, "dropout")


def test_check_fields():
    @dataclasses.dataclass
    class Point:
        x: int = 0
        y: int = 0

    check_fields(Point, {"x": 1})
    check_fields(Point, {})
    with pytest.raises(ValueError, match=r"unknown Point field\(s\) \['w', 'z'\]; valid: x, y"):
        check_fields(Point, {"x": 1, "z": 2, "w": 3})
