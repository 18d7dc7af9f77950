"""Run folders: checked before any work, locked while written, never silently overwritten.

One mechanism for every command that writes a run (``posenc train``, ``posenc extrapolate``):

* :func:`check_folder` validates an output folder **before** any training: not a file, no file
  in its path, writable;
* :class:`RunFolder` takes an exclusive lock (``OUT/.posenc.lock``, ``fcntl.flock``) so two
  processes never write one folder; refuses a folder that already holds a run unless the caller
  resumes it or asks to overwrite it (then the old run's files are removed first); and deletes
  temporary files that a killed process left behind (``.NAME.tmp<PID>`` of a process no longer alive);
* gives each run (each time a folder is taken) a fresh **run id**, written into the lock file next
  to the holder's pid; every process that writes for the run (the cell workers too) checks,
  before each write, that the lock is still held and still names its run id
  (:func:`writing_for`, :func:`check_owner`). So a worker that outlived a killed study can never
  write into the folder, nor into a newer run started there with ``--resume`` or ``--overwrite``;
* :func:`write_json` writes a file atomically (temporary file, ``fsync``, ``os.replace``), after
  that check.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import _paths
from .._paths import check_folder

__all__ = [
    "LOCK_NAME",
    "RunFolder",
    "RunFolderLost",
    "check_folder",
    "check_owner",
    "current_run_id",
    "remove_stale_temporaries",
    "write_json",
    "writing_for",
]

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


#: What ``safetensors`` itself writes a file through (``.tmp`` and 6 random characters): a write
#: killed half-way leaves it, without a pid to tell whether its writer is alive.
_SAFETENSORS_TEMP = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")


def remove_stale_temporaries(folder: str | os.PathLike, *, holding_lock: bool = False) -> list[Path]:
    """Delete ``.NAME.tmp<PID>`` files under ``folder`` whose process is gone; returns them.

    ``holding_lock``: the caller holds the folder's lock and nothing writes into it yet, so
    safetensors' own temporaries (``.tmpXXXXXX``, no pid in the name) are stale too."""
    removed = []
    for path in Path(folder).rglob(".*tmp*"):
        match = _TEMP.match(path.name)
        ours = match is not None and not _alive(int(match.group(1)))
        if (
            (ours or (holding_lock and _SAFETENSORS_TEMP.match(path.name)))
            and path.is_file()
            and not path.is_symlink()
        ):
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
        self._fd: int | None = None
        #: This run's id (``None`` until entered, and in a process that does not take the lock).
        self.run_id: str | None = None

    def existing(self) -> list[str]:
        """The run artifacts already in the folder."""
        return [name for name in self.artifacts if (self.path / name).exists()]

    def __enter__(self) -> RunFolder:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.lock:
            self._acquire()
        try:
            linked = [name for name in self.artifacts if (self.path / name).is_symlink()]
            if linked:  # a write would land wherever the link points, outside the folder
                raise ValueError(
                    f"{self.flag} {str(self.path)!r}: {', '.join(linked)} is a symbolic link; posenc writes "
                    "a run only inside its folder: remove the link or choose another folder"
                )
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
            remove_stale_temporaries(self.path, holding_lock=self.lock)
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

        lock = self.path / LOCK_NAME
        try:  # never through a symbolic link: the lock's target would be truncated
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise ValueError(
                    f"{self.flag} {str(self.path)!r}: {LOCK_NAME} is a symbolic link; posenc will not "
                    "write through it; remove it (rm) or choose another folder"
                ) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{self.flag} {str(self.path)!r}: {LOCK_NAME} is not a file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (_read_lock(fd) or ["?"])[0]
            os.close(fd)
            raise ValueError(
                f"{self.flag} {str(self.path)!r} is being written by another posenc process (pid {holder}); "
                "wait for it to finish or choose another folder"
            ) from None
        self.run_id = uuid.uuid4().hex[:16]
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.run_id}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def _release(self) -> None:
        if self._fd is not None:  # the file stays: unlinking it would let two processes lock two inodes
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)  # the run id goes: a late writer of this run is refused
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def _read_lock(fd: int) -> list[str]:
    """The lock file's words: ``[pid, run id]`` while a run holds it (at most 200 bytes read)."""
    return os.pread(fd, 200, 0).decode("ascii", "replace").split()


class RunFolderLost(ValueError):
    """The run a process writes for no longer holds its folder (its main process is gone, or a
    newer run took the folder); the process must stop without writing."""


_owner: tuple[Path, str] | None = None  # (folder, run id) this process writes for


@contextlib.contextmanager
def writing_for(folder: str | os.PathLike | None, run_id: str | None) -> Iterator[None]:
    """Within the block, every :func:`check_owner` (each :func:`write_json`, each checkpoint)
    verifies that run ``run_id`` still holds ``folder``; ``None`` for either checks nothing."""
    global _owner
    before = _owner
    _owner = None if folder is None or run_id is None else (Path(folder).resolve(), run_id)
    try:
        yield
    finally:
        _owner = before


def current_run_id() -> str:
    """The run id set by :func:`writing_for` (``""`` outside one): recorded in the files written."""
    return _owner[1] if _owner is not None else ""


def check_owner(path: str | os.PathLike | None = None) -> None:
    """Raise :class:`RunFolderLost` unless the run this process writes for (:func:`writing_for`)
    still holds its folder: the lock taken by a live process, naming this run's id. ``path``: the
    file about to be written (a path outside the folder is not checked)."""
    import fcntl

    if _owner is None:
        return
    folder, run_id = _owner
    if path is not None and not Path(path).resolve().is_relative_to(folder):
        return
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        held, words = False, []
    else:
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                held = True  # the holder's exclusive lock
            else:
                held = False
                fcntl.flock(fd, fcntl.LOCK_UN)
            words = _read_lock(fd)
        finally:
            os.close(fd)
    if not held or run_id not in words[1:2]:
        why = "no process holds it" if not held else "another run holds it now"
        raise RunFolderLost(
            f"the run folder {str(folder)!r} no longer belongs to run {run_id} ({why}); this process "
            "stops without writing into it"
        )


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as JSON atomically (after :func:`check_owner`)."""
    check_owner(path)
    _paths.write_json(path, data)
