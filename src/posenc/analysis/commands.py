"""``posenc verify``, ``posenc plot`` and ``posenc report``: argument parsers and runners.

``cli.py`` imports this module only when one of these commands runs, so ``import posenc`` and
``posenc list`` never import matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = [
    "PLOT_KIND_NAMES",
    "plot_args",
    "plot_run",
    "report_args",
    "report_context",
    "report_run",
    "verify_args",
    "verify_run",
]

#: the names of ``plots.PLOT_KINDS``, here so that ``posenc plot --help`` and its argument errors
#: need no matplotlib or torch (tests/test_cli.py checks the two agree)
PLOT_KIND_NAMES = (
    "heatmap",
    "waves",
    "similarity",
    "frequencies",
    "surface",
    "kernel",
    "kernel_curve",
    "bias",
    "scalings",
    "grid",
    "axes",
)


# ---------------------------------------------------------------------------------------------- verify
def verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("schemes", nargs="*", metavar="SCHEME", help="schemes to check (default: all registered)")
    p.add_argument(
        "--property",
        action="append",
        dest="properties",
        metavar="NAME",
        help="check only this property (repeatable); default: all",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="one row per check: value, threshold and how it was measured",
    )


def _matrix(results) -> list[str]:
    """Scheme rows x property columns (numbered, with a legend), each cell the check's status."""
    props = list(dict.fromkeys(r.property for r in results))
    schemes = list(dict.fromkeys(r.scheme for r in results))
    cell = {(r.scheme, r.property): "-" if r.status == "n/a" else r.status for r in results}
    w_s = max(len("scheme"), *map(len, schemes))
    lines = [f"{'scheme':<{w_s}}" + "".join(f"{i:>6}" for i in range(1, len(props) + 1))]
    lines += [f"{s:<{w_s}}" + "".join(f"{cell.get((s, p), ''):>6}" for p in props) for s in schemes]
    legend = [f"{i} {p}" for i, p in enumerate(props, 1)]
    lines.append("")
    lines += ["  ".join(legend[i : i + 5]) for i in range(0, len(legend), 5)]
    lines.append("pass: holds; FAIL: a promised property fails; no: fails, not promised; -: does not apply")
    lines.append("values, thresholds and how each was measured: posenc verify --verbose")
    return lines


def _details(results) -> list[str]:
    """One row per check; a reason repeated for the same scheme is printed once."""
    w_s = max(len("scheme"), *(len(r.scheme) for r in results))
    w_p = max(len("property"), *(len(r.property) for r in results))
    lines = [
        f"{'scheme':<{w_s}}  {'property':<{w_p}}  {'status':<6}  {'value':>10}  {'threshold':>12}  detail"
    ]
    last = None
    for r in results:
        value = "-" if r.value is None else f"{r.value:.3g}"
        thr = "-" if r.threshold is None else f"{r.comparison} {r.threshold:.3g}"
        mark = r.status + ("" if r.promised or not r.applies else "*")
        reason = '"' if (r.scheme, r.reason) == last else r.reason
        last = (r.scheme, r.reason)
        lines.append(f"{r.scheme:<{w_s}}  {r.property:<{w_p}}  {mark:<6}  {value:>10}  {thr:>12}  {reason}")
    lines.append("\n* not promised by the scheme (informational).")
    return lines


def verify_run(args: argparse.Namespace) -> int:
    """Print the property matrix (``--verbose``: every check's details); exit 1 when a scheme
    breaks a property it promises."""
    from .properties import verify

    results = verify(args.schemes or None, args.properties)
    broken = [r for r in results if r.broken_promise]
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
        return 1 if broken else 0
    print("\n".join(_details(results) if args.verbose else _matrix(results)))
    print(
        f"{len(broken)} broken promise(s): " + ", ".join(f"{r.scheme}.{r.property}" for r in broken)
        if broken
        else "Every scheme keeps every property it promises."
    )
    return 1 if broken else 0


# ---------------------------------------------------------------------------------------------- plot
def plot_args(p: argparse.ArgumentParser) -> None:
    kinds = "{" + ",".join(PLOT_KIND_NAMES) + "}"
    p.usage = f"%(prog)s SCHEME --kind {kinds} -o FILE\n       %(prog)s embeddings --checkpoint PATH -o FILE"
    p.add_argument(
        "scheme", help="a registered scheme, e.g. sinusoidal; or `embeddings` (needs --checkpoint)"
    )
    p.add_argument(
        "--kind",
        choices=PLOT_KIND_NAMES,
        help="required for a scheme (not for embeddings): %(choices)s",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="output image, .png or .svg")
    emb = p.add_argument_group("posenc plot embeddings: a trained model's token space")
    emb.add_argument(
        "--checkpoint", metavar="PATH", help="a `posenc train`/`extrapolate` checkpoint or model file"
    )
    emb.add_argument("--method", choices=("pca", "tsne"), default="pca", help="2D projection (default pca)")
    emb.add_argument(
        "--tokenizer", metavar="PATH", help="tokenizer.json for labels (byte-level models need none)"
    )
    emb.add_argument(
        "--top-k", type=int, default=300, help="project the K most frequent tokens (default 300)"
    )


def plot_run(args: argparse.Namespace) -> int:
    from .._paths import check_output_file

    check_output_file(args.output, "-o")  # before any rendering
    if args.scheme == "embeddings":
        from .embeddings import plot_embeddings_run

        return plot_embeddings_run(args)
    if args.kind is None:
        raise ValueError(f"--kind is required for a scheme: one of {', '.join(PLOT_KIND_NAMES)}")
    from .plots import plot

    path = plot(args.scheme, args.kind, args.output)
    print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------------------------------------- report
def report_args(p: argparse.ArgumentParser) -> None:
    from .context import DEFAULT_CONTEXT

    p.add_argument(
        "-o",
        "--output",
        default="report",
        metavar="DIR",
        help="output folder; the page is DIR/index.html (default: report)",
    )
    p.add_argument(
        "schemes", nargs="*", metavar="SCHEME", help="schemes to include (default: all registered)"
    )
    sizes = p.add_argument_group("sizes the schemes are built with")
    for flag, key in (
        ("--d-model", "d_model"),
        ("--head-dim", "head_dim"),
        ("--num-heads", "num_heads"),
        ("--max-len", "max_len"),
    ):
        sizes.add_argument(flag, type=int, metavar="N", help=f"default {DEFAULT_CONTEXT[key]}")
    form = sizes.add_mutually_exclusive_group()
    form.add_argument(
        "--causal",
        action="store_true",
        help="build schemes as a causal decoder would (the default; T5's one-directional buckets)",
    )
    form.add_argument(
        "--bidirectional",
        action="store_true",
        help="build schemes as an encoder would (keys on both sides of the query)",
    )
    train = p.add_argument_group("learnable schemes")
    how = train.add_mutually_exclusive_group()
    how.add_argument(
        "--fast",
        action="store_true",
        help="train nothing: learnable schemes show their random initial values (the page says so)",
    )
    how.add_argument(
        "--study",
        metavar="DIR",
        help="a `posenc extrapolate --out DIR` study: show its results and use its trained checkpoints",
    )
    train.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where the report's trained models and drawn scheme sections are kept and reused "
        "(default ~/.cache/posenc/report; --fast keeps nothing unless this is given)",
    )


def report_context(args: argparse.Namespace) -> dict:
    """The sizes given on the command line, checked (``--head-dim`` etc.), as a scheme context."""
    from .._validate import check_int

    ctx: dict = {}
    for flag, key in (
        ("--d-model", "d_model"),
        ("--head-dim", "head_dim"),
        ("--num-heads", "num_heads"),
        ("--max-len", "max_len"),
    ):
        value = getattr(args, key)
        if value is not None:
            ctx[key] = check_int(value, flag, minimum=2 if key != "num_heads" else 1)
            if key in ("d_model", "head_dim") and value % 2:
                raise ValueError(f"{flag} must be even (pairs of dimensions rotate together), got {value}")
            if value > 8192:
                raise ValueError(f"{flag}={value} is too large for a page of figures; use at most 8192")
    if getattr(args, "bidirectional", False):
        ctx["causal"] = False
    return ctx


def report_run(args: argparse.Namespace) -> int:
    from .._paths import check_folder
    from .report import build_report

    if args.output == "-":
        raise ValueError(
            "-o '-': the report is a folder holding index.html, not a stream to standard output; "
            "give a folder, e.g. -o report"
        )
    check_folder(args.output, "-o")
    if args.cache_dir is not None:
        check_folder(args.cache_dir, "--cache-dir")
    ctx = report_context(args)
    t0 = time.perf_counter()
    path = build_report(
        args.output,
        args.schemes or None,
        context=ctx,
        fast=args.fast,
        study=args.study,
        cache_dir=args.cache_dir,
        log=lambda line: print(line, file=sys.stderr),
    )
    print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)",
        file=sys.stdout,
    )
    return 0
