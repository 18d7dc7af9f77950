"""Build and load posenc's small C kernels (CPU fast paths), once per machine, with a safe fallback.

A kernel is a few dozen lines of plain C99 (no Python or torch headers) that works on raw pointers
and strides. It is compiled with the system C compiler on first use (well under a second) into a
cache directory and loaded with :mod:`ctypes`; ctypes releases the GIL during the call. Later
processes load the cached library directly.

* The cache key hashes the source, the flags, the compiler's version and the CPU's feature flags
  (the code is built with ``-march=native``), so a shared home directory across machines is safe.
* ``-ffp-contract=off``, no SLP vectorization and no fast-math: every product and sum is rounded
  exactly as PyTorch's elementwise ops round them, so a kernel can give bit-identical results to
  the reference path (callers also check that on first use, see ``rope_cpu``).
* OpenMP when the compiler has it (the process then shares PyTorch's ``libgomp``), else serial.
* A cached library is used only when it loads and exports every ``posenc_*`` function its source
  defines (a kernel's exported functions are named ``posenc_*``); otherwise it is rebuilt once.
* A build runs in a temporary folder ``.build-<PID>-*`` of the cache; the folders of builds whose
  process is gone (killed mid-build) are removed by the next build.
* No compiler, a failed build, or ``POSENC_C_KERNELS=0`` in the environment: :func:`load` returns
  ``None`` and the callers use their reference (pure PyTorch) path. ``POSENC_KERNEL_CACHE`` sets the
  cache directory (default ``$XDG_CACHE_HOME/posenc/kernels`` or ``~/.cache/posenc/kernels``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from . import _settings

__all__ = ["cache_dir", "enabled", "load", "source"]

# -ffp-contract=off: no fused multiply-add, every product is rounded as PyTorch rounds it.
# -fno-tree-slp-vectorize: GCC's SLP pass recognises complex-multiply patterns and emits
# vfmaddsub even with contraction off (seen with GCC 12), which changes the last bit.
_BASE_FLAGS = (
    "-O3",
    "-std=gnu99",
    "-shared",
    "-fPIC",
    "-ffp-contract=off",
    "-fno-tree-slp-vectorize",
    "-fno-math-errno",
)
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_why: dict[str, str] = {}  # why a kernel is not loaded, by name


_INCLUDE = re.compile(r'^#include "([\w.]+\.c)"$', re.MULTILINE)


def source(name: str, read: Callable[[str], str] | None = None) -> str:
    """Kernel ``name``'s C source (``csrc/<name>.c``) as one string: each ``#include "file.c"``
    line is replaced by that csrc file (a kernel's per-instruction-set loops live in their own
    files; the compiler sees one translation unit, built from a temporary directory). ``read``
    maps a csrc file name to its text (default: the installed package's files)."""
    if read is None:

        def read(filename: str) -> str:
            return (resources.files(__package__) / "csrc" / filename).read_text(encoding="utf-8")

    return _INCLUDE.sub(lambda m: read(m.group(1)).rstrip("\n"), read(f"{name}.c"))


def enabled() -> bool:
    """False when fast paths are switched off (:mod:`posenc.kernels._settings`: ``POSENC_C_KERNELS=0``
    or ``posenc.kernels.set_enabled(False)``)."""
    return _settings.enabled()


def cache_dir() -> Path:
    """Where compiled kernels live (``POSENC_KERNEL_CACHE`` overrides)."""
    if os.environ.get("POSENC_KERNEL_CACHE"):
        return Path(os.environ["POSENC_KERNEL_CACHE"])
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "posenc" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """The CPU's model and feature flags (what ``-march=native`` depends on)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "model name", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


#: The functions a kernel's source exports: non-static definitions named ``posenc_*`` at a line start.
_EXPORTED = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(posenc_\w+)\s*\(", re.MULTILINE)
_BUILD_DIR = re.compile(r"^\.build-(\d+)-")


def exported(source: str) -> list[str]:
    """The ``posenc_*`` functions ``source`` defines (what a cached library must export)."""
    return sorted(set(_EXPORTED.findall(source)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove_dead_builds(folder: Path) -> None:
    """Remove the build folders (``.build-<PID>-*``) of processes that are gone."""
    for entry in folder.glob(".build-*"):
        match = _BUILD_DIR.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and not _alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def _compile(cc: str, flags: tuple[str, ...], source: str, name: str, path: Path) -> str | None:
    """Compile ``source`` into ``path`` (atomically); the compiler's error, or None on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_builds(path.parent)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".build-{os.getpid()}-") as tmp:
        src, lib = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        src.write_text(source)
        proc = subprocess.run(
            [cc, *flags, str(src), "-o", str(lib), "-lm"], capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            return proc.stderr.strip()[-2000:]
        os.replace(lib, path)  # atomic: concurrent processes never load a half-written file
    return None


def _build(name: str, source: str) -> ctypes.CDLL | None:
    if platform.system() not in ("Linux", "Darwin"):
        _why[name] = f"no C kernels on {platform.system()}"
        return None
    cc = _compiler()
    if cc is None:
        _why[name] = "no compiler"
        return None
    _why[name] = "build failed"
    arch = ("-march=native",) if platform.machine() in ("x86_64", "AMD64") else ("-mcpu=native",)
    version = _version(cc)
    errors = []
    for extra in (("-fopenmp",), ()):  # OpenMP if the compiler has it, else a serial build
        flags = (*_BASE_FLAGS, *arch, *extra)
        key = hashlib.sha256("\0".join((source, " ".join(flags), version, _cpu_signature())).encode())
        path = cache_dir() / f"{name}-{key.hexdigest()[:20]}.so"
        for _attempt in range(2):  # a cached library that does not load (corrupt, truncated) is rebuilt once
            if not path.exists():
                error = _compile(cc, flags, source, name, path)
                if error is not None:
                    errors.append(error)
                    break  # this flag set does not compile here: try the next one
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as err:
                errors.append(str(err))
                path.unlink(missing_ok=True)
                continue
            missing = [f for f in exported(source) if not hasattr(lib, f)]
            if not missing:
                return lib
            errors.append(f"{path} loads but lacks {missing}")  # a stale or foreign file: rebuilt
            path.unlink(missing_ok=True)
    _why[name] = f"build failed ({(errors[-1] if errors else '?').splitlines()[0][:120]})"
    warnings.warn(
        f"posenc: could not build the C kernel {name!r}; using the PyTorch reference path "
        f"(set POSENC_C_KERNELS=0 to silence). Compiler said: {errors[-1] if errors else '?'}",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def status(name: str) -> str:
    """Why kernel ``name`` is or is not in use: ``"loaded"``, ``"disabled"`` (``POSENC_C_KERNELS=0``),
    ``"not built yet"``, ``"no compiler"``, or ``"build failed (...)"`` with the first line of the
    reason (an unwritable cache folder, a compiler error)."""
    if not enabled():
        return "disabled"
    if name not in _loaded:
        return "not built yet"
    return "loaded" if _loaded[name] is not None else _why.get(name, "no compiler")


def load(name: str, source: str) -> ctypes.CDLL | None:
    """The compiled library for ``source`` (built on first use), or ``None`` where it cannot be.

    One library per ``name`` per process; the build happens under a lock.
    """
    if not enabled():
        return None
    if name in _loaded:
        return _loaded[name]
    with _lock:
        if name not in _loaded:
            try:
                _loaded[name] = _build(name, source)
            except (OSError, subprocess.SubprocessError) as err:
                _why[name] = f"build failed ({str(err)[:120]})"
                warnings.warn(
                    f"posenc: C kernel {name!r} unavailable ({err}); using the reference path",
                    RuntimeWarning,
                    stacklevel=2,
                )
                _loaded[name] = None
    return _loaded[name]
