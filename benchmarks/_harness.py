"""Shared by the runners in this folder: the harness lives in the package (``posenc.benchmarks``),
so ``posenc bench`` and these scripts time the same code.

Run from a checkout without installing: ``python benchmarks/bench_rope.py [--quick] [--json]``
(``src/`` is put on ``sys.path``). Every option of ``posenc bench`` works (``--repeats``,
``--threads``, ``--allocator keep``, ``--out FILE``); extra positional names pick single cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from posenc.benchmarks.harness import (  # noqa: E402
    Case,
    Impl,
    environment,
    gbps,
    run_case,
    set_allocator,
    tensor_bytes,
    time_interleaved,
)
from posenc.cli import main as _cli_main  # noqa: E402

__all__ = ["Case", "Impl", "environment", "gbps", "main_for", "run_case", "set_allocator", "tensor_bytes",
           "time_interleaved"]


def main_for(group: str, argv: list[str] | None = None) -> int:
    """``posenc bench GROUP`` (or the single cases named in ``argv``) with the remaining options."""
    args = list(sys.argv[1:] if argv is None else argv)
    names = [a for a in args if not a.startswith("-") and not _is_option_value(args, a)]
    return _cli_main(["bench", *([] if names else [group]), *args])


def _is_option_value(args: list[str], item: str) -> bool:
    i = args.index(item)
    return i > 0 and args[i - 1] in ("--repeats", "--threads", "--allocator", "--out")
