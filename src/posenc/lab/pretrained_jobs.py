"""``posenc extrapolate --model PATH --workers N`` (or ``--cluster ADDRESS``): a loaded model's run
on several processes or machines, through the executor the lab's studies use
(:func:`~posenc.lab.executor.cell_executor`: local processes that die with this one, or a Dask cluster).

The run splits into jobs: the model scored as it is and under each variant, then (with
``--finetune-len``) each fine-tuning run and the control. A job is a plain function of picklable
arguments: the model's path and the options that chose the text, the windows and the lengths
(:func:`~posenc.lab.pretrained_eval.prepare_pretrained`'s). Each worker loads the model and reads
the text itself, and draws the same windows (they depend on the split seed alone), so every job
computes what it would in one process; the parent combines the results as a one-process run does.
On a cluster the model's folder and the corpus must be readable at the same paths on every worker
(a shared file system).

::

    score = score_all("exported-model", options, threads=1, workers=4, cluster=None)
    results = evaluate_setup(setup, score)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .executor import cell_executor, finished
from .finetune_pretrained import FinetunePlan
from .pretrained_eval import Setup, prepare_pretrained

__all__ = ["score_all", "score_job", "train_all", "train_job"]


def _setup(path: str, options: dict[str, Any], threads: int | None) -> Setup:
    """The run's :class:`~posenc.lab.pretrained_eval.Setup`, rebuilt in a worker."""
    if threads is not None:
        torch.set_num_threads(threads)
    return prepare_pretrained(path, **options)


def score_job(path: str, options: dict[str, Any], threads: int | None, variant: str | None) -> list[dict]:
    """One job: the model at ``path`` scored as it is (``None``) or under ``variant`` at every
    length (:meth:`~posenc.lab.pretrained_eval.Setup.score_variant`)."""
    return _setup(path, options, threads).score_variant(variant)


def train_job(
    path: str, options: dict[str, Any], threads: int | None, plan: dict[str, Any], run: tuple
) -> tuple[list[dict], dict[str, Any]]:
    """One job: a fine-tuning run ``(name, variant, control)`` of the plan (the fields of a checked
    :class:`~posenc.lab.finetune_pretrained.FinetunePlan`), trained and scored."""
    setup = _setup(path, options, threads)
    return FinetunePlan(**plan).train_and_score(setup, *run, progress=False)


def _map(fn: Callable, path: str, options: dict, threads: int | None, items: list[tuple], workers, cluster):
    """``[fn(path, options, threads, *item) for item in items]``, the jobs run at once on the
    executor (at most ``workers`` local processes, never more than there are jobs); the results in
    the order of ``items``."""
    with cell_executor(max(1, min(workers, len(items))), cluster) as executor:
        futures = [executor.submit(fn, path, options, threads, *item) for item in items]
        lost = "start it again and rerun (a loaded model's run does not resume)"
        return list(finished(futures, cluster, "run", lost, ordered=True))


def score_all(
    path: str, options: dict[str, Any], *, threads: int | None, workers: int, cluster: Any = None
) -> Callable[[list], list]:
    """The ``score_all`` of :func:`~posenc.lab.pretrained_eval.evaluate_setup`: one
    :func:`score_job` per variant, at once."""
    return lambda variants: _map(
        score_job, path, options, threads, [(v,) for v in variants], workers, cluster
    )


def train_all(
    path: str,
    options: dict[str, Any],
    plan: FinetunePlan,
    *,
    threads: int | None,
    workers: int,
    cluster: Any = None,
) -> Callable[[list], list]:
    """The ``train_all`` of :meth:`~posenc.lab.finetune_pretrained.FinetunePlan.run`: one
    :func:`train_job` per run, at once."""
    fields = dataclasses.asdict(plan)
    return lambda runs: _map(train_job, path, options, threads, [(fields, r) for r in runs], workers, cluster)
