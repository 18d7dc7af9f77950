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

__all__ = ["check_folder", "check_output_file", "write_json", "write_text"]


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


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) atomically: a temporary file in the same folder, ``fsync``,
    ``os.replace``. The temporary file is created new (never through a link left in its place) with
    the permissions any new file gets (``0o666`` less the umask), and a failed write leaves the old
    file as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover of a killed write by a process with the same pid
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        with os.fdopen(os.open(tmp, flags, 0o666), "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as JSON atomically (:func:`write_text`)."""
    write_text(path, json.dumps(data, indent=1))
