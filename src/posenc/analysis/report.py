"""One self-contained HTML page that shows every registered scheme, checks it, and teaches it.

:func:`build_report` builds every scheme from :data:`REPORT_CONTEXT` (causal; or the
sizes given), runs every property check, trains one small model per learnable scheme (or reads a
study's checkpoints, or skips training in the fast mode), and writes ``DIR/index.html``: static
images as base64 ``data:`` URIs and interactive figures drawn by plotly.js, embedded in the page,
so the single file opens offline and fetches nothing. ``posenc report`` calls it.

Sections, in order, as a course: how to read the page; the input layer end to end; every scheme
explained (the problem, typeset maths, a worked example, captions from its own numbers; grouped
from no position through added, rotated and biased); learnable schemes trained; explore (sliders);
the kernels side by side; which scheme (a study's verdicts: the user's, or the summary posenc
ships); the property checks; common claims, measured. Every value read from a file is escaped
(:func:`~posenc.analysis.page.esc`); the page is written atomically.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from .._paths import write_text
from .._validate import check_choice, check_int
from ..registry import describe
from ..registry import schemes as registered_schemes
from .captions import figure_caption
from .claims import common_claims, study_claims
from .default_study import load_default_study
from .explore import explorers
from .grid import axis_names, is_grid
from .interactive import HOOK_COLORS, kernel_profile, overview_figure
from .kernel import DEFAULT_CONTEXT, Probe, make_probe
from .lessons import lesson_html
from .page import CSS, esc, figure_data_uri, figure_img, interactive, plotly_script
from .plots import PLOT_KINDS, render
from .properties import PropertyResult, check
from .sections import (
    GROUPS,
    HOW_TO_READ,
    PROPERTY_EXPLANATIONS,
    claims_section,
    property_notes,
    property_table,
    study_section,
    trained_section,
)

__all__ = [
    "GRID_KINDS",
    "REPORT_CONTEXT",
    "REPORT_KINDS",
    "build_report",
    "figure_data_uri",
    "report_html",
    "report_kinds",
    "scheme_group",
]

#: The sizes the report builds schemes with: :data:`DEFAULT_CONTEXT`, causal as the library's
#: schemes are by default (ALiBi, T5) and as the trained models are (decoders).
REPORT_CONTEXT: dict[str, Any] = {**DEFAULT_CONTEXT, "causal": True}

#: Plot kinds shown per scheme in the report, in order (each only where it applies).
REPORT_KINDS = ("heatmap", "frequencies", "kernel_curve", "bias", "kernel", "scalings")

#: Plot kinds shown instead for a scheme of grid positions (``position_dims`` > 1): on its grid.
GRID_KINDS = ("grid", "axes")


def report_kinds(probe: Probe, results: Sequence[PropertyResult]) -> list[str]:
    """The report's plots for one scheme: every applicable kind of :data:`REPORT_KINDS`, except the
    kernel heatmap where it adds nothing to the curve (one head, translation invariant: constant
    diagonals) and the kernel curve where the page's overview already shows it (anything but a
    rotation, whose curve here adds RoFormer's bound). A scheme of grid positions gets
    :data:`GRID_KINDS`: its kernel over the grid and, for a rotation, the axes of its head."""
    if is_grid(probe):
        return [kind for kind in GRID_KINDS if PLOT_KINDS[kind].applies(probe) is None]
    invariant = any(r.property == "translation_inv" and r.passed for r in results)
    kinds = []
    for kind in REPORT_KINDS:
        if PLOT_KINDS[kind].applies(probe) is not None:
            continue
        if kind == "kernel" and invariant and "score_bias" not in probe.hooks:
            continue
        if kind == "kernel_curve" and not probe.rotates:
            continue  # the overview draws it; only a rotation adds RoFormer's bound here
        kinds.append(kind)
    return kinds


def scheme_group(probe: Probe) -> str:
    """The key of :data:`~posenc.analysis.sections.GROUPS` a scheme belongs to: where its
    positional signal enters (a bias wins over a rotation, a rotation over an added vector)."""
    if "score_bias" in probe.hooks:
        return "score_bias"
    if probe.rotates:
        return "rotate"
    return "embed" if "embed" in probe.hooks else "none"


def _caption(probe: Probe, kind: str) -> str:
    tag = " <span class='tag untrained'>initialisation</span>" if probe.trainable else ""
    return f"<b>{esc(PLOT_KINDS[kind].title)}</b>{tag}. {figure_caption(probe, kind)}"


def _scheme_part(
    name: str, ctx: dict[str, Any], dpi: int, study: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Checks, figures and kernel profile of one scheme (runs in a worker process)."""
    info = describe(name)
    try:
        probe = make_probe(name, ctx)
    except (ValueError, TypeError) as err:
        return {
            "section": f"<h3 id='{esc(name)}'>{esc(name)}</h3>"
            f"<p class='muted'>cannot be built from the report's context: {esc(str(err))}</p>",
            "results": None,
            "profile": None,
            "group": "none",
            "trainable": False,
            "sequence": False,
            "along": None,
        }
    results = check(probe)
    figs = [
        figure_img(render(probe, kind), _caption(probe, kind), f"{name}: {PLOT_KINDS[kind].title}", dpi=dpi)
        for kind in report_kinds(probe, results)
    ]
    broken = [r.property for r in results if r.broken_promise]
    verdict = (
        f"<b style='color:#b00'>breaks: {', '.join(broken)}</b>"
        if broken
        else "keeps every property it promises"
    )
    trained_link = (
        f" Its trained version: <a href='#trained-{esc(name)}'>below</a>." if probe.trainable else ""
    )
    section = (
        f"<h3 id='{esc(name)}'>{esc(name)}</h3>"
        f"<p>{esc(info['summary'])}. Hooks: "
        f"<code>{esc(', '.join(info['hooks']) or 'none')}</code>; "
        f"nominal length {probe.nominal_len}; {verdict}.{trained_link}</p>"
        + lesson_html(name, tuple(info["hooks"]), study)
        + (
            f"<div class='figs'>{''.join(figs)}</div>"
            if figs
            else "<p class='muted'>No positional hooks: nothing to plot (its kernel is zero).</p>"
        )
    )
    profile = kernel_profile(probe, min(probe.nominal_len, 256), scaled=False) if probe.hooks else None
    along = f"along {axis_names(probe)[0]}" if is_grid(probe) else None  # the overview's 1-D cut
    return {
        "section": section,
        "results": results,
        "profile": profile,
        "group": scheme_group(probe),
        "trainable": probe.trainable,
        "sequence": probe.scheme.position_dims == 1,  # encodes token positions (not a 2-D/3-D grid)
        "along": along,
    }


def _worker_init() -> None:
    torch.set_num_threads(1)  # one process per core; as torch's DataLoader workers do


def _parts(
    names: list[str],
    ctx: dict[str, Any],
    dpi: int,
    workers: int,
    study: dict[str, Any] | None = None,
    cache: str | Path | None = None,
) -> list[dict[str, Any]]:
    """:func:`_scheme_part` for every scheme, on ``workers`` forked processes (in order); with a
    ``cache`` folder, sections stored by an earlier build with the same inputs are read back
    (:mod:`~posenc.analysis.section_cache`) and the others stored.

    Forked workers inherit the registry, so schemes registered at run time are reported too.
    Without ``fork`` (Windows, macOS default) or with one worker, runs in this process.
    """
    from .section_cache import load_section, section_key, store_section

    cache = Path(cache) if cache is not None else None
    keys = {n: section_key(n, ctx, dpi, study) for n in names} if cache is not None else {}
    found = {n: load_section(cache, keys[n]) for n in names} if cache is not None else {}
    todo = [n for n in names if found.get(n) is None]
    if workers > 1 and len(todo) > 1 and "fork" in multiprocessing.get_all_start_methods():
        ctx_fork = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            min(workers, len(todo)), mp_context=ctx_fork, initializer=_worker_init
        ) as pool:
            futures = [pool.submit(_scheme_part, n, ctx, dpi, study) for n in todo]
            drawn = dict(zip(todo, (f.result() for f in futures)))
    else:
        drawn = {n: _scheme_part(n, ctx, dpi, study) for n in todo}
    if cache is not None:
        for n, part in drawn.items():
            store_section(cache, keys[n], part)
    return [found.get(n) or drawn[n] for n in names]


def _overview(names: list[str], parts: list[dict[str, Any]], trained: dict[str, Any]) -> str:
    """Small multiples of every scheme's kernel against distance, grouped by hook."""
    panels = []
    for key, _, _ in GROUPS:
        for name, part in zip(names, parts):
            if part["group"] != key or part["profile"] is None:
                continue
            r, y = part["profile"]
            panel = {"title": name, "group": key, "r": r, "y": y, "label": "kernel"}
            if name in trained:
                t = trained[name]
                tr, ty = kernel_profile(t.trained, t.train_len, scaled=False)
                panel.update(
                    r=tr, y=ty, label=f"trained, L = {t.train_len}", extra=[("initialisation", r, y, "dot")]
                )
            elif part["trainable"]:
                panel["title"] = f"{name} (initialisation)"
            if part["along"]:
                panel["title"] = f"{name} ({part['along']})"
            panels.append(panel)
    if not panels:
        return ""
    legend = " · ".join(
        f"<span style='color:{HOOK_COLORS[k]}'>■</span> {esc(title.lower())}"
        for k, title, _ in GROUPS
        if k != "none"
    )
    caption = (
        f"One panel per scheme, colour by where it acts ({legend}): the kernel against distance, mean "
        "over heads. The menu at the top left chooses the view, and the y-axis title says which is shown: "
        "<b>magnitude</b> (the default) draws K in logit units, each panel on its own y-axis, its "
        "largest |K| in its title; <b>shape</b> divides each curve by its own largest |K| and puts "
        "every panel on one y-axis from −1 to 1, so shapes compare. Hover for values; drag to zoom "
        "one panel and all follow along the distance. Learnable schemes show their trained kernel, with the "
        "initialisation dotted. A scheme without position has no panel: its kernel is zero. What each "
        "shape means is in that scheme's section above, written from its own numbers."
    )
    return interactive("overview", overview_figure(panels), caption)


def _explore(names: list[str], ctx: dict[str, Any]) -> str:
    out = []
    for i, (ex, name) in enumerate(explorers(names)):
        out.append(f"<h3>{esc(ex.title)} <span class='muted'>({esc(name)})</span></h3>")
        out.append(interactive(f"explore-{i}", ex.build(name, ctx), ex.caption, height=420))
    return "".join(out) or "<p class='muted'>None of the chosen schemes has an explore figure.</p>"


def _scheme_sections(names: list[str], parts: list[dict[str, Any]]) -> str:
    out = []
    for key, title, what in GROUPS:
        members = [p["section"] for n, p in zip(names, parts) if p["group"] == key]
        if members:
            out.append(f"<h3 class='group'>{esc(title)}</h3><p class='muted'>{esc(what)}.</p>")
            out.extend(members)
    return "".join(out)


def _input_layer(names: list[str], parts: list[dict[str, Any]]) -> str:
    """The input-layer section for up to three schemes that add to the input, and one that acts
    inside attention (to show that it adds nothing there)."""
    from .input_layer import input_layer_section

    seq = [(n, p["group"]) for n, p in zip(names, parts) if p["sequence"]]
    chosen = [n for n, g in seq if g == "embed"][:3] + [n for n, g in seq if g in ("rotate", "score_bias")][
        :1
    ]
    if not chosen:
        return "<p class='muted'>None of the chosen schemes encodes token sequences.</p>"
    return input_layer_section(chosen)


def _properties(results: dict[str, list[PropertyResult]]) -> str:
    broken = [f"{r.scheme}.{r.property}" for res in results.values() for r in res if r.broken_promise]
    verdict = (
        "<b style='color:#b00'>Broken promises: " + esc(", ".join(broken)) + "</b>"
        if broken
        else "No scheme breaks a property it promises."
    )
    return (
        "<p>Each cell: status and measured value (hover for the threshold and how it was measured). "
        "<b>pass</b>: holds; <b>FAIL</b>: a promised property does not hold (<code>posenc verify</code> "
        f"exits 1); <b>no</b>: does not hold and is not promised; <b>n/a</b>: does not apply. {verdict}</p>"
        + property_table(results)
        + property_notes(PROPERTY_EXPLANATIONS)
    )


def report_html(
    schemes: Sequence[str] | None = None,
    *,
    context: dict[str, Any] | None = None,
    dpi: int = 72,
    workers: int | None = None,
    trained: Sequence[Any] = (),
    fast: bool = False,
    study: dict[str, Any] | None = None,
    study_folder: str | None = None,
    trained_note: str = "",
    started: float | None = None,
    section_cache: str | Path | None = None,
) -> str:
    """The report as one HTML string (see :func:`build_report`).

    Args:
        schemes, context, dpi, workers: as in :func:`build_report`.
        trained: :class:`~posenc.analysis.trained.TrainedScheme` per learnable scheme shown trained.
        fast: the page says that learnable schemes show their initialisation.
        study: a ``posenc extrapolate`` results dict, shown with its intervals (default: the
            summary posenc ships, :func:`~posenc.analysis.default_study.load_default_study`).
        study_folder: where ``study`` came from (shown).
        trained_note: one sentence (HTML) on how the trained models were made.
        started: :func:`time.perf_counter` when the build began (the header's build time includes
            the training before this call); default: now.
        section_cache: a folder keeping each scheme's section for later builds (None: nothing kept).
    """
    t0 = time.perf_counter() if started is None else started
    ctx = {**REPORT_CONTEXT, **(context or {})}
    names = list(schemes) if schemes else registered_schemes()
    for n in names:
        check_choice(n, "scheme", registered_schemes())
    workers = min(2, os.cpu_count() or 1) if workers is None else check_int(workers, "workers")
    if study is None:
        study, study_folder = load_default_study(), None
    parts = _parts(names, ctx, dpi, workers, study, section_cache)
    results: dict[str, list[PropertyResult]] = {n: p["results"] for n, p in zip(names, parts) if p["results"]}
    by_name = {t.name: t for t in trained if t.name in names}
    input_layer = _input_layer(names, parts)
    claims = common_claims() + (study_claims(study) if study else [])
    body = {
        "input": ("The input layer, end to end", input_layer),
        "schemes": ("Every scheme, explained", _scheme_sections(names, parts)),
        "trained": (
            "Learnable schemes, trained",
            trained_section(list(by_name.values()), fast, trained_note),
        ),
        "explore": ("Explore", _explore(names, ctx)),
        "kernels": ("Side by side: the positional kernel of every scheme", _overview(names, parts, by_name)),
        "which": ("Which scheme? Measured in training", study_section(study, study_folder)),
        "properties": ("Checked properties", _properties(results)),
        "claims": (
            "Common claims, measured",
            "<p>Statements that circulate about positional encodings, each measured here in float64 "
            "with posenc's own code.</p>" + claims_section(claims),
        ),
    }
    return _document(body, names, ctx, list(by_name.values()), time.perf_counter() - t0)


def _document(
    body: dict[str, tuple[str, str]],
    names: list[str],
    ctx: dict[str, Any],
    trained: list[Any],
    elapsed: float,
) -> str:
    """The page: header, navigation, how to read it, the sections of ``body`` (key -> (title, HTML)),
    plotly.js and its loader."""
    nav = "".join(f"<a href='#{k}'>{esc(title)}</a>" for k, (title, _) in body.items())
    sections = "".join(f"<h2 id='{k}'>{esc(t)}</h2>{content}" for k, (t, content) in body.items())
    form = "causal (keys after the query masked, as in a decoder)" if ctx["causal"] else "bidirectional"
    sizes = (
        f"schemes drawn at d_model = {esc(ctx['d_model'])}, {esc(ctx['num_heads'])} heads of "
        f"{esc(ctx['head_dim'])}, L = {esc(ctx['max_len'])}, {form}"
    )
    if trained:
        t = trained[0]
        models = (
            f"{len(trained)} learnable schemes shown trained (causal byte-level language models, "
            f"L = {esc(t.train_len)}, {esc(t.steps)} steps)"
        )
    else:
        models = "fast mode: learnable schemes shown at initialisation (untrained)"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posenc report</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>
<body>
<h1>posenc: every positional scheme, explained, seen and checked</h1>
<p class="muted">posenc {esc(__version__)} · torch {esc(torch.__version__)} · {len(names)} schemes · {sizes} ·
{models} · built in {elapsed:.0f} s, training included</p>
<nav>{nav}</nav>
{HOW_TO_READ}
{sections}
{plotly_script()}
</body></html>
"""


def _train_here(names, ctx, cache_dir, progress, log, training) -> tuple[list[Any], str]:
    """Train (or reuse) the learnable schemes of ``names``; the trained schemes and a note (HTML)."""
    from .trained import REPORT_STUDY, default_cache_dir, learnable, train_for_report

    probes = []
    for n in names:
        try:
            probes.append(make_probe(n, ctx))
        except (ValueError, TypeError):
            continue  # reported as "cannot be built" in its section
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    trained = train_for_report(learnable(probes), cache, progress=progress, log=log, overrides=training)
    f = {**REPORT_STUDY, **(training or {})}
    note = (
        f"Each was trained here, as a {f['num_layers']}-layer byte-level language model (d = {f['d_model']}, "
        f"{f['num_heads']} heads, L = {f['train_len']}, {f['steps']} steps) on "
        + (
            "the Python standard library's source"
            if f.get("corpus", "stdlib") == "stdlib"
            else "the given corpus"
        )
        + ", and cached for the next build (<code>--cache-dir</code> chooses where). One seed: these "
        "panels show what training does to a table, not which scheme is better."
    )
    return trained, note


def build_report(
    out_dir: str | Path = "report",
    schemes: Sequence[str] | None = None,
    *,
    context: dict[str, Any] | None = None,
    dpi: int = 72,
    workers: int | None = None,
    fast: bool = False,
    study: str | Path | None = None,
    cache_dir: str | Path | None = None,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
    training: dict[str, Any] | None = None,
) -> Path:
    """Write the self-contained report to ``out_dir/index.html`` and return its path.

    Args:
        out_dir: the output folder (created).
        schemes: scheme names (default: every registered scheme).
        context: sizes to build schemes with (``d_model``, ``num_heads``, ``head_dim``, ``max_len``,
            ``causal``; default :data:`REPORT_CONTEXT`).
        dpi: the static figures' displayed resolution (CSS pixels per inch); each PNG is drawn at
            :data:`~posenc.analysis.page.ZOOM` times it, so it stays sharp when enlarged.
        workers: processes drawing schemes in parallel (default: 2, or 1 on a 1-core machine).
        fast: train nothing; learnable schemes show their initialisation, and the page says so.
        study: a ``posenc extrapolate --out`` folder: its tables and figure are shown, and its
            checkpoints are the trained schemes (nothing is trained here).
        cache_dir: where the report's own trained models and drawn scheme sections are kept and
            reused (default :func:`~posenc.analysis.trained.default_cache_dir`; a fast build keeps
            nothing unless it is given).
        progress: training progress bars (``None`` = when stderr is a terminal).
        log: where training progress lines go (``None`` = silent).
        training: study fields replacing the report's training defaults
            (:data:`~posenc.analysis.trained.REPORT_STUDY`), e.g. ``{"steps": 50}``.
    """
    from .trained import read_study, read_study_results

    started = time.perf_counter()
    names = list(schemes) if schemes else registered_schemes()
    for n in names:
        check_choice(n, "scheme", registered_schemes())
    Path(out_dir).mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails before any work
    results, trained, note = None, [], ""
    sections = None  # a fast build keeps nothing unless a cache folder is given
    if cache_dir is not None or not fast:
        from .trained import default_cache_dir

        sections = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "sections"
    if study is not None:
        results = read_study_results(study)  # one line naming the file and field when malformed
        trained = read_study(study)
        note = f"Checkpoints of the study <code>{esc(Path(study).name)}</code> (its first seed)."
    elif not fast:
        trained, note = _train_here(
            names, {**REPORT_CONTEXT, **(context or {})}, cache_dir, progress, log, training
        )
    page = report_html(
        names,
        context=context,
        dpi=dpi,
        workers=workers,
        trained=trained,
        fast=fast and study is None,
        study=results,
        study_folder=Path(study).name if study is not None else None,
        trained_note=note,
        started=started,
        section_cache=sections,
    )
    path = Path(out_dir) / "index.html"
    write_text(path, page)
    return path
