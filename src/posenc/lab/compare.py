"""Two studies side by side: is B better than A on the same bytes, seed for seed?

For every run name and length both studies measured, the difference B - A of the sliding-window
bits/byte (the same windows: the studies must share the corpus and the evaluation anchors), one
value per seed both ran, summarised with a t interval over seeds; with one common seed, a
bootstrap interval over windows instead. Use it for ablations (``--position-lr-scale 1`` against
the default, ``--option t5.max_distance=128`` against the default).

Legend: ``K`` windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .stats import bootstrap_interval, format_interval, seed_interval

__all__ = ["compare_run", "compare_studies", "format_comparison", "paired_rows", "read_results"]


def read_results(spec: str, flag: str = "--compare") -> dict[str, Any]:
    """The results dict of a finished study (``results.json`` or its folder); errors name ``flag``."""
    path = Path(spec)
    if path.is_dir():
        path = path / "results.json"
    from ..model.io import parse_json

    try:
        text = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{flag}: cannot read a study from {spec!r}: {err}") from None
    results = parse_json(text, f"{flag} {str(path)!r}")
    if not isinstance(results, dict) or not {"config", "runs", "eval", "summary"} <= results.keys():
        raise ValueError(f"{flag}: {str(path)!r} is not a results.json of posenc extrapolate")
    types = {"config": dict, "runs": list, "eval": dict, "summary": list}
    wrong = [k for k, kind in types.items() if not isinstance(results[k], kind)]
    if wrong:
        raise ValueError(f"{flag}: {str(path)!r} field {wrong[0]!r} is not a {types[wrong[0]].__name__}")
    return results


def compare_run(specs: list[str]) -> int:
    """``posenc extrapolate --compare A B``: print B - A on the same bytes."""
    a, b = (read_results(x) for x in specs)
    rows = compare_studies(a, b)
    if not rows:
        raise ValueError("--compare: the two studies share no (scheme, seed) run")
    print(format_comparison(rows, b["config"]["eval_lens"]))
    return 0


def _check_same_bytes(a: dict[str, Any], b: dict[str, Any]) -> None:
    if a["config"]["mode"] != "lm" or b["config"]["mode"] != "lm":
        raise ValueError("--compare takes two language-modelling studies (mode 'lm')")
    if a["corpus"]["sha256"] != b["corpus"]["sha256"] or a["eval"]["anchors"] != b["eval"]["anchors"]:
        raise ValueError(
            "the two studies scored different bytes (corpus or evaluation windows differ); run both with "
            "the same --corpus, --max-chars, --split-seed, --eval-windows and longest --eval-lens"
        )
    if a["eval"]["score_len"] != b["eval"]["score_len"]:
        raise ValueError("the two studies score a different number of targets per window (--score-len)")


def _point(run: dict[str, Any], length: int) -> dict[str, Any] | None:
    return next((p for p in run["eval"] if p["length"] == length and p["window_bits"]), None)


def compare_studies(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{"name", "length", "seeds", "diff", "over"}``: B - A in bits/byte (``diff`` an
    Interval dict over the seeds both studies ran, or over windows when they share one seed)."""
    _check_same_bytes(a, b)
    runs_a = {(r["name"], r["seed"]): r for r in a["runs"]}
    pairs: dict[str, list[tuple[dict, dict]]] = {}  # run name -> [(run in A, run in B)] per common seed
    for rb in b["runs"]:
        if (rb["name"], rb["seed"]) in runs_a:
            pairs.setdefault(rb["name"], []).append((runs_a[rb["name"], rb["seed"]], rb))
    return [row for name, seed_pairs in pairs.items() for row in paired_rows(name, seed_pairs)]


def paired_rows(name: str, seed_pairs: list[tuple[dict, dict]]) -> list[dict[str, Any]]:
    """Per length, run B minus run A on the same windows, one ``(A, B)`` pair of runs per seed: a
    t interval over the seeds' mean differences, or with one seed a bootstrap over windows."""
    rows = []
    for length in (p["length"] for p in seed_pairs[0][1]["eval"]):
        both = [(_point(ra, length), _point(rb, length), rb["seed"]) for ra, rb in seed_pairs]
        both = [(pa, pb, seed) for pa, pb, seed in both if pa and pb]
        if not both:
            continue
        # [K] per-window differences of each common seed: the same bytes, B's model minus A's
        diffs = [torch.tensor(pb["window_bits"]) - torch.tensor(pa["window_bits"]) for pa, pb, _ in both]
        many = len(diffs) > 1
        diff = seed_interval([float(d.mean()) for d in diffs]) if many else bootstrap_interval(diffs[0])
        rows.append(
            {
                "name": name,
                "length": length,
                "seeds": [seed for *_, seed in both],
                "diff": diff.to_dict(),
                "over": "seeds" if many else "windows",
            }
        )
    return rows


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
