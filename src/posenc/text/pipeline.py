"""The input pipeline as data: every step from token ids to the vectors a Transformer sees.

One sentence walked through the input layer::

    tokens -> ids [s] -> one_hot(ids) @ E == E[ids] [s, d] -> x sqrt(d) -> + PE [s, d]
           -> LayerNorm (per token: mean 0, variance 1) -> dropout (train) / identity (eval)

:func:`run_pipeline` performs each step with posenc's own :class:`~posenc.InputEmbedding` (its
``token``, ``position``, ``norm`` and ``dropout`` submodules) and returns every intermediate tensor
with its statistics, so the CLI (``posenc encode``), the docs and the tests read the same numbers.
The final steps equal ``InputEmbedding.forward`` in eval mode and, for the same RNG state, in train
mode (tested).

Legend: ``s`` number of tokens, ``d`` model width (``d_model``), ``V`` vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._validate import check_int, check_probability
from ..embedding import InputEmbedding
from ..registry import build_with_context, config_keys, scheme_class
from .tokenizer import Tokenizer

__all__ = ["PipelineResult", "Step", "encode_text", "format_pipeline", "plot_pipeline", "run_pipeline"]


@dataclass(frozen=True)
class Step:
    """One step of the pipeline: ``tensor`` is ``[s]`` (ids) or ``[s, d]`` / ``[s, V]``; ``stats`` are
    plain numbers (and per-token lists) describing it."""

    name: str
    title: str
    tensor: torch.Tensor
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineResult:
    """Every step of :func:`run_pipeline`, in order, keyed by name.

    ``module`` is the :class:`~posenc.InputEmbedding` that produced them (in eval mode).
    """

    tokens: list[str]
    ids: torch.Tensor
    steps: dict[str, Step]
    module: InputEmbedding
    seed: int

    def __getitem__(self, name: str) -> Step:
        try:
            return self.steps[name]
        except KeyError:
            raise KeyError(f"no step {name!r}; steps: {', '.join(self.steps)}") from None

    @property
    def output(self) -> torch.Tensor:
        """``[s, d]``: the input layer's output in eval mode (= ``module.eval()(ids[None])[0]``)."""
        return self.steps["dropout_eval"].tensor


def _row_stats(x: torch.Tensor) -> dict[str, Any]:
    """Per-token mean and (biased, as LayerNorm uses) variance of ``x`` ``[s, d]``, plus overall std."""
    x64 = x.double()
    return {
        "mean_per_token": x64.mean(-1).tolist(),
        "var_per_token": x64.var(-1, unbiased=False).tolist(),
        "std": float(x64.std(unbiased=False)),
        "abs_max": float(x64.abs().max()),
    }


def _check_inputs(ids, tokens, vocab_size, d_model, dropout, seed) -> tuple[torch.Tensor, list[str]]:
    """``ids`` ``[s]`` and one display string per token, after checking every argument."""
    ids = torch.as_tensor(ids)
    if ids.dim() != 1:
        raise ValueError(f"ids must have shape [s], got {tuple(ids.shape)}; run one text at a time")
    if ids.numel() == 0:
        raise ValueError("ids is empty: there is nothing to encode (is the text empty?)")
    check_int(vocab_size, "vocab_size")
    check_int(d_model, "d_model")
    check_probability(dropout, "dropout")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} ({seed!r})")
    s = ids.numel()
    tokens = [str(i) for i in ids.tolist()] if tokens is None else list(tokens)
    if len(tokens) != s:
        raise ValueError(f"tokens has {len(tokens)} entries but ids has {s}; they must match one to one")
    return ids, tokens


def _lookup_steps(
    add, ids: torch.Tensor, module: InputEmbedding, vocab_size: int, d_model: int
) -> torch.Tensor:
    """Steps ``ids``, ``one_hot``, ``lookup``, ``scaled``; returns the scaled embeddings ``[s, d]``."""
    s = ids.numel()
    weight = module.token.weight  # E [V, d]
    add("ids", "token ids", ids, vocab_size=vocab_size)
    one_hot = nn.functional.one_hot(ids.long(), vocab_size).to(weight.dtype)  # [s, V], one 1 per row
    via_matmul = one_hot @ weight  # [s, V] @ [V, d] -> [s, d]
    lookup = nn.functional.embedding(ids, weight)  # E[ids], the gather [s, d]
    add(
        "one_hot",
        "one_hot(ids) [s, V]",
        one_hot,
        max_abs_diff=float((via_matmul - lookup).abs().max()),
        equal=bool(torch.equal(via_matmul, lookup)),
        matmul_flops=2 * s * vocab_size * d_model,
    )
    add("lookup", "E[ids]: embedding lookup", lookup, **_row_stats(lookup), init_std=module.token.init_std)
    x = module.token(ids[None])[0]  # [1, s] -> [1, s, d] -> [s, d], times the scale
    add(
        "scaled",
        f"E[ids] x {module.token.scale:.4g} (sqrt(d_model)={math.sqrt(d_model):.4g})",
        x,
        **_row_stats(x),
        scale=module.token.scale,
    )
    return x


def _position_steps(add, module: InputEmbedding, scheme: str, x: torch.Tensor, options) -> torch.Tensor:
    """Steps ``positional``, ``attention`` (schemes acting inside attention) and ``sum``; returns the
    sum ``[s, d]``."""
    if module.position is not None:
        pe = module.position.embed(torch.zeros_like(x)[None])[0]  # the positional part alone [s, d]
        summed = module.position.embed(x[None])[0]  # [1, s, d] -> [s, d]
        note = f"{scheme} adds its table to the embeddings"
    else:
        pe = torch.zeros_like(x)
        summed = x
        note = f"{scheme} adds nothing here: it acts inside attention"
    add("positional", f"positional part ({scheme})", pe, **_row_stats(pe), note=note)
    effect = _attention_effect(scheme, x, options)
    if effect is not None:
        title, tensor, stats = effect
        add("attention", title, tensor, **stats)
    add(
        "sum",
        "token + positional",
        summed,
        **_row_stats(summed),
        max_abs_diff_vs_x_plus_pe=float((summed - (x + pe)).abs().max()),
    )
    return summed


def _norm_and_dropout_steps(
    add, module: InputEmbedding, summed: torch.Tensor, dropout: float, seed: int
) -> None:
    """Steps ``layer_norm``, ``dropout_train`` (the mask of ``seed``, global RNG restored after) and
    ``dropout_eval``."""
    normed = module.norm(summed[None])[0]  # LayerNorm over d, per token
    add(
        "layer_norm",
        "LayerNorm (per token)",
        normed,
        **_row_stats(normed),
        gamma_is_one=bool(isinstance(module.norm, nn.LayerNorm) and torch.all(module.norm.weight == 1)),
    )
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    module.dropout.train()
    dropped = module.dropout(normed[None])[0]  # [s, d], zeros and 1/(1-p) scaling
    module.dropout.eval()
    torch.random.set_rng_state(gen_state)
    zeros = int((dropped == 0).sum()) - int((normed == 0).sum())
    add(
        "dropout_train",
        f"dropout p={dropout} (train)",
        dropped,
        **_row_stats(dropped),
        zeroed_fraction=zeros / dropped.numel(),
        keep_scale=1 / (1 - dropout),
    )
    add("dropout_eval", "dropout (eval): identity", module.dropout(normed[None])[0], equal_to_layer_norm=True)


def run_pipeline(
    ids: torch.Tensor | Sequence[int],
    vocab_size: int,
    *,
    tokens: Sequence[str] | None = None,
    scheme: str = "sinusoidal",
    d_model: int = 16,
    dropout: float = 0.1,
    seed: int = 0,
    scheme_options: dict[str, Any] | None = None,
) -> PipelineResult:
    """Run ids through a freshly initialised :class:`~posenc.InputEmbedding` one step at a time.

    Args:
        ids: ``[s]`` token ids in ``[0, vocab_size)``.
        vocab_size: ``V``, the rows of the embedding matrix ``E`` ``[V, d]``.
        tokens: the token strings, for display (default: the ids as strings).
        scheme: a scheme name; a scheme acting inside attention (rope, alibi, ...) adds nothing here,
            and the ``positional`` step is then zero.
        d_model: ``d``.
        dropout: the dropout rate shown in the train-mode step.
        seed: seeds the weights (``torch.manual_seed(seed)`` before building) and the dropout mask.
        scheme_options: extra scheme options; ``max_len`` defaults to ``s`` for schemes that take it.

    Returns:
        :class:`PipelineResult` with steps ``ids``, ``one_hot``, ``lookup``, ``scaled``,
        ``positional``, ``sum``, ``layer_norm``, ``dropout_train``, ``dropout_eval``; and, for a
        scheme acting inside attention, ``attention``: what it does there, with the scaled
        embeddings ``[s, d]`` as one head's queries and keys (``d_h = d``): the rotated vectors
        ``R_p x`` ``[s, d]`` for a ``rotate`` scheme, the transformed queries ``[s, d]`` for a
        ``queries`` one, the bias ``[s_q, s_k]`` for a ``score_bias`` one.
    """
    ids, tokens = _check_inputs(ids, tokens, vocab_size, d_model, dropout, seed)
    options = dict(scheme_options or {})
    if "max_len" in config_keys(scheme) and "max_len" not in options:
        options["max_len"] = ids.numel()
    torch.manual_seed(seed)
    module = InputEmbedding(
        vocab_size, d_model, scheme, layer_norm=True, dropout=dropout, scheme_options=options or None
    )
    module.eval()
    module.token.check_ids(ids)
    steps: dict[str, Step] = {}

    def add(name: str, title: str, tensor: torch.Tensor, **stats: Any) -> torch.Tensor:
        steps[name] = Step(name, title, tensor.detach(), stats)
        return tensor

    with torch.no_grad():
        x = _lookup_steps(add, ids, module, vocab_size, d_model)  # [s, d], scaled
        summed = _position_steps(add, module, scheme, x, options)  # [s, d]
        _norm_and_dropout_steps(add, module, summed, dropout, seed)
    return PipelineResult(tokens=tokens, ids=ids, steps=steps, module=module, seed=seed)


def _attention_effect(scheme: str, x: torch.Tensor, options: dict[str, Any]):
    """``(title, tensor, stats)`` of what ``scheme`` does inside attention to ``x`` ``[s, d]`` taken
    as one head's queries and keys, or ``None`` for schemes that add to the input or do nothing."""
    hooks = scheme_class(scheme).hooks
    if not hooks or "embed" in hooks:
        return None
    s, d = x.shape
    context = {"d_model": d, "head_dim": d, "num_heads": 1, "max_len": s, "causal": True}
    built = build_with_context(scheme, context, options)
    q, pos = x[None, None], torch.arange(s)  # [1, 1, s, d]: one head, d_h = d
    if "score_bias" in hooks:
        bias = built.score_bias(pos, pos, q)[0, 0].to(x.dtype)  # [s_q, s_k]
        note = f"{scheme} adds a bias to the attention logits: row = query, columns = keys 0, 1, ..."
        return f"bias {scheme} adds to the logits", bias, {"note": note, **_row_stats(bias)}
    if "rotate" not in hooks:  # "queries": a transform of the queries alone
        changed = built.queries(q, pos)[0, 0]  # [1, 1, s, d] -> [s, d]
        note = f"{scheme} transforms the queries alone (keys untouched), with x taken as one head's queries"
        return f"queries after {scheme}", changed, {"note": note, **_row_stats(changed)}
    rotated, _ = built.rotate(q, q)  # [1, 1, s, d]
    rotated = rotated[0, 0]
    ratio = rotated.norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-30)  # [s]
    note = f"{scheme} turns q and k by their positions: R_p x, with x taken as one head"
    stats = {"note": note, "norm_ratio_min": float(ratio.min()), "norm_ratio_max": float(ratio.max())}
    return f"R_p x ({scheme})", rotated, {**stats, **_row_stats(rotated)}


def encode_text(text: str, tokenizer: Tokenizer, **options: Any) -> PipelineResult:
    """Tokenize ``text`` and :func:`run_pipeline` it. ``options`` go to :func:`run_pipeline`.

    Raises:
        ValueError: ``text`` is empty or only whitespace.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f'text is empty ({text!r}): give a sentence, e.g. "The cat sat on the mat."')
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # e.g. bytes a terminal passed through as lone surrogates
        raise ValueError(
            f"text is not valid UTF-8 (character {err.start}: {text[err.start]!r}); pass UTF-8 text"
        ) from None
    enc = tokenizer.encode(text)
    return run_pipeline(
        torch.tensor(enc.ids, dtype=torch.long), tokenizer.vocab_size, tokens=enc.tokens, **options
    )


# ---------------------------------------------------------------------------------------------
# Presentation
# ---------------------------------------------------------------------------------------------
def _fmt_row(values: Sequence[float], digits: int) -> str:
    return "[" + ", ".join(f"{v:+.{digits}f}" for v in values) + "]"


def _more_rows(count: int, rows: int | None) -> list[str]:
    if rows is None or count <= rows:
        return []
    return [f"    ... {count - rows:,} more rows (posenc encode --all shows every row)"]


def _matrix_lines(
    result: PipelineResult, x: torch.Tensor, digits: int, columns: int, rows: int | None = None
) -> list[str]:
    width = max(len(t) for t in result.tokens[:rows])
    more = f" ... ({x.shape[1] - columns} more)" if x.shape[1] > columns else ""
    lines = [
        f"    {t:<{width}} {_fmt_row(row[:columns], digits)}{more}"
        for t, row in zip(result.tokens[:rows], x[:rows].tolist())
    ]
    return lines + _more_rows(x.shape[0], rows)


def _capped(items: list, rows: int | None, sep: str = " ") -> str:
    """``items`` joined, at most ``4 * rows`` of them (a line, not a page), then how many more."""
    cap = None if rows is None else 4 * rows
    shown = sep.join(map(str, items[:cap]))
    return shown if cap is None or len(items) <= cap else f"{shown} ... ({len(items) - cap:,} more)"


def _attention_lines(result: PipelineResult, digits: int, columns: int, rows: int | None) -> list[str]:
    step = result.steps["attention"]
    st = step.stats
    if "norm_ratio_min" in st:
        head = (
            f"6. inside attention: {st['note']} (d_h = {step.tensor.shape[1]}); |R_p x| / |x| is "
            f"{st['norm_ratio_min']:.4f} .. {st['norm_ratio_max']:.4f}; nothing is added to the input"
        )
    else:
        head = f"6. inside attention: {st['note']}; |max| {st['abs_max']:.3f}; nothing is added to the input"
    return [head, *_matrix_lines(result, step.tensor, digits, columns, rows)]


def format_pipeline(
    result: PipelineResult, digits: int = 3, columns: int = 6, rows: int | None = None
) -> str:
    """Human-readable text of every step (what ``posenc encode`` prints); ``rows`` caps the tokens
    shown per step (``None``: all), with a line saying how many more there are."""
    st = result.steps
    m = result.module
    s, d = st["lookup"].tensor.shape
    V = st["ids"].stats["vocab_size"]
    lines = [
        f"1. tokens ({s}): {_capped(result.tokens, rows)}",
        f"2. ids [s={s}]: [{_capped(result.ids.tolist(), rows, ', ')}]  (vocabulary V={V})",
    ]
    oh = st["one_hot"].stats
    lines.append(
        f"3. one_hot(ids) [{s}, {V}] @ E [{V}, {d}] == E[ids] [{s}, {d}]: "
        f"max |diff| = {oh['max_abs_diff']:.3g} "
        f"({'bit-identical' if oh['equal'] else 'not identical'}); "
        f"the matmul costs {oh['matmul_flops']:,} flops, the lookup copies {s * d} numbers"
    )
    lk = st["lookup"].stats
    lines.append(f"4. E[ids] [{s}, {d}]: std {lk['std']:.3f} (init std {lk['init_std']:.3f} = 1/sqrt(d))")
    lines += _matrix_lines(result, st["lookup"].tensor, digits, columns, rows)
    sc = st["scaled"].stats
    lines.append(f"5. x sqrt(d_model) = x {sc['scale']:.4g} -> std {sc['std']:.3f}")
    lines += _matrix_lines(result, st["scaled"].tensor, digits, columns, rows)
    if "attention" in st:
        lines += _attention_lines(result, digits, columns, rows)
    else:
        lines.append(
            f"6. positional part [{s}, {d}] ({st['positional'].stats['note']}), "
            f"|max| {st['positional'].stats['abs_max']:.3f}"
        )
        lines += _matrix_lines(result, st["positional"].tensor, digits, columns, rows)
    sm = st["sum"].stats
    lines.append(f"7. sum [{s}, {d}]: std {sm['std']:.3f}")
    lines += _matrix_lines(result, st["sum"].tensor, digits, columns, rows)
    ids = result.ids.tolist()
    repeat = next((i for i in range(s) if ids.index(ids[i]) != i), None)
    if repeat is not None:  # the id alone cannot tell the two occurrences apart
        first = ids.index(ids[repeat])
        gap = float((st["sum"].tensor[repeat] - st["sum"].tensor[first]).norm())
        why = (
            f"the same vector here; {m.scheme_name} tells them apart inside attention"
            if "attention" in st
            else "only the positional part tells them apart"
        )
        lines.append(
            f"    {result.tokens[repeat]!r} at positions {first} and {repeat}: the same row of E, "
            f"but the sums differ by |diff| = {gap:.3f} ({why})"
        )
    ln = st["layer_norm"].stats
    eps = getattr(m.norm, "eps", "-")
    lines.append(f"8. LayerNorm over d={d}, per token (gamma=1, beta=0 at init; eps={eps}):")
    width = max(len(t) for t in result.tokens[:rows])
    for t, mu, var in zip(result.tokens[:rows], ln["mean_per_token"], ln["var_per_token"]):
        lines.append(f"    {t:<{width}} mean {mu:+.2e}  var {var:.5f}")
    lines += _more_rows(s, rows)
    dt = st["dropout_train"].stats
    lines.append(
        f"9. dropout p={m.dropout.p}: train zeroes {dt['zeroed_fraction']:.1%} of {s * d} values, "
        f"scales the rest by 1/(1-p) = {dt['keep_scale']:.4g}; eval is the identity"
    )
    lines += _matrix_lines(result, st["dropout_train"].tensor, digits, columns, rows)
    lines.append(
        f"output [1, {s}, {d}] (eval) = posenc.InputEmbedding({V}, {d}, {m.scheme_name!r}, layer_norm=True, "
        f"dropout={m.dropout.p})(ids)"
    )
    return "\n".join(lines)


#: The matrices drawn by :func:`plot_pipeline`, in order.
PLOT_STEPS = ("lookup", "scaled", "positional", "sum", "layer_norm", "dropout_train")


#: What ``plot_pipeline`` writes, by suffix; a path without one gets ``.png``.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def plot_path(out_path: str | Path, flag: str = "--plot") -> Path:
    """The file :func:`plot_pipeline` will write: ``.png`` added to a name without a suffix; the
    path checked (a folder, a path under a file, an unknown suffix: ``ValueError``) before any work."""
    from .._paths import check_output_file

    out_path = Path(out_path)
    if not out_path.suffix:
        out_path = out_path.with_suffix(".png")
    if out_path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"{flag} {str(out_path)!r} must end in {', '.join(PLOT_SUFFIXES)}")
    return check_output_file(out_path, flag)


def plot_pipeline(result: PipelineResult, out_path: str | Path) -> Path:
    """Write a figure of the token x dimension matrices ``[s, d]`` at each step to ``out_path``.

    The format follows the file suffix (``.png``, ``.svg``, ``.pdf``). Needs matplotlib.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_path = plot_path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)  # the rule of every posenc plot: folders are made
    s, d = result.steps["lookup"].tensor.shape
    size = (3 + 0.35 * d * 3, 1.8 + 0.4 * s * 2)
    fig, axes = plt.subplots(2, 3, figsize=size, squeeze=False, layout="constrained")  # no overlaps
    for ax, name in zip(axes.flat, PLOT_STEPS):
        step = result.steps[name]
        x = step.tensor.float()
        ax.set_title(step.title, fontsize=9)
        if not bool(x.any()):  # e.g. the positional part of a scheme that acts inside attention
            ax.text(
                0.5,
                0.5,
                step.stats.get("note") or "all zeros",
                ha="center",
                va="center",
                wrap=True,
                fontsize=8,
                transform=ax.transAxes,
            )
            ax.set_axis_off()
            continue
        lim = float(x.abs().max())
        im = ax.imshow(x.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_yticks(range(s), result.tokens, fontsize=7)
        ax.set_xlabel("dimension")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"posenc encode: {s} tokens, d_model={d}, scheme {result.module.scheme_name!r}")
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
