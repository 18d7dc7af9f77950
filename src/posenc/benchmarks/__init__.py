"""posenc's benchmark cases, importable (``posenc bench`` and ``benchmarks/*.py`` run them).

Each module of this package defines ``cases(quick: bool) -> dict[name, builder]``: a builder makes
the tensors and returns a :class:`~posenc.benchmarks.harness.Case` (built one at a time, so only
one case's tensors are alive). :data:`GROUPS` maps a group name to its module; modules and the
peers they compare against (HF transformers, rotary-embedding-torch, x-transformers) are imported
only when a case runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["GROUPS", "all_cases", "select"]

#: group name -> module with ``cases(quick)``
GROUPS: dict[str, str] = {
    "rope": "posenc.benchmarks.rope",
    "sinusoidal": "posenc.benchmarks.sinusoidal",
    "embedding": "posenc.benchmarks.embedding",
    "bias": "posenc.benchmarks.bias",
    "train_step": "posenc.benchmarks.train_step",
}


def all_cases(quick: bool, groups: list[str] | None = None) -> dict[str, Callable]:
    """``{case name: builder}`` of the given groups (default all), in group order."""
    out: dict[str, Callable] = {}
    for group in groups or list(GROUPS):
        out.update(importlib.import_module(GROUPS[group]).cases(quick))
    return out


def select(names: list[str], quick: bool) -> dict[str, Callable]:
    """Builders for ``names``: group names (all their cases) or single case names, which start with
    their group's name (``rope_decode``); none = all.

    Raises:
        ValueError: a name that is neither, listing the valid ones.
    """
    if not names:
        return all_cases(quick)
    out: dict[str, Callable] = {}
    for name in names:
        if name in GROUPS:
            out.update(all_cases(quick, [name]))
            continue
        group = next((g for g in GROUPS if name.startswith(g + "_")), None)
        found = all_cases(quick, [group]) if group else {}
        if name not in found:
            every = all_cases(quick)
            from .._validate import did_you_mean

            raise ValueError(
                f"unknown benchmark case {name!r}; valid: groups {', '.join(GROUPS)} "
                f"or cases {', '.join(every)}" + did_you_mean(name, [*GROUPS, *every])
            )
        out[name] = found[name]
    return out
