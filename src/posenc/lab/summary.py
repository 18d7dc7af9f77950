"""A study's numbers across seeds: per (run, length), each metric's mean and 95% interval, and the
training losses per trained run.

``bpb_window`` and the paired ``delta`` take :func:`~posenc.lab.stats.paired_bootstrap` over seeds
and documents when every seed kept its per-window values; the other metrics Student's t over the
seeds (:func:`~posenc.lab.stats.seed_interval`); a task study of one seed Wilson's interval over
its examples.

Legend: ``R`` seeds, ``K`` windows.
"""

from __future__ import annotations

from typing import Any

import torch

from .stats import paired_bootstrap, seed_interval

__all__ = ["SUMMARY_METRICS", "summarize", "training_summary"]


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
