"""A study as text: per-length tables of ``mean ±half-width`` (plain columns for a terminal, or
Markdown for docs), with the paired comparisons of settings, fine-tuning and schemes, the training
losses, the effective-context probe and, in task mode, the ranking.

Legend: ``L`` train length, ``E`` evaluation length, ``S`` scored targets per window.
"""

from __future__ import annotations

from typing import Any

from .results import StudyResults
from .stats import format_interval

__all__ = ["format_table"]


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
    if cfg.lm:  # task studies compare settings per question (their comparisons table)
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
