"""The report's sections as HTML (each a pure function of what was computed for it).

:mod:`~posenc.analysis.report` computes (schemes, checks, trained models, a study) and puts these
sections in order; figures come from :mod:`~posenc.analysis.interactive` (interactive) and
:mod:`~posenc.analysis.plots` (static, per scheme).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .captions import trained_kernel_note, trained_table_note
from .claims import Claim
from .interactive import encodings_figure, study_figure, trained_figure
from .page import esc, interactive, num, table
from .properties import PROPERTIES, PropertyResult

__all__ = [
    "GROUPS",
    "HOW_TO_READ",
    "PROPERTY_EXPLANATIONS",
    "claims_section",
    "interval_text",
    "property_notes",
    "property_table",
    "study_section",
    "trained_section",
]

#: Schemes grouped by where they act, in the page's order (a course: the problem, then schemes
#: that add to the input, rotate, bias): (key, heading, one-line explanation).
GROUPS: tuple[tuple[str, str, str], ...] = (
    ("none", "The problem: no positional signal", "the causal mask alone tells a decoder where it is"),
    ("embed", "Added to the input", "a vector per position is added to the token embeddings"),
    ("rotate", "Rotating queries and keys", "q and k are rotated by angles that grow with position"),
    ("score_bias", "Biasing the attention logits", "a number per (query, key) pair is added to the logits"),
)

HOW_TO_READ = """<div class="read"><b>How to read this page.</b>
<ul>
<li>A positional scheme tells attention where tokens are. It acts in up to four places (its
<i>hooks</i>): it adds a vector to each input (<code>embed</code>), rotates queries and keys
(<code>rotate</code>), transforms the queries alone (<code>queries</code>), or adds a bias to the
attention logits (<code>score_bias</code>).</li>
<li>The common currency is the <b>positional kernel</b> K(m, n): how much the attention logit of query
position m for key position n changes because of position alone. Most figures show it against the
distance m − n: a kernel that falls with distance makes attention prefer nearby tokens.</li>
<li>Interactive figures: hover for values, drag to zoom (double-click resets), use the sliders and
menus above a figure to change a parameter. Static images are per scheme, further down.</li>
<li>Schemes with trainable parameters are labelled <span class="tag trained">trained</span> where a
model trained them and <span class="tag untrained">initialisation</span> where they show their
random starting values.</li>
</ul></div>"""

#: What each checked property means, in words (HTML), under the property table.
PROPERTY_EXPLANATIONS: dict[str, str] = {
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


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def property_table(results: dict[str, list[PropertyResult]]) -> str:
    """Scheme rows, property columns: status and value, the threshold and method on hover."""
    head = "".join(f'<th title="{esc(PROPERTIES[p].formula)}">{esc(p)}</th>' for p in PROPERTIES)
    rows = []
    for name, res in results.items():
        cells = []
        by_property = {r.property: r for r in res}
        for r in (by_property.get(p) for p in PROPERTIES):
            if r is None:  # not checked
                cells.append("<td class='na'>–</td>")
                continue
            tip = esc(
                f"{r.reason}; threshold {r.comparison} {_fmt(r.threshold)}; "
                f"{'promised' if r.promised else 'not promised'}"
            )
            text = r.status if r.value is None else f"{r.status}<br><small>{_fmt(r.value)}</small>"
            cells.append(f'<td class="{_STATUS_CLASS[r.status]}" title="{tip}">{text}</td>')
        rows.append(f"<tr><th>{esc(name)}</th>{''.join(cells)}</tr>")
    return f"<table><tr><th>scheme</th>{head}</tr>{''.join(rows)}</table>"


def property_notes(explain: dict[str, str]) -> str:
    """One line per property: its formula, comparison and ``explain[name]`` (HTML)."""
    items = [
        f"<li><b>{esc(name)}</b> — <span class='formula'>{esc(p.formula)}</span>"
        f" ({esc(p.comparison)} threshold). {explain.get(name, '')}</li>"
        for name, p in PROPERTIES.items()
    ]
    return "<ul>" + "".join(items) + "</ul>"


def claims_section(claims: Sequence[Claim]) -> str:
    """The claims as a table: claim, the number usually quoted, the measurement, the verdict."""
    rows = [
        [
            esc(c.claim),
            esc(c.quoted) or "–",
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
            f"<h3 id='trained-{esc(t.name)}'>{esc(t.name)}<span class='tag trained'>trained</span></h3>"
        )
        caption = (
            f"Left and middle: K(m, n) of head 0 at initialisation and after {t.steps} steps at L = "
            f"{t.train_len} (final training loss {t.final_loss / math.log(2):.2f} bits/byte), each on "
            "its own colour scale (its range in its title). "
            "Right: K against distance per head, trained (solid) and at initialisation (dotted). "
            + trained_kernel_note(t.initial, t.trained, t.train_len)
        )
        parts.append(
            interactive(f"trained-{t.name}", trained_figure(t.initial, t.trained, t.train_len), caption)
        )
        if "embed" in t.trained.hooks:
            caption = (
                "The position vectors themselves, initial and trained, for the trained positions. "
                + trained_table_note(t.initial, t.trained, t.train_len)
            )
            parts.append(
                interactive(
                    f"trained-{t.name}-pe", encodings_figure(t.initial, t.trained, t.train_len), caption
                )
            )
    return "".join(parts)


def interval_text(cell: Any, signed: bool) -> str:
    """``mean ±half-width`` of an interval dict (``mean``, ``low``, ``high``), numbers only; text
    from a file is shown escaped."""
    if not isinstance(cell, dict) or "mean" not in cell:
        return "–"
    spec = "+.3f" if signed else ".3f"
    low, high = cell.get("low"), cell.get("high")
    if not all(isinstance(v, (int, float)) for v in (low, high)):
        return num(cell["mean"], spec)
    return f"{num(cell['mean'], spec)} ±{(high - low) / 2:.3f}"


def _no_study() -> str:
    return (
        "<p>Which scheme reads inputs longer than it was trained on? posenc's lab answers with "
        "paired comparisons over several seeds: <code>posenc extrapolate --out study</code> trains "
        "one small language model per scheme and seed, then <code>posenc report --study study</code> "
        "puts its tables and figure here.</p>"
    )


def _interval_scope(summary: list[dict[str, Any]], seeds: int) -> str:
    """What the study's intervals cover, in words (``"over 5 seeds and 17 documents"``), read from
    the first interval that records it (``over``, ``n``); a summary that does not record it (made
    before intervals resampled documents) had intervals over seeds, or over windows with one seed.
    """
    for row in summary:
        for metric in ("delta", "bpb_window"):
            cell = row.get(metric)
            if isinstance(cell, dict) and isinstance(cell.get("over"), str):
                n = cell.get("n")
                units = cell["over"].removeprefix("seeds and ")
                count = f"{n} {esc(units)}" if isinstance(n, int) and not isinstance(n, bool) else esc(units)
                if cell["over"].startswith("seeds and "):
                    return f"over {seeds} seeds and {count}"
                return f"over {seeds} seeds" if cell["over"] == "seeds" else f"over {count} (one seed)"
    return f"over {seeds} seeds" if seeds > 1 else "over evaluation windows (one seed)"


def study_section(results: dict[str, Any] | None, folder: str | None) -> str:
    """A study's verdicts (paired deltas and bits/byte with intervals) and its figure; without a
    study, how to run one.

    Args:
        results: a checked study (:func:`~posenc.analysis.default_study.check_study`): a
            ``results.json`` of ``posenc extrapolate``, or the shipped summary, whose
            ``provenance`` (command, version, date) is then shown.
        folder: where ``results`` came from (``--study DIR``), or None for the shipped summary.
    """
    if results is None:
        return _no_study()
    cfg = results["config"]
    if cfg["mode"] != "lm":
        return (
            f"<p class='note'>Study {esc(folder)} is a {esc(cfg['mode'])} task "
            "study; the report shows language-model studies.</p>"
        )
    lens = cfg["eval_lens"]
    L = cfg["train_len"]
    by_name: dict[str, dict[Any, dict[str, Any]]] = {}
    for row in results["summary"]:
        by_name.setdefault(str(row["name"]), {})[row["length"]] = row
    seeds = cfg["seeds"]
    over = _interval_scope(results["summary"], len(seeds))
    beyond = [e for e in lens if e != L]
    rows = [
        [esc(name), *(interval_text(pts.get(e, {}).get("delta"), True) for e in beyond)]
        for name, pts in by_name.items()
    ]
    delta_table = table(["run", *(f"E = {esc(e)}" for e in beyond)], rows, numeric=range(1, len(lens)))
    bpb_rows = [
        [esc(name), *(interval_text(pts.get(e, {}).get("bpb_window"), False) for e in lens)]
        for name, pts in by_name.items()
    ]
    bpb_table = table(["run", *(f"E = {esc(e)}" for e in lens)], bpb_rows, numeric=range(1, len(lens) + 1))
    caption = (
        f"Sliding-window bits per byte (the same bytes scored at every length; lower is better) against the "
        f"evaluation length, trained at L = {esc(L)} (dashed). Bands: 95% intervals {over}."
    )
    size = (
        f"{esc(cfg.get('steps', '?'))} steps per model, L = {esc(L)}, "
        f"seeds {esc(', '.join(map(str, seeds)))}, "
        f"d = {esc(cfg.get('d_model', '?'))}, {esc(cfg.get('num_layers', '?'))} layers"
    )
    prov = results.get("provenance")
    if folder is not None or not isinstance(prov, dict):
        source = f"<p>From the study <code>{esc(folder)}</code>: {size}. "
    else:
        source = (
            "<p>posenc ships the summary of one real study, so this page answers without training: "
            f"<code>{esc(prov.get('command'))}</code>, run on {esc(prov.get('date'))} with posenc "
            f"{esc(prov.get('posenc'))} (torch {esc(prov.get('torch'))}, Python {esc(prov.get('python'))}): "
            f"byte-level causal language models, {size}, trained on the Python standard library's source. "
            "It is a small study: its numbers show the shapes, not the values a large model reaches. "
            "<code>posenc report --study DIR</code> shows your own instead. "
        )
    return (
        source + "Paired delta: bits/byte of the same bytes read in windows of E minus in windows of L "
        f"(&gt; 0: worse with the longer window), mean ±95% half-width {over}.</p>"
        + delta_table
        + "<p>Sliding-window bits/byte at each evaluation length (lower is better), mean ±95% "
        f"half-width {over}:</p>"
        + bpb_table
        + interactive("study", study_figure(results), caption, height=440)
    )
