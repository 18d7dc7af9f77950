"""The lab's evaluation on a model it did not train (:mod:`posenc.lab.pretrained_load`), scored
as it is and under each evaluation-time variant its scheme declares (RoPE's scalings), at each
length, with paired deltas against its trained length and against the model as it is, the
effective-context probe, and intervals over documents.

::

    results = evaluate_pretrained("exported-model", eval_lens=(128, 256, 512))
    print(format_pretrained(results))

or from a shell: ``posenc extrapolate --model DIR [--quick] [--out OUT]`` (:mod:`posenc.lab.pretrained`).

**Scores** (:mod:`posenc.lab.evaluate`), in bits per byte or per token: per length ``E`` the
sliding-window score (the same last ``S`` targets of each window at every length), its paired delta
against ``E = L`` (``delta``) and, for a variant, against the model as it is at the same ``E``
(``vs_as_is``), each with a 95% bootstrap interval over documents; at the longest length the
repeated-string probe (:mod:`posenc.lab.probe`; for a tokenized model its random strings are ids
0-255). Windows that repeat the corpus's training documents are dropped
(:func:`~posenc.lab.evalset.sample_eval_set`).

Legend: ``L`` trained length, ``E`` evaluation length, ``K`` windows, ``S`` scored targets per window.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._validate import check_int
from .evalset import sample_eval_set
from .evaluate import PROBE_STRING, EvalPoint, evaluate_lm, paired_deltas
from .memory import check_memory, estimate_memory
from .pretrained_load import PretrainedText, checked_model, position_limit, read_text, trained_length
from .probe import probe_distances, repeated_string_probe
from .stats import format_interval, paired_bootstrap

__all__ = [
    "DEFAULT_MULTIPLES",
    "PROBE_IDS",
    "PROBE_TRIALS",
    "Setup",
    "at_variant",
    "evaluate_pretrained",
    "evaluate_setup",
    "format_pretrained",
    "format_probe",
    "format_rows",
    "prepare_pretrained",
]

#: Evaluation lengths by default: these multiples of ``L`` that the model's positions allow.
DEFAULT_MULTIPLES = (1, 2, 4, 8)

#: Probe trials per distance by default.
PROBE_TRIALS = 32

#: The ids the probe's random strings are drawn from (``[0, 256)``: bytes, or a tokenizer's first
#: ids); a smaller vocabulary has no probe.
PROBE_IDS = 256


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------
def _interval(values: list[float], clusters: list[int], seed: int) -> dict[str, Any]:
    return paired_bootstrap(torch.tensor(values, dtype=torch.float64), clusters, seed=seed).to_dict()


def _offered(model, variants: tuple[str, ...] | None) -> tuple[str, ...]:
    """The variants to run: those the model's scheme declares, or the requested subset of them."""
    scheme = model.decoder.scheme(0)
    offered = type(scheme).eval_variants if scheme is not None else ()
    unknown = [v for v in (variants or ()) if v not in offered]
    if unknown:
        close = difflib.get_close_matches(unknown[0], offered, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"variants {unknown} are not offered by this model's scheme{hint}; it offers "
            f"{list(offered) or 'none'}"
        )
    return offered if variants is None else tuple(variants)


def at_variant(model, variant: str | None, factor: float, train_len: int):
    """``model`` with ``variant``'s positional options at ``factor`` and original length ``L``
    (replacing its own scaling); ``variant=None``: the model itself."""
    from ..model.surgery import with_position

    if variant is None:
        return model
    scheme = model.decoder.scheme(0)
    return with_position(model, type(scheme).variant_options(variant, factor, train_len)).eval()


def _lengths(
    eval_lens: tuple[int, ...] | None, train_len: int, limit: int | None, multiples: tuple[int, ...]
) -> tuple[int, ...]:
    """The lengths to score (``L`` added); by default the ``multiples`` of ``L`` the positions allow;
    a requested length past them is an error."""
    if eval_lens is None:
        lens = [train_len * k for k in multiples if limit is None or train_len * k <= limit]
    else:
        lens = [check_int(e, "--eval-lens entry") for e in eval_lens]
        beyond = [e for e in lens if limit is not None and e > limit]
        if beyond:
            raise ValueError(
                f"--eval-lens {beyond} are longer than the model's positions allow ({limit}: a "
                f"learned table); use lengths up to {limit}"
            )
    return tuple(sorted({*lens, train_len}))


def _checked_lengths(model, train_len, limit, eval_lens, multiples, score_len, device):
    """``(lens, score_len)`` checked against the positions' ``limit`` and, for the longest length,
    against memory (one window), before the corpus is read."""
    if limit is not None and train_len > limit:
        raise ValueError(
            f"--train-len {train_len} is longer than the model's positions allow ({limit}: a learned "
            f"table), so it cannot be the length the model was trained at; give {limit} or less"
        )
    lens = _lengths(eval_lens, train_len, limit, multiples)
    score_len = max(1, min(lens) // 2) if score_len is None else check_int(score_len, "--score-len")
    if not 1 <= score_len <= min(lens):
        raise ValueError(f"--score-len {score_len} must be in [1, {min(lens)}] (the shortest length)")
    # evaluate_lm checks each length again when it reaches it, with its batch
    check_memory(
        estimate_memory(model.config, 1, max(lens), training=False),
        device,
        what=f"evaluation at length {max(lens)} (one window)",
    )
    return lens, score_len


@dataclass
class Setup:
    """A loaded model and what it is scored on: the text, the windows, the lengths.

    Attributes:
        model: the posenc ``TransformerLM`` in eval mode.
        text: the corpus as the model reads it.
        evalset: the ``K`` windows (:class:`~posenc.lab.evalset.EvalSet`).
        train_len, lens, score_len: ``L``, the lengths ``E`` (``L`` among them), ``S``.
        limit: the longest input the positions allow (``None``: no limit).
        variants: the evaluation-time variants to run.
    """

    model: Any
    text: PretrainedText
    evalset: Any
    train_len: int
    lens: tuple[int, ...]
    score_len: int
    limit: int | None
    variants: tuple[str, ...]
    split_seed: int = 0
    probe_trials: int = PROBE_TRIALS
    batch_tokens: int = 16384
    device: str | torch.device = "cpu"

    def score(self, model_at) -> list[dict[str, Any]]:
        """One model at every length: :func:`~posenc.lab.evaluate.evaluate_lm`, the paired deltas
        against ``L`` (intervals over documents), a ``score`` interval of ``bpb_window``, and at the
        longest measured length the repeated-string probe.

        Args:
            model_at: ``E -> model`` (the model read at length ``E``: a variant's factor depends on it).

        Returns:
            one :class:`~posenc.lab.evaluate.EvalPoint` dict per length, with ``score`` (``n/a``
            past the positions' limit).
        """
        points = []
        run = {"batch_tokens": self.batch_tokens, "device": self.device}
        run["autocast"] = torch.device(self.device).type == "cuda"  # bf16 on a GPU, as the lab scores
        for e in self.lens:
            if self.limit is not None and e > self.limit:
                points.append(EvalPoint(e, note=f"n/a: positions stop at {self.limit}"))
                continue
            points.append(evaluate_lm(model_at(e), self.evalset, e, self.train_len, self.score_len, **run))
        clusters = self.evalset.clusters
        paired_deltas(points, self.train_len, seed=self.split_seed, clusters=clusters)
        longest = max((p for p in points if p.window_bits), key=lambda p: p.length)
        longest.probe = self.probe(model_at(longest.length), longest.length)
        out = []
        for p in points:
            d = p.to_dict()
            d["score"] = _interval(p.window_bits, clusters, self.split_seed) if p.window_bits else None
            out.append(d)
        return out

    def score_variant(self, variant: str | None) -> list[dict[str, Any]]:
        """:meth:`score` of the model as it is (``None``) or under ``variant``, read at each
        length ``E`` with factor ``max(1, E / L)`` and original length ``L``."""
        model, L = self.model, self.train_len
        if variant is None:
            return self.score(lambda e: model)
        return self.score(lambda e: at_variant(model, variant, max(1.0, e / L), L))

    def probe(self, model, length: int) -> list[dict[str, Any]] | None:
        """The repeated-string probe at every distance that fits in ``length`` (``None``: none
        fits, ``probe_trials`` is 0, or the vocabulary has fewer ids than the probe's random strings
        draw from: :data:`PROBE_IDS`)."""
        distances = probe_distances(length, PROBE_STRING)
        if not (self.probe_trials and distances) or model.config.vocab_size < PROBE_IDS:
            return None
        return repeated_string_probe(
            model,
            self.evalset.tokens,
            distances,
            string_len=PROBE_STRING,
            trials=self.probe_trials,
            seed=self.split_seed,
            device=self.device,
        )

    def against(self, points: list[dict], reference: list[dict]) -> list[dict | None]:
        """Per length, the paired difference ``points - reference`` on the same windows, with a 95%
        interval over documents (``None`` where either is not measured)."""
        out = []
        for p, r in zip(points, reference):
            both = p["window_bits"] and r["window_bits"]
            diff = [a - b for a, b in zip(p["window_bits"], r["window_bits"])] if both else None
            out.append(_interval(diff, self.evalset.clusters, self.split_seed) if diff else None)
        return out


def prepare_pretrained(
    model: Any,
    *,
    train_len: int | None = None,
    eval_lens: tuple[int, ...] | None = None,
    variants: tuple[str, ...] | None = None,
    corpus: str | os.PathLike = "stdlib",
    max_chars: int | None = None,
    eval_windows: int = 32,
    score_len: int | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    probe_trials: int = PROBE_TRIALS,
    multiples: tuple[int, ...] = DEFAULT_MULTIPLES,
    batch_tokens: int = 16384,
    device: str | torch.device = "cpu",
) -> Setup:
    """Load and check the model, read the text, choose the windows (arguments as
    :func:`evaluate_pretrained`). Every check runs here, before any scoring."""
    model, tokenizer = checked_model(model, device)
    train_len = trained_length(model) if train_len is None else check_int(train_len, "--train-len")
    check_int(probe_trials, "probe_trials", minimum=0)
    check_int(eval_windows, "--eval-windows")
    check_int(split_seed, "--split-seed", minimum=0)
    limit = position_limit(model)
    lens, score_len = _checked_lengths(model, train_len, limit, eval_lens, multiples, score_len, device)
    chosen = _offered(model, variants)
    text = read_text(
        corpus,
        tokenizer,
        vocab_size=model.config.vocab_size,
        max_chars=max_chars,
        split_seed=split_seed,
        val_fraction=val_fraction,
    )
    evalset = sample_eval_set(
        text.val,
        eval_windows,
        max(lens),
        split_seed,
        doc_names=list(text.val_names),
        doc_starts=list(text.val_starts),
        train_tokens=text.train if text.train.numel() > score_len else None,
        score_len=score_len,
    )
    return Setup(
        model,
        text,
        evalset,
        train_len,
        lens,
        score_len,
        limit,
        chosen,
        split_seed,
        probe_trials,
        batch_tokens,
        device,
    )


def evaluate_setup(setup: Setup, score_all: Callable[[list], list] | None = None) -> dict[str, Any]:
    """The model as it is and under each variant at every length (see :func:`evaluate_pretrained`).

    ``score_all``: ``[None, *variants] -> [points of each]``, e.g. on several processes or machines
    (:func:`posenc.lab.pretrained_jobs.score_all`); default: :meth:`Setup.score_variant` of each,
    here."""
    t0 = time.perf_counter()
    wanted = [None, *setup.variants]
    scored = [setup.score_variant(v) for v in wanted] if score_all is None else score_all(wanted)
    as_is = scored[0]
    runs = [{"name": "as is", "variant": None, "eval": as_is}]
    for v, points in zip(setup.variants, scored[1:]):
        for p, d in zip(points, setup.against(points, as_is)):
            p["vs_as_is"] = d
        runs.append({"name": f"+{v}", "variant": v, "eval": points})
    return {
        "unit": setup.text.unit,
        "corpus": setup.text.summary,
        "corpus_info": setup.text.info,
        "data_id": setup.text.data_id,
        "eval": {"score_len": setup.score_len, "split_seed": setup.split_seed, **setup.evalset.record()},
        "train_len": setup.train_len,
        "eval_lens": list(setup.lens),
        "position_limit": setup.limit,
        "model_config": setup.model.config.to_dict(),
        "runs": runs,
        "wall_s": time.perf_counter() - t0,
    }


def evaluate_pretrained(model: Any, **options: Any) -> dict[str, Any]:
    """Score ``model`` as it is and under each variant, at every length.

    Args:
        model: a posenc ``TransformerLM`` (read as bytes) or a path for :func:`load_pretrained`
            (with the ``tokenizer.json`` beside it, if any).
        train_len: ``L``, the length the model was trained at (default: its config's ``max_len``).
        eval_lens: the lengths ``E`` (``L`` is added); default: ``multiples`` of ``L`` within the
            model's positions. A length past a learned table is a ``ValueError``.
        variants: evaluation-time variants (default: every one the model's scheme declares, e.g.
            RoPE's ``linear``, ``ntk``, ``dynamic``, ``yarn``), each with factor ``max(1, E / L)``
            and original length ``L`` (it replaces the model's own scaling).
        corpus, max_chars, val_fraction, split_seed: the text (:func:`read_text`).
        eval_windows, score_len: ``K`` windows and ``S`` (default ``min(E) / 2``).
        probe_trials: trials per probe distance (0: no probe).
        batch_tokens, device: as :func:`~posenc.lab.evaluate.evaluate_lm`.

    Returns:
        ``{"unit", "corpus", "eval", "train_len", "eval_lens", "runs": [{"name", "variant",
        "eval": [points]}], ...}``; each point as :meth:`Setup.score`, a variant's with ``vs_as_is``.
    """
    return evaluate_setup(prepare_pretrained(model, **options))


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------
def format_rows(title: str, runs: list[dict], lens: list[int], cell) -> list[str]:
    width = max(len(r["name"]) for r in runs) + 2
    lines = [title, "run".ljust(width) + "".join(f"{e:>17}" for e in lens)]
    for run in runs:
        lines.append(run["name"].ljust(width) + "".join(f"{cell(p):>17}" for p in run["eval"]))
    return lines


def _missing(p: dict) -> str:
    return "n/a" if p["note"].startswith("n/a") else "-"


def format_probe(runs: list[dict], unit: str) -> list[str]:
    """The probe's gain per run and distance (bits per ``unit`` on the second copy: control minus
    copy, 95% interval over trials)."""
    rows = [(r["name"], p) for r in runs for p in r["eval"] if p.get("probe")]
    if not rows:
        return []
    distances = [x["distance"] for x in rows[0][1]["probe"]]
    width = max(len(name) for name, _ in rows) + 2
    lines = [
        f"effective-context probe at E={rows[0][1]['length']}: gain in bits/{unit} on a repeated random "
        "string by distance (0 = no retrieval; 95% interval over trials)",
        "run".ljust(width) + "".join(f"{d:>17}" for d in distances),
    ]
    for name, p in rows:
        lines.append(name.ljust(width) + "".join(f"{format_interval(x['gain']):>17}" for x in p["probe"]))
    return lines


def format_pretrained(results: dict[str, Any]) -> str:
    """The per-variant tables: sliding-window loss, paired deltas against ``L`` and against the
    model as it is (95% intervals over documents), and the probe."""
    unit = results.get("unit", "byte")
    runs, lens = results["runs"], [p["length"] for p in results["runs"][0]["eval"]]
    L = results["train_len"]
    ev = results["eval"]
    lines = [
        results["corpus"],
        f"{ev['windows']} windows in {ev['n_documents']} validation documents; every ± is a 95% bootstrap "
        "interval over those documents (the probe's: over its trials)",
    ]
    lines += format_rows(
        f"sliding-window bits/{unit} (the same last {results['eval']['score_len']} targets at every length; "
        "lower is better)",
        runs,
        lens,
        lambda p: format_interval(p.get("score"), missing=_missing(p)),
    )
    lines += format_rows(
        f"paired delta vs L={L}, bits/{unit} (> 0 = worse with the longer window)",
        runs,
        lens,
        lambda p: format_interval(p["delta"], signed=True, missing=_missing(p)),
    )
    if len(runs) > 1:
        lines += format_rows(
            f"paired delta vs as is at the same length, bits/{unit} (< 0 = the variant helps)",
            runs[1:],
            lens,
            lambda p: format_interval(p.get("vs_as_is"), signed=True, missing=_missing(p)),
        )
    lines += format_probe(runs, unit)
    return "\n".join(lines)
