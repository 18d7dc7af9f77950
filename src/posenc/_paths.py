"""Output paths: checked before any work is spent, written atomically.

Every command that writes a file or a folder validates the path first (a typo costs a second, not
a training run) and writes through a temporary file and ``os.replace`` (a kill never leaves half
a file under the real name).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["check_folder", "check_output_file", "write_json"]


def _writable_ancestor(path: Path, flag: str, start: Path | None = None) -> None:
    """The nearest existing folder at or above ``start`` (default ``path``) must be a writable folder."""
    ancestor = path if start is None else start
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(
            f"{flag} {str(path)!r} lies under the file {str(ancestor)!r}; give a path in a folder"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r}: {str(ancestor)!r} is not writable; choose another place")


def check_folder(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a folder that exists or can be created and written; a clear ``ValueError`` otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file, not a folder; give a folder for the run's files")
    _writable_ancestor(path, flag)
    return path


def check_output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a file that can be written (its folder exists or can be created); a clear
    ``ValueError`` for a folder, a path under a file, or an unwritable place."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"{flag} {str(path)!r} is a folder; give a file name, e.g. {str(path / 'out.json')!r}"
        )
    _writable_ancestor(path, flag, start=path.parent)  # an existing file is replaced, as -o does
    return path


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as JSON atomically: a temporary file in the same folder, ``fsync``, ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
