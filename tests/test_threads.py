"""Thread counts: the CPUs a process may use and the cap on what a flag may ask torch for."""

from __future__ import annotations

import pytest

from posenc._threads import MAX_THREADS_PER_CPU, check_threads, usable_cpus


def test_usable_cpus_is_positive():
    assert usable_cpus() >= 1


def test_the_cap_is_a_factor_of_the_usable_cpus():
    most = MAX_THREADS_PER_CPU * usable_cpus()
    assert check_threads(1) == 1 and check_threads(most) == most
    with pytest.raises(ValueError, match=f"--threads {most + 1} is more than .* give at most {most}"):
        check_threads(most + 1)


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_bad_counts_name_the_flag(value, error):
    with pytest.raises(error, match="--workers"):
        check_threads(value, "--workers")
