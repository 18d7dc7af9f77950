"""The ``posenc`` command.

Each subcommand is one entry in :data:`COMMANDS`: a function that adds its arguments and a
function that runs it. ``posenc --help`` lists them.

Only the chosen subcommand's arguments are built, and torch is imported only by the commands that
compute, so ``posenc --help``, ``--version``, ``list`` and argument errors never load it. Every user
mistake (a bad flag, value, name or path) prints one line, ``posenc CMD: error: ...``, with the
closest valid names when there are some, and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from . import __version__

__all__ = ["COMMANDS", "Parser", "main", "parse_positions"]


class CLIError(Exception):
    """A user error: printed as ``posenc: error: ...`` with exit code 2, no traceback."""


def _suggest(value: str, choices) -> str:
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=3, cutoff=0.6)
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""


class Parser(argparse.ArgumentParser):
    """``argparse`` with posenc's error format: one line on stderr, exit code 2, close matches.

    A value that starts with ``-`` and a digit (``--positions -5:3``) is a value, not a flag.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d")  # no posenc flag starts with a digit

    def error(self, message: str):  # type: ignore[override]
        raise CLIError(message)

    def _check_value(self, action, value):  # invalid choice: add the closest ones
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r} (choose from {choices}){_suggest(value, action.choices)}"
            )


#: The most values ``posenc show`` computes and prints (positions x dims): beyond it, a plot says more.
SHOW_MAX_VALUES = 10_000_000


def parse_positions(spec: str, max_count: int = SHOW_MAX_VALUES):
    """``"0:3"`` -> ``[0, 1, 2]``; ``"0:100:10"`` -> every 10th; ``"0,5,9"`` -> those positions.
    An empty range or more than ``max_count`` positions is a :class:`CLIError` (nothing is allocated)."""
    try:
        if ":" in spec:
            parts = [int(p) if p else None for p in spec.split(":")]
            if len(parts) > 3 or parts[1] is None:
                raise ValueError
            start, stop = parts[0] or 0, parts[1]
            step = parts[2] if len(parts) == 3 and parts[2] is not None else 1
            if step <= 0:
                raise ValueError
            count = max(0, -(-(stop - start) // step))
        else:
            values = [int(p) for p in spec.split(",")]
            count = len(values)
    except ValueError:
        raise CLIError(f"--positions {spec!r} is not START:STOP[:STEP] or a comma list like 0,5,9") from None
    if count == 0:
        raise CLIError(f"--positions {spec!r} is empty: STOP must be larger than START (e.g. 0:8)")
    if count > max_count:
        raise CLIError(
            f"--positions {spec!r} has {count:,} positions, more than {max_count:,}; use a step "
            "(e.g. 0:1000000:1000) or a plot"
        )
    import torch

    if ":" in spec:
        return torch.arange(start, stop, step)
    return torch.tensor(values, dtype=torch.long)


# ---------------------------------------------------------------------------------------------- list
def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _list_run(args: argparse.Namespace) -> int:
    from ._catalog import builtin_schemes  # the scheme files' declarations, read without torch

    rows = builtin_schemes()
    if args.json:
        import json

        print(json.dumps(rows, indent=2, default=str))
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"{'scheme':<{width}}  {'hooks':<18}  summary")
    for r in rows:
        hooks = ",".join(r["hooks"]) or "-"
        print(f"{r['name']:<{width}}  {hooks:<18}  {r['summary']}")
    return 0


# ---------------------------------------------------------------------------------------------- show
def _show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scheme",
        help="an absolute scheme (embed hook: prints its table), e.g. sinusoidal; or a rotation (prints "
        "which position axis turns each dimension of the head), e.g. rope or mrope",
    )
    p.add_argument("--dim", type=int, default=16, help="d_model, or head_dim for a rotation (default 16)")
    p.add_argument("--positions", default="0:3", help="START:STOP[:STEP] or 0,5,9 (default 0:3)")
    p.add_argument("--columns", type=int, default=None, help="show only the first N dimensions")
    p.add_argument("--digits", type=int, default=4, help="decimal digits (default 4)")
    p.add_argument("--variant", default=None, help="sinusoidal variant: vaswani or tensor2tensor")
    p.add_argument("--base", type=float, default=None, help="wavelength base (default 10000)")
    p.add_argument("--max-len", type=int, default=None, help="table size for learned (default: enough)")
    p.add_argument("--seed", type=int, default=0, help="random seed for learned tables")


def _show_run(args: argparse.Namespace) -> int:
    import torch

    from .registry import build, config_keys, scheme_class, schemes

    cls = scheme_class(args.scheme)
    limits = (("--dim", args.dim, 2), ("--digits", args.digits, 0), ("--columns", args.columns, 1))
    for flag, value, low in limits:
        if value is not None and value < low:
            raise CLIError(f"{flag} must be >= {low}, got {value}")
    if "embed" not in cls.hooks and "rotate" in cls.hooks:
        return _show_rotation(args)
    if "embed" not in cls.hooks:
        raise CLIError(
            f"{args.scheme!r} has no table to show: it acts inside attention (hooks: "
            f"{', '.join(cls.hooks) or 'none'}). Show one of: "
            + ", ".join(n for n in schemes() if {"embed", "rotate"} & set(scheme_class(n).hooks))
        )
    if cls.position_dims != 1:
        raise CLIError(f"{args.scheme!r} encodes grids, not sequences: use `posenc plot` for it")
    if args.dim > SHOW_MAX_VALUES:
        raise CLIError(
            f"--dim {args.dim:,} is more than {SHOW_MAX_VALUES:,} values per position; use a smaller --dim"
        )
    positions = parse_positions(args.positions, max_count=SHOW_MAX_VALUES // args.dim)
    options: dict = {"d_model": args.dim}
    for key, value in (("variant", args.variant), ("base", args.base)):
        if value is not None:
            options[key] = value
    torch.manual_seed(args.seed)  # a scheme with trainable values (a learned table) starts from it
    if "max_len" in config_keys(args.scheme):  # a table of max_len rows must hold every position
        options["max_len"] = args.max_len or int(positions.max()) + 1
    scheme = build(args.scheme, **options)
    with torch.no_grad():
        table = scheme.embed(torch.zeros(1, len(positions), args.dim), positions)[0]  # [s, d]
    cols = table.shape[1] if args.columns is None else min(args.columns, table.shape[1])
    print(f"{args.scheme} encoding, d_model={args.dim}, dims 0..{cols - 1}")
    for p, row in zip(positions.tolist(), table[:, :cols].tolist()):
        values = ", ".join(f"{v:.{args.digits}f}" for v in row)
        print(f"position {p}: [{values}]")
    return 0


def _show_rotation(args: argparse.Namespace) -> int:
    """``posenc show`` for a rotation: which position axis turns each dimension of the head."""
    from .analysis.grid import SHOW_MAX_HEAD_DIM, axes_text
    from .analysis.kernel import make_probe

    if args.dim > SHOW_MAX_HEAD_DIM:
        raise CLIError(
            f"--dim {args.dim:,} is wider than {SHOW_MAX_HEAD_DIM:,} for a rotation's head; use less"
        )
    for flag, value in (("--variant", args.variant), ("--max-len", args.max_len)):
        if value is not None:
            raise CLIError(f"{flag} applies to absolute schemes; {args.scheme!r} is a rotation")
    context = {"d_model": args.dim, "head_dim": args.dim, "num_heads": 1}
    config = {"base": args.base} if args.base is not None else None
    try:
        probe = make_probe(args.scheme, context, config)
        print(axes_text(probe, args.digits, args.columns))
    except (ValueError, TypeError) as err:
        raise CLIError(f"posenc show {args.scheme}: {err}") from None
    return 0


# ---------------------------------------------------------------------------------------------- main
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _lazy(module: str, name: str) -> tuple[Callable, Callable]:
    """``(add_args, run)`` for a command living in ``module`` as ``{name}_args``/``{name}_run``,
    imported only when used, so ``posenc list`` does not load matplotlib or tokenizers."""

    def add_args(parser: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(module), f"{name}_args")(parser)

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), f"{name}_run")(args)

    return add_args, run


_ANALYSIS = "posenc.analysis.commands"

#: name -> (help, add arguments, run). Later features add entries here.
COMMANDS: dict[str, Command] = {
    "list": ("list every scheme with its hooks", _list_args, _list_run),
    "show": (
        "print an absolute encoding's values, or which axis turns each dimension of a rotation",
        _show_args,
        _show_run,
    ),
    "encode": (
        "run a text through tokenizer, embedding, positions, LayerNorm, dropout, step by step",
        *_lazy("posenc.text.commands", "encode"),
    ),
    "verify": ("check every scheme's properties (exit 1 on a broken promise)", *_lazy(_ANALYSIS, "verify")),
    "plot": ("draw one plot of a scheme to a PNG or SVG", *_lazy(_ANALYSIS, "plot")),
    "report": ("write the HTML report comparing every scheme", *_lazy(_ANALYSIS, "report")),
    "extrapolate": (
        "train short, test long: one LM per scheme, bits/byte (or task accuracy) vs length",
        *_lazy("posenc.lab.commands", "extrapolate"),
    ),
    "train": (
        "train one byte-level LM with checkpoints, resume and DDP (torchrun)",
        *_lazy("posenc.lab.commands", "train"),
    ),
    "bench": (
        "time posenc against its peers next to a same-run copy",
        *_lazy("posenc.benchmarks.commands", "bench"),
    ),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> tuple[Parser, dict[str, Parser]]:
    """The top-level parser and the subcommand parsers; only the subcommand chosen in ``argv``
    gets its arguments (building the others would import their modules)."""
    parser = Parser(
        prog="posenc", description="Token embeddings and positional encodings: see, check, measure."
    )
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    chosen = _chosen(sys.argv[1:] if argv is None else argv)
    subparsers = {}
    for name, (help_text, add_args, _) in COMMANDS.items():
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            add_args(subparsers[name])
    return parser, subparsers


def _flag_error(extras: list[str], sub: Parser | None) -> str:
    """The message for unrecognized arguments, with the closest flags of the subcommand."""
    flags = [o for a in (sub._actions if sub else []) for o in a.option_strings]
    first = extras[0]
    hint = _suggest(first.split("=")[0], flags) if first.startswith("-") else ""
    what = "argument" if len(extras) == 1 else "arguments"
    return f"unrecognized {what}: {' '.join(extras)}{hint}"


#: OS errors of the storage rather than of posenc: the disk full, the quota used, a read-only disk.
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's ``KeyboardInterrupt``: the same cleanup runs
    (worker processes stopped, temporary files removed), then one line and exit code 143."""


@contextlib.contextmanager
def _sigterm_interrupts():
    """While a command runs, SIGTERM raises :class:`Terminated` (in the main thread only, where
    Python runs signal handlers); the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen(argv)
    prog = f"posenc {chosen}" if chosen in COMMANDS else "posenc"
    try:
        parser, subparsers = build_parser(argv)
        if chosen is not None and chosen not in COMMANDS:
            raise CLIError(
                f"unknown command {chosen!r}; commands: {', '.join(COMMANDS)}{_suggest(chosen, COMMANDS)}"
            )
        args, extras = parser.parse_known_args(argv)
        if extras:
            raise CLIError(_flag_error(extras, subparsers.get(chosen)))
    except CLIError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with _sigterm_interrupts():
            return COMMANDS[args.command][2](args)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (timeout, kill, a supervisor)
        workers = sys.modules.get("posenc.lab.workers")
        if workers is not None:  # a study's worker processes: stopped, not waited for
            workers.stop_pools()
        what = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
        # a command may say what an interruption left (re-raised with one string argument)
        left = err.args[0] if err.args and isinstance(err.args[0], str) else None
        print(
            f"posenc {args.command}: {what}; {left or 'a run folder keeps its finished work (--resume)'}",
            file=sys.stderr,
        )
        return 143 if isinstance(err, Terminated) else 130
    except (CLIError, ValueError, TypeError) as err:
        print(f"posenc {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `posenc ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # after BrokenPipeError, one of its subclasses
        if err.errno in _STORAGE_ERRNOS:  # the disk full or read-only: the user's to fix, one line
            where = f": {err.filename!r}" if err.filename else ""
            print(
                f"posenc {args.command}: error: {err.strerror or err}{where}; free space or write "
                "elsewhere (a run folder continues with --resume)",
                file=sys.stderr,
            )
            return 2
        if err.filename is None:  # not about a path the user gave: a bug, keep its traceback
            raise
        print(
            f"posenc {args.command}: error: {err.strerror or err}: {err.filename!r}; check the path",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
