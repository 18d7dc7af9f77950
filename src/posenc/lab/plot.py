"""The study's figure: what a reader needs to choose a scheme, with its uncertainty drawn.

``lm`` mode, three panels sharing the evaluation length on a log-2 axis:

1. sliding-window bits/byte (the same bytes at every length), mean across seeds with a 95% band;
2. the paired delta against ``L`` with its interval (0 = no change; above 0 = worse);
3. the loss by position inside the longest window (the early-token effect), mean across seeds.

Task modes, two panels against question length: exact-match accuracy, with a line at the level that
counts as having learned the task (:data:`~posenc.lab.tasks.LEARNED_AT`), and the share of answer
tokens right. Lower is better except for accuracy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["plot_attention", "plot_study", "plot_training"]


def _series(rows: list[dict[str, Any]], name: str, metric: str):
    """``(lengths, means, lows, highs)`` of one run's measured points."""
    pts = [
        r for r in rows if r["name"] == name and r.get(metric) is not None
    ]  # older results lack newer metrics
    xs = [r["length"] for r in pts]
    means = [r[metric]["mean"] for r in pts]
    lows = [r[metric]["low"] if r[metric]["low"] is not None else r[metric]["mean"] for r in pts]
    highs = [r[metric]["high"] if r[metric]["high"] is not None else r[metric]["mean"] for r in pts]
    return xs, means, lows, highs


def _curves(results: dict[str, Any], name: str, length: int) -> tuple[list[float], list[float]] | None:
    """Mean over seeds of the loss-by-position curve of run ``name`` at ``length``."""
    curves = [
        p["curve"]
        for r in results["runs"]
        if r["name"] == name
        for p in r["eval"]
        if p["length"] == length and p.get("curve")
    ]
    if not curves:
        return None
    xs = [c[0] for c in curves[0]]
    ys = [sum(c[i][1] for c in curves) / len(curves) for i in range(len(xs))]
    return xs, ys


def plot_study(results: dict[str, Any], path: str | os.PathLike) -> list[Path]:
    """Plot the study to ``path`` (png) and the same name with ``.svg``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    L, lens = cfg["train_len"], cfg["eval_lens"]
    lm = cfg["mode"] == "lm"
    rows = results["summary"]
    names = list(dict.fromkeys(r["name"] for r in rows))
    colors = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    n_seeds = len(cfg["seeds"])
    probe = (results.get("probe") or []) if lm else []
    panels = (4 if probe else 3) if lm else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4), squeeze=False, layout="constrained")
    axes = axes[0]
    metrics = (
        [("bpb_window", "bits per byte (sliding window)"), ("delta", "paired delta vs L (bits/byte)")]
        if lm
        else [("accuracy", "exact-match accuracy"), ("token_accuracy", "answer tokens right")]
    )
    variants = {r["name"]: r["variant"] for r in rows}
    for i, name in enumerate(names):
        style = "--" if variants[name] else "-"
        for ax, (metric, _) in zip(axes, metrics):
            xs, mean, low, high = _series(rows, name, metric)
            if not xs:
                continue
            if metric == "delta":  # E = L is the reference: 0 by definition
                xs, mean, low, high = [L, *xs], [0.0, *mean], [0.0, *low], [0.0, *high]
            ax.plot(xs, mean, style, marker="o", ms=3, color=colors(i), label=name)
            ax.fill_between(xs, low, high, color=colors(i), alpha=0.15, lw=0)
        if lm:
            curve = _curves(results, name, max(lens))
            if curve is not None:
                axes[2].plot([x + 1 for x in curve[0]], curve[1], style, color=colors(i), label=name)
    covers = next((r["delta"].get("over") for r in results["summary"] if r.get("delta")), None)
    over = f"95% interval over {covers or (f'{n_seeds} seeds' if n_seeds > 1 else 'windows')}"
    for ax, (_, label) in zip(axes, metrics):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(e) for e in lens])
        ax.minorticks_off()
        ax.axvline(L, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("question length (digits)" if not lm else "evaluation length E (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if lm:
        axes[0].set_title(
            f"same bytes at every length; lower is better\n(trained at L={L}; {over})", fontsize=9
        )
        axes[1].axhline(0, color="black", lw=0.8)
        axes[1].set_title(
            "windows of E minus windows of L, same bytes\n(> 0: worse with more context)", fontsize=9
        )
        axes[0].set_ylim(top=min(axes[0].get_ylim()[1], 8.0))  # 8 bits/byte = a uniform guess
        axes[2].set_xscale("log", base=2)
        axes[2].axvline(L, color="grey", lw=0.8, ls=":")
        axes[2].set_xlabel(f"position in the window (E={max(lens)})")
        axes[2].set_ylabel("bits per byte")
        axes[2].set_ylim(top=min(axes[2].get_ylim()[1], 8.0))
        axes[2].set_title("loss by position: early tokens lack context\n(lower is better)", fontsize=9)
        axes[2].grid(alpha=0.3)
        if probe:
            _probe_panel(axes[3], probe, names, variants, colors)
    else:
        from .tasks import LEARNED_AT

        axes[0].axhline(LEARNED_AT, color="grey", lw=0.8, ls="--", label=f"{LEARNED_AT:.0%} (learned)")
        for ax in axes:
            ax.set_ylim(-0.05, 1.05)
        axes[0].set_title(f"{cfg['mode']}: trained on lengths 1..{L}; higher is better\n({over})", fontsize=9)
        axes[1].set_title("partial credit: share of answer tokens right\n(teacher-forced)", fontsize=9)
    axes[0].legend(fontsize=7, loc="best")  # the first panel draws every run (learned: one point)
    path = Path(path)
    written = [path, path.with_suffix(".svg")]
    for p in written:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return written


def _probe_panel(ax, probe: list[dict[str, Any]], names: list[str], variants, colors) -> None:
    """The effective-context probe: retrieval gain (bits/byte) by distance between the two copies of
    a random string, per run, with its interval (the results' ``probe`` rows)."""
    for i, name in enumerate(names):
        rows = sorted((r for r in probe if r["name"] == name and r.get("gain")), key=lambda r: r["distance"])
        if not rows:
            continue
        xs = [r["distance"] for r in rows]
        mean = [r["gain"]["mean"] for r in rows]
        low = [r["gain"]["mean"] if r["gain"]["low"] is None else r["gain"]["low"] for r in rows]
        high = [r["gain"]["mean"] if r["gain"]["high"] is None else r["gain"]["high"] for r in rows]
        style = "--" if variants.get(name) else "-"
        ax.plot(xs, mean, style, marker="o", ms=3, color=colors(i), label=name)
        ax.fill_between(xs, low, high, color=colors(i), alpha=0.15, lw=0)
    ax.set_xscale("log", base=2)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("distance between the copies (tokens)")
    ax.set_ylabel("retrieval gain (bits/byte)")
    ax.set_title(
        "effective-context probe: a repeated random string\n(> 0: the second copy is read from the first)",
        fontsize=9,
    )
    ax.grid(alpha=0.3)


def _panels(results: dict[str, Any], path: str | os.PathLike, metrics, title: str) -> list[Path]:
    """One panel per ``(metric, label)`` against the evaluation length, a line and a 95% band per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, rows = results["config"], results["summary"]
    L, lens = cfg["train_len"], cfg["eval_lens"]
    names = list(dict.fromkeys(r["name"] for r in rows))
    colors = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(5.2 * len(metrics), 4.4), squeeze=False, layout="constrained"
    )
    for i, name in enumerate(names):
        style = "--" if any(r["variant"] for r in rows if r["name"] == name) else "-"
        for ax, (metric, _) in zip(axes[0], metrics):
            xs, mean, low, high = _series([r for r in rows if r.get(metric)], name, metric)
            if xs:
                ax.plot(xs, mean, style, marker="o", ms=3, color=colors(i), label=name)
                ax.fill_between(xs, low, high, color=colors(i), alpha=0.15, lw=0)
    for ax, (_, label) in zip(axes[0], metrics):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(e) for e in lens])
        ax.minorticks_off()
        ax.axvline(L, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("evaluation length E (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    n = len(cfg["seeds"])
    axes[0][0].set_title(f"{title}\n(trained at L={L}; 95% interval over {n} seed(s))", fontsize=9)
    axes[0][0].legend(fontsize=7, loc="best")
    path = Path(path)
    written = [path, path.with_suffix(".svg")]
    for p in written:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return written


def plot_attention(results: dict[str, Any], path: str | os.PathLike) -> list[Path]:
    """The attention diagnostics against length (entropy, attended distance, mass beyond ``L``),
    a line per run; ``path`` (png) and ``.svg``."""
    metrics = [
        ("attn_entropy", "attention entropy (bits)"),
        ("attn_distance", "mean attended distance (tokens)"),
        ("attn_beyond", "attention share on keys >= L back"),
    ]
    return _panels(results, path, metrics, "attention over the scored queries, mean of layers and heads")


def plot_training(results: dict[str, Any], path: str | os.PathLike) -> list[Path]:
    """Training loss against step, a line and a 95% band across seeds per run; ``path`` and ``.svg``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {run: t["curve"] for run, t in results.get("training", {}).items()}
    colors = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.4), layout="constrained")
    for i, (run, c) in enumerate(curves.items()):
        for ax, start in zip(axes, (0, len(c["step"]) // 2)):
            sl = slice(start, None)
            ax.plot(c["step"][sl], c["mean"][sl], color=colors(i), label=run)
            ax.fill_between(c["step"][sl], c["low"][sl], c["high"][sl], color=colors(i), alpha=0.15, lw=0)
    n = len(results["config"]["seeds"])
    for ax, title in zip(axes, ("training loss", "second half")):
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats per token)")
        ax.set_title(f"{title} (95% interval over {n} seed(s))", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    path = Path(path)
    written = [path, path.with_suffix(".svg")]
    for p in written:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return written
