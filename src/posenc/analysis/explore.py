"""The report's "explore" figures: one parameter on a slider, another in a menu.

Each figure builds the schemes through the registry for every value shown (the same path a
model takes) and reads them through :mod:`~posenc.analysis.kernel`; the page switches between
precomputed traces (:func:`~posenc.analysis.interactive.selector_figure`), so it stays offline.
Schemes are chosen by what they declare: a frequency-based ``embed`` scheme taking ``base`` for the
first figure, a ``rotate`` scheme taking ``scaling`` and ``base`` for the next two, and a
``score_bias`` scheme taking ``causal`` for the last (:func:`explorers` finds them).

Legend: ``s`` positions, ``d`` model width, ``r`` distance ``m - n``, ``L`` the context length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..registry import config_keys, scheme_class
from ..registry import schemes as registered_schemes
from .interactive import selector_figure, vline
from .kernel import display_kernel, encodings, make_probe, rotation_frequencies

__all__ = ["EXPLORERS", "Explorer", "explorers"]


@dataclass(frozen=True)
class Explorer:
    """One explore figure: which schemes it can show (``accepts(hooks, config keys)``), how to build
    its figure (``build(name, context)``) and its caption (HTML, what to try and what to notice)."""

    title: str
    accepts: Callable[[tuple[str, ...], dict[str, Any]], bool]
    build: Callable[[str, dict[str, Any]], dict[str, Any]]
    caption: str


def _fmt(x: float) -> str:
    return f"{x:g}"


# ---------------------------------------------------------------------------------------------- embed
def _similarity(name: str, ctx: dict[str, Any]) -> dict[str, Any]:
    """cos(PE(p), PE(n)) against n, slider over the query position p, menu over d."""
    L = min(int(ctx["max_len"]), 512)
    widths = sorted({16, 64, int(ctx["d_model"]), 512})
    offsets = sorted({0, L // 8, L // 4, L // 2, 3 * L // 4, L - 1})
    traces = {}
    for d in widths:
        enc = encodings(make_probe(name, {**ctx, "d_model": d}), L).double()  # [s, d]
        unit = enc / enc.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # [s, d], rows of norm 1
        for p in offsets:
            sim = unit @ unit[p]  # [s]: cos(PE(n), PE(p)) for every n
            traces[(str(d), str(p))] = [
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": list(range(L)),
                    "y": sim.tolist(),
                    "name": f"d = {d}, p = {p}",
                    "line": {"width": 1.6, "color": "#1f77b4"},
                    "hovertemplate": f"n = %{{x}}<br>cos(PE({p}), PE(n)) = %{{y:.3f}}<extra></extra>",
                }
            ]
    layout = {
        "xaxis": {"title": {"text": "position n (tokens)"}},
        "yaxis": {"title": {"text": "cos(PE(p), PE(n))"}, "range": [-0.3, 1.05]},
        "height": 400,
    }
    start = (str(int(ctx["d_model"])), str(offsets[2]))
    return selector_figure(
        traces, ("d_model", [str(d) for d in widths]), ("p", [str(p) for p in offsets]), layout, start=start
    )


# ---------------------------------------------------------------------------------------------- rotate
def _scaling_config(rule: str, factor: float, L: int, rotary_pairs: int) -> dict[str, Any]:
    """The ``scaling`` option of rule ``rule`` (HF's ``rope_type`` names) at ``factor``, for a model
    trained at ``L`` with ``rotary_pairs`` rotated pairs. LongRoPE's per-pair divisors are searched
    for each model; here they rise linearly from 1 on the fastest pair to ``factor`` on the slowest,
    a stand-in that shows how the rule works (its short divisors are 1: unchanged inside L)."""
    if rule == "linear":
        return {"rope_type": "linear", "factor": factor}
    if rule == "ntk":
        return {"rope_type": "ntk", "factor": factor}
    if rule == "proportional":  # the fraction of turning pairs is the model's own; half shows the form
        return {"rope_type": "proportional", "factor": factor, "partial_rotary_factor": 0.5}
    if rule == "llama3":
        return {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": L,
        }
    if rule == "longrope":
        ramp = [1 + (factor - 1) * i / max(rotary_pairs - 1, 1) for i in range(rotary_pairs)]
        return {
            "rope_type": "longrope",
            "factor": factor,
            "short_factor": [1.0] * rotary_pairs,
            "long_factor": ramp,
            "original_max_position_embeddings": L,
        }
    return {"rope_type": rule, "factor": factor, "original_max_position_embeddings": L}  # dynamic, yarn


#: Scalings offered by the rotary explorer: every rule posenc's RoPE takes (``none`` is drawn as a
#: grey reference in every view).
SCALING_RULES = ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "proportional")


def _curve_trace(probe, n: int, step: int, label: str, color: str = "#d62728") -> dict[str, Any]:
    """The kernel seen from the last of ``n`` queries against every key before it (a rotation's
    kernel depends only on the distance, so one query row is the whole curve)."""
    kern, _ = display_kernel(probe, [n - 1], n)  # [h, 1, n]
    r = torch.arange(n - 1, -1, -1)  # distance of each key from the query [n]
    keep = r % step == 0  # thinned to <= ~500 points
    return {
        "type": "scatter",
        "mode": "lines",
        "x": r[keep].tolist(),
        "y": kern.mean(0)[0][keep].tolist(),
        "name": label,
        "line": {"width": 1.4, "color": color},
        "hovertemplate": f"{label}<br>r = %{{x}}<br>K = %{{y:.3f}}<extra></extra>",
    }


def _y_range(traces: list[dict[str, Any]]) -> list[float]:
    """One y-axis range for every view of a figure, so switching views does not rescale it."""
    ys = [y for t in traces for y in t["y"] if y is not None and math.isfinite(y)]
    lo, hi = min(ys), max(ys)
    pad = 0.05 * (hi - lo or 1.0)
    return [lo - pad, hi + pad]


def _scalings(name: str, ctx: dict[str, Any]) -> dict[str, Any]:
    """Kernel against distance up to 4L: menu over the scaling, slider over its factor, plain RoPE
    as a grey reference."""
    L = min(int(ctx["max_len"]), 256)  # K(m, n) over 4L positions: 1024^2 values per head at most
    n = 4 * L
    step = max(1, n // 512)
    factors = ["1", "2", "4", "8"]
    plain = make_probe(name, {**ctx, "max_len": L})
    pairs = len(rotation_frequencies(plain))
    reference = _curve_trace(plain, n, step, "none (plain RoPE)", "#9a9a9a")
    traces = {}
    for rule in SCALING_RULES:
        for f in factors:
            config = {"scaling": _scaling_config(rule, float(f), L, pairs)} if f != "1" else None
            probe = make_probe(name, {**ctx, "max_len": L}, config)
            traces[(rule, f)] = [_curve_trace(probe, n, step, f"{rule}, factor {f}")]
    layout = {
        "xaxis": {"title": {"text": "distance m − n (tokens)"}},
        "yaxis": {
            "title": {"text": "mean K (logit units)"},
            "range": _y_range([reference, *(t for ts in traces.values() for t in ts)]),
        },
        "shapes": [vline(L)],
        "annotations": [
            {"x": L, "y": 1, "yref": "paper", "text": f"L = {L}", "showarrow": False, "xanchor": "left"}
        ],
        "legend": {"font": {"size": 13}},
        "height": 420,
    }
    return selector_figure(
        traces,
        ("scaling", list(SCALING_RULES)),
        ("factor", factors),
        layout,
        start=("linear", "4"),
        reference=[reference],
    )


def _bases(name: str, ctx: dict[str, Any]) -> dict[str, Any]:
    """Kernel against distance for bases 100 .. 1e6 (slider): the base sets the slowest wavelength."""
    L = min(int(ctx["max_len"]), 512)
    bases = ["100", "1000", "10000", "100000", "1000000"]
    traces = {
        ("", b): [_curve_trace(make_probe(name, ctx, {"base": float(b)}), L, max(1, L // 512), f"base {b}")]
        for b in bases
    }
    layout = {
        "xaxis": {"title": {"text": "distance m − n (tokens)"}},
        "yaxis": {"title": {"text": "mean K (logit units)"}},
        "height": 380,
    }
    return selector_figure(traces, None, ("base", bases), layout, start=("", "10000"))


# ---------------------------------------------------------------------------------------------- bias
def _heads(name: str, ctx: dict[str, Any]) -> dict[str, Any]:
    """The bias ``[m, n]`` of one head (slider), causal or bidirectional (menu)."""
    n = min(int(ctx["max_len"]), 48)
    cls = scheme_class(name)
    forms = {
        form: causal
        for form, causal, ok in (
            ("causal", True, cls.causal_ok),
            ("bidirectional", False, cls.bidirectional_ok),
        )
        if ok  # only the forms the scheme has (CoPE has no bidirectional one)
    }
    traces = {}
    heads = int(ctx["num_heads"])
    shown = list(range(0, heads, -(-heads // 16)))  # at most ~16 heads: the page stays small
    for form, causal in forms.items():
        kern, _ = display_kernel(make_probe(name, {**ctx, "causal": causal}), n)  # [h, n, n]
        if causal:  # keys after the query are masked out: the model never sees those entries
            kern = kern.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), math.nan)
        for h in shown:
            z = kern[h].float()
            vmax = float(z.nan_to_num().abs().max()) or 1.0
            traces[(form, str(h))] = [
                {
                    "type": "heatmap",
                    "z": z.tolist(),
                    "zmin": -vmax,
                    "zmax": vmax,
                    "colorscale": "RdBu",
                    "hovertemplate": "query m = %{y}<br>key n = %{x}<br>bias = %{z:.3f}<extra></extra>",
                }
            ]
    layout = {
        "xaxis": {"title": {"text": "key position n"}, "constrain": "domain"},
        "yaxis": {"title": {"text": "query position m"}, "scaleanchor": "x", "constrain": "domain"},
        "height": 470,
    }
    start = ("causal" if ctx.get("causal") or "bidirectional" not in forms else "bidirectional", "0")
    return selector_figure(
        traces, ("form", list(forms)), ("head", [str(h) for h in shown]), layout, start=start
    )


EXPLORERS: tuple[Explorer, ...] = (
    Explorer(
        "Position similarity: move the query position, change the width",
        lambda hooks, keys: "embed" in hooks and "base" in keys and "d_model" in keys,
        _similarity,
        "cos(PE(p), PE(n)) for every position n. Move <b>p</b>: the curve moves with it and keeps its "
        "shape, because PE(p)·PE(n) depends only on p − n. Change <b>d_model</b>: more dimensions give a "
        "sharper peak (positions become easier to tell apart), but neighbours stay strongly aligned: "
        "sinusoidal encodings are far from orthogonal.",
    ),
    Explorer(
        "Rotary scalings: stretch the context",
        lambda hooks, keys: "rotate" in hooks and "scaling" in keys,
        _scalings,
        "The rotary kernel against distance up to 4L (red), with plain RoPE in grey. Choose a "
        "<b>scaling</b> (every rule posenc's RoPE takes) and a <b>factor</b>: each keeps the other. "
        "Linear interpolation (PI) slows every frequency, so the whole curve stretches by the factor; NTK, "
        "YaRN and Llama 3 leave the fast pairs (short distances) almost as they were and stretch the "
        "slow ones; dynamic NTK grows its factor with the length read; LongRoPE divides each pair by its "
        "own factor (here rising from 1 to the factor, a stand-in for its searched values). The y-axis "
        "stays fixed, so curves compare across choices.",
    ),
    Explorer(
        "Rotary base: the slowest wavelength",
        lambda hooks, keys: "rotate" in hooks and "base" in keys,
        _bases,
        "The same kernel for bases from 100 to 10<sup>6</sup> (10 000 is the usual default). A small "
        "base makes every pair turn quickly: the kernel oscillates and stops telling far distances "
        "apart. A large base keeps slow pairs slow: the kernel decays gently over the whole context.",
    ),
    Explorer(
        "Biases by head: causal or bidirectional",
        lambda hooks, keys: "score_bias" in hooks,
        _heads,
        "One head's bias for every query m and key n. Move <b>head</b>: each head has its own (ALiBi: a "
        "slope from steep, attending locally, to almost flat, seeing the whole context). <b>causal</b> "
        "shows what a decoder sees (keys after the query are masked, blank) from the scheme built as a "
        "decoder's; <b>bidirectional</b> the scheme built as an encoder's (ALiBi's bias is the same "
        "symmetric −slope·|m − n| in both; T5 gives keys after the query buckets of their own).",
    ),
)


def explorers(names: Sequence[str] | None = None) -> list[tuple[Explorer, str]]:
    """Each explorer with the first scheme of ``names`` (default: every registered scheme) it
    accepts, by the scheme's declared hooks and configuration keys."""
    from ..registry import describe

    names = list(names) if names is not None else registered_schemes()
    out = []
    for ex in EXPLORERS:
        for n in names:
            if ex.accepts(tuple(describe(n)["hooks"]), config_keys(n)):
                out.append((ex, n))
                break
    return out
