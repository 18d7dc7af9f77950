"""Train short, test long: the length-extrapolation study (Press et al. 2022) on one machine or many.

One small decoder-only byte-level LM per (scheme, seed), trained at length ``L`` with the same
data, the same batches for a seed (:func:`~posenc.lab.train.batch_at` depends only on seed and
step) and the same budget; then each is scored at a list of lengths ``E`` on the same windows,
sampled across every validation document (:mod:`posenc.lab.evalset`). The verdict "does it
degrade past L" is the **paired delta** (:mod:`posenc.lab.evaluate`): the same target bytes read
deep inside windows of ``E`` minus read in windows of ``L``, with a bootstrap interval over
windows, and across seeds a t interval. RoPE scalings (and any evaluation-time variant a scheme
declares) are applied to the trained weights with factor ``E / L``, as extra rows such as
``rope+yarn``.

A second mode trains on the synthetic tasks of Kazemnejad et al. 2023 (``copy``, ``reverse``,
``addition``, ``sort``, ``parity``; :mod:`posenc.text.tasks`) and reports exact-match accuracy at
longer lengths, with the schemes ranked past the trained length (:mod:`posenc.lab.tasks`).

The grid of cells (:mod:`posenc.lab.cells`: scheme x setting x seed, settings from
:mod:`posenc.lab.grid`) runs here, in local processes or on a Dask cluster, then the fine-tuning
cells of :mod:`posenc.lab.finetune` when asked for; this module turns the cells' records into the
study's :class:`~posenc.lab.results.StudyResults` (``results.json``): every run, the summary per
(run, length) across seeds (:mod:`posenc.lab.summary`), the paired comparisons of schemes, settings
and fine-tuning; :mod:`posenc.lab.tables` prints them.

Legend: ``L`` train length, ``E`` evaluation length, ``S`` scored targets per window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .cells import iter_cells, study_cells
from .config import StudyConfig
from .data import study_data
from .distributed import dist_info
from .finetune import finetune_cells, finetune_summary
from .results import CellRecord, StudyResults
from .runs import RunFolder, write_json, writing_for
from .summary import summarize, training_summary

__all__ = ["STUDY_ARTIFACTS", "run_study"]

#: What a study writes into its folder (their presence means the folder holds a study).
STUDY_ARTIFACTS = (
    "results.json",
    "extrapolation.png",
    "extrapolation.svg",
    "attention.png",
    "attention.svg",
    "training.png",
    "training.svg",
    "cells",
    "checkpoints",
)


def _environment(device: torch.device, threads: int | None, workers: int, cluster: Any) -> dict[str, Any]:
    from .. import __version__

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "posenc": __version__,
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "workers": workers,
        "cluster": None if cluster is None else str(cluster),
        "device": str(device),
        "world_size": dist_info().world_size,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "command": " ".join(sys.argv),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        env["load_avg_start"] = list(os.getloadavg())
    return env


def run_study(
    config: StudyConfig,
    *,
    out: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    resume: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] | None = print,
    threads: int | None = None,
    workers: int = 1,
    cluster: Any = None,
) -> StudyResults:
    """Run every cell of the study, summarise, return (and write) the results.

    Args:
        config: the :class:`~posenc.lab.config.StudyConfig`.
        out: a folder for ``results.json``, the plot (``extrapolation.png``/``.svg``), the cells
            (``cells/NAME.json``) and training checkpoints; ``None`` = write nothing.
        device: where to train and evaluate (``cuda`` trains with bf16 autocast).
        resume: skip finished cells whose file matches the config; continue checkpoints.
        overwrite: replace a study already in ``out`` (without ``resume`` or ``overwrite``, a
            folder holding a study is refused; see :class:`~posenc.lab.runs.RunFolder`).
        progress: progress bars (``None`` = when stderr is a terminal).
        log: where progress lines go (rank 0 only); ``None`` = silent.
        threads: torch threads per cell (``None`` = as set in this process; workers get 1).
        workers: cells run at once in local processes (1 = in this process).
        cluster: a Dask scheduler address or ``distributed.Client`` to run the cells on.

    Returns:
        the :class:`~posenc.lab.results.StudyResults` (``results.json``): the configuration,
        environment, corpus and evaluation set, the cells, the runs (one per run name and seed,
        with ``eval`` per length), the summary per run and length across seeds, the training
        losses, and the paired comparisons of schemes, settings and fine-tuning.
    """
    info = dist_info()
    if out is None and config.finetune_len:
        raise ValueError(
            "fine-tuning starts from each trained model's checkpoint: give an output folder (out=, --out)"
        )
    if out is None:
        return _run_study(config, None, device, resume, progress, log, threads, workers, cluster, None)
    with RunFolder(out, STUDY_ARTIFACTS, resume=resume, overwrite=overwrite, lock=info.is_main) as folder:
        run_id = folder.run_id  # checked by every write into the folder, the workers' too
        return _run_study(config, out, device, resume, progress, log, threads, workers, cluster, run_id)


def _run_study(config, out, device, resume, progress, log, threads, workers, cluster, run_id) -> StudyResults:
    t_start = time.perf_counter()
    device = torch.device(device)
    info = dist_info()
    say = log if (log is not None and info.is_main) else (lambda _msg: None)
    if info.world_size > 1:  # DDP trains each cell with every process: cells run here, in order
        workers, cluster = 1, None
    if threads is None and (workers > 1 or cluster is not None):
        threads = 1
    env = _environment(device, threads, workers, cluster)
    data = study_data(config)  # fails early on a bad corpus; workers build their own
    if "corpus" in data.record:
        say(_corpus_line(data.record))
    cells = study_cells(config)
    run = dict(
        out=out,
        device=device,
        resume=resume,
        workers=workers,
        cluster=cluster,
        threads=threads,
        progress=progress if workers <= 1 and cluster is None else False,
        run_id=run_id,
    )
    show = sys.stderr.isatty() if progress is None else progress  # None: bars on a terminal only
    records = _run_cells(config, cells, run, show and info.is_main, say)
    ft_cells = finetune_cells(config, cells)  # phase 2: each starts from a trained cell's checkpoint
    records.update(_run_cells(config, ft_cells, run, show and info.is_main, say))
    results = _collect([records[c.name] for c in [*cells, *ft_cells]], config, data, env)  # the grid's order
    results.wall_s = time.perf_counter() - t_start
    with contextlib.suppress(OSError):
        env["load_avg_end"] = list(os.getloadavg())
    if out is not None and info.is_main:
        with writing_for(out, run_id):
            _write_study(Path(out), results, say)
    return results


def _run_cells(
    config: StudyConfig, cells: list, run: dict[str, Any], bar: bool, say
) -> dict[str, CellRecord]:
    """Run ``cells`` with :func:`~posenc.lab.cells.iter_cells` (``run``: its arguments); records by name."""
    records = {}
    bar = _cell_bar(bar and len(cells) > 1, len(cells))
    for record in iter_cells(config, cells, **run):
        records[record.cell] = record
        if dist_info().is_main:  # other ranks of a torchrun group train but do not evaluate
            say(_cell_line(record, config))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return records


def _collect(ordered: list[CellRecord], config: StudyConfig, data, env: dict[str, Any]) -> StudyResults:
    """The study's results from the cells' records (in the grid's order): configs, cells, one entry
    per run, the summaries across seeds and the comparisons."""
    runs = [
        dataclasses.replace(run, scheme=r.scheme, setting=r.setting, seed=r.seed, params=r.params)
        for r in ordered
        for run in r.runs
    ]
    results = StudyResults(
        config=config,
        environment=env,
        eval=json.loads(json.dumps(data.record["eval"])),  # as results.json holds it (lists, not tuples)
        corpus=json.loads(json.dumps(data.record.get("corpus"))),
        runs=runs,
        summary=[],
        cells=[dataclasses.replace(r, runs=[], key=None, model_config=None) for r in ordered],
        train_config=config.train_config(data.seq_len).to_dict(),
        model_configs={r.run: r.model_config for r in ordered},
    )
    view = results.to_dict()  # what the summaries read: runs and cells as JSON objects
    clusters = results.eval.get("window_documents")
    results.summary = summarize(view["runs"], clusters, config.train_len if config.lm else None)
    results.training = training_summary(view["cells"])
    if config.lm:
        from .compare import scheme_comparisons
        from .probe import probe_summary

        results.comparisons = scheme_comparisons({**view, "summary": results.summary})
        results.probe = probe_summary(view["runs"])
    if config.lm and (config.vary or config.randomized_positions):  # tasks: in task_comparisons
        from .compare import settings_summary

        results.settings = settings_summary(view)
    if config.finetune_len:
        results.finetune = finetune_summary(view)
    if not config.lm:
        from .tasks import ranking_by_length, task_comparisons, task_ranking

        results.comparisons = task_comparisons(view["runs"], config.train_len)
        results.ranking = task_ranking(view["runs"], config.train_len)
        results.ranking_by_length = ranking_by_length(results.summary, config.train_len)
    return results


def _write_study(out_dir: Path, study: StudyResults, say: Callable[[str], None]) -> None:
    """``results.json`` and the figure (PNG and SVG; without matplotlib, a line saying so)."""
    results = study.to_dict()
    write_json(out_dir / "results.json", results)
    try:
        from .plot import plot_attention, plot_study, plot_training

        plot_study(results, out_dir / "extrapolation.png")
        plot_training(results, out_dir / "training.png")
        if any(r.get("attn_entropy") for r in results["summary"]):
            plot_attention(results, out_dir / "attention.png")
    except ImportError as err:  # matplotlib is an optional extra
        say(f"no plot: {err}")


def _cell_bar(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="cells", unit="cell", dynamic_ncols=True, leave=False)


def _corpus_line(record: dict[str, Any]) -> str:
    c, e = record["corpus"], record["eval"]
    return (
        f"corpus {c['name']!r}: {c['n_documents']} documents ({c['n_train']} train, {c['n_val']} val), "
        f"sha256 {c['sha256'][:12]}; evaluation: {e['windows']} windows from {e['n_documents']} "
        f"documents (largest share {e['largest_document_share']:.0%}), "
        f"last {e['score_len']} targets of each scored{_duplicates_note(e)}"
    )


def _duplicates_note(e: dict[str, Any]) -> str:
    d = e.get("near_duplicates")
    if not d:
        return ""
    kept = f", {d['kept']} kept (too few others)" if d["kept"] else ""
    return f"; near-duplicates of the training bytes: {d['found']} of {d['candidates']} candidates{kept}"


def _cell_line(record: CellRecord, config: StudyConfig) -> str:
    t = record.train
    how = "reused" if record.reused else f"{t.steps - t.resumed_from} steps in {t.wall_s:.0f} s"
    key = "accuracy" if not config.lm else "bpb_window"
    cells = "  ".join(
        f"{p['length']}:{'n/a' if p[key] is None else format(p[key], '.3f')}" for p in record.runs[0].eval
    )
    return f"{record.cell:>18}: {record.params:,} params, {how}; {cells}"
