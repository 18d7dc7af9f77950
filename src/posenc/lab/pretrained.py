"""``posenc extrapolate --model PATH``: the lab on a model it did not train, from the command line.

The model is scored as it is and under each scaling its scheme declares, at each length
(:mod:`posenc.lab.pretrained_eval`), and with ``--finetune-len``/``--finetune-steps`` fine-tuned
next to the lab's control (:mod:`posenc.lab.finetune_pretrained`); the tables are printed and
``--out DIR`` receives ``results.json``. The study's flags that mean something for one loaded
model are read from the same namespace (``--train-len``, ``--eval-lens``, ``--variants``,
``--corpus``, ``--max-chars``, ``--eval-windows``, ``--score-len``, ``--split-seed``,
``--val-fraction``, ``--batch-size``, ``--lr``, ``--seed``, ``--quick``, ``--device``,
``--threads``, ``--workers``, ``--cluster``, ``--out``, ``--overwrite``); the others are refused.
With ``--workers N`` or ``--cluster ADDRESS`` the variants and the fine-tuning runs are jobs on
several processes or machines (:mod:`posenc.lab.pretrained_jobs`), with the same numbers.

This module is imported by the ``extrapolate`` parser, so it imports torch only inside :func:`run`
(``posenc extrapolate --help`` stays light).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from .._threads import check_threads

__all__ = ["ARTIFACTS", "QUICK", "add_model_flags", "run"]

#: ``--quick``: the corpus subset of the lab's quick preset, fewer windows, lengths up to ``4L``,
#: fewer probe trials.
QUICK = {"max_chars": 3_000_000, "eval_windows": 16, "multiples": (1, 2, 4), "probe_trials": 16}

#: What ``--out`` holds (present: the folder already holds a run).
ARTIFACTS = ("results.json",)


def _comma_list(spec: str, kind: type, flag: str) -> tuple:
    """``"a,b"`` -> ``("a", "b")`` converted with ``kind``; a ``ValueError`` naming ``flag``. (The
    study's own parser, ``commands.parse_list``, lives in the module that imports this one.)"""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    try:
        values = tuple(kind(x) for x in items)
    except ValueError:
        values = ()
    if not values:
        raise ValueError(f"{flag} {spec!r} is not a comma list of {kind.__name__}s (e.g. 128,256)")
    return values


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The flags ``posenc extrapolate`` adds for a pretrained model (the rest are the study's:
    --train-len, --eval-lens, --variants, --corpus, --max-chars, --eval-windows, --score-len,
    --finetune-len, --finetune-steps, --batch-size, --lr, --seed, --split-seed, --quick, --out)."""
    parser.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="evaluate (and with --finetune-len, fine-tune) this Hugging Face checkpoint folder or "
        "posenc save instead of training models; --train-len defaults to its config's length",
    )
    parser.add_argument(
        "--peft",
        default=None,
        choices=["lora"],
        help="with --model --finetune-len: parameter-efficient fine-tuning through the peft package "
        "(default: every parameter)",
    )


#: Study flags that mean nothing for one loaded model: (attribute, the flag as typed).
_STUDY_ONLY = (
    ("schemes", "--schemes"),
    ("seeds", "--seeds"),
    ("vary", "--vary"),
    ("option", "--option"),
    ("from_file", "--from"),
    ("compare", "--compare"),
    ("regenerate", "--regenerate"),
    ("markdown", "--markdown"),
    ("resume", "--resume"),
)

#: The configuration fields ``--model`` reads; every other one (the model's shape, the training
#: schedule, the task) describes a model the lab would train itself, and is refused.
_MODEL_FIELDS = frozenset(
    {
        "train_len",
        "eval_lens",
        "variants",
        "corpus",
        "max_chars",
        "eval_windows",
        "score_len",
        "split_seed",
        "val_fraction",
        "device",
        "threads",
        "workers",
        "cluster",
        "finetune_len",
        "finetune_steps",
        "batch_size",
        "lr",
        "seed",
        "task",
    }
)

#: Flags that set fine-tuning, meaningless without --finetune-len.
_FINETUNE_ONLY = (("batch_size", "--batch-size"), ("lr", "--lr"), ("seed", "--seed"), ("peft", "--peft"))


def _check_flags(args: argparse.Namespace) -> None:
    given = [flag for attr, flag in _STUDY_ONLY if getattr(args, attr, None) not in (None, False, [], ())]
    config_fields = getattr(args, "config_fields", {})
    given += [flag for name, flag in config_fields.items() if name not in _MODEL_FIELDS and flag not in given]
    if getattr(args, "task", "lm") != "lm":
        given.append("--task")
    if given:
        raise ValueError(
            f"{', '.join(given)} train models of their own; with --model posenc evaluates (and "
            "fine-tunes) the model given: leave them out"
        )
    ft_len, ft_steps = getattr(args, "finetune_len", None), getattr(args, "finetune_steps", None)
    if (ft_len is None) != (ft_steps is None):
        raise ValueError("--finetune-len and --finetune-steps go together: give both (e.g. 256 and 100)")
    unused = [flag for attr, flag in _FINETUNE_ONLY if getattr(args, attr, None) is not None]
    if unused and ft_len is None:
        raise ValueError(
            f"{', '.join(unused)} set how to fine-tune: give them with --finetune-len and --finetune-steps"
        )


def _given(args: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def run(args: argparse.Namespace) -> int:
    """``posenc extrapolate --model PATH``: evaluate (and fine-tune), print the tables, write
    ``--out/results.json``. A user mistake raises ``ValueError`` (one line, exit code 2).

    Every check (the flags, the model, the text, the plan) runs before ``--out`` is taken, so a
    mistake leaves a previous run there as it was, even with ``--overwrite``."""
    import torch

    from .runs import RunFolder, check_folder

    _check_flags(args)
    jobs = _jobs(args)
    out = getattr(args, "out", None)
    overwrite = bool(getattr(args, "overwrite", False))
    if out is not None:
        check_folder(out, "--out")
        previous = Path(out) / ARTIFACTS[0]
        if not overwrite and previous.is_file() and not previous.is_symlink():
            # said here, not by RunFolder, whose message offers --resume: a loaded model's run has none
            raise ValueError(
                f"--out {str(out)!r} already holds a run ({ARTIFACTS[0]}); replace it with --overwrite "
                "or choose another folder"
            )
    if getattr(args, "threads", None) is not None:  # capped: 10^5 threads crash OpenMP
        torch.set_num_threads(check_threads(args.threads))
    start = (list(os.getloadavg()), time.perf_counter())
    try:
        setup = _setup(args)
        plan = _plan(args, setup)
        if out is None:
            return _run(args, setup, plan, jobs, start, None)
        with RunFolder(out, ARTIFACTS, overwrite=overwrite) as folder:
            return _run(args, setup, plan, jobs, start, folder.path)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: results.json is written only at the end
        raise type(err)("no results were written (a loaded model's run does not resume)") from None


def _variants(spec: str | tuple[str, ...] | None) -> tuple[str, ...] | None:
    if spec is None:
        return None  # every variant the scheme declares
    if isinstance(spec, tuple):  # converted by the command's flag: () = none
        return spec
    return () if spec == "none" else _comma_list(spec, str, "--variants")


def _device(spec: str):
    """``--device`` as a ``torch.device``: cpu, or cuda when torch sees that device."""
    import torch

    try:
        device = torch.device(spec)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {spec!r} is not a device posenc runs on; use cpu, cuda or cuda:N")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= count:
        raise ValueError(f"--device {spec} but torch sees {count} CUDA device(s); use --device cpu")
    return device


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`~posenc.lab.pretrained_eval.prepare_pretrained`'s options from the flags (picklable:
    a worker rebuilds the same run from them)."""
    from .pretrained_eval import DEFAULT_MULTIPLES, PROBE_TRIALS

    quick = bool(getattr(args, "quick", False))
    eval_lens = getattr(args, "eval_lens", None)
    return {
        "train_len": getattr(args, "train_len", None),
        "eval_lens": _comma_list(eval_lens, int, "--eval-lens") if isinstance(eval_lens, str) else eval_lens,
        "variants": _variants(getattr(args, "variants", None)),
        "corpus": _given(args, "corpus", "stdlib"),
        "max_chars": _given(args, "max_chars", QUICK["max_chars"] if quick else None),
        "eval_windows": _given(args, "eval_windows", QUICK["eval_windows"] if quick else 32),
        "score_len": getattr(args, "score_len", None),
        "split_seed": _given(args, "split_seed", 0),
        "val_fraction": _given(args, "val_fraction", 0.1),
        "probe_trials": QUICK["probe_trials"] if quick else PROBE_TRIALS,
        "multiples": QUICK["multiples"] if quick else DEFAULT_MULTIPLES,
        "device": str(_device(_given(args, "device", "cpu"))),
    }


def _setup(args: argparse.Namespace):
    """The :class:`~posenc.lab.pretrained_eval.Setup` the flags describe (every check runs here)."""
    from .pretrained_eval import prepare_pretrained

    return prepare_pretrained(args.model, **_options(args))


def _jobs(args: argparse.Namespace) -> dict[str, Any] | None:
    """Where the jobs run (``workers``, ``cluster``, ``threads`` per job), or None: here, serially."""
    workers, cluster = getattr(args, "workers", None), getattr(args, "cluster", None)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"--workers must be >= 1, got {workers!r}")
    if cluster is not None:
        from .executor import check_scheduler

        check_scheduler(cluster)  # before any work: the address answers
    elif workers is None or workers == 1:
        return None
    threads = getattr(args, "threads", None)
    return {"workers": workers or 1, "cluster": cluster, "threads": 1 if threads is None else threads}


def _processes(jobs: dict[str, Any] | None, setup, plan) -> int | None:
    """The local processes the jobs ran on: ``--workers``, but never more than a phase's jobs (the
    scoring: one per variant and the model as it is; the fine-tuning: one per run); None on a
    cluster (its workers are the scheduler's)."""
    if jobs is None:
        return 1
    if jobs["cluster"] is not None:
        return None
    most = max(1 + len(setup.variants), 0 if plan is None else len(plan.runs(setup)))
    return min(jobs["workers"], most)


def _where(env: dict[str, Any]) -> str:
    """``"2 worker(s) x 1 thread(s)"``, ``"cluster ADDRESS, 1 thread(s) per job"`` or ``"4 thread(s)"``."""
    if env["cluster"] is not None:
        return f"cluster {env['cluster']}, {env['threads']} thread(s) per job"
    if env["workers"] > 1:
        return f"{env['workers']} worker(s) x {env['threads']} thread(s)"
    return f"{env['threads']} thread(s)"


def _job_inputs(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The model's path and :func:`_options` as a job gets them: paths made absolute, so a worker
    started elsewhere (a Dask worker's own directory) reads the same files."""
    options = _options(args)
    corpus = options["corpus"]
    if corpus != "stdlib" and os.path.exists(corpus):
        options["corpus"] = os.path.abspath(corpus)
    return os.path.abspath(args.model), options


def _plan(args: argparse.Namespace, setup):
    """The fine-tuning plan (``None`` without --finetune-len), checked before any work."""
    if getattr(args, "finetune_len", None) is None:
        return None
    from .finetune_pretrained import FinetunePlan

    return FinetunePlan.checked(
        setup,
        args.finetune_len,
        args.finetune_steps,
        batch_size=getattr(args, "batch_size", None),
        lr=getattr(args, "lr", None),
        seed=_given(args, "seed", 0),
        peft=getattr(args, "peft", None),
    )


def _run(
    args: argparse.Namespace, setup, plan, jobs, start: tuple[list[float], float], out: Path | None
) -> int:
    """Score (and fine-tune) the checked ``setup``/``plan``, here or as ``jobs`` (:func:`_jobs`);
    ``start``: the load average and clock when the command began."""
    import torch

    from .._paths import write_json
    from .finetune_pretrained import format_finetune
    from .pretrained_eval import evaluate_setup, format_pretrained

    load_avg, t0 = start
    if jobs is None:
        results = evaluate_setup(setup)
    else:
        from .pretrained_jobs import score_all

        results = evaluate_setup(setup, score_all(*_job_inputs(args), **jobs))
    if plan is not None:
        progress = False if getattr(args, "no_progress", False) else None
        if jobs is None:
            results["finetune"] = plan.run(setup, results, progress=progress)
        else:
            from .pretrained_jobs import train_all

            results["finetune"] = plan.run(
                setup, results, train_all=train_all(*_job_inputs(args), plan, **jobs)
            )
    results["wall_s"] = time.perf_counter() - t0
    results["model"] = str(args.model)
    env = {
        "device": str(setup.device),
        "dtype": str(next(setup.model.parameters()).dtype).removeprefix("torch."),
        "threads": torch.get_num_threads() if jobs is None else jobs["threads"],
        "workers": _processes(jobs, setup, plan),
        "cluster": None if jobs is None else jobs["cluster"],
        "quick": bool(getattr(args, "quick", False)),
    }
    results["environment"] = {**env, "load_avg_start": load_avg, "load_avg_end": list(os.getloadavg())}
    print(format_pretrained(results))
    if plan is not None:
        print("\n".join(format_finetune(results, setup.text.unit)))
    print(
        f"\nwall time {results['wall_s']:.0f} s on {env['device']} ({env['dtype']} weights, "
        f"{_where(env)}); load "
        f"average at start/end {load_avg[0]:.2f}/{results['environment']['load_avg_end'][0]:.2f}"
    )
    if out is not None:
        write_json(out / "results.json", results)
        print(f"wrote {out / 'results.json'}")
    return 0
