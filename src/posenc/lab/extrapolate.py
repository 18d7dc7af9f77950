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
cells of :mod:`posenc.lab.finetune` when asked for; this module turns the cells into
``results.json``: every run, a summary per (run, length) across seeds, the paired comparisons of
settings and of fine-tuning, and the tables.

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

from .cells import iter_cells, study_cells, study_data
from .config import StudyConfig
from .distributed import dist_info
from .finetune import finetune_cells, finetune_summary
from .results import CellRecord, StudyResults
from .runs import RunFolder, write_json, writing_for
from .stats import format_interval, paired_bootstrap, seed_interval

__all__ = ["STUDY_ARTIFACTS", "SUMMARY_METRICS", "format_table", "run_study", "summarize", "training_summary"]

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

#: The numbers summarised across seeds, per run and length.
SUMMARY_METRICS = (
    "bpb_window",
    "delta",
    "bpb_all",
    "bpb_beyond",
    "accuracy",
    "token_accuracy",
    "digit_accuracy",
    "early_end",
    "stopped_at_L",
    "attn_entropy",
    "attn_distance",
    "attn_beyond",
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
    if config.vary or config.randomized_positions:
        from .compare import settings_summary

        results.settings = settings_summary(view)
    if config.finetune_len:
        results.finetune = finetune_summary(view)
    if not config.lm:
        from .tasks import ranking_by_length, task_ranking

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


# ----------------------------------------------------------------------------------------------
# Across seeds
# ----------------------------------------------------------------------------------------------
def summarize(
    runs: list[dict[str, Any]], clusters: list[int] | None = None, train_len: int | None = None
) -> list[dict[str, Any]]:
    """Per (run name, length): each metric's mean and 95% interval across the seeds that measured
    it. ``bpb_window`` and the paired ``delta`` (with per-window values and ``train_len``) take
    :func:`~posenc.lab.stats.paired_bootstrap` over seeds and documents (``clusters[i]``: window
    ``i``'s document); the other metrics Student's t over seeds
    (:func:`~posenc.lab.stats.seed_interval`). ``delta_over`` names what the delta's interval covers."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_name.setdefault(run["name"], []).append(run)
    summary = []
    for name, group in by_name.items():
        for i, length in enumerate(p["length"] for p in group[0]["eval"]):
            points = [r["eval"][i] for r in group]
            row: dict[str, Any] = {
                "name": name,
                "scheme": group[0]["scheme"],
                "variant": group[0]["variant"],
                "setting": group[0].get("setting", {}),
                "length": length,
                "seeds": [r["seed"] for r in group],
                "note": points[0]["note"],
            }
            for metric in SUMMARY_METRICS:  # .get: cells of older versions lack newer metrics
                values = [p.get(metric) for p in points if p.get(metric) is not None]
                if metric == "delta":
                    values = [v["mean"] for v in values]
                row[metric] = seed_interval(values).to_dict() if values else None
            if row["delta"] is not None and row["delta"]["n"] == 1:
                row["delta"] = points[0]["delta"]  # one seed: the point's own bootstrap interval
            _window_intervals(row, group, i, clusters, train_len)
            _wilson_intervals(row, points)
            row["delta_over"] = _delta_over(row["delta"], len(group))
            summary.append(row)
    return summary


def _delta_over(delta: dict[str, Any] | None, n_seeds: int) -> str:
    """What the delta's interval covers (older results without ``over``: a t interval over the
    seeds when it counts them, else the one seed's bootstrap over windows)."""
    if delta is None:
        return "seeds"
    return delta.get("over") or ("seeds" if n_seeds > 1 and delta["n"] == n_seeds else "windows")


def _wilson_intervals(row: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """One seed of a task study: each rate's interval is Wilson's over the examples."""
    if len(points) == 1 and points[0].get("wilson"):
        for metric, interval in points[0]["wilson"].items():
            if interval is not None and row.get(metric) is not None:
                row[metric] = interval


def _window_intervals(row, group, i, clusters, train_len) -> None:
    """Replace ``row``'s ``bpb_window`` and ``delta`` by intervals over seeds and documents when
    every seed kept its per-window values (``[R, K]``)."""
    bits = [r["eval"][i].get("window_bits") or [] for r in group]
    if not all(bits) or len({len(b) for b in bits}) != 1:
        return
    seed = 0 if train_len is None else train_len
    row["bpb_window"] = paired_bootstrap(bits, clusters, seed=seed).to_dict()
    if train_len is None or row["length"] == train_len:
        return
    base = [next((p.get("window_bits") for p in r["eval"] if p["length"] == train_len), None) for r in group]
    if all(base) and all(len(b) == len(bits[0]) for b in base):
        diffs = (torch.tensor(bits, dtype=torch.float64) - torch.tensor(base, dtype=torch.float64)).tolist()
        row["delta"] = paired_bootstrap(diffs, clusters, seed=seed).to_dict()


def training_summary(cells: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per trained run (fine-tuning cells aside): the final training loss (nats per token, mean of
    the last 10% of steps) and the mean loss of every 10 steps, each a mean with a 95% t interval across
    seeds: ``{run: {"seeds", "final_loss": Interval dict, "curve": {"step", "mean", "low", "high"}}}``."""
    by_run: dict[str, list[dict[str, Any]]] = {}
    for cell in cells:
        if "finetune" not in cell and cell.get("train", {}).get("loss_every_10_steps"):
            by_run.setdefault(cell.get("run", cell["scheme"]), []).append(cell)
    out = {}
    for run, group in by_run.items():  # the mean of each 10 steps (older cells: every 10th step)
        losses = [c["train"].get("loss_mean_10_steps") or c["train"]["loss_every_10_steps"] for c in group]
        n = min(len(x) for x in losses)
        steps = [seed_interval([x[i] for x in losses]) for i in range(n)]
        out[run] = {
            "seeds": [c["seed"] for c in group],
            "final_loss": seed_interval([c["train"]["final_loss_nats"] for c in group]).to_dict(),
            "curve": {
                "step": [10 * i for i in range(n)],
                "mean": [iv.mean for iv in steps],
                "low": [iv.mean if iv.low is None else iv.low for iv in steps],
                "high": [iv.mean if iv.high is None else iv.high for iv in steps],
            },
        }
    return out


# ----------------------------------------------------------------------------------------------
# Terminal tables
# ----------------------------------------------------------------------------------------------
def _cell(value: dict | None, signed: bool, missing: str) -> str:
    return format_interval(value, signed, missing)


def _metric_table(rows, names, lens, metric, signed, title, markdown, head, width, col) -> list[str]:
    """One metric's table: a title, a header, one line per run (plain columns or Markdown)."""
    if markdown:
        lines = [
            f"**{title}**",
            "",
            "| scheme | " + " | ".join(map(str, lens)) + " |",
            "|---" * (len(lens) + 1) + "|",
        ]
    table = []
    for name in names:
        cells = []
        for r in (r for r in rows if r["name"] == name):
            missing = "n/a" if r["note"].startswith("n/a") else "-"
            cells.append(_cell(r.get(metric), signed, missing))
        table.append((name, cells))
    if markdown:
        return [*lines, *(f"| {name} | " + " | ".join(cells) + " |" for name, cells in table), ""]
    if any(len(c) + 2 > col for _, cells in table for c in cells):  # intervals with both ends are wider
        col = max(len(c) + 2 for _, cells in table for c in cells)
        head = f"{'scheme':<{width}}" + "".join(f"{e:>{col}}" for e in lens)
    lines = [title, head]
    lines += [f"{name:<{width}}" + "".join(f"{c:>{col}}" for c in cells) for name, cells in table]
    return [*lines, ""]


def _finetune_table(entries: list[dict[str, Any]], lens, markdown: bool, width: int, col: int) -> list[str]:
    """Fine-tuned minus the same weights before fine-tuning, per length, with the cost."""
    if not entries:
        return []
    e0 = entries[0]
    share = e0["tokens"] / max(1, e0["train_tokens"])
    title = (
        f"fine-tuned minus not fine-tuned, sliding-window bits/byte on the same bytes (< 0: fine-tuning "
        f"helps; 95% interval over {e0['rows'][0]['over'] if e0['rows'] else 'seeds'}); cost: "
        f"{e0['steps']} steps at length {e0['length']}, {e0['tokens']:,} tokens ({share:.0%} of training)"
    )
    lines = _paired_table(
        title, [(f"{e['run']} - {e['before']}", e["rows"]) for e in entries], lens, markdown, width, col
    )
    against = [
        (f"{e['run']} - {e['against_control']}", e["rows_vs_control"])
        for e in entries
        if e.get("rows_vs_control")
    ]
    if against:
        title = (
            "fine-tuned minus the control (the same steps and tokens continued at the training length), "
            "sliding-window bits/byte on the same bytes (< 0: fine-tuning at the longer length helps "
            "beyond more training; at L: its cost)"
        )
        lines += _paired_table(title, against, lens, markdown, width, col)
    return lines


def _settings_table(entries: list[dict[str, Any]], lens, markdown: bool, width: int, col: int) -> list[str]:
    """Each setting minus the grid's first setting (same scheme and variant), per length."""
    if not entries:
        return []
    over = entries[0]["rows"][0]["over"] if entries[0]["rows"] else "seeds"
    title = (
        f"each setting minus the first setting of the grid, sliding-window bits/byte on the same bytes "
        f"(< 0: the setting helps; 95% interval over {over})"
    )
    return _paired_table(
        title, [(f"{e['run']} - {e['against']}", e["rows"]) for e in entries], lens, markdown, width, col
    )


def _paired_table(title: str, entries, lens, markdown: bool, width: int, col: int) -> list[str]:
    """``entries``: ``(label, paired rows)`` (:func:`~posenc.lab.compare.paired_rows`), one line each."""
    table = []
    for name, rows in entries:
        by_len = {r["length"]: r["diff"] for r in rows}
        table.append((name, [_cell(by_len.get(n), True, "-") for n in lens]))
    if markdown:
        head = ["| run | " + " | ".join(map(str, lens)) + " |", "|---" * (len(lens) + 1) + "|"]
        return [f"**{title}**", "", *head, *(f"| {n} | " + " | ".join(c) + " |" for n, c in table), ""]
    w = max(width, *(len(n) for n, _ in table))
    head = f"{'run':<{w}}" + "".join(f"{n:>{col}}" for n in lens)
    return [title, head, *(f"{n:<{w}}" + "".join(f"{c:>{col}}" for c in cells) for n, cells in table), ""]


def _training_table(training: dict[str, Any], markdown: bool) -> list[str]:
    """The final training loss per trained run (mean of the last 10% of steps, nats per token)."""
    if not training:
        return []
    title = "final training loss, nats/token (mean of the last 10% of steps; 95% interval over seeds)"
    cells = {run: _cell(t["final_loss"], False, "-") for run, t in training.items()}
    if markdown:
        return [
            f"**{title}**",
            "",
            "| run | loss |",
            "|---|---|",
            *(f"| {r} | {c} |" for r, c in cells.items()),
            "",
        ]
    width = max(8, *(len(r) for r in cells))
    return [title, *(f"{r:<{width}}{c:>16}" for r, c in cells.items()), ""]


def _probe_table(rows: list[dict[str, Any]], markdown: bool) -> list[str]:
    """The effective-context probe: bits/byte on the second copy of a random string, by distance."""
    if not any(r.get("gain") for r in rows):
        return []
    names = list(dict.fromkeys(r["name"] for r in rows))
    dists = sorted({r["distance"] for r in rows})
    title = (
        "effective-context probe: retrieval gain in bits/byte on the second copy of a random 16-byte "
        "string, by distance between the copies (the same text with a different first string minus "
        "with the same; 0 = nothing retrieved; 95% interval)"
    )
    table = [
        (
            n,
            [
                _cell(
                    next((r.get("gain") for r in rows if r["name"] == n and r["distance"] == d), None),
                    False,
                    "-",
                )
                for d in dists
            ],
        )
        for n in names
    ]
    return _grid(title, "run", table, dists, markdown)


def _grid(title: str, first: str, table, columns, markdown: bool) -> list[str]:
    if markdown:
        head = [f"| {first} | " + " | ".join(map(str, columns)) + " |", "|---" * (len(columns) + 1) + "|"]
        return [f"**{title}**", "", *head, *(f"| {n} | " + " | ".join(c) + " |" for n, c in table), ""]
    w = max(8, *(len(n) for n, _ in table))
    head = f"{first:<{w}}" + "".join(f"{c:>16}" for c in columns)
    return [title, head, *(f"{n:<{w}}" + "".join(f"{c:>16}" for c in cells) for n, cells in table), ""]


def _diagnostic_sections(L: int) -> list[tuple[str, bool, str]]:
    what = "attention over the scored queries, mean of layers and heads"
    return [
        ("attn_entropy", False, f"{what}: entropy in bits (higher = more spread out)"),
        ("attn_distance", False, f"{what}: mean attended distance in tokens"),
        ("attn_beyond", False, f"{what}: share of the attention on keys >= L={L} tokens back"),
    ]


def _interval_cover(rows: list[dict[str, Any]], metric: str, n_seeds: int) -> str:
    """What the intervals of ``metric`` cover, as the summary rows say (older results: seeds)."""
    over = next((r[metric]["over"] for r in rows if r.get(metric) and r[metric].get("over")), None)
    if over is None:
        return f"{n_seeds} seeds" if n_seeds > 1 else "windows (1 seed)"
    return over.replace("seeds", f"{n_seeds} seeds") if n_seeds > 1 else f"{over} (1 seed)"


def format_table(results: StudyResults, markdown: bool = False) -> str:
    """The study as tables of ``mean ±half-width`` (95%): the paired delta and the sliding-window
    bits/byte first, all-position and beyond-``L`` bits/byte after (``lm``); or exact-match
    accuracy (task modes). Plain text, or Markdown tables (``markdown``) for docs."""
    cfg = results.config
    lens, L = list(cfg.eval_lens), cfg.train_len
    rows = results.summary
    names = list(dict.fromkeys(r["name"] for r in rows))
    n_seeds = len(cfg.seeds)
    over = f"over {_interval_cover(rows, 'delta', n_seeds)}"
    width = max([8, *(len(n) for n in names)])
    col = 16
    head = f"{'scheme':<{width}}" + "".join(f"{e:>{col}}" for e in lens)
    if cfg.lm:
        S = results.eval["score_len"]
        sections = [
            (
                "delta",
                True,
                f"paired delta vs L={L}, bits/byte: the same bytes read in windows of E minus in "
                f"windows of L (> 0 = worse with the longer window; 95% interval {over})",
            ),
            (
                "bpb_window",
                False,
                f"sliding-window bits/byte: the last {S} targets of every window, the same "
                f"bytes at every length (lower is better)",
            ),
            ("bpb_all", False, "bits/byte over all positions of the windows (secondary)"),
            ("bpb_beyond", False, f"bits/byte over positions >= L={L} of the windows (secondary)"),
        ]
        if any(r.get("attn_entropy") for r in rows):
            sections += _diagnostic_sections(L)
    else:
        sections = [
            (
                "accuracy",
                False,
                f"exact-match accuracy, task {cfg.mode!r}, trained on lengths 1..{L} (higher is better; "
                f"95% intervals over {_interval_cover(rows, 'accuracy', n_seeds)})",
            ),
            ("token_accuracy", False, "answer tokens right (teacher-forced; partial credit)"),
            ("digit_accuracy", False, "answer digits right (the end token scored apart)"),
            ("early_end", False, "examples where the model ends the answer early (predicts the end token)"),
            ("stopped_at_L", False, f"examples ending early right after the answer length of L={L}"),
        ]
    lines = []
    for metric, signed, title in sections:
        lines += _metric_table(rows, names, lens, metric, signed, title, markdown, head, width, col)
    lines += _settings_table(results.settings or [], lens, markdown, width, col)
    lines += _finetune_table(results.finetune or [], lens, markdown, width, col)
    lines += _training_table(results.training, markdown)
    lines += _probe_table(results.probe or [], markdown)
    if results.comparisons:
        from .compare import format_scheme_comparisons

        lines += format_scheme_comparisons(results.comparisons, markdown)
    if not cfg.lm:
        from .tasks import format_ranking, format_ranking_by_length, ranking_by_length, task_ranking

        lines += format_ranking(task_ranking(results.run_dicts(), L), L, markdown)
        lines += format_ranking_by_length(ranking_by_length(rows, L), markdown)
    seeds = ",".join(map(str, cfg.seeds))
    lines.append(
        f"L = {L}; seeds {seeds}; '-' = not defined at this length; n/a = the scheme cannot run so long"
    )
    return "\n".join(lines)
