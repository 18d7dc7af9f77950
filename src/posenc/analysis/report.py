"""One self-contained HTML page comparing every registered scheme: figures, properties, formulas.

:func:`build_report` builds every scheme from :data:`~posenc.analysis.kernel.DEFAULT_CONTEXT`
(no data, no downloads), runs every property check, draws the plots that apply to each scheme
and writes ``DIR/index.html`` with the images embedded as base64 ``data:`` URIs, so the single
file can be mailed or opened offline. ``posenc report`` calls it.
"""

from __future__ import annotations

import base64
import html
import io
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch

from .. import __version__
from .._validate import check_choice, check_int
from ..registry import describe
from ..registry import schemes as registered_schemes
from .kernel import DEFAULT_CONTEXT, Probe, display_kernel, kernel_curve, make_probe
from .plots import PLOT_KINDS, render
from .properties import PROPERTIES, PropertyResult, check, seed_claims

__all__ = ["REPORT_KINDS", "build_report", "figure_data_uri", "report_html", "report_kinds"]

#: Plot kinds shown per scheme in the report, in order (each only where it applies).
REPORT_KINDS = ("heatmap", "frequencies", "kernel_curve", "bias", "kernel", "scalings")


def report_kinds(probe: Probe, results: Sequence[PropertyResult]) -> list[str]:
    """The report's plots for one scheme: every applicable kind of :data:`REPORT_KINDS`, except the
    kernel heatmap where it adds nothing to the curve (one head, translation invariant: constant
    diagonals). Keeps the report under a minute on 2 cores."""
    invariant = any(r.property == "translation_inv" and r.passed for r in results)
    kinds = []
    for kind in REPORT_KINDS:
        if PLOT_KINDS[kind].applies(probe) is not None:
            continue
        if kind == "kernel" and invariant and "score_bias" not in probe.hooks:
            continue
        kinds.append(kind)
    return kinds


_EXPLAIN: dict[str, str] = {
    "distinct_fp32": "Every position must get its own vector, or the model cannot tell them apart. Measured "
    "as the smallest distance between two positions' vectors relative to a typical norm; it must be > 0.",
    "distinct_bf16": "The same after <code>module.to(torch.bfloat16)</code>: a table stored in bf16 or "
    "positions held in bf16 (8 mantissa bits) collapse neighbours; posenc keeps positions integer.",
    "distinct_fp16": "The same in float16.",
    "bounded": "Sinusoidal values stay in [−1, 1] at every position; a rotation keeps |R<sub>p</sub>x| = |x| "
    "(xPos deliberately scales q and k, so it does not).",
    "relative_linear": "Vaswani et al.'s reason for sinusoids: PE(p+k) = M<sub>k</sub> PE(p) for a fixed "
    "matrix M<sub>k</sub> (a block rotation). posenc fits M<sub>k</sub> by least squares and reports the "
    "relative residual: float rounding for sinusoids and rotations, O(1) for a learned table.",
    "translation_inv": "K(m+t, n+t) = K(m, n): attention sees only the distance m − n. The threshold is "
    "float32 angle rounding at the largest position used (8·2<sup>−24</sup>·P).",
    "decay": "Far keys should matter less. ALiBi: the bias falls linearly with its slope. RoPE: RoFormer's "
    "bound B(r) = mean<sub>j</sub>|Σ<sub>i&lt;j</sub> e<sup>i r θ<sub>i</sub></sup>| falls with r. "
    "Added encodings: mean |K| far away over |K(0)| (informational).",
    "symmetry": "K(m, n) = K(n, m) with shared content; informational (causal and bucketed schemes differ).",
    "beyond_length": "Can the scheme encode positions at 4× its nominal length L? A learned table cannot.",
    "wavelengths": "Wavelength 2π/θ<sub>i</sub> of each frequency pair against the context length L: pairs "
    "with wavelength ≤ L wrap around inside the context; the slowest must not, or far positions alias.",
}

_STATUS_CLASS = {"pass": "pass", "FAIL": "fail", "no": "no", "n/a": "na"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1280px;margin:0 auto;
padding:24px;color:#1d1d1f;line-height:1.45}
h1{margin-bottom:0}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:40px}
code,.formula{font-family:ui-monospace,Menlo,Consolas,monospace;background:#f4f4f6;padding:1px 4px;
border-radius:3px}
table{border-collapse:collapse;margin:12px 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f3}
td.pass{background:#dff3e3}td.fail{background:#f8d0d0;font-weight:bold}td.no{background:#fff2cc}
td.na{color:#999}
.figs{display:flex;flex-wrap:wrap;gap:12px}
.figs figure{margin:0;max-width:100%}
.figs img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:12px;color:#555}
.muted{color:#666;font-size:13px}
"""


def figure_data_uri(fig: Any, *, dpi: int = 72) -> str:
    """A matplotlib figure as a ``data:image/png;base64,...`` URI (the figure is closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(uri: str, caption: str) -> str:
    return (
        f'<figure><img src="{uri}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}"


def _property_table(results: dict[str, list[PropertyResult]]) -> str:
    props = list(PROPERTIES)
    head = "".join(f'<th title="{html.escape(PROPERTIES[p].formula)}">{html.escape(p)}</th>' for p in props)
    rows = []
    for name, res in results.items():
        cells = []
        for r in res:
            tip = html.escape(
                f"{r.reason}; threshold {r.comparison} {_fmt(r.threshold)}; "
                f"{'promised' if r.promised else 'not promised'}"
            )
            text = r.status if r.value is None else f"{r.status}<br><small>{_fmt(r.value)}</small>"
            cells.append(f'<td class="{_STATUS_CLASS[r.status]}" title="{tip}">{text}</td>')
        rows.append(f"<tr><th>{html.escape(name)}</th>{''.join(cells)}</tr>")
    return f"<table><tr><th>scheme</th>{head}</tr>{''.join(rows)}</table>"


def _property_notes() -> str:
    items = []
    for name, p in PROPERTIES.items():
        items.append(
            f"<li><b>{html.escape(name)}</b> — <span class='formula'>{html.escape(p.formula)}</span>"
            f" ({html.escape(p.comparison)} threshold). {_EXPLAIN.get(name, '')}</li>"
        )
    return "<ul>" + "".join(items) + "</ul>"


def _mean_curve(probe: Probe) -> tuple[list[int], list[float]] | None:
    """The scheme's kernel against key distance ``r >= 0`` (mean over heads), scaled to max 1."""
    if not probe.hooks:
        return None
    n = min(probe.nominal_len, 256)
    r, curve = kernel_curve(display_kernel(probe, n)[0])  # [2n-1], [h, 2n-1]
    c = curve.mean(0)[r >= 0]  # [n]
    scale = float(c.abs().max()) or 1.0
    return list(range(n)), (c / scale).tolist()


def _comparison_figure(curves: dict[str, tuple[list[int], list[float]] | None]) -> str | None:
    """Every scheme's kernel against distance on one axes, each scaled to max |K| = 1."""
    drawn = {name: c for name, c in curves.items() if c is not None}
    if not drawn:
        return None
    fig = plt.figure(figsize=(9.5, 4.4), layout="constrained")
    ax = fig.add_subplot()
    for idx, (name, (r, c)) in enumerate(drawn.items()):
        ax.plot(r, c, lw=1.3, label=name, color=f"C{idx % 10}", ls="-" if idx < 10 else "--")
    ax.set_xlabel("key distance before the query, m − n (tokens)")
    ax.set_ylabel("mean kernel / max |kernel|")
    ax.set_title("Positional kernel against distance, every scheme (mean over heads and content)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return figure_data_uri(fig)


def _seed_table() -> str:
    rows = "".join(
        f"<tr><td>{html.escape(c.seed)}</td><td>{html.escape(c.claim)}</td><td>{html.escape(c.claimed)}</td>"
        f"<td>{html.escape(c.measured)}</td><td>{html.escape(c.verdict)}</td></tr>"
        for c in seed_claims()
    )
    return (
        "<table><tr><th>seed</th><th>claim</th><th>says</th><th>posenc measures</th><th>verdict</th></tr>"
        f"{rows}</table>"
    )


def _scheme_part(name: str, ctx: dict[str, Any], dpi: int) -> dict[str, Any]:
    """Checks, figures and kernel curve of one scheme (runs in a worker process)."""
    info = describe(name)
    try:
        probe = make_probe(name, ctx)
    except (ValueError, TypeError) as err:
        return {
            "section": f"<h3 id='{html.escape(name)}'>{html.escape(name)}</h3>"
            f"<p class='muted'>cannot be built from the report's context: {html.escape(str(err))}</p>",
            "results": None,
            "curve": None,
        }
    results = check(probe)
    figs = []
    for kind in report_kinds(probe, results):
        spec = PLOT_KINDS[kind]
        figs.append(_img(figure_data_uri(render(probe, kind), dpi=dpi), f"{name}: {spec.title}"))
    broken = [r.property for r in results if r.broken_promise]
    verdict = (
        f"<b style='color:#b00'>breaks: {', '.join(broken)}</b>"
        if broken
        else "keeps every property it promises"
    )
    section = (
        f"<h3 id='{html.escape(name)}'>{html.escape(name)}</h3>"
        f"<p>{html.escape(info['summary'])}. Hooks: "
        f"<code>{html.escape(', '.join(info['hooks']) or 'none')}</code>; "
        f"nominal length {probe.nominal_len}; {verdict}.</p>"
        + (
            f"<div class='figs'>{''.join(figs)}</div>"
            if figs
            else "<p class='muted'>no positional hooks: nothing to plot (its kernel is zero).</p>"
        )
    )
    return {"section": section, "results": results, "curve": _mean_curve(probe)}


def _worker_init() -> None:
    torch.set_num_threads(1)  # one process per core; as torch's DataLoader workers do


def _parts(names: list[str], ctx: dict[str, Any], dpi: int, workers: int) -> list[dict[str, Any]]:
    """:func:`_scheme_part` for every scheme, on ``workers`` forked processes (in order).

    Forked workers inherit the registry, so schemes registered at run time are reported too.
    Without ``fork`` (Windows, macOS default) or with one worker, runs in this process.
    """
    if workers > 1 and len(names) > 1 and "fork" in multiprocessing.get_all_start_methods():
        ctx_fork = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            min(workers, len(names)), mp_context=ctx_fork, initializer=_worker_init
        ) as pool:
            futures = [pool.submit(_scheme_part, n, ctx, dpi) for n in names]
            return [f.result() for f in futures]
    return [_scheme_part(n, ctx, dpi) for n in names]


def report_html(
    schemes: Sequence[str] | None = None,
    *,
    context: dict[str, Any] | None = None,
    dpi: int = 72,
    workers: int | None = None,
) -> str:
    """The report as one HTML string (see :func:`build_report`)."""
    t0 = time.perf_counter()
    ctx = {**DEFAULT_CONTEXT, **(context or {})}
    names = list(schemes) if schemes else registered_schemes()
    for n in names:
        check_choice(n, "scheme", registered_schemes())
    workers = min(2, os.cpu_count() or 1) if workers is None else check_int(workers, "workers")
    parts = _parts(names, ctx, dpi, workers)
    sections = [p["section"] for p in parts]
    results: dict[str, list[PropertyResult]] = {n: p["results"] for n, p in zip(names, parts) if p["results"]}
    curves = {n: p["curve"] for n, p in zip(names, parts)}
    comparison = _comparison_figure(curves)
    elapsed = time.perf_counter() - t0
    ctx_text = ", ".join(f"{k}={v}" for k, v in ctx.items())
    broken_all = [f"{r.scheme}.{r.property}" for res in results.values() for r in res if r.broken_promise]
    toc = " · ".join(f"<a href='#{html.escape(n)}'>{html.escape(n)}</a>" for n in names)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posenc report</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>
<body>
<h1>posenc: every positional scheme, seen and checked</h1>
<p class="muted">posenc {__version__} · torch {torch.__version__} · {
        len(names)
    } registered schemes · built from
defaults ({html.escape(ctx_text)}), no data · {elapsed:.1f} s</p>
<p>{toc}</p>

<h2>The positional kernel</h2>
<p>A scheme acts on attention through up to three hooks. For fixed content, the part of the (scaled)
attention logit that depends on the query position m and the key position n is the <b>positional
kernel</b> K(m, n):</p>
<ul>
<li><code>embed</code> (added to the input): <span class="formula">K(m, n) = PE(m)·PE(n) / √d</span>
(with an identity projection);</li>
<li><code>rotate</code> (queries and keys):
<span class="formula">K(m, n) = (R<sub>m</sub>q)·(R<sub>n</sub>k) / √d<sub>h</sub></span>;
the report uses the mean over isotropic content shared by q and k,
<span class="formula">trace(R<sub>m</sub><sup>T</sup>R<sub>n</sub>) / √d<sub>h</sub></span>;</li>
<li><code>score_bias</code> (added to the logits):
<span class="formula">K<sub>h</sub>(m, n) = bias<sub>h</sub>(m, n)</span>, per head.</li>
</ul>
{
        ('<div class="figs">' + _img(comparison, "kernel against distance, every scheme") + "</div>")
        if comparison
        else ""
    }

<h2>Properties</h2>
<p>Each cell: status and measured value (hover for the threshold and how it was measured).
<b>pass</b>: holds; <b>FAIL</b>: a property the scheme promises does not hold (<code>posenc verify</code>
exits 1); <b>no</b>: does not hold and is not promised (e.g. a learned table at init is not
translation invariant); <b>n/a</b>: does not apply (hover for why).
{
        ("<b style='color:#b00'>Broken promises: " + html.escape(", ".join(broken_all)) + "</b>")
        if broken_all
        else "No scheme breaks a property it promises."
    }</p>
{_property_table(results)}
{_property_notes()}

<h2>Schemes</h2>
{"".join(sections)}

<h2>Common claims, measured</h2>
<p>Measured with posenc's own sinusoidal encoding.</p>
{_seed_table()}

<h2>How to read the plots</h2>
<ul>
<li><b>heatmap</b>: rows are positions, columns dimensions; fast dimensions (low i) flicker, slow ones
barely change over the context.</li>
<li><b>frequencies</b>: wavelength 2π/θ<sub>i</sub> per dimension pair on a log axis against the context
length L (dashed): pairs below the line complete a period inside the context.</li>
<li><b>kernel against distance</b>: the mean of K(m, m − r) over m; for rotations the dashed line is
RoFormer's decay bound.</li>
<li><b>bias per head</b>: each head's bias against m − n; ALiBi's heads are lines with slopes
2<sup>−8h/H</sup>.</li>
<li><b>kernel</b>: K(m, n) as an image; translation invariance shows as constant diagonals.</li>
<li><b>scalings</b>: how linear (PI), NTK, YaRN and Llama 3 scaling stretch each pair's wavelength.</li>
</ul>
<p class="muted">See docs/analysis.md for the maths and caveats.</p>
</body></html>
"""


def build_report(
    out_dir: str | Path = "report",
    schemes: Sequence[str] | None = None,
    *,
    context: dict[str, Any] | None = None,
    dpi: int = 72,
    workers: int | None = None,
) -> Path:
    """Write the self-contained report to ``out_dir/index.html`` and return its path.

    Args:
        out_dir: the output folder (created).
        schemes: scheme names (default: every registered scheme).
        context: model sizes to build schemes with (default :data:`DEFAULT_CONTEXT`).
        dpi: resolution of the embedded PNGs.
        workers: processes drawing schemes in parallel (default: 2, or 1 on a 1-core machine).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(report_html(schemes, context=context, dpi=dpi, workers=workers), encoding="utf-8")
    return path
