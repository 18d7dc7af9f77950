"""Peak memory of one call of an implementation, each measured in a fresh process.

In the benchmark's own process the allocator keeps memory that earlier calls freed, so the resident
size stops growing and a second implementation's peak would read 0. Here each
``(case, implementation)`` runs in a new interpreter: it builds the case, calls the implementation
once to warm up (kernels built, pools made), resets Linux's peak-resident counter
(``/proc/self/clear_refs``), calls it again and reports ``VmHWM - VmRSS`` before the call: the
memory that one call needs beyond its inputs. Linux only; elsewhere nothing is measured.

Run as ``python -m posenc.benchmarks.memory CASE IMPL [--quick] [--threads N]``: prints the bytes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

__all__ = ["peak_bytes", "supported"]


def supported() -> bool:
    """Whether this machine can reset and read the peak resident size (Linux /proc)."""
    return os.path.exists("/proc/self/clear_refs") and os.path.exists("/proc/self/status")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {key}")


def peak_bytes(
    case: str,
    impl: str,
    *,
    quick: bool,
    threads: int | None = None,
    allocator: str = "system",
    timeout: float = 600,
) -> int | None:
    """Peak memory of one call of ``impl`` of benchmark ``case`` beyond its inputs, in bytes, from a
    fresh process with the same threads and allocator setting (None where it cannot be measured).

    Raises:
        RuntimeError: the probe process failed (the end of its stderr in the message)."""
    if not supported():
        return None
    cmd = [sys.executable, "-m", "posenc.benchmarks.memory", case, impl, "--allocator", allocator]
    cmd += ["--quick"] if quick else []
    cmd += ["--threads", str(threads)] if threads else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"peak memory of {case}/{impl} failed: {done.stderr.strip()[-500:]}")
    return int(done.stdout.strip().splitlines()[-1])


def _trim() -> None:
    """glibc's ``malloc_trim(0)``: return freed heap memory to the system (elsewhere nothing)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)


def _measure(case_name: str, impl_name: str, quick: bool) -> int:
    from . import select

    case = select([case_name], quick)[case_name]()
    impl = next((i for i in case.impls if i.name == impl_name), None)
    if impl is None:
        raise ValueError(f"case {case_name!r} has no implementation {impl_name!r}")
    impl.fn()  # warm up: kernels built, thread pools made
    _trim()  # what the warm-up freed goes back to the system, so the measured call pays for its own
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts again from the current one
    before = _status("VmRSS:")
    impl.fn()
    return _status("VmHWM:") - before


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m posenc.benchmarks.memory")
    p.add_argument("case")
    p.add_argument("impl")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--allocator", default="system")
    args = p.parse_args(argv)
    from .harness import set_allocator

    set_allocator(args.allocator)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        print(_measure(args.case, args.impl, args.quick))
    except ValueError as err:  # an unknown case or implementation: one line, exit 2
        print(f"python -m posenc.benchmarks.memory: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
