"""Names of a package loaded on first use, so importing it (as the command line does to read its
arguments) does not import torch. One helper for every lazy package of posenc."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, exports: Mapping[str, str], submodules: Sequence[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the submodule that defines it; loaded on first access, then kept
            as a plain attribute of the package.
        submodules: submodules reachable as attributes (``posenc.analysis.properties``).
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module("." + exports[name], package), name)
            setattr(sys.modules[package], name, value)  # once loaded, a plain attribute
            return value
        if name in submodules:
            return importlib.import_module("." + name, package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports, *submodules})

    return __getattr__, __dir__
