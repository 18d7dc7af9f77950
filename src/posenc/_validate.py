"""Argument checks shared by every module: clear TypeError/ValueError naming the argument."""

from __future__ import annotations

import difflib
import math


def check_int(value: object, name: str, *, minimum: int = 1, even: bool = False, hint: str = "") -> int:
    """``value`` as an int >= ``minimum`` (and even if asked), else a clear TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}{hint}")
    if even and value % 2:
        raise ValueError(
            f"{name} must be even (the encoding pairs dimensions as sin/cos), got {value}; "
            f"use {value + 1} or {value - 1}{hint}"
        )
    return value


def check_positive_float(value: object, name: str) -> float:
    """``value`` as a finite float > 0, else a clear TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def did_you_mean(value: object, choices) -> str:
    """``"; did you mean 'rope'?"`` when ``value`` is close to one of ``choices`` (difflib), else ``""``."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


def check_choice(value: object, name: str, choices: dict | tuple | list) -> str:
    """``value`` if it is one of ``choices``, else a ValueError listing them (and the closest)."""
    if value not in choices:
        raise ValueError(
            f"unknown {name} {value!r}; valid values: {', '.join(map(repr, choices))}"
            + did_you_mean(value, choices)
        )
    return value  # type: ignore[return-value]


def check_probability(value: object, name: str) -> float:
    """``value`` as a float in [0, 1), else a clear TypeError/ValueError (dropout rates)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in [0, 1), got {type(value).__name__} ({value!r})")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_fields(cls: type, data: dict) -> None:
    """Raise ``ValueError`` listing the valid fields when ``data`` has keys that dataclass ``cls``
    does not (for ``from_dict`` of configs read from JSON)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; valid: {', '.join(sorted(names))}")


def defining_class(cls: type, name: str) -> type | None:
    """The class in ``cls``'s MRO that defines attribute ``name`` (None if none does): for asking
    whether two capabilities of a scheme come from the same class."""
    return next((c for c in cls.__mro__ if name in c.__dict__), None)
