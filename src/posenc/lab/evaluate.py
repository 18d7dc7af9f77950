"""Evaluators: how a trained model is scored at a length, one per study mode, in a registry.

**Language modelling** (:func:`evaluate_lm`, mode ``lm``). The model reads the windows of an
:class:`~posenc.lab.evalset.EvalSet` at length ``E``; one forward pass per window gives the loss
of every target, from which come:

* ``bpb_window``: bits per byte over the **last ``S`` targets** of each window (context
  ``E - S .. E - 1``): the same bytes at every length, Press et al.'s sliding-window score;
* the **paired delta** (:func:`paired_deltas`): per window, ``bpb_window`` at ``E`` minus at the
  training length ``L`` (short context), averaged, with a bootstrap interval over documents. This is
  the lab's answer to "does the model degrade past L": positive = worse with the longer window;
* ``bpb_all`` and ``bpb_beyond``: over all positions, and over positions ``>= L`` of the window
  (secondary: at different ``E`` they cover different bytes);
* ``curve``: the loss by position inside the window (the early-token effect made visible).

**Synthetic tasks** (:func:`evaluate_task`, modes ``copy``, ``reverse``, ``addition``, ``sort``,
``parity``):
exact-match accuracy on fresh examples of question length ``n`` (teacher-forced argmax, which
equals greedy decoding's exact match), with the answer digits scored separately from the end
token (per-digit accuracy, and how often the model ends early, at the length it trained on) and
Wilson intervals over the examples.

Legend: ``K`` windows, ``b`` windows per forward pass, ``E`` evaluation length, ``L`` training
length, ``S`` scored targets per window, ``V`` vocabulary.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..text.tasks import task_seq_len
from .evalset import EvalSet
from .memory import available_memory, check_memory, estimate_memory
from .stats import paired_bootstrap

__all__ = [
    "EVALUATORS",
    "EvalPoint",
    "LMEvaluator",
    "TaskEvaluator",
    "evaluate_lengths",
    "evaluate_lm",
    "evaluate_task",
    "paired_deltas",
    "position_limit",
]

#: Bytes of the random string of the effective-context probe (:mod:`posenc.lab.probe`).
PROBE_STRING = 16

#: Points in the stored loss-by-position curve of one length (positions are averaged in bins).
CURVE_POINTS = 64


@dataclass
class EvalPoint:
    """One evaluation length of one model (``None`` = not measured or n/a; ``note`` says why).

    Attributes:
        length: ``E``.
        bpb_window: bits/byte over the last ``S`` targets of each window (the same bytes at every ``E``).
        delta: the paired delta against ``E = L`` (an :class:`~posenc.lab.stats.Interval` dict:
            mean, low, high, n windows); ``None`` at ``E = L``.
        bpb_all / bpb_beyond: bits/byte over all positions / positions ``>= L`` of the windows.
        window_bits: ``[K]`` per-window ``bpb_window`` (what the paired delta pairs).
        curve: ``[[position, bits], ...]`` the mean loss by position in the window, binned.
        n_scored: targets in ``bpb_window`` (``K * S``), or task examples.
        accuracy: exact-match accuracy (task modes).
        token_accuracy: the share of answer tokens (and ``[EOS]``) predicted right (task modes).
        note: why a value is missing, or the variant's setting (e.g. ``factor 4``).
        wall_s: evaluation time.
        attn_entropy, attn_distance, attn_beyond: attention diagnostics (:mod:`posenc.lab.diagnostics`),
            means over layers and heads; ``attention`` holds them per layer and head.
        digit_accuracy: task modes: the share of answer digits (``[EOS]`` excluded) predicted right.
        early_end: task modes: the share of examples where the model predicted ``[EOS]`` before
            the answer's end; ``stopped_at_L``: where that first early end came right after the
            answer length of a trained-length question (the model stopped at what it trained on).
        wilson: task modes: per metric (``accuracy``, ``digit_accuracy``, ``early_end``,
            ``stopped_at_L``), Wilson's 95% interval over the examples (digits for digit accuracy).
        probe: ``lm`` mode, at the longest length: the repeated-string effective-context probe
            per distance (:func:`~posenc.lab.probe.repeated_string_probe`).
        example_correct: task modes: ``[examples]`` 1 where the example's answer was exactly
            right, else 0, in the examples' order (the same questions for every model and seed of
            a study, so two schemes pair example for example).
    """

    length: int
    bpb_window: float | None = None
    delta: dict | None = None
    bpb_all: float | None = None
    bpb_beyond: float | None = None
    window_bits: list[float] = field(default_factory=list)
    curve: list[list[float]] = field(default_factory=list)
    n_scored: int = 0
    accuracy: float | None = None
    token_accuracy: float | None = None
    note: str = ""
    wall_s: float = 0.0
    attn_entropy: float | None = None
    attn_distance: float | None = None
    attn_beyond: float | None = None
    attention: dict | None = None
    digit_accuracy: float | None = None
    early_end: float | None = None
    stopped_at_L: float | None = None
    wilson: dict | None = None
    probe: list[dict] | None = None
    example_correct: list[int] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.bpb_window is not None or self.accuracy is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# Language modelling
# ----------------------------------------------------------------------------------------------
def _eval_batch(model_config, length: int, n_windows: int, budget_tokens: int, device: torch.device) -> int:
    """Windows per forward pass: at most ``budget_tokens`` tokens, and halved until the inference
    memory estimate (attention matrices ``[b, h, E, E]`` included) fits in a quarter of free memory."""
    b = max(1, min(n_windows, budget_tokens // length))
    free = available_memory(device)
    while b > 1 and estimate_memory(model_config, b, length, training=False).total > free / 4:
        b //= 2
    return b


def _loss_dtype(logits: torch.Tensor) -> torch.Tensor:
    """Logits for the loss: float32 at least (bf16 logits lose small probabilities), float64 kept."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def _curve(position_bits: torch.Tensor) -> list[list[float]]:
    """``[E]`` mean bits per position -> at most about :data:`CURVE_POINTS` ``[mid position, mean
    bits]``, in bins that widen geometrically (every early position alone, where the loss moves)."""
    e = position_bits.numel()
    edges = sorted({0, e, *(int(x) for x in torch.logspace(0, math.log10(e), CURVE_POINTS).tolist())})
    out = []
    for lo, hi in itertools.pairwise(edges):
        if hi > lo:
            out.append([(lo + hi - 1) / 2, float(position_bits[lo:hi].mean())])
    return out


def _checked_batch(model, length: int, k: int, batch_tokens: int, device: torch.device) -> int:
    """Windows per forward pass at length ``length`` (1 for a model without a config), refused
    before any work when even that cannot fit in memory."""
    config = getattr(model, "config", None)
    if config is None:
        return 1
    b = _eval_batch(config, length, k, batch_tokens, device)
    check_memory(
        estimate_memory(config, b, length, training=False),
        device,
        what=f"evaluation at length {length} (batch {b})",
    )
    return b


@torch.no_grad()
def evaluate_lm(
    model: torch.nn.Module,
    evalset: EvalSet,
    length: int,
    train_len: int,
    score_len: int,
    *,
    batch_tokens: int = 16384,
    device: str | torch.device | None = None,
    autocast: bool = False,
) -> EvalPoint:
    """Score ``model`` on every window of ``evalset`` at length ``E = length``.

    Args:
        model: ids ``[b, E]`` -> logits ``[b, E, V]`` (or an object with ``.logits``).
        evalset: the windows (:func:`~posenc.lab.evalset.sample_eval_set`).
        length: ``E``.
        train_len: ``L``; positions ``>= L`` of each window also go into ``bpb_beyond``.
        score_len: ``S <= E``, the last targets of each window that ``bpb_window`` averages.
        batch_tokens: at most this many tokens per forward pass (fewer when long windows'
            attention would not fit in memory).
        autocast: bf16 autocast (CUDA runs).

    Returns:
        an :class:`EvalPoint` without ``delta`` (see :func:`paired_deltas`).
    """
    if not 1 <= score_len <= length:
        raise ValueError(f"score_len={score_len} must be in [1, length={length}]")
    t0 = time.perf_counter()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    k = int(evalset.anchors.numel())
    b = _checked_batch(model, length, k, batch_tokens, device)
    window_bits = torch.empty(k, dtype=torch.float64)  # [K]
    position_sum = torch.zeros(length, dtype=torch.float64)  # [E]
    model.eval()
    for i in range(0, k, b):
        window = evalset.windows(length, slice(i, i + b)).to(device)  # [b', E + 1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(window[:, :-1])
        logits = _loss_dtype(out.logits)  # [b', E, V], float32 or better
        nats = F.cross_entropy(logits.transpose(1, 2), window[:, 1:], reduction="none")  # [b', E]
        bits = nats.double().cpu() / math.log(2)  # [b', E], summed in float64
        window_bits[i : i + bits.shape[0]] = bits[:, -score_len:].mean(dim=1)
        position_sum += bits.sum(dim=0)
    position_mean = position_sum / k  # [E]
    return EvalPoint(
        length=length,
        bpb_window=float(window_bits.mean()),
        bpb_all=float(position_mean.mean()),
        bpb_beyond=float(position_mean[train_len:].mean()) if length > train_len else None,
        window_bits=window_bits.tolist(),
        curve=_curve(position_mean),
        n_scored=k * score_len,
        wall_s=time.perf_counter() - t0,
    )


def paired_deltas(
    points: list[EvalPoint], train_len: int, *, seed: int = 0, clusters: list[int] | None = None
) -> None:
    """Fill each point's ``delta``: per window, its ``bpb_window`` minus the same window's at
    ``E = L``, with a bootstrap interval and p-value that resample documents (``clusters[i]``:
    window ``i``'s document; ``None`` = windows) (in place; needs the point at ``L``)."""
    base = next((p for p in points if p.length == train_len and p.window_bits), None)
    if base is None:
        raise ValueError(f"paired deltas need the evaluation at the training length L={train_len}")
    ref = torch.tensor(base.window_bits, dtype=torch.float64)  # [K]
    for p in points:
        if p.length != train_len and p.window_bits:
            diff = torch.tensor(p.window_bits, dtype=torch.float64) - ref  # [K], same targets
            p.delta = paired_bootstrap(diff, clusters, seed=seed).to_dict()


# ----------------------------------------------------------------------------------------------
# Synthetic tasks
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_task(
    model: torch.nn.Module,
    task: str,
    n: int,
    examples: int,
    seed: int,
    device: str | torch.device | None = None,
    train_len: int | None = None,
    positions: Callable[[int, int], torch.Tensor] | None = None,
) -> EvalPoint:
    """Score ``model`` on ``examples`` fresh examples of ``task`` with question length ``n``
    (teacher-forced argmax over the answer tokens and ``[EOS]``, which equals greedy decoding's
    exact match).

    Args:
        train_len: ``L``, the longest trained question: ``stopped_at_L`` counts examples whose first
            early ``[EOS]`` follows exactly the answer length of a question of ``L`` (``None``: not
            measured).
        positions: ``(batch, seq) -> [batch, seq]`` position ids to feed the model (randomized
            positions re-sampled at test time); ``None`` = ``0 .. s - 1``.

    Returns:
        an :class:`EvalPoint` with ``accuracy`` (exact match), ``token_accuracy`` (answer tokens and
        ``[EOS]`` right), ``digit_accuracy``, ``early_end``, ``stopped_at_L`` and their ``wilson``
        intervals.
    """
    from ..text.tasks import generate_task, score_answers
    from .stats import wilson_interval

    t0 = time.perf_counter()
    if device is None:
        device = next(model.parameters()).device
    ex = generate_task(task, examples, n, seed=seed)  # [n_ex, s], all the same length
    trained_answer = None
    if train_len is not None:
        trained_answer = int(generate_task(task, 1, train_len, seed=0).answer_mask.sum()) - 1  # digits
    exact = digits_right = digits = early = at_l = right_tokens = 0
    correct: list[int] = []  # [examples] 1 = exact match
    model.eval()
    for i in range(0, examples, 64):
        tokens, mask = ex.tokens[i : i + 64].to(device), ex.answer_mask[i : i + 64].to(device)  # [b, s]
        ids = tokens[:, :-1]
        if positions is None:
            out = model(ids)
        else:
            out = model(ids, positions=positions(ids.shape[0], ids.shape[1]).to(device))
        pred = out.logits.argmax(-1)  # [b, s - 1]: prediction for position t + 1
        sc = score_answers(pred, tokens[:, 1:], mask[:, 1:])
        exact += int(sc.exact.sum())
        correct += sc.exact.int().tolist()
        digits_right += int(sc.digits_right.sum())
        digits += int(sc.digits.sum())
        early += int((sc.early_end >= 0).sum())
        if trained_answer is not None:
            at_l += int((sc.early_end == trained_answer).sum())
        right_tokens += int(((pred == tokens[:, 1:]) & mask[:, 1:]).sum())
    wilson = {
        "accuracy": wilson_interval(exact, examples).to_dict(),
        "digit_accuracy": wilson_interval(digits_right, digits).to_dict() if digits else None,
        "early_end": wilson_interval(early, examples).to_dict(),
    }
    if trained_answer is not None:
        wilson["stopped_at_L"] = wilson_interval(at_l, examples).to_dict()
    return EvalPoint(
        length=n,
        accuracy=exact / examples,
        token_accuracy=right_tokens / int(ex.answer_mask.sum()),
        digit_accuracy=digits_right / digits if digits else None,
        early_end=early / examples,
        stopped_at_L=at_l / examples if trained_answer is not None else None,
        wilson=wilson,
        n_scored=examples,
        wall_s=time.perf_counter() - t0,
        example_correct=correct,
    )


# ----------------------------------------------------------------------------------------------
# One evaluator per study mode
# ----------------------------------------------------------------------------------------------
class LMEvaluator:
    """Mode ``lm``: :func:`evaluate_lm` at each length on one :class:`EvalSet`, then the paired
    deltas against ``L``; at the longest length also the repeated-string probe
    (:mod:`posenc.lab.probe`), at every distance that fits."""

    def __init__(self, config, evalset: EvalSet, device: torch.device) -> None:
        self.config, self.evalset, self.device = config, evalset, device

    def positions_needed(self, length: int) -> int:
        """The longest input (tokens) a model reads at this length."""
        return length

    def __call__(self, model: torch.nn.Module, length: int) -> EvalPoint:
        c = self.config
        point = evaluate_lm(
            model,
            self.evalset,
            length,
            c.train_len,
            c.targets_per_window,
            batch_tokens=c.eval_batch_tokens,
            device=self.device,
            autocast=self.device.type == "cuda",
        )
        if length == max(c.eval_lens):  # the effective-context probe, with the longest reach
            from .probe import probe_distances, repeated_string_probe

            distances = probe_distances(length, PROBE_STRING)
            if distances:
                point.probe = repeated_string_probe(
                    model,
                    self.evalset.tokens,
                    distances,
                    string_len=PROBE_STRING,
                    seed=c.data.split_seed,
                    device=self.device,
                )
        return point

    def finish(self, points: list[EvalPoint]) -> None:
        if any(p.window_bits for p in points):
            paired_deltas(
                points,
                self.config.train_len,
                seed=self.config.data.split_seed,
                clusters=self.evalset.clusters,
            )


class TaskEvaluator:
    """Task modes (``copy``, ``reverse``, ...): exact match on fresh examples per length (the
    same examples for every model: their seed depends on the split seed and the length only)."""

    def __init__(self, config, evalset: None, device: torch.device) -> None:
        self.config, self.device = config, device

    def positions_needed(self, length: int) -> int:
        return task_seq_len(self.config.mode, length) - 1

    def __call__(self, model: torch.nn.Module, length: int) -> EvalPoint:
        c = self.config
        return evaluate_task(
            model,
            c.mode,
            length,
            c.eval_examples,
            seed=c.data.split_seed + 1_000_003 + length,
            device=self.device,
            train_len=c.train_len,
        )

    def resampled(self, model: torch.nn.Module, length: int, max_position: int) -> EvalPoint:
        """Ruoss et al.'s test protocol for a model trained at randomized positions: the same
        examples as :meth:`__call__`, read at positions drawn sorted from ``[0, max_position)``
        (n/a when the example needs more positions than that)."""
        from ..positions import randomized_positions

        c = self.config
        s = self.positions_needed(length)
        if s > max_position:
            return EvalPoint(length, note=f"n/a: {s} positions do not fit in [0, {max_position})")
        g = torch.Generator().manual_seed(c.data.split_seed + 7_919 + length)
        point = evaluate_task(
            model,
            c.mode,
            length,
            c.eval_examples,
            seed=c.data.split_seed + 1_000_003 + length,
            device=self.device,
            train_len=c.train_len,
            positions=lambda b, seq: randomized_positions(b, seq, max_position, generator=g),
        )
        point.note = f"positions re-sampled from [0, {max_position})"
        return point

    def finish(self, points: list[EvalPoint]) -> None:
        pass


#: Study mode -> evaluator class (``config.mode`` picks one; ``lm`` needs an evaluation set).
EVALUATORS: dict[str, type] = {
    "lm": LMEvaluator,
    "copy": TaskEvaluator,
    "reverse": TaskEvaluator,
    "addition": TaskEvaluator,
    "sort": TaskEvaluator,
    "parity": TaskEvaluator,
    "addition_reversed": TaskEvaluator,
}


def position_limit(model_config) -> int | None:
    """The longest input the scheme can encode (learned: its table), built on the meta device."""
    from ..registry import build_with_context

    with torch.device("meta"):
        scheme = build_with_context(
            model_config.position, model_config.scheme_context(True), model_config.position_options
        )
    return getattr(scheme, "max_len", None)


def evaluate_lengths(
    config,
    evaluator,
    model_at: Callable[[int], torch.nn.Module],
    model_config,
    note: Callable[[int], str] | None = None,
) -> list[EvalPoint]:
    """Every length with the model ``model_at(E)`` (n/a past the scheme's table), then the
    evaluator's pairing."""
    limit = position_limit(model_config)
    points = []
    for e in config.eval_lens:
        if limit is not None and evaluator.positions_needed(e) > limit:
            points.append(EvalPoint(e, note=f"n/a: {model_config.position} positions stop at {limit}"))
            continue
        model = model_at(e)
        point = evaluator(model, e)
        if note is not None:
            point.note = note(e)
        if config.diagnostic_windows:  # attention entropy, distance, mass beyond L
            from .diagnostics import fill_diagnostics

            fill_diagnostics(point, model, config, evaluator.evalset, evaluator.device)
        points.append(point)
    evaluator.finish(points)
    return points
