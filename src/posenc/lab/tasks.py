"""Task-mode verdicts: did each scheme learn the task at the trained length, and how do the
schemes rank past it.

Kazemnejad et al. 2023 rank positional schemes by exact-match accuracy on questions longer than
any seen in training (their ranking: NoPE > T5 > ALiBi ~ RoPE > absolute). A ranking means
something only among models that learned the task in distribution, so each row also says whether
the scheme reached :data:`LEARNED_AT` at the training length ``L``.

For each run (a scheme, or a scheme with an evaluation-time variant) and seed, the score past
``L`` is the mean exact match over the evaluated lengths ``n > L``; across seeds, the mean with a
95% t interval (:func:`~posenc.lab.stats.seed_interval`).

Comparisons are tests (:func:`task_comparisons`): every pair of runs at every length past ``L``,
B - A exact match on the same questions and seeds, resampling seeds and questions, Holm-corrected.
"""

from __future__ import annotations

from typing import Any

from .stats import Interval, holm, paired_bootstrap, seed_interval

__all__ = [
    "LEARNED_AT",
    "PAPER_RANKING",
    "format_ranking",
    "format_ranking_by_length",
    "ranking_by_length",
    "task_comparisons",
    "task_eval_lens",
    "task_ranking",
]

#: Kazemnejad et al. 2023's ranking of the schemes by length generalization, for the tables.
PAPER_RANKING = "NoPE > T5 > ALiBi ~ RoPE > absolute"

#: Exact match at the training length from which a run counts as having learned the task.
LEARNED_AT = 0.95


def task_eval_lens(train_len: int) -> tuple[int, ...]:
    """The default evaluation lengths of a task study: ``L``, every length ``L+1 .. L+8`` (where
    small models still differ: exact match at ``2L`` is 0 for all of them) and ``2L``, ``3L``."""
    return tuple(sorted({train_len, *range(train_len + 1, train_len + 9), 2 * train_len, 3 * train_len}))


def _accuracies(run: dict[str, Any], keep, metric: str = "accuracy") -> list[float]:
    return [p[metric] for p in run["eval"] if keep(p["length"]) and p.get(metric) is not None]


def _mean_past(group: list[dict[str, Any]], train_len: int, metric: str) -> dict[str, Any] | None:
    """Across seeds: each seed's mean of ``metric`` over the lengths past ``L``."""
    beyond = [_accuracies(r, lambda n: n > train_len, metric) for r in group]
    per_seed = [sum(b) / len(b) for b in beyond if b]
    return seed_interval(per_seed).to_dict() if per_seed else None


def _key(row: dict[str, Any]) -> tuple[float, float]:
    exact, tokens = row["beyond_L"], row["beyond_L_tokens"]
    return (-1.0 if exact is None else exact["mean"], -1.0 if tokens is None else tokens["mean"])


def task_ranking(runs: list[dict[str, Any]], train_len: int) -> list[dict[str, Any]]:
    """The runs of a task study ranked by exact match past the training length, best first.

    Args:
        runs: ``results["runs"]``: one entry per run name and seed, each with ``eval`` points
            (``length``, ``accuracy``).
        train_len: ``L``, the longest training question.

    Returns:
        one dict per run name: ``name``, ``seeds``, ``at_L``, ``beyond_L`` and ``beyond_L_tokens``
        (exact match at ``L``, exact match and answer-token accuracy past ``L``: interval dicts
        across seeds, ``None`` when not measured, e.g. learned positions past ``L``), ``lengths``
        (the lengths past ``L`` averaged), ``learned`` (``at_L`` mean >= :data:`LEARNED_AT`).
        Ties in exact match are broken by token accuracy; runs without a score past ``L`` come last.
    """
    by_name: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_name.setdefault(run["name"], []).append(run)
    rows = []
    for name, group in by_name.items():
        at_l = [a for r in group for a in _accuracies(r, lambda n: n == train_len)]
        lengths = sorted({p["length"] for r in group for p in r["eval"] if p["length"] > train_len})
        at = seed_interval(at_l) if at_l else None
        rows.append(
            {
                "name": name,
                "seeds": [r["seed"] for r in group],
                "at_L": at.to_dict() if at else None,
                "learned": bool(at and at.mean >= LEARNED_AT),
                "beyond_L": _mean_past(group, train_len, "accuracy"),
                "beyond_L_tokens": _mean_past(group, train_len, "token_accuracy"),
                "lengths": lengths,
            }
        )
    rows.sort(key=_key, reverse=True)
    return rows


def format_ranking(ranking: list[dict[str, Any]], train_len: int, markdown: bool = False) -> list[str]:
    """The ranking as lines of text (or a Markdown table): exact match at ``L`` and past it."""

    def cell(value: dict[str, Any] | None) -> str:
        if value is None:
            return "n/a"
        return Interval(value["mean"], value["low"], value["high"], value["n"]).format()

    lengths = ranking[0]["lengths"] if ranking else []
    title = (
        f"ranking by mean exact match past L={train_len} (lengths {','.join(map(str, lengths))}); "
        f"learned = exact match >= {LEARNED_AT:.0%} at L"
    )
    rows = [
        (
            r["name"],
            cell(r["at_L"]),
            cell(r["beyond_L"]),
            cell(r.get("beyond_L_tokens")),
            "yes" if r["learned"] else "no",
        )
        for r in ranking
    ]
    if markdown:
        head = "| scheme | exact match at L | exact match past L | tokens right past L | learned |"
        lines = [f"**{title}**", "", head, "|---|---|---|---|---|"]
        return [*lines, *(f"| {' | '.join(row)} |" for row in rows), ""]
    width = max(8, *(len(r[0]) for r in rows)) if rows else 8
    lines = [title, f"{'scheme':<{width}}{'at L':>16}{'past L':>16}{'tokens past L':>16}{'learned':>9}"]
    return [*lines, *(f"{a:<{width}}{b:>16}{c:>16}{d:>16}{e:>9}" for a, b, c, d, e in rows), ""]


def ranking_by_length(summary: list[dict[str, Any]], train_len: int) -> list[dict[str, Any]]:
    """Per evaluated length past ``L``, the runs ordered by exact match (best first), each with
    its interval (over seeds, or Wilson's over the examples with one seed): ``[{"length",
    "order": [{"name", "accuracy"}]}]``. Runs without a score at a length are left out of it."""
    lengths = sorted({r["length"] for r in summary if r["length"] > train_len})
    out = []
    for n in lengths:
        scored = [r for r in summary if r["length"] == n and r.get("accuracy") is not None]
        scored.sort(key=lambda r: r["accuracy"]["mean"], reverse=True)
        out.append({"length": n, "order": [{"name": r["name"], "accuracy": r["accuracy"]} for r in scored]})
    return out


def format_ranking_by_length(by_length: list[dict[str, Any]], markdown: bool = False) -> list[str]:
    """One line per length: ``9: nope 1.000 [0.98, 1.00] > alibi 0.845 ...`` (or a Markdown list)."""
    if not by_length:
        return []
    title = (
        f"ranking per length past L by exact match (95% intervals); Kazemnejad et al. 2023: {PAPER_RANKING}"
    )

    def cell(entry: dict[str, Any]) -> str:
        a = entry["accuracy"]
        return f"{entry['name']} {Interval(**a).format()}"

    lines = [f"**{title}**", ""] if markdown else [title]
    for row in by_length:
        text = f"{row['length']}: " + " > ".join(cell(e) for e in row["order"])
        lines.append(f"- {text}" if markdown else text)
    return [*lines, ""]


def task_comparisons(
    runs: list[dict[str, Any]], train_len: int, alpha: float = 0.05
) -> dict[str, Any] | None:
    """Every pair of runs of a task study (schemes, settings such as randomized positions, and
    evaluation-time variants such as re-sampled positions) at every length past ``L``: B - A exact
    match per question, paired by seed and question
    (every model of a study answers the same questions), with :func:`~posenc.lab.stats.paired_bootstrap`
    over seeds and questions and Holm's correction over all of them.

    Returns:
        ``{"method", "alpha", "family", "metric", "higher_is_better", "rows"}`` as
        :func:`~posenc.lab.compare.scheme_comparisons`, each row ``{"a", "b", "length", "seeds",
        "diff", "p_holm", "verdict"}``; ``None`` when no pair has per-question records (results of
        earlier versions).
    """
    from .compare import verdict

    by_name: dict[str, dict[int, dict]] = {}
    for r in runs:
        if not r.get("finetune"):
            by_name.setdefault(r["name"], {})[r["seed"]] = r
    names = list(by_name)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            seeds = sorted(s for s in by_name[b] if s in by_name[a])
            for length in sorted({p["length"] for p in by_name[a][seeds[0]]["eval"]} if seeds else ()):
                if length <= train_len:
                    continue
                diffs = _paired_correct(by_name[a], by_name[b], seeds, length)  # [R][K]
                if diffs is None:
                    continue
                diff = paired_bootstrap(diffs, unit="questions").to_dict()
                rows.append({"a": a, "b": b, "length": length, "seeds": seeds, "diff": diff})
    if not rows:
        return None
    adjusted = holm([r["diff"]["p_value"] for r in rows if r["diff"]["p_value"] is not None])
    it = iter(adjusted)
    for r in rows:
        r["p_holm"] = next(it) if r["diff"]["p_value"] is not None else None
        r["verdict"] = verdict(r["diff"], r["p_holm"], alpha, higher_is_better=True)
    return {
        "method": f"paired bootstrap of B - A per question (2000 resamples of {rows[0]['diff']['over']}); "
        "two-sided p-values (a normal fitted to the resamples where fewer than 10 fall beyond 0), "
        f"Holm-corrected over the {len(adjusted)} comparisons below",
        "alpha": alpha,
        "family": len(adjusted),
        "metric": "exact match on the same questions and seeds",
        "higher_is_better": True,
        "rows": rows,
    }


def _paired_correct(a: dict[int, dict], b: dict[int, dict], seeds: list[int], length: int):
    """``[R][K]`` B's minus A's per-question exact match at ``length`` for each seed, or None where
    a run lacks per-question records there (or their counts differ)."""
    out = []
    for seed in seeds:
        pa = next((p for p in a[seed]["eval"] if p["length"] == length), None)
        pb = next((p for p in b[seed]["eval"] if p["length"] == length), None)
        ca, cb = (p.get("example_correct") if p else None for p in (pa, pb))
        if not ca or not cb or len(ca) != len(cb):
            return None
        out.append([y - x for x, y in zip(ca, cb)])
    return out
