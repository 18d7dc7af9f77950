"""The report's input-layer section: one sentence through the input layer, step by step.

``text -> tokens -> ids -> E[ids] -> x sqrt(d) -> + PE -> LayerNorm -> dropout``, tokenized by
``posenc encode``'s default WordPiece and computed by
:func:`posenc.text.pipeline.run_pipeline` (posenc's own :class:`~posenc.InputEmbedding`, the same
numbers ``posenc encode`` prints) and drawn as one heatmap per step: a slider walks the steps, a
menu switches the positional scheme.

Legend: ``s`` tokens, ``d`` model width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .interactive import selector_figure
from .page import esc, interactive, table

__all__ = ["EXAMPLE", "STEPS", "input_layer_section"]

#: The sentence the section encodes.
EXAMPLE = "The cat sat on the mat, and the dog sat on the log."

#: Pipeline steps drawn, in order: (step name in :func:`run_pipeline`'s result, slider label).
STEPS: tuple[tuple[str, str], ...] = (
    ("lookup", "1 E[ids]"),
    ("scaled", "2 × √d"),
    ("positional", "3 PE"),
    ("sum", "4 sum"),
    ("layer_norm", "5 LayerNorm"),
    ("dropout_train", "6 dropout (train)"),
)


def _tokenizer():
    """``posenc encode``'s default tokenizer: a WordPiece trained here on the standard library's
    documentation strings (English text on every machine, no download), and its description."""
    from ..text.commands import resolve_tokenizer

    return resolve_tokenizer("wordpiece")


def _label(i: int, token: str) -> str:
    return f"{i}: {token}"


def _step_figure(results: dict[str, Any], d_model: int) -> dict[str, Any]:
    """One heatmap ``[s, d]`` per (scheme, step), a menu over schemes and a slider over steps."""
    first = next(iter(results.values()))
    labels = [_label(i, t) for i, t in enumerate(first.tokens)]
    traces: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for scheme, res in results.items():
        for step, label in STEPS:
            z = res[step].tensor.float()  # [s, d]
            vmax = float(z.abs().max()) or 1.0  # each step its own colour range
            hover = f"token %{{y}}<br>dimension %{{x}}<br>value %{{z:.4f}}<extra>{esc(res[step].title)}"
            traces[(scheme, label)] = [
                {
                    "type": "heatmap",
                    "z": z.tolist(),
                    "y": labels,
                    "zmin": -vmax,
                    "zmax": vmax,
                    "colorscale": "RdBu",
                    "name": res[step].title,
                    "hovertemplate": hover + "</extra>",
                }
            ]
    layout = {
        "xaxis": {"title": {"text": f"dimension (d = {d_model})"}, "dtick": 1},
        "yaxis": {"autorange": "reversed", "type": "category"},
        "margin": {"l": 110, "t": 70},
        "height": 520,
    }
    return selector_figure(traces, ("scheme", list(results)), ("step", [lbl for _, lbl in STEPS]), layout)


def _stats_table(result: Any, d_model: int) -> str:
    """What each step does and the spread of its values (one scheme's run)."""
    st = result.steps
    drop = st["dropout_train"].stats
    rows = [
        ["E[ids]", "each id picks its row of the embedding matrix E [V, d]", st["lookup"].stats["std"]],
        ["× √d", f"every value times √{d_model} = {d_model**0.5:.3g}", st["scaled"].stats["std"]],
        ["+ PE", esc(st["positional"].stats["note"]), st["sum"].stats["std"]],
        [
            "LayerNorm",
            "per token: mean 0, variance 1 (then a learned gain and bias, 1 and 0 at start)",
            st["layer_norm"].stats["std"],
        ],
        [
            "dropout",
            f"training only: {drop['zeroed_fraction']:.0%} of values zeroed here, the rest × "
            f"{drop['keep_scale']:.3g}; identity at evaluation",
            drop["std"],
        ],
    ]
    head = ["step", "what happens", f"std over the {len(result.tokens)} × {d_model} values"]
    return table(head, [[a, b, f"{c:.3f}"] for a, b, c in rows], numeric=(2,))


_CAPTION = (
    "Move the <b>step</b> slider to walk the input layer; hover a cell for its value. Rows are the "
    "tokens above, columns the model's dimensions (each step has its own colour range). Notice how "
    "× √d lifts the tiny initial embeddings to the scale of the positional encoding, how each scheme's "
    "positional part differs (a scheme that acts inside attention adds nothing here), and how "
    "LayerNorm puts every row back on the same scale."
)


def input_layer_section(schemes: Sequence[str], d_model: int = 16, dropout: float = 0.1) -> str:
    """The section's HTML: the tokens and ids as a table, the steps as one interactive figure.

    Args:
        schemes: schemes offered in the menu, the first shown first (each must build from
            ``d_model`` alone, e.g. by name from the registry).
        d_model: ``d``, small enough to read every number.
        dropout: the dropout rate of the last step.
    """
    from ..text.pipeline import encode_text

    try:
        tok, _ = _tokenizer()
    except ImportError as err:
        why = esc(str(err))
        return f"<p class='note'>This section needs HF tokenizers: pip install 'posenc[text]' ({why}).</p>"
    results = {s: encode_text(EXAMPLE, tok, scheme=s, d_model=d_model, dropout=dropout) for s in schemes}
    first = results[schemes[0]]
    tokens_table = table(
        ["position", *range(len(first.tokens))],
        [["token", *(esc(repr(t)[1:-1]) for t in first.tokens)], ["id", *first.ids.tolist()]],
    )
    special = [t for t in first.tokens if t in tok.special_tokens]
    pieces = [t for t in first.tokens if t.startswith("##")]
    notes = []
    if special:
        notes.append(
            f"{', '.join(f'<code>{esc(t)}</code>' for t in dict.fromkeys(special))} are special tokens "
            "the tokenizer adds: [CLS] opens every input (BERT reads its final vector as the summary of "
            "the sentence), [SEP] closes it"
        )
    if pieces:
        notes.append(
            "a token starting with <code>##</code> continues the word before it (a sub-word piece: "
            "rare words are split into common pieces)"
        )
    else:
        notes.append(
            "every word here is common enough to be one token; a rare word would be split into pieces "
            "marked <code>##</code> (continuing the word before)"
        )
    return (
        f"<p>The sentence <code>{esc(EXAMPLE)}</code>, split by <code>posenc encode</code>'s tokenizer "
        f"(a WordPiece of {tok.vocab_size} tokens trained on the Python standard library's documentation "
        f"strings, English text found on every machine), becomes {len(first.tokens)} ids. "
        f"Lower case: this tokenizer folds case. {'; '.join(notes)}.</p>"
        + tokens_table
        + interactive("input-layer", _step_figure(results, d_model), _CAPTION, height=520)
        + f"<p>The same steps as numbers ({esc(schemes[0])}, d = {d_model}, dropout p = {dropout}; "
        "<code>posenc encode</code> prints them all):</p>" + _stats_table(first, d_model)
    )
