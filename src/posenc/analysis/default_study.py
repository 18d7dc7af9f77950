"""The study the report shows when it is given none: a few kB of a real run's summary, shipped
with posenc, with the command, version and date that produced it.

``posenc report`` answers "which scheme?" on every page: without ``--study DIR`` it renders the
summary in ``data/which_scheme.json`` (paired deltas and sliding-window bits/byte, each a mean
with its 95% interval, per run and evaluation length). The file is made from a finished
``posenc extrapolate --out DIR`` folder by::

    python -m posenc.analysis.default_study DIR --command "posenc extrapolate ... --out DIR"

which keeps only what the page draws, and records where it came from.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["SUMMARY_FILE", "check_study", "load_default_study", "main", "study_summary"]

#: The shipped summary (package data).
SUMMARY_FILE = Path(__file__).with_name("data") / "which_scheme.json"

#: Configuration fields the page quotes.
_CONFIG_FIELDS = (
    "mode",
    "schemes",
    "seeds",
    "train_len",
    "eval_lens",
    "steps",
    "batch_size",
    "d_model",
    "num_layers",
    "num_heads",
    "corpus",
    "max_chars",
)

#: Per-row fields the page draws (each metric keeps only _INTERVAL_FIELDS).
_ROW_FIELDS = ("name", "scheme", "variant", "length", "seeds", "delta_over")
_METRICS = ("delta", "bpb_window")
#: Per-interval fields kept: the page says what an interval covers (``over``: seeds, documents).
_INTERVAL_FIELDS = ("mean", "low", "high", "n", "over")


def check_study(results: Any, source: str) -> dict[str, Any]:
    """``results`` if it has the structure the page reads, else a one-line ValueError naming
    ``source`` (the file) and the missing or malformed field.

    Only the structure is checked (``config`` with ``mode``, ``train_len``, ``eval_lens`` and
    ``seeds``; ``summary`` a list of rows with ``name`` and ``length``); values are shown as they
    are, escaped, so a wrong type in a number field is visible on the page, never run.
    """

    def bad(field: str, what: str) -> ValueError:
        return ValueError(
            f"{source}: field {field} {what}; give the results.json of a finished `posenc extrapolate` run"
        )

    if not isinstance(results, dict):
        raise bad("(top level)", f"is a {type(results).__name__}, not an object")
    cfg = results.get("config")
    if not isinstance(cfg, dict):
        raise bad("'config'", "is missing" if cfg is None else "is not an object")
    for key, kind in (("mode", str), ("train_len", object), ("eval_lens", list), ("seeds", list)):
        if key not in cfg:
            raise bad(f"'config.{key}'", "is missing")
        if not isinstance(cfg[key], kind):
            raise bad(f"'config.{key}'", f"is a {type(cfg[key]).__name__}, not a {kind.__name__}")
    summary = results.get("summary")
    if not isinstance(summary, list):
        raise bad("'summary'", "is missing" if summary is None else "is not a list")
    for i, row in enumerate(summary):
        if not isinstance(row, dict) or "name" not in row or "length" not in row:
            raise bad(f"'summary[{i}]'", "is not an object with 'name' and 'length'")
    return results


def study_summary(results: dict[str, Any], command: str, date: str | None = None) -> dict[str, Any]:
    """The part of a study's ``results.json`` the page shows, with its provenance.

    Args:
        results: a finished study's results (``posenc extrapolate --out DIR``'s ``results.json``).
        command: the exact command that produced it (shown on the page).
        date: when it ran (default: today, UTC).
    """
    import torch

    from .. import __version__

    check_study(results, "results")
    cfg = results["config"]
    rows = []
    for row in results["summary"]:
        if row.get("setting"):
            continue  # the page shows one setting per run; --vary studies are shown with --study
        out = {k: row.get(k) for k in _ROW_FIELDS}
        for metric in _METRICS:
            cell = row.get(metric)
            out[metric] = None if cell is None else {k: cell.get(k) for k in _INTERVAL_FIELDS if k in cell}
        rows.append(out)
    return {
        "provenance": {
            "command": command,
            "posenc": __version__,
            "date": date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "corpus_sha256": (results.get("corpus") or {}).get("sha256"),
        },
        "config": {k: cfg.get(k) for k in _CONFIG_FIELDS if k in cfg},
        "summary": rows,
    }


def load_default_study() -> dict[str, Any] | None:
    """The shipped summary, or None when the file is absent (a source tree without it)."""
    if not SUMMARY_FILE.is_file():
        return None
    return check_study(json.loads(SUMMARY_FILE.read_text(encoding="utf-8")), str(SUMMARY_FILE.name))


def main(argv: list[str] | None = None) -> int:
    """Write :data:`SUMMARY_FILE` (or ``--output``) from a finished study folder."""
    p = argparse.ArgumentParser(
        prog="python -m posenc.analysis.default_study", description=__doc__.split("\n")[0]
    )
    p.add_argument("study", help="a finished `posenc extrapolate --out DIR` folder")
    p.add_argument("--command", required=True, help="the exact command that produced it")
    p.add_argument("--date", default=None, help="when it ran, YYYY-MM-DD (default today)")
    p.add_argument("--output", default=str(SUMMARY_FILE), help="where to write (default: the package's file)")
    args = p.parse_args(argv)
    path = Path(args.study) / "results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        summary = study_summary(check_study(results, str(path)), args.command, args.date)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from .page import rounded

    # one summary row per line: small (4 significant digits) and readable in a diff
    rows = ",\n".join(json.dumps(r, separators=(",", ":")) for r in rounded(summary["summary"]))
    head = json.dumps({k: v for k, v in summary.items() if k != "summary"}, indent=1)
    Path(args.output).write_text(head[:-2] + ',\n "summary": [\n' + rows + "\n ]\n}\n", encoding="utf-8")
    print(f"wrote {args.output} ({Path(args.output).stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
