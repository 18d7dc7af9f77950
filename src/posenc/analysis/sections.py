"""The report's sections as HTML (each a pure function of what was computed for it).

:mod:`~posenc.analysis.report` computes (schemes, checks, trained models, a study) and puts these
sections in order; figures come from :mod:`~posenc.analysis.interactive` (interactive) and
:mod:`~posenc.analysis.plots` (static, per scheme).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from .claims import Claim
from .interactive import encodings_figure, study_figure, trained_figure
from .page import interactive, table
from .properties import PROPERTIES, PropertyResult

__all__ = [
    "GROUPS",
    "HOW_TO_READ",
    "KIND_CAPTIONS",
    "claims_section",
    "property_notes",
    "property_table",
    "study_section",
    "trained_section",
]

#: Schemes grouped by where they act, in the page's order: (key, heading, one-line explanation).
GROUPS: tuple[tuple[str, str, str], ...] = (
    ("embed", "Added to the input", "a vector per position is added to the token embeddings"),
    ("rotate", "Rotating queries and keys", "q and k are rotated by angles that grow with position"),
    ("score_bias", "Biasing the attention logits", "a number per (query, key) pair is added to the logits"),
    ("none", "No positional signal", "the causal mask alone tells a decoder where it is"),
)

HOW_TO_READ = """<div class="read"><b>How to read this page.</b>
<ul>
<li>A positional scheme tells attention where tokens are. It acts in up to three places (its
<i>hooks</i>): it adds a vector to each input (<code>embed</code>), rotates queries and keys
(<code>rotate</code>), or adds a bias to the attention logits (<code>score_bias</code>).</li>
<li>The common currency is the <b>positional kernel</b> K(m, n): how much the attention logit of query
position m for key position n changes because of position alone. Most figures show it against the
distance m − n: a kernel that falls with distance makes attention prefer nearby tokens.</li>
<li>Interactive figures: hover for values, drag to zoom (double-click resets), use the sliders and
menus above a figure to change a parameter. Static images are per scheme, further down.</li>
<li>Schemes with trainable parameters are labelled <span class="tag trained">trained</span> where a
model trained them and <span class="tag untrained">initialisation</span> where they show their
random starting values.</li>
</ul></div>"""

#: What to notice in each static plot kind of the per-scheme sections.
KIND_CAPTIONS: dict[str, str] = {
    "heatmap": "Rows are positions, columns dimensions. Fast dimensions flicker from row to row, slow "
    "ones barely change over the context; together they give every position its own pattern.",
    "frequencies": "Each dimension pair's wavelength against the context length L (dashed). Pairs below "
    "the line turn inside the context and tell near positions apart; the slowest must stay above it, "
    "or far positions alias.",
    "kernel_curve": "The kernel against distance (positive: key before the query), per head or for mean "
    "content; for rotations the dashed line is RoFormer's bound, which falls with distance.",
    "bias": "Left: every head's bias against distance as an image; right: one curve per head. The spread "
    "of slopes lets some heads look locally and others across the whole context.",
    "kernel": "K(m, n) as an image. Constant diagonals mean the scheme sees only the distance m − n; "
    "anything else means it also knows absolute positions.",
    "scalings": "How each long-context scaling (factor 4) stretches each pair's wavelength: linear "
    "interpolation stretches every pair, NTK, YaRN and Llama 3 mostly the slow ones.",
}

_STATUS_CLASS = {"pass": "pass", "FAIL": "fail", "no": "no", "n/a": "na"}


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def property_table(results: dict[str, list[PropertyResult]]) -> str:
    """Scheme rows, property columns: status and value, the threshold and method on hover."""
    head = "".join(
        f'<th title="{html.escape(PROPERTIES[p].formula)}">{html.escape(p)}</th>' for p in PROPERTIES
    )
    rows = []
    for name, res in results.items():
        cells = []
        by_property = {r.property: r for r in res}
        for r in (by_property.get(p) for p in PROPERTIES):
            if r is None:  # not checked
                cells.append("<td class='na'>–</td>")
                continue
            tip = html.escape(
                f"{r.reason}; threshold {r.comparison} {_fmt(r.threshold)}; "
                f"{'promised' if r.promised else 'not promised'}"
            )
            text = r.status if r.value is None else f"{r.status}<br><small>{_fmt(r.value)}</small>"
            cells.append(f'<td class="{_STATUS_CLASS[r.status]}" title="{tip}">{text}</td>')
        rows.append(f"<tr><th>{html.escape(name)}</th>{''.join(cells)}</tr>")
    return f"<table><tr><th>scheme</th>{head}</tr>{''.join(rows)}</table>"


def property_notes(explain: dict[str, str]) -> str:
    """One line per property: its formula, comparison and ``explain[name]`` (HTML)."""
    items = [
        f"<li><b>{html.escape(name)}</b> — <span class='formula'>{html.escape(p.formula)}</span>"
        f" ({html.escape(p.comparison)} threshold). {explain.get(name, '')}</li>"
        for name, p in PROPERTIES.items()
    ]
    return "<ul>" + "".join(items) + "</ul>"


def claims_section(claims: Sequence[Claim]) -> str:
    """The claims as a table: claim, the number usually quoted, the measurement, the verdict."""
    rows = [
        [
            html.escape(c.claim),
            html.escape(c.quoted) or "–",
            c.measured,
            f"<b>{c.verdict.split(':', 1)[0]}</b>:{c.verdict.split(':', 1)[1]}"
            if ":" in c.verdict
            else c.verdict,
            f"<small>{c.how}</small>",
        ]
        for c in claims
    ]
    return table(["claim", "often quoted", "posenc measures", "verdict", "how"], rows)


def trained_section(trained: Sequence[Any], fast: bool, note: str) -> str:
    """Each learnable scheme's initial and trained kernel (and position vectors, where it adds
    them to the input), or a note in the fast mode."""
    if fast or not trained:
        return (
            "<p class='note'>Built without training (fast mode): the panels of schemes with trainable "
            "parameters below show their <b>random initial values</b>, not what they learn. Run "
            "<code>posenc report</code> without <code>--fast</code> to train them (about a minute on "
            "2 cores, cached), or pass <code>--study DIR</code>.</p>"
        )
    parts = [f"<p>{note}</p>"]
    for t in trained:
        parts.append(
            f"<h3 id='trained-{html.escape(t.name)}'>{html.escape(t.name)}"
            "<span class='tag trained'>trained</span></h3>"
        )
        caption = (
            f"Left and middle: K(m, n) of head 0 at initialisation and after {t.steps} steps at L = "
            f"{t.train_len} (final training loss {t.final_loss:.2f} nats/byte), on one colour scale. "
            "Right: K against distance per head, trained (solid) and at initialisation (dotted). "
            "Training turns noise into structure: watch for a kernel that falls with distance "
            "(recency) and heads that differ."
        )
        parts.append(
            interactive(f"trained-{t.name}", trained_figure(t.initial, t.trained, t.train_len), caption)
        )
        if "embed" in t.trained.hooks:
            caption = (
                "The position vectors themselves, initial and trained, for the trained positions. A trained "
                "table keeps no fixed frequencies, but neighbouring rows end up alike."
            )
            parts.append(
                interactive(
                    f"trained-{t.name}-pe", encodings_figure(t.initial, t.trained, t.train_len), caption
                )
            )
    return "".join(parts)


def _interval(cell: dict[str, Any] | None, signed: bool) -> str:
    if not cell:
        return "–"
    sign = "+" if signed else ""
    if cell.get("low") is None:
        return f"{cell['mean']:{sign}.3f}"
    half = (cell["high"] - cell["low"]) / 2
    return f"{cell['mean']:{sign}.3f} ±{half:.3f}"


def study_section(results: dict[str, Any] | None, folder: str | None) -> str:
    """A study's verdicts (paired deltas and bits/byte with intervals) and its figure; without a
    study, how to run one."""
    if results is None:
        return (
            "<p>Which scheme reads inputs longer than it was trained on? posenc's lab answers with "
            "paired comparisons over several seeds: <code>posenc extrapolate --out study</code> trains "
            "one small language model per scheme and seed (about an hour on 2 cores; "
            "<code>--quick</code> for a 2-minute version), then <code>posenc report --study study</code> "
            "puts its tables and figure here, and uses its trained checkpoints for the learned schemes.</p>"
        )
    cfg = results["config"]
    if cfg["mode"] != "lm":
        return (
            f"<p class='note'>Study {html.escape(str(folder))} is a {html.escape(cfg['mode'])} task "
            "study; the report shows language-model studies.</p>"
        )
    lens = cfg["eval_lens"]
    L = cfg["train_len"]
    by_name: dict[str, dict[int, dict[str, Any]]] = {}
    for row in results["summary"]:
        by_name.setdefault(row["name"], {})[row["length"]] = row
    over = (
        f"over {len(cfg['seeds'])} seeds" if len(cfg["seeds"]) > 1 else "over evaluation windows (one seed)"
    )
    rows = [
        [html.escape(name), *(_interval(pts.get(e, {}).get("delta"), True) for e in lens if e != L)]
        for name, pts in by_name.items()
    ]
    delta_table = table(["run", *(f"E = {e}" for e in lens if e != L)], rows, numeric=range(1, len(lens)))
    caption = (
        f"Sliding-window bits per byte (the same bytes scored at every length; lower is better) against the "
        f"evaluation length, trained at L = {L} (dashed). Bands: 95% intervals {over}."
    )
    return (
        f"<p>From the study in <code>{html.escape(str(folder))}</code>: {cfg['steps']} steps per model, "
        f"L = {L}, seeds {', '.join(map(str, cfg['seeds']))}, d = {cfg['d_model']}, "
        f"{cfg['num_layers']} layers. "
        f"Paired delta: bits/byte of the same bytes read in windows of E minus in windows of L "
        f"(&gt; 0: worse with the longer window), mean ±95% half-width {over}.</p>"
        + delta_table
        + interactive("study", study_figure(results), caption, height=440)
    )
