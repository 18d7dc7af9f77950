"""Run folders: checked before any work, locked while written, never silently overwritten.

One mechanism for every command that writes a run (``posenc train``, ``posenc extrapolate``):

* :func:`check_folder` validates an output folder **before** any training: not a file, no file
  in its path, writable;
* :class:`RunFolder` takes an exclusive lock (``OUT/.posenc.lock``, ``fcntl.flock``) so two
  processes never write one folder; refuses a folder that already holds a run unless the caller
  resumes it or asks to overwrite it (then the old run's files are removed first); and deletes
  temporary files that a killed process left behind (``.NAME.tmp<PID>`` of a process no longer alive);
* :func:`write_json` writes a file atomically (temporary file, ``fsync``, ``os.replace``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from .._paths import check_folder, write_json

__all__ = ["LOCK_NAME", "RunFolder", "check_folder", "remove_stale_temporaries", "write_json"]

#: The lock file inside a run folder.
LOCK_NAME = ".posenc.lock"

_TEMP = re.compile(r"^\..+\.tmp(\d+)$")  # what write_json and save_checkpoint leave if killed mid-write


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete ``.NAME.tmp<PID>`` files under ``folder`` whose process is gone; returns them."""
    removed = []
    for path in Path(folder).rglob(".*.tmp*"):
        match = _TEMP.match(path.name)
        if match and path.is_file() and not _alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


class RunFolder:
    """The output folder of one run, held for the duration of a ``with`` block.

    Args:
        path: the folder.
        artifacts: names (files or folders) that make up a run in it; any of them present means
            the folder already holds a run.
        resume: continue that run (its files are kept).
        overwrite: replace that run (its artifacts are deleted first).
        lock: take the folder's lock (only one process of a DDP group should).
        flag: the option that named the folder, for messages.

    Raises:
        ValueError: on entering: a bad path, a run already there without ``resume``/``overwrite``,
            or another process holding the lock.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        artifacts: Sequence[str],
        *,
        resume: bool = False,
        overwrite: bool = False,
        lock: bool = True,
        flag: str = "--out",
    ) -> None:
        if resume and overwrite:
            raise ValueError("give --resume or --overwrite, not both")
        self.path = check_folder(path, flag)
        self.artifacts, self.resume, self.overwrite, self.lock, self.flag = (
            tuple(artifacts),
            resume,
            overwrite,
            lock,
            flag,
        )
        self._fh = None

    def existing(self) -> list[str]:
        """The run artifacts already in the folder."""
        return [name for name in self.artifacts if (self.path / name).exists()]

    def __enter__(self) -> RunFolder:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.lock:
            self._acquire()
        try:
            found = self.existing()
            if found and not (self.resume or self.overwrite):
                raise ValueError(
                    f"{self.flag} {str(self.path)!r} already holds a run ({', '.join(found)}); continue it "
                    "with --resume, replace it with --overwrite, or choose another folder"
                )
            if self.overwrite and self.lock:  # the lock holder alone deletes (one process of a DDP group)
                for name in found:
                    target = self.path / name
                    if target.is_dir():
                        shutil.rmtree(target, ignore_errors=True)
                    else:
                        target.unlink(missing_ok=True)
            remove_stale_temporaries(self.path)
        except BaseException:
            self._release()
            raise
        from .distributed import dist_info

        if dist_info().world_size > 1:  # torchrun: no rank starts before the lock holder cleaned up
            import torch.distributed

            torch.distributed.barrier()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def _acquire(self) -> None:
        import fcntl

        fh = open(self.path / LOCK_NAME, "a+")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise ValueError(
                f"{self.flag} {str(self.path)!r} is being written by another posenc process (pid {holder}); "
                "wait for it to finish or choose another folder"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def _release(self) -> None:
        if self._fh is not None:  # the file stays: unlinking it would let two processes lock two inodes
            self._fh.close()  # closing the descriptor releases the flock
            self._fh = None
