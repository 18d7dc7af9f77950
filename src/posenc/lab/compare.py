"""Comparisons are tests: is B better than A on the same bytes, seed for seed?

Every comparison is a **paired difference** B - A of the sliding-window bits/byte on the same
windows and seeds: per seed, per window, B's bits minus A's; its mean, 95% interval and
two-sided p-value come from :func:`~posenc.lab.stats.paired_bootstrap`, which resamples
documents and, with several seeds, seeds (so the interval covers both).

* Within one study, :func:`scheme_comparisons` compares every pair of schemes at every length
  and corrects the p-values for the number of comparisons the study reports (Holm,
  :func:`~posenc.lab.stats.holm`); :func:`verdict` turns each into words ("better", "worse",
  "no difference shown") from those numbers alone.
* Across two studies (:func:`compare_studies`, ``posenc extrapolate --compare A B``), the same
  run names are paired: ablations (``--position-lr-scale 1`` against the default,
  ``--option t5.max_distance=128`` against the default).

Legend: ``K`` windows, ``R`` seeds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .grid import run_name, study_settings
from .stats import format_interval, holm, paired_bootstrap

if TYPE_CHECKING:
    from .results import StudyResults

__all__ = [
    "ALPHA",
    "compare_run",
    "compare_studies",
    "format_comparison",
    "format_scheme_comparisons",
    "paired_rows",
    "scheme_comparisons",
    "settings_summary",
    "verdict",
]

#: Family-wise error rate of a study's comparisons (Holm-corrected p-values below it are claims).
ALPHA = 0.05


def compare_run(specs: list[str]) -> int:
    """``posenc extrapolate --compare A B``: print B - A on the same bytes."""
    from .results import read_results

    a, b = (read_results(x) for x in specs)
    rows = compare_studies(a, b)
    if not rows:
        raise ValueError("--compare: the two studies share no (scheme, seed) run")
    print(format_comparison(rows, list(b.config.eval_lens)))
    return 0


def _check_same_bytes(a: StudyResults, b: StudyResults) -> None:
    if not (a.config.lm and b.config.lm):
        raise ValueError("--compare takes two language-modelling studies (mode 'lm')")
    if a.corpus["sha256"] != b.corpus["sha256"] or a.eval["anchors"] != b.eval["anchors"]:
        raise ValueError(
            "the two studies scored different bytes (corpus or evaluation windows differ); run both with "
            "the same --corpus, --max-chars, --split-seed, --eval-windows and longest --eval-lens"
        )
    if a.eval["score_len"] != b.eval["score_len"]:
        raise ValueError("the two studies score a different number of targets per window (--score-len)")


def _point(run: dict[str, Any], length: int) -> dict[str, Any] | None:
    return next((p for p in run["eval"] if p["length"] == length and p["window_bits"]), None)


def compare_studies(a: StudyResults, b: StudyResults) -> list[dict[str, Any]]:
    """Rows ``{"name", "length", "seeds", "diff", "over"}``: B - A in bits/byte, paired over the
    seeds both studies ran (:func:`paired_rows`)."""
    _check_same_bytes(a, b)
    runs_a = {(r["name"], r["seed"]): r for r in a.run_dicts()}
    pairs: dict[str, list[tuple[dict, dict]]] = {}  # run name -> [(run in A, run in B)] per common seed
    for rb in b.run_dicts():
        if (rb["name"], rb["seed"]) in runs_a:
            pairs.setdefault(rb["name"], []).append((runs_a[rb["name"], rb["seed"]], rb))
    clusters = a.eval.get("window_documents")
    return [row for name, seed_pairs in pairs.items() for row in paired_rows(name, seed_pairs, clusters)]


def paired_rows(
    name: str, seed_pairs: list[tuple[dict, dict]], clusters: list[int] | None = None
) -> list[dict[str, Any]]:
    """Per length, run B minus run A on the same windows, one ``(A, B)`` pair of runs per seed:
    :func:`~posenc.lab.stats.paired_bootstrap` of the ``[R, K]`` per-window differences
    (``clusters[i]``: window ``i``'s document; ``None`` = windows). Rows ``{"name", "length",
    "seeds", "diff", "over"}``; ``diff`` holds the interval and the p-value."""
    rows = []
    for length in (p["length"] for p in seed_pairs[0][1]["eval"]):
        both = [(_point(ra, length), _point(rb, length), rb["seed"]) for ra, rb in seed_pairs]
        both = [(pa, pb, seed) for pa, pb, seed in both if pa and pb]
        if not both:
            continue
        # [R, K] per-window differences: the same bytes, B's model minus A's, one row per seed
        f64 = torch.float64
        diffs = torch.stack(
            [
                torch.tensor(pb["window_bits"], dtype=f64) - torch.tensor(pa["window_bits"], dtype=f64)
                for pa, pb, _ in both
            ]
        )
        diff = paired_bootstrap(diffs, clusters, seed=length)
        rows.append(
            {
                "name": name,
                "length": length,
                "seeds": [seed for *_, seed in both],
                "diff": diff.to_dict(),
                "over": diff.over,
            }
        )
    return rows


def verdict(
    diff: dict[str, Any], p_adjusted: float | None, alpha: float = ALPHA, higher_is_better: bool = False
) -> str:
    """B's verdict against A from a difference B - A (bits/byte: lower is better; with
    ``higher_is_better``, e.g. accuracy, higher) and its corrected p-value: ``"better"`` /
    ``"worse"`` when ``p_adjusted < alpha``, else ``"no difference shown"`` (also without a
    p-value: one seed on one document has none)."""
    if p_adjusted is None or p_adjusted >= alpha or diff["mean"] == 0:
        return "no difference shown"
    return "better" if (diff["mean"] > 0) == higher_is_better else "worse"


def scheme_comparisons(results: dict[str, Any], alpha: float = ALPHA) -> dict[str, Any]:
    """Every pair of schemes of a language-modelling study (plain runs: no evaluation-time variant,
    no fine-tuning, the grid's first setting), B - A at every length on the same bytes and seeds,
    Holm-corrected over all of them.

    Returns:
        ``{"method", "alpha", "family", "rows"}``; each row ``{"a", "b", "length", "seeds", "diff"
        (mean, low, high, n documents, over, p_value), "p_holm", "verdict"}`` where ``verdict``
        is B's (:func:`verdict`).
    """
    clusters = results["eval"].get("window_documents")
    plain = [r for r in results["runs"] if not r.get("variant") and not r.get("finetune")]
    first_setting = plain[0].get("setting", {}) if plain else {}
    plain = [r for r in plain if r.get("setting", {}) == first_setting]
    by_name: dict[str, dict[int, dict]] = {}
    for r in plain:
        by_name.setdefault(r["name"], {})[r["seed"]] = r
    names = list(by_name)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            seeds = [s for s in by_name[b] if s in by_name[a]]
            pairs = [(by_name[a][s], by_name[b][s]) for s in seeds]
            if pairs:
                rows += [{"a": a, "b": b, **r} for r in paired_rows(b, pairs, clusters)]
    adjusted = holm([r["diff"]["p_value"] for r in rows if r["diff"]["p_value"] is not None])
    it = iter(adjusted)
    for r in rows:
        r.pop("name")
        r["p_holm"] = next(it) if r["diff"]["p_value"] is not None else None
        r["verdict"] = verdict(r["diff"], r["p_holm"], alpha)
    over = rows[0]["over"] if rows else "documents"
    return {
        "method": f"paired bootstrap of B - A per window (2000 resamples of {over}); two-sided p-values "
        "(a normal fitted to the resamples where fewer than 10 fall beyond 0), "
        f"Holm-corrected over the {len(adjusted)} comparisons below",
        "alpha": alpha,
        "family": len(adjusted),
        "rows": rows,
    }


def format_scheme_comparisons(comparisons: dict[str, Any], markdown: bool = False) -> list[str]:
    """The comparisons as lines (or a Markdown table): B - A with its interval, p, Holm p, verdict."""
    rows = comparisons.get("rows", [])
    if not rows:
        return []
    metric = comparisons.get("metric", "sliding-window bits/byte on the same bytes and seeds")
    better = "> 0" if comparisons.get("higher_is_better") else "< 0"
    title = (
        f"scheme vs scheme: B - A {metric} ({better}: B is better); {comparisons['method']}; "
        f"verdict at Holm p < {comparisons['alpha']}"
    )
    table = []
    for r in rows:
        d = r["diff"]
        low = "-" if d["low"] is None else f"[{d['low']:+.3f}, {d['high']:+.3f}]"
        p = "-" if d["p_value"] is None else f"{d['p_value']:.3g}"
        holm_p = "-" if r["p_holm"] is None else f"{r['p_holm']:.3g}"
        table.append(
            (
                f"{r['b']} - {r['a']}",
                str(r["length"]),
                f"{d['mean']:+.3f}",
                low,
                p,
                holm_p,
                f"{r['b']} {r['verdict']}",
            )
        )
    head = ("B - A", "length", "mean", "95% interval", "p", "Holm p", "verdict")
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        return [*lines, *("| " + " | ".join(t) + " |" for t in table), ""]
    widths = [max(len(x) for x in col) for col in zip(head, *table)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [title, fmt.format(*head), *(fmt.format(*t) for t in table), ""]


def format_comparison(rows: list[dict[str, Any]], lens: list[int]) -> str:
    """A table of ``B - A`` per run and length (``mean ±half-width``; < 0 = B is better)."""
    names = list(dict.fromkeys(r["name"] for r in rows))
    width = max(8, *(len(n) for n in names)) if names else 8
    over = rows[0]["over"] if rows else "windows"  # "seeds" or "windows"
    lines = [
        f"B - A, sliding-window bits/byte on the same bytes (< 0: B is better; 95% interval over {over})",
        f"{'scheme':<{width}}" + "".join(f"{e:>16}" for e in lens),
    ]
    for name in names:
        by_len = {r["length"]: r["diff"] for r in rows if r["name"] == name}
        lines.append(
            f"{name:<{width}}" + "".join(f"{format_interval(by_len.get(e), True, 'n/a'):>16}" for e in lens)
        )
    return "\n".join(lines)


def settings_summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run with a setting other than the grid's first, minus the run of the same scheme and
    variant with the first setting, on the same bytes, seed for seed
    (:func:`~posenc.lab.compare.paired_rows`): ``[{"run", "against", "rows"}]``."""
    cfg = results["config"]
    first = study_settings(cfg.get("vary") or {}, cfg.get("randomized_positions") or 0)[0]
    runs = {(r["name"], r["seed"]): r for r in results["runs"]}
    pairs: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for run in results["runs"]:
        setting = tuple(run.get("setting", {}).items())
        if run.get("finetune") or setting == first:
            continue
        own, ref = run_name(run["scheme"], setting), run_name(run["scheme"], first)
        against = ref + run["name"][len(own) :]  # the same variant suffix (``+yarn``)
        if (against, run["seed"]) in runs:
            pairs.setdefault((run["name"], against), []).append((runs[against, run["seed"]], run))
    return [
        {"run": run, "against": against, "rows": paired_rows(run, p, results["eval"].get("window_documents"))}
        for (run, against), p in pairs.items()
    ]
