"""The report's per-scheme sections, kept between builds.

A scheme's section (its checks, figures, captions and lesson) is a deterministic function of the
scheme's code, posenc's analysis code, the sizes it is drawn at, the figures' resolution and the
study it quotes. :func:`section_key` hashes all of them: posenc's own source files, the file that
defines the scheme's class (a scheme registered at run time included), torch's and matplotlib's
versions, and the arguments. A section is stored as JSON under that key, so a changed scheme,
figure or study is drawn anew and nothing stale is ever shown. A file that cannot be read back
(truncated, edited, another format) is drawn anew and replaced; a cache that cannot be written
is skipped.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import matplotlib
import torch

from .. import __version__
from .._paths import write_text
from ..registry import scheme_class
from .properties import PropertyResult

__all__ = ["load_section", "section_key", "store_section"]

#: The fields of a stored section, with their types (a file without them is drawn anew).
_FIELDS = {
    "section": str,
    "results": (list, type(None)),
    "profile": (list, type(None)),
    "group": str,
    "trainable": bool,
    "sequence": bool,
    "along": (str, type(None)),
}


@functools.lru_cache(maxsize=1)
def _posenc_source_hash() -> str:
    """A hash of every Python file of the installed posenc package (read once per process)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _class_source_hash(name: str) -> str:
    """A hash of the file that defines scheme ``name``'s class ("" when it has no file)."""
    try:
        return hashlib.sha256(Path(inspect.getfile(scheme_class(name))).read_bytes()).hexdigest()
    except (TypeError, OSError):
        return ""


def section_key(name: str, context: dict[str, Any], dpi: int, study: dict[str, Any] | None) -> str:
    """The cache key of scheme ``name``'s section: a hash of everything that decides it."""
    text = json.dumps(
        {
            "name": name,
            "context": context,
            "dpi": dpi,
            "study": study,
            "posenc": [__version__, _posenc_source_hash(), _class_source_hash(name)],
            "libraries": [torch.__version__, matplotlib.__version__],
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def load_section(folder: Path, key: str) -> dict[str, Any] | None:
    """The stored section of ``key`` in ``folder``, or None when absent or unreadable."""
    try:
        part = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(part, dict) or any(not isinstance(part.get(k), t) for k, t in _FIELDS.items()):
        return None
    try:
        if part["results"] is not None:
            part["results"] = [
                PropertyResult(**{k: v for k, v in r.items() if k != "status"}) for r in part["results"]
            ]
        if part["profile"] is not None:
            r, y = part["profile"]
            part["profile"] = (list(r), list(y))
    except (TypeError, ValueError, AttributeError):
        return None
    return part


def store_section(folder: Path, key: str, part: dict[str, Any]) -> None:
    """Store ``part`` (one scheme's section, as the report computed it) under ``key``; a folder
    that cannot be written is skipped (the next build draws the section again)."""
    data = {
        **part,
        "results": None if part["results"] is None else [r.to_json() for r in part["results"]],
        "profile": None if part["profile"] is None else list(part["profile"]),
    }
    with contextlib.suppress(OSError):
        write_text(folder / f"{key}.json", json.dumps(data))
