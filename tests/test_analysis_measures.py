"""Tests of posenc.analysis.measures: the registry's declarations and each measurement read
directly, against what :func:`~posenc.analysis.properties.check` reports."""

from __future__ import annotations

import math

import pytest

from posenc.analysis.kernel import make_probe
from posenc.analysis.measures import PROPERTIES, Measurement
from posenc.analysis.properties import check

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}


def test_every_property_declares_its_rules():
    assert list(PROPERTIES) == [
        "distinct_fp32",
        "distinct_bf16",
        "distinct_fp16",
        "bounded",
        "relative_linear",
        "translation_inv",
        "decay",
        "symmetry",
        "beyond_length",
        "wavelengths",
    ]
    for name, prop in PROPERTIES.items():
        assert prop.name == name and prop.comparison in ("<=", "<", ">", ">=") and prop.formula


@pytest.mark.parametrize(("scheme", "cmp"), [("alibi", "<="), ("rope", "<"), ("sinusoidal", "<")])
def test_decay_is_compared_by_what_the_scheme_does(scheme, cmp):
    """A bias's largest rise passes at <= 0; a decay ratio must be strictly below its threshold."""
    probe = make_probe(scheme, SMALL)
    assert PROPERTIES["decay"].comparison_of(probe) == cmp
    assert PROPERTIES["symmetry"].comparison_of(probe) == "<="  # no per-scheme rule: the default


@pytest.mark.parametrize("scheme", ["sinusoidal", "learned", "rope", "alibi", "t5"])
def test_measures_read_directly_equal_the_checks(scheme):
    probe = make_probe(scheme, SMALL)
    results = {r.property: r for r in check(probe)}
    for name, prop in PROPERTIES.items():
        if prop.applies(probe) is not None:
            assert not results[name].applies
            continue
        try:
            m = prop.measure(probe)
        except ValueError:  # a learned table cannot encode 4L: check reports the failure
            assert results[name].passed is False
            continue
        assert isinstance(m, Measurement)
        got = results[name].value
        assert (math.isnan(m.value) and math.isnan(got)) or m.value == pytest.approx(got, rel=1e-12)
