"""Tests of posenc.lab.evaluate: scores against a float64 reference, paired deltas, the task evaluator."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from _lab_toys import tiny_lm
from posenc.lab.evalset import sample_eval_set
from posenc.lab.evaluate import (
    EvalPoint,
    _eval_batch,
    evaluate_lm,
    evaluate_task,
    paired_deltas,
)
from posenc.model import LMOutput
from posenc.text.tasks import EOS, SEP, TASK_VOCAB


def _evalset(n=600, k=5, max_len=64, seed=2):
    tokens = torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).to(torch.uint8)
    return sample_eval_set(tokens, k, max_len, seed=0)


def reference(model: nn.Module, es, length: int, train_len: int, score_len: int):
    """Each window alone, log-softmax in float64, one target at a time."""
    per_window, all_bits, beyond = [], [], []
    with torch.no_grad():
        for a in es.anchors.tolist():
            window = es.tokens[a - length : a + 1].long()
            logp = torch.log_softmax(model(window[None, :-1]).logits[0].double(), dim=-1)  # [E, V]
            bits = [-logp[i, window[i + 1]].item() / math.log(2) for i in range(length)]
            per_window.append(sum(bits[-score_len:]) / score_len)
            all_bits += bits
            beyond += bits[train_len:]
    return per_window, sum(all_bits) / len(all_bits), (sum(beyond) / len(beyond) if beyond else None)


@pytest.mark.parametrize("length", [8, 16, 64])
def test_evaluate_lm_matches_float64_reference(length):
    model, es = tiny_lm(), _evalset()
    point = evaluate_lm(model, es, length, train_len=8, score_len=4, batch_tokens=2 * length)  # 3 batches
    windows, ref_all, ref_beyond = reference(model, es, length, 8, 4)
    assert point.window_bits == pytest.approx(windows, rel=1e-5)
    assert point.bpb_window == pytest.approx(sum(windows) / len(windows), rel=1e-5)
    assert point.bpb_all == pytest.approx(ref_all, rel=1e-5)
    assert point.n_scored == 5 * 4
    if length == 8:
        assert point.bpb_beyond is None
    else:
        assert point.bpb_beyond == pytest.approx(ref_beyond, rel=1e-5)
    # the loss-by-position curve: every early position alone, bins widening after; their
    # size-weighted mean is the all-position value
    xs = [x for x, _ in point.curve]
    assert len(xs) <= 65 and xs == sorted(xs) and xs[:4] == [0.0, 1.0, 2.0, 3.0] and xs[-1] < length
    per_position = reference_positions(model, es, length)
    for x, y in point.curve[:4]:
        assert y == pytest.approx(per_position[int(x)], rel=1e-5)
    assert point.bpb_all == pytest.approx(sum(per_position) / length, rel=1e-5)


def reference_positions(model: nn.Module, es, length: int) -> list[float]:
    """Mean bits at each position of the window over all windows, in float64."""
    sums = [0.0] * length
    with torch.no_grad():
        for a in es.anchors.tolist():
            window = es.tokens[a - length : a + 1].long()
            logp = torch.log_softmax(model(window[None, :-1]).logits[0].double(), dim=-1)
            for i in range(length):
                sums[i] -= logp[i, window[i + 1]].item() / math.log(2)
    return [x / es.anchors.numel() for x in sums]


class Bigram(nn.Module):
    """Logits depend on the current token only: no use of context or position."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(256, 256, generator=torch.Generator().manual_seed(1)))

    def forward(self, ids):  # [b, s] -> logits [b, s, V], as a posenc LM returns them
        return LMOutput(self.table[ids])


def test_paired_delta_is_zero_for_a_model_blind_to_context():
    model, es = Bigram(), _evalset()
    points = [evaluate_lm(model, es, e, train_len=8, score_len=8) for e in (8, 16, 64)]
    paired_deltas(points, 8)
    assert points[0].delta is None  # the reference length
    for p in points[1:]:
        assert p.window_bits == points[0].window_bits  # the very same bytes, the same losses
        assert p.delta == {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 5, "over": "windows", "p_value": 1.0}


def test_evaluation_records_no_gradients():
    """Scoring runs without autograd (no graph kept for thousands of windows), whatever the caller's mode."""
    seen = []

    class Watching(Bigram):
        def forward(self, ids):
            seen.append(torch.is_grad_enabled())
            return super().forward(ids)

    with torch.enable_grad():
        point = evaluate_lm(Watching(), _evalset(), 8, train_len=8, score_len=8)
    assert seen and not any(seen) and isinstance(point.bpb_window, float)


def test_paired_delta_pairs_each_window_with_itself():
    model, es = tiny_lm("rope"), _evalset()
    points = [evaluate_lm(model, es, e, train_len=8, score_len=4) for e in (8, 32)]
    paired_deltas(points, 8, seed=1)
    short, _, _ = reference(model, es, 8, 8, 4)
    long, _, _ = reference(model, es, 32, 8, 4)
    diffs = [b - a for a, b in zip(short, long)]
    delta = points[1].delta
    assert delta["mean"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-5)
    assert delta["low"] <= delta["mean"] <= delta["high"] and delta["n"] == 5
    assert delta["low"] >= min(diffs) - 1e-6 and delta["high"] <= max(diffs) + 1e-6


def test_evaluation_errors():
    model, es = tiny_lm(), _evalset()
    with pytest.raises(ValueError, match=r"score_len=9 must be in \[1, length=8\]"):
        evaluate_lm(model, es, 8, train_len=8, score_len=9)
    with pytest.raises(ValueError, match="paired deltas need the evaluation at the training length L=8"):
        paired_deltas([EvalPoint(16, 2.0, window_bits=[2.0])], 8)


def test_eval_batch_shrinks_when_memory_is_short(monkeypatch):
    import posenc.lab.evaluate as ev

    config = tiny_lm().config
    assert _eval_batch(config, 64, 16, 4096, torch.device("cpu")) == 16
    monkeypatch.setattr(ev, "available_memory", lambda device: 4 * 2**20)  # 4 MiB free
    assert _eval_batch(config, 64, 16, 4096, torch.device("cpu")) < 16


# ---------------------------------------------------------------------------------------------- tasks
class CopyOracle(nn.Module):
    """Predicts the copy task perfectly from the question it is given (one-hot logits)."""

    def __init__(self, wrong_at: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.wrong_at = wrong_at

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [b, 2n + 2] = BOS q SEP a
        s = ids.shape[1]
        n = (s - 2) // 2
        nxt = torch.zeros_like(ids)
        # position t predicts token t + 1: SEP (token n + 1), the answer (tokens n + 2 .. 2n + 1), EOS
        nxt[:, n] = SEP
        nxt[:, n + 1 : 2 * n + 1] = ids[:, 1 : n + 1]
        nxt[:, 2 * n + 1] = EOS
        if self.wrong_at is not None:
            nxt[:, n + 1 + self.wrong_at] = (nxt[:, n + 1 + self.wrong_at] + 1) % len(TASK_VOCAB)
        return LMOutput(nn.functional.one_hot(nxt, len(TASK_VOCAB)).float() + 0 * self.weight)


def test_evaluate_task_aligns_predictions_with_answers():
    assert evaluate_task(CopyOracle(), "copy", 6, 20, seed=0).accuracy == 1.0
    wrong = evaluate_task(CopyOracle(wrong_at=3), "copy", 6, 20, seed=0)
    assert wrong.accuracy == 0.0 and wrong.token_accuracy == pytest.approx(6 / 7)  # 6 digits + EOS, one wrong
    assert evaluate_task(CopyOracle(), "copy", 6, 20, seed=0).token_accuracy == 1.0


class StopsAtTrained(CopyOracle):
    """Copies the question but predicts ``[EOS]`` after ``stop`` answer digits (what a small model
    trained on ``stop``-digit questions does one digit past them); positions given are recorded."""

    def __init__(self, stop: int) -> None:
        super().__init__()
        self.stop, self.seen_positions = stop, []

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        self.seen_positions.append(positions)
        logits = super().forward(ids).logits  # [b, s, V]
        n = (ids.shape[1] - 2) // 2
        if n > self.stop:  # position n + stop predicts answer digit `stop`: the end token instead
            logits[:, n + 1 + self.stop] = nn.functional.one_hot(torch.tensor(EOS), len(TASK_VOCAB)).float()
        return LMOutput(logits)


def test_task_scores_digits_apart_from_the_end_token():
    """A model that ends after the 8 digits it trained on: exact match 0 at 9 digits, but 8 of 9
    digits right, every example ended early, exactly at the trained length; Wilson intervals."""
    at_l = evaluate_task(StopsAtTrained(8), "copy", 8, 50, seed=0, train_len=8)
    assert at_l.accuracy == 1.0 and at_l.early_end == 0.0 and at_l.stopped_at_L == 0.0
    past = evaluate_task(StopsAtTrained(8), "copy", 9, 50, seed=0, train_len=8)
    assert past.accuracy == 0.0 and past.digit_accuracy == pytest.approx(8 / 9)
    assert past.early_end == 1.0 and past.stopped_at_L == 1.0
    w = past.wilson
    assert w["accuracy"]["low"] == 0.0 and 0.05 < w["accuracy"]["high"] < 0.09  # Wilson at 0/50: [0, 0.071]
    assert w["digit_accuracy"]["n"] == 450 and w["early_end"]["over"] == "examples (Wilson)"
    # ending early elsewhere is not "stopped at L"
    other = evaluate_task(StopsAtTrained(5), "copy", 9, 50, seed=0, train_len=8)
    assert (
        other.early_end == 1.0 and other.stopped_at_L == 0.0 and other.digit_accuracy == pytest.approx(8 / 9)
    )


def test_task_positions_are_passed_to_the_model():
    model = StopsAtTrained(8)
    evaluate_task(model, "copy", 4, 10, seed=0, positions=lambda b, s: torch.arange(s).expand(b, s) * 3)
    assert model.seen_positions[0].shape == (10, 10) and int(model.seen_positions[0][0, 1]) == 3


def test_a_float64_model_is_scored_in_float64():
    model, es = Bigram().double(), _evalset()
    with torch.no_grad():
        model.table.mul_(1e-3).add_(1e6)  # logits near 1e6: float32 would round their differences away
    point = evaluate_lm(model, es, 16, train_len=8, score_len=4)
    windows, _, _ = reference(model, es, 16, 8, 4)
    assert point.window_bits == pytest.approx(windows, rel=1e-12)


class WrongOnOddDigitSums(CopyOracle):
    """Copies the question, but gets the first answer digit wrong where the question's digits sum
    to an odd number: a per-question pattern the record must keep in order."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = super().forward(ids).logits  # [b, s, V]
        n = (ids.shape[1] - 2) // 2
        odd = ids[:, 1 : n + 1].sum(-1) % 2 == 1  # [b] by the question's token ids
        first = logits[:, n + 1].argmax(-1)  # [b] the first answer digit's prediction
        bad = nn.functional.one_hot((first + 1) % len(TASK_VOCAB), len(TASK_VOCAB)).float()
        logits[:, n + 1] = torch.where(odd[:, None], bad, logits[:, n + 1])
        return LMOutput(logits)


def test_task_records_each_question_right_or_wrong_in_order():
    """``example_correct`` holds one 0/1 per question, in the questions' order across batches of
    64, and its mean is the exact match."""
    from posenc.text.tasks import generate_task

    point = evaluate_task(WrongOnOddDigitSums(), "copy", 6, 150, seed=3)
    ex = generate_task("copy", 150, 6, seed=3)
    q = ex.tokens[:, 1:7]  # [150, 6] the question digits
    want = (q.sum(-1) % 2 == 0).int().tolist()
    assert point.example_correct == want
    assert 0 < sum(want) < 150 and point.accuracy == pytest.approx(sum(want) / 150)
