"""``posenc bench``: posenc against its peers, in one run, next to a same-run copy of the same bytes.

Cases live in :mod:`posenc.benchmarks` (``rope``, ``sinusoidal``, ``embedding``, ``bias``,
``train_step``); ``benchmarks/*.py`` in the repository are thin runners of the same code.

JSON (``--json``, or ``--out FILE``)::

    {"schema": 1, "quick": false, "environment": {cpu, cores, torch, threads, allocator,
     malloc_env, loadavg, ...},
     "cases": [{"case", "description", "params", "bytes",
                "results": {impl: {"kind", "layout", "note", "median_s", "q1_s", "q3_s", "gbps",
                                   "limit", "of_limit", "of_limit_q1", "of_limit_q3",
                                   "of_limit_medians", "copy_fraction",
                                   and for an impl timed next to another one: "versus",
                                   "versus_ratio", "versus_q1", "versus_q3"}},
                "copy_gbps", "clone_gbps",
                "speedup": {posenc impl: {peer impl: peer median / posenc median}},
                "skipped": {impl: reason}, "loadavg_before", "loadavg_after"}]}

Speed is never asserted anywhere: figures depend on the machine and its load, which the output
records with every case.
"""

from __future__ import annotations

import argparse
import json
import sys

from .._threads import check_threads

__all__ = ["bench_args", "bench_run", "run"]

SCHEMA = 1

#: the peers' import names and the packages that provide them (the ``bench`` extra)
PEERS = {
    "transformers": "transformers",
    "rotary_embedding_torch": "rotary-embedding-torch",
    "x_transformers": "x-transformers",
}


def missing_peers() -> list[str]:
    """The peer packages that are not installed (found without importing them)."""
    import importlib.util

    return [package for module, package in PEERS.items() if importlib.util.find_spec(module) is None]


def peers_hint() -> str | None:
    """One line saying how to enable the comparisons that cannot run, or ``None``."""
    missing = missing_peers()
    if not missing:
        return None
    return (
        f"not installed, so not compared: {', '.join(missing)}; to compare with them: "
        "pip install 'posenc[bench]' (or pip install " + " ".join(missing) + ")"
    )


def bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "cases",
        nargs="*",
        metavar="CASE",
        help="groups (rope, sinusoidal, embedding, bias, train_step) or single cases; default all",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes, 3 repeats, no torch.compile")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per case (default 7; --quick 3)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--allocator", default="system", help="system (default) or keep: glibc keeps freed memory")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--markdown", action="store_true", help="Markdown tables (as in benchmarks/RESULTS.md)")
    p.add_argument(
        "--from",
        dest="from_file",
        default=None,
        metavar="JSON",
        help="run nothing: print the tables of a saved run (--out or --json output)",
    )


def run(
    names: list[str] | None = None,
    *,
    quick: bool = False,
    repeats: int | None = None,
    threads: int | None = None,
    allocator: str = "system",
    progress=None,
) -> dict:
    """Run cases and return the JSON-ready report (see the module docstring).

    Args:
        names: group or case names (:func:`posenc.benchmarks.select`); None or empty = all.
        quick: tiny shapes and few repeats (what tests run).
        repeats: timed rounds per case.
        threads: intra-op threads for the run.
        allocator: a key of :data:`posenc.benchmarks.harness.ALLOCATORS`.
        progress: optional callable receiving each finished :class:`CaseResult`.
    """
    import torch

    from . import select
    from .harness import environment, run_case, set_allocator
    from .memory import peak_bytes

    set_allocator(allocator)
    if threads is not None:
        torch.set_num_threads(check_threads(threads, "threads"))
    repeats = repeats if repeats is not None else (3 if quick else 7)
    builders = select(list(names or []), quick)
    report = {"schema": SCHEMA, "quick": quick, "environment": environment(), "cases": []}
    for build in builders.values():
        case = build()
        result = run_case(case, repeats=repeats, warmup=1, min_time=0.001 if quick else 0.005)
        impls = [i.name for i in case.impls] if case.memory else []
        del case  # its tensors: the memory probes run in fresh processes
        for impl in impls:
            try:
                peak = peak_bytes(result.name, impl, quick=quick, threads=threads, allocator=allocator)
            except RuntimeError as err:  # one failed probe: recorded, the run goes on
                result.results[impl]["peak_error"] = str(err)
                continue
            result.results[impl]["peak_mb"] = None if peak is None else peak / 1e6
        report["cases"].append(result.to_json())
        if progress is not None:
            progress(result)
    report["environment_after"] = environment()
    return report


def _print_saved(args: argparse.Namespace) -> int:
    """``posenc bench --from FILE``: a saved run's tables (plain or ``--markdown``)."""
    from .harness import environment_line
    from .tables import case_result_from_json, format_case

    if args.cases or args.json or args.out:
        raise ValueError("--from prints a saved run: drop case names, --json and --out")
    try:
        with open(args.from_file) as f:
            saved = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--from {args.from_file}: cannot read a JSON report ({err})") from err
    keys = ("schema", "environment", "cases")
    if not isinstance(saved, dict) or saved.get("schema") != SCHEMA or any(k not in saved for k in keys):
        raise ValueError(
            f"--from {args.from_file}: not a posenc bench report (schema {SCHEMA}, "
            "written by posenc bench --out or --json)"
        )
    env = saved["environment"]
    print(environment_line(env) + f"; started {env.get('date', '?')}")
    for case in saved["cases"]:
        print(("\n" if args.markdown else "") + format_case(case_result_from_json(case), args.markdown))
    return 0


def bench_run(args: argparse.Namespace) -> int:
    from .._paths import check_output_file, write_json
    from . import all_cases
    from .harness import environment_line
    from .tables import format_case

    if args.from_file:
        return _print_saved(args)
    if args.list:
        for name in all_cases(args.quick):
            print(name)
        return 0
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads is not None:  # before the environment line is printed or torch's pool is sized
        check_threads(args.threads)
    if args.out:
        check_output_file(args.out)  # before the benchmark runs, not after

    def show(result) -> None:
        if not args.json:
            print(("\n" if args.markdown else "") + format_case(result, args.markdown), flush=True)

    if not args.json:
        import torch

        from .harness import set_allocator

        set_allocator(args.allocator)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        print(environment_line(), flush=True)
    from .checks import BenchmarkMismatchError

    try:
        report = run(
            args.cases,
            quick=args.quick,
            repeats=args.repeats,
            threads=args.threads,
            allocator=args.allocator,
            progress=show,
        )
    except BenchmarkMismatchError as err:  # a wrong implementation, not a user's mistake: exit 1
        print(f"posenc bench: failed: {err}", file=sys.stderr)
        return 1
    text = json.dumps(report, indent=2)
    if args.out:
        write_json(args.out, report)
    if args.json:
        sys.stdout.write(text + "\n")
    elif peers_hint() is not None:
        print("\n" + peers_hint())
    return 0
