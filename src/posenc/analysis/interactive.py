"""The report's interactive figures as Plotly figure dicts (drawn by :mod:`~posenc.analysis.page`).

Every figure reads its numbers from the same functions as the static plots and the checks
(:func:`~posenc.analysis.kernel.display_kernel`, :func:`~posenc.analysis.kernel.encodings`), never
from a second copy of a scheme's maths. Figures that vary a parameter precompute one set of
traces per value and switch between them with Plotly's own controls (a drop-down menu and a
slider, :func:`selector_figure`), so the page needs no server.

Legend: ``h`` heads, ``m`` query positions, ``n`` key positions, ``r`` distance ``m - n``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .kernel import Probe, display_kernel, encodings, kernel_curve

__all__ = [
    "HOOK_COLORS",
    "OVERVIEW_VIEWS",
    "kernel_profile",
    "overview_figure",
    "selector_figure",
    "study_figure",
    "trained_figure",
    "vline",
]

#: One colour per hook group, shared by every figure of the report.
HOOK_COLORS = {"embed": "#1f77b4", "rotate": "#d62728", "score_bias": "#2ca02c", "none": "#7f7f7f"}


def kernel_profile(probe: Probe, n: int, *, scaled: bool = True) -> tuple[list[int], list[float]]:
    """The kernel against key distance ``r = 0..n-1`` before the query (mean over heads and query
    positions): ``(r [n], profile [n])``, scaled so its largest ``|value|`` is 1 (``scaled``), else
    in scaled-logit units."""
    r, curve = kernel_curve(display_kernel(probe, n)[0])  # [2n-1], [h, 2n-1]
    c = curve.mean(0)[r >= 0]  # [n]: keys at or before the query
    scale = (float(c.abs().max()) or 1.0) if scaled else 1.0
    return list(range(n)), (c / scale).tolist()


def vline(x: float) -> dict[str, Any]:
    """A dashed vertical line at ``x`` across the plot (a layout shape), e.g. at the trained length."""
    line = {"dash": "dash", "color": "#999"}
    return {"type": "line", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1, "line": line}


def _axis(i: int) -> str:
    """Plotly's name of the i-th axis pair's suffix: '' for the first, '2', '3', ... after."""
    return "" if i == 0 else str(i + 1)


#: The overview's two views of every panel (its menu): magnitudes on each panel's own y-axis, or
#: every curve divided by its own largest |K| on one shared axis, so shapes compare.
OVERVIEW_VIEWS = (
    ("magnitude: K in logit units, each panel its own y-axis", "K (logit units)"),
    ("shape: K / max |K|, one shared y-axis", "K / max |K|"),
)


def _peak(y: Sequence[float]) -> float:
    """The largest |value| of a curve (0 for a zero curve)."""
    return max((abs(v) for v in y), default=0.0)


def overview_figure(panels: Sequence[dict[str, Any]], columns: int = 4) -> dict[str, Any]:
    """Small multiples: one panel per scheme, the distance axis shared, and a menu between the
    two :data:`OVERVIEW_VIEWS`: raw values (the default; each panel's title gives its largest |K|)
    or each curve scaled to a largest |K| of 1 on one shared y-axis.

    Args:
        panels: ``{"title", "group", "r", "y", "extra"}`` per scheme: distances, the kernel in
            logit units, and optional extra traces (e.g. the initialisation beside a trained
            curve) as ``[(label, r, y, dash)]``.
        columns: panels per row.
    """
    rows = -(-len(panels) // columns)
    data, annotations, layout, shapes = [], [], {}, []
    for i, panel in enumerate(panels):
        ax = _axis(i)
        color = HOOK_COLORS.get(panel["group"], "#444")
        traces = [(panel.get("label", "kernel"), panel["r"], panel["y"], "solid", color)]
        traces += [(label, r, y, dash, "#111") for label, r, y, dash in panel.get("extra", ())]
        for label, r, y, dash, c in traces:
            shapes.append([v / (_peak(y) or 1.0) for v in y])
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": r,
                    "y": list(y),
                    "name": f"{panel['title']}: {label}",
                    "line": {"color": c, "width": 1.8, "dash": dash},
                    "xaxis": f"x{ax}",
                    "yaxis": f"y{ax}",
                    "showlegend": False,
                    "hovertemplate": f"{panel['title']} ({label})<br>r = %{{x}}<br>value = %{{y:.3g}}"
                    "<extra></extra>",
                }
            )
        row, col = divmod(i, columns)
        bottom = row == rows - 1 or i + columns >= len(panels)  # no panel below this one
        layout[f"xaxis{ax}"] = {
            "matches": "x" if i else None,
            "showticklabels": bottom,
            "title": {"text": "distance m − n (tokens)" if bottom else "", "font": {"size": 12}},
        }
        layout[f"yaxis{ax}"] = {
            "autorange": True,
            "zeroline": True,
            "title": {"text": OVERVIEW_VIEWS[0][1] if col == 0 else "", "font": {"size": 12}},
        }
        annotations.append(
            {
                "text": f"<b>{panel['title']}</b> · max |K| {_peak(panel['y']):.3g}",
                "xref": f"x{ax} domain",
                "yref": f"y{ax} domain",
                "x": 0.5,
                "y": 1.0,
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"color": color, "size": 12},
            }
        )
    titled = [f"yaxis{_axis(i)}" for i in range(len(panels)) if i % columns == 0]
    views = []
    for v, (label, title) in enumerate(OVERVIEW_VIEWS):
        axes: dict[str, Any] = {f"{t}.title.text": title for t in titled}
        for i in range(len(panels)):
            axes.update(
                {f"yaxis{_axis(i)}.autorange": True}
                if v == 0
                else {f"yaxis{_axis(i)}.range": [-1.1, 1.1], f"yaxis{_axis(i)}.autorange": False}
            )
        ys = [t["y"] for t in data] if v == 0 else shapes
        views.append({"label": label, "method": "update", "args": [{"y": ys}, axes]})
    height, top, bottom = 190 * rows + 140, 90, 60  # pixels: the menu and toolbar sit in the top margin
    layout.update(
        {
            "grid": {"rows": rows, "columns": columns, "pattern": "independent", "ygap": 0.45},
            "annotations": annotations,
            "height": height,
            "margin": {"l": 60, "r": 10, "t": top, "b": bottom},
            "updatemenus": [
                {
                    "type": "dropdown",
                    "x": 0.0,
                    "y": 1 + 40 / (height - top - bottom),  # 40 px above the plotting area, in paper units
                    "yanchor": "bottom",
                    "xanchor": "left",
                    "active": 0,
                    "buttons": views,
                }
            ],
        }
    )
    return {"data": data, "layout": layout}


def selector_figure(
    traces: dict[tuple[str, str], list[dict[str, Any]]],
    menu: tuple[str, Sequence[str]] | None,
    slider: tuple[str, Sequence[str]],
    layout: dict[str, Any],
    *,
    start: tuple[str, str] | None = None,
    reference: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A figure that shows one group of traces at a time, chosen by a drop-down ``menu`` (label,
    values) and a ``slider`` (label, values); ``traces[(menu value, slider value)]`` are the group's
    Plotly traces, and ``reference`` traces are always shown.

    The menu and the slider are independent: changing one keeps the other's value. The page's
    loader (:func:`~posenc.analysis.page.plotly_script`) does the switching from
    ``layout.meta.selector`` (which group owns each trace); the buttons and steps themselves only
    report what was chosen (Plotly's ``"skip"`` method).
    """
    menu_values = list(menu[1]) if menu else [""]
    slider_values = list(slider[1])
    keys = [(m, s) for m in menu_values for s in slider_values]
    data: list[dict[str, Any]] = []
    owner: list[list[int] | None] = []
    for key in keys:
        for t in traces[key]:
            data.append(t)
            owner.append([menu_values.index(key[0]), slider_values.index(key[1])])
    for t in reference:
        data.append(t)
        owner.append(None)
    m0, s0 = start or keys[0]
    mi, si = menu_values.index(m0), slider_values.index(s0)
    for t, o in zip(data, owner):
        t["visible"] = o is None or o == [mi, si]
    out_layout = {
        **layout,
        "meta": {"selector": {"owner": owner, "menu": mi, "slider": si}},
        "sliders": [
            {
                "active": si,
                "currentvalue": {"prefix": f"{slider[0]} = "},
                "pad": {"t": 40},
                "steps": [{"label": v, "method": "skip", "args": []} for v in slider_values],
            }
        ],
    }
    if menu:
        out_layout["updatemenus"] = [
            {
                "type": "dropdown",
                "x": 0.0,
                "y": 1.18,
                "xanchor": "left",
                "active": mi,
                "buttons": [{"label": f"{menu[0]}: {m}", "method": "skip", "args": []} for m in menu_values],
            }
        ]
        out_layout.setdefault("margin", {"t": 70})
    return {"data": data, "layout": out_layout}


def _heat(
    z: torch.Tensor, *, name: str, x: str, y: str, axis: int = 0, vmax: float | None = None, **extra: Any
) -> dict[str, Any]:
    """A heatmap trace of ``z`` ``[rows, cols]`` with a colour scale symmetric around 0, to ``vmax``
    (default: ``max |z|``)."""
    z = z.float()
    vmax = vmax or float(z.abs().max()) or 1.0
    ax = _axis(axis)
    return {
        "type": "heatmap",
        "z": z.tolist(),
        "zmin": -vmax,
        "zmax": vmax,
        "colorscale": "RdBu",
        "name": name,
        "xaxis": f"x{ax}",
        "yaxis": f"y{ax}",
        "hovertemplate": f"{x} = %{{x}}<br>{y} = %{{y}}<br>value = %{{z:.4f}}<extra>{name}</extra>",
        **extra,
    }


def trained_figure(initial: Probe, trained: Probe, train_len: int) -> dict[str, Any]:
    """Initial and trained kernel ``K(m, n)`` side by side (head 0, each on its own colour scale: the
    initial values are often 100x smaller, and would read as a uniform square on the trained
    scale), and the kernel against distance per head, trained (solid) and initial (dotted, head
    mean)."""
    n = train_len
    k_init, _ = display_kernel(initial, n)  # [h, n, n]
    k_trained, _ = display_kernel(trained, n)  # [h, n, n]
    bar = {"len": 0.9, "thickness": 10, "xanchor": "left", "tickfont": {"size": 11}}
    data = [
        _heat(k_init[0], name="initial", x="key n", y="query m", axis=0, colorbar={**bar, "x": 0.245}),
        _heat(k_trained[0], name="trained", x="key n", y="query m", axis=1, colorbar={**bar, "x": 0.615}),
    ]
    r, curve = kernel_curve(k_trained)  # [2n-1], [h, 2n-1]
    keep = r >= 0  # keys at or before the query: what a causal model attends to
    for h in range(curve.shape[0]):
        data.append(_line(r[keep], curve[h][keep], f"trained, head {h}", axis=2))
    _, curve0 = kernel_curve(k_init)
    data.append(_line(r[keep], curve0.mean(0)[keep], "initial (mean of heads)", axis=2, dash="dot"))
    layout = {
        "grid": {"rows": 1, "columns": 3, "pattern": "independent", "xgap": 0.12},
        "xaxis": {"title": {"text": "key n"}, "domain": [0, 0.24]},
        "yaxis": {"title": {"text": "query m"}, "scaleanchor": "x"},
        "xaxis2": {"title": {"text": "key n"}, "domain": [0.37, 0.61]},  # clear of the first colour bar
        "yaxis2": {"scaleanchor": "x2"},
        "xaxis3": {"title": {"text": "distance m − n"}, "domain": [0.75, 1.0]},
        "yaxis3": {"title": {"text": "K (logit units)"}},
        "annotations": [
            _panel_title(f"initial K(m, n), head 0 (±{float(k_init[0].abs().max()):.2g})", 0),
            _panel_title(f"trained K(m, n), head 0 (±{float(k_trained[0].abs().max()):.2g})", 1),
            _panel_title("K against distance", 2),
        ],
        "legend": {"x": 1.02, "y": 1, "font": {"size": 12}},
        "height": 360,
    }
    return {"data": data, "layout": layout}


def _line(x: torch.Tensor, y: torch.Tensor, name: str, *, axis: int = 0, **line: Any) -> dict[str, Any]:
    ax = _axis(axis)
    return {
        "type": "scatter",
        "mode": "lines",
        "x": x.tolist(),
        "y": y.float().tolist(),
        "name": name,
        "line": {"width": 1.6, **line},
        "xaxis": f"x{ax}",
        "yaxis": f"y{ax}",
    }


def _panel_title(text: str, axis: int) -> dict[str, Any]:
    ax = _axis(axis)
    return {
        "text": text,
        "xref": f"x{ax} domain",
        "yref": f"y{ax} domain",
        "x": 0.5,
        "y": 1.02,
        "yanchor": "bottom",
        "showarrow": False,
    }


def encodings_figure(initial: Probe, trained: Probe, train_len: int) -> dict[str, Any]:
    """Initial and trained position vectors ``[s, d]`` (positions ``0..L-1``) side by side."""
    e0 = encodings(initial, train_len)  # [s, d]
    e1 = encodings(trained, train_len)  # [s, d]
    vmax = float(torch.cat([e0, e1]).abs().max())  # one colour scale for both panels
    data = [
        _heat(e0, name="initial", x="dimension", y="position", axis=0, vmax=vmax, showscale=False),
        _heat(e1, name="trained", x="dimension", y="position", axis=1, vmax=vmax),
    ]
    layout = {
        "grid": {"rows": 1, "columns": 2, "pattern": "independent"},
        "xaxis": {"title": {"text": "dimension i"}},
        "yaxis": {"title": {"text": "position p"}},
        "xaxis2": {"title": {"text": "dimension i"}},
        "annotations": [_panel_title("initial PE(p)", 0), _panel_title("trained PE(p)", 1)],
        "height": 340,
    }
    return {"data": data, "layout": layout}


def study_figure(results: dict[str, Any]) -> dict[str, Any]:
    """A study's sliding-window bits/byte against evaluation length, one line per run with its 95%
    interval as a band (lower is better)."""
    data = []
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in results["summary"]:
        by_name.setdefault(row["name"], []).append(row)
    for idx, (name, rows) in enumerate(by_name.items()):
        pts = [r for r in rows if r.get("bpb_window")]
        x = [r["length"] for r in pts]
        mean = [r["bpb_window"]["mean"] for r in pts]
        low = [r["bpb_window"]["low"] if r["bpb_window"]["low"] is not None else m for r, m in zip(pts, mean)]
        high = [
            r["bpb_window"]["high"] if r["bpb_window"]["high"] is not None else m for r, m in zip(pts, mean)
        ]
        color = f"hsl({(idx * 47) % 360},65%,42%)"
        band = {
            "type": "scatter",
            "mode": "lines",  # the band's outline only: no markers at its corners
            "x": x + x[::-1],
            "y": high + low[::-1],
            "fill": "toself",
            "fillcolor": color.replace("hsl", "hsla").replace("%)", "%,0.15)"),
            "line": {"width": 0},
            "hoverinfo": "skip",
            "showlegend": False,
            "legendgroup": name,
        }
        data.append(band)
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": x,
                "y": mean,
                "name": name,
                "legendgroup": name,
                "line": {"color": color, "width": 2},
                "customdata": [[lo, hi] for lo, hi in zip(low, high)],
                "hovertemplate": f"{name}<br>E = %{{x}}<br>%{{y:.3f}} bits/byte "
                "(95%: %{customdata[0]:.3f} to %{customdata[1]:.3f})<extra></extra>",
            }
        )
    L = results["config"]["train_len"]
    layout = {
        "xaxis": {
            "type": "log",
            "title": {"text": "evaluation length E (tokens, log)"},
            "tickvals": sorted({r["length"] for r in results["summary"]}),  # the lengths measured
        },
        "yaxis": {"title": {"text": "bits per byte (lower is better)"}},
        "shapes": [vline(L)],
        "height": 420,
    }
    return {"data": data, "layout": layout}
