"""Synthetic length-generalization tasks (Kazemnejad et al. 2023): copy, reverse, addition,
sorting and parity.

Every example is one token sequence for a decoder-only model::

    [BOS] question [SEP] answer [EOS] [PAD]...

with a boolean ``answer_mask`` marking the answer tokens and ``[EOS]`` (what a model must
generate). Train on short lengths, test on longer ones: exact-match accuracy
(:func:`exact_match`) is the share of examples whose every answer token is right.

=============  ===========================  ==========================================
task           question (length n)          answer
=============  ===========================  ==========================================
``copy``       n random digits              the same digits
``reverse``    n random digits              the digits in reverse order
``addition``   a ``+`` b, n digits each     a + b, n + 1 digits (leading zero kept),
                                            most significant first (``reverse_answer``
                                            writes it least significant first)
``sort``       n random digits              the same digits in ascending order
``parity``     n random bits (``0``/``1``)  one token: ``1`` if the question holds an odd
                                            number of ``1`` s, else ``0``
=============  ===========================  ==========================================

Shapes: ``tokens`` and ``answer_mask`` are ``[n_examples, s]`` (int64 / bool); ``s`` is the
longest example's length, shorter ones are padded with ``[PAD]`` (mask False).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validate import check_int

__all__ = [
    "TASKS",
    "TASK_VOCAB",
    "AnswerScores",
    "TaskBatch",
    "exact_match",
    "generate_task",
    "score_answers",
    "task_seq_len",
]

#: The shared vocabulary of every task: 4 special tokens, the digits, and "+".
TASK_VOCAB: tuple[str, ...] = ("[PAD]", "[BOS]", "[SEP]", "[EOS]", *"0123456789", "+")
_ID = {t: i for i, t in enumerate(TASK_VOCAB)}
PAD, BOS, SEP, EOS, PLUS = _ID["[PAD]"], _ID["[BOS]"], _ID["[SEP]"], _ID["[EOS]"], _ID["+"]


def _digits(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10) for _ in range(n)]


def _copy(rng: random.Random, n: int, **_: object) -> tuple[list[str], list[str]]:
    q = [str(x) for x in _digits(rng, n)]
    return q, list(q)


def _reverse(rng: random.Random, n: int, **_: object) -> tuple[list[str], list[str]]:
    q = [str(x) for x in _digits(rng, n)]
    return q, q[::-1]


def _addition(
    rng: random.Random, n: int, reverse_answer: bool = False, **_: object
) -> tuple[list[str], list[str]]:
    a, b = _digits(rng, n), _digits(rng, n)
    total = int("".join(map(str, a))) + int("".join(map(str, b)))
    answer = list(str(total).zfill(n + 1))
    if reverse_answer:
        answer = answer[::-1]
    return [*map(str, a), "+", *map(str, b)], answer


def _addition_reversed(rng: random.Random, n: int, **_: object) -> tuple[list[str], list[str]]:
    """Addition with the answer written least-significant digit first: each answer digit then
    depends on digits already read and one carry, the order a left-to-right model can compute."""
    return _addition(rng, n, reverse_answer=True)


def _sort(rng: random.Random, n: int, **_: object) -> tuple[list[str], list[str]]:
    q = [str(x) for x in _digits(rng, n)]
    return q, sorted(q)


def _parity(rng: random.Random, n: int, **_: object) -> tuple[list[str], list[str]]:
    bits = [rng.randrange(2) for _ in range(n)]
    return [str(b) for b in bits], [str(sum(bits) % 2)]


#: task name -> ``(rng, n, **options) -> (question tokens, answer tokens)``.
TASKS: dict[str, Callable[..., tuple[list[str], list[str]]]] = {
    "copy": _copy,
    "reverse": _reverse,
    "addition": _addition,
    "addition_reversed": _addition_reversed,
    "sort": _sort,
    "parity": _parity,
}


@dataclass(frozen=True)
class TaskBatch:
    """Examples of one task. ``tokens``/``answer_mask`` ``[n, s]``; ``lengths`` ``[n]`` (the
    question length ``n`` of each example); ``vocab`` maps ids to strings."""

    task: str
    tokens: torch.Tensor
    answer_mask: torch.Tensor
    lengths: torch.Tensor
    vocab: tuple[str, ...] = TASK_VOCAB

    def decode(self, index: int) -> str:
        """Example ``index`` as text, padding dropped: ``"[BOS] 1 2 [SEP] 1 2 [EOS]"``."""
        return " ".join(self.vocab[i] for i in self.tokens[index].tolist() if i != PAD)


def generate_task(
    name: str,
    n_examples: int,
    length: int | tuple[int, int],
    *,
    seed: int = 0,
    **options: object,
) -> TaskBatch:
    """Generate ``n_examples`` of task ``name`` deterministically for ``seed``.

    Args:
        name: a key of :data:`TASKS`.
        n_examples: how many examples.
        length: the question length ``n`` (digits; per operand for addition), or an inclusive
            range ``(lo, hi)`` drawn uniformly per example.
        seed: same seed, same examples (a private ``random.Random``; global RNGs untouched).
        **options: task options (``reverse_answer=True`` for addition).
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    check_int(n_examples, "n_examples")
    if isinstance(length, tuple):
        if len(length) != 2:
            raise ValueError(f"length must be an int or a (lo, hi) pair, got {length!r}")
        lo, hi = (check_int(v, "length") for v in length)
        if lo > hi:
            raise ValueError(f"length range {length!r} is empty: need lo <= hi")
    else:
        lo = hi = check_int(length, "length")
    allowed = {"reverse_answer"} if name == "addition" else set()
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for task {name!r}; valid: {sorted(allowed) or 'none'}")
    rng = random.Random(seed)
    rows: list[list[int]] = []
    masks: list[list[bool]] = []
    lengths: list[int] = []
    for _ in range(n_examples):
        n = rng.randint(lo, hi)
        question, answer = TASKS[name](rng, n, **options)
        seq = [BOS, *(_ID[t] for t in question), SEP, *(_ID[t] for t in answer), EOS]
        mask = [False] * (len(question) + 2) + [True] * (len(answer) + 1)
        rows.append(seq)
        masks.append(mask)
        lengths.append(n)
    s = max(len(r) for r in rows)
    tokens = torch.full((n_examples, s), PAD, dtype=torch.long)
    answer_mask = torch.zeros(n_examples, s, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, : len(r)] = torch.tensor(r)
        answer_mask[i, : len(m)] = torch.tensor(m)
    return TaskBatch(name, tokens, answer_mask, torch.tensor(lengths))


def exact_match(predictions: torch.Tensor, tokens: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """Per example, whether every answer token is predicted right.

    Args:
        predictions: ``[n, s]`` predicted token at each position (for a next-token model, the
            argmax at position ``t - 1`` placed at ``t``).
        tokens: ``[n, s]`` the true tokens.
        answer_mask: ``[n, s]`` bool, the positions that count.

    Returns:
        ``[n]`` bool; ``.float().mean()`` is the exact-match accuracy.
    """
    if predictions.shape != tokens.shape or answer_mask.shape != tokens.shape:
        raise ValueError(
            f"predictions {tuple(predictions.shape)}, tokens {tuple(tokens.shape)} and "
            f"answer_mask {tuple(answer_mask.shape)} must have the same shape [n, s]"
        )
    if answer_mask.dtype != torch.bool:
        raise TypeError(f"answer_mask must be a bool tensor, got {answer_mask.dtype}")
    wrong = (predictions != tokens) & answer_mask  # [n, s]
    return ~wrong.any(dim=-1)


@dataclass(frozen=True)
class AnswerScores:
    """Per-example scores of teacher-forced predictions on task answers (``[n]`` each).

    Attributes:
        exact: every answer token and ``[EOS]`` right.
        digits_right / digits: answer tokens (``[EOS]`` excluded) predicted right / in the answer.
        early_end: the index (0-based, within the answer) of the first answer token where the
            model predicted ``[EOS]`` instead; ``-1`` when it never ended early.
    """

    exact: torch.Tensor
    digits_right: torch.Tensor
    digits: torch.Tensor
    early_end: torch.Tensor


def score_answers(predictions: torch.Tensor, tokens: torch.Tensor, answer_mask: torch.Tensor) -> AnswerScores:
    """Score answers digit by digit, separately from the end token.

    Args:
        predictions: ``[n, s]`` predicted token at each position (as :func:`exact_match`).
        tokens: ``[n, s]`` the true tokens.
        answer_mask: ``[n, s]`` bool, the answer tokens and ``[EOS]``.

    Returns:
        :class:`AnswerScores`: a model that stops after the answer length it trained on shows
        ``early_end`` equal to that length.
    """
    exact = exact_match(predictions, tokens, answer_mask)  # validates shapes and dtype
    digit = answer_mask & (tokens != EOS)  # [n, s] answer tokens without the end token
    right = (predictions == tokens) & digit
    ended = (predictions == EOS) & digit  # [n, s] an end predicted where a digit belongs
    index = digit.long().cumsum(dim=-1) - 1  # [n, s] position within the answer
    first = torch.where(ended, index, torch.full_like(index, tokens.shape[1])).min(dim=-1).values  # [n]
    early = torch.where(first < tokens.shape[1], first, torch.full_like(first, -1))
    return AnswerScores(exact, right.sum(dim=-1), digit.sum(dim=-1), early)


def task_seq_len(task: str, n: int) -> int:
    """Tokens in one example of ``task`` with question length ``n`` (BOS, question, SEP, answer, EOS)."""
    return int(generate_task(task, 1, n, seed=0).tokens.shape[1])
