"""Tests of posenc.text.tasks: copy, reverse, addition, sort, parity; determinism, masks, exact match."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.text.tasks import TASK_VOCAB, TASKS, exact_match, generate_task

ID = {t: i for i, t in enumerate(TASK_VOCAB)}


def _parts(batch, i):
    """(question, answer) strings of example i, parsed back from the tokens."""
    words = batch.decode(i).split()
    sep = words.index("[SEP]")
    assert words[0] == "[BOS]" and words[-1] == "[EOS]"
    return words[1:sep], words[sep + 1 : -1]


@settings(deadline=None, max_examples=30)
@given(task=st.sampled_from(sorted(TASKS)), n=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_answers_are_right(task, n, seed):
    batch = generate_task(task, 4, n, seed=seed)
    for i in range(4):
        q, a = _parts(batch, i)
        if task == "copy":
            assert a == q and len(q) == n
        elif task == "reverse":
            assert a == q[::-1] and len(q) == n
        elif task == "sort":
            assert a == sorted(q) and len(q) == n and set(q) <= set("0123456789")
        elif task == "parity":
            assert len(q) == n and set(q) <= {"0", "1"} and a == [str(q.count("1") % 2)]
        else:
            plus = q.index("+")
            x, y = int("".join(q[:plus])), int("".join(q[plus + 1 :]))
            answer = a[::-1] if task == "addition_reversed" else a  # least-significant digit first
            assert plus == n and len(a) == n + 1 and int("".join(answer)) == x + y
        # the mask covers exactly the answer and [EOS]
        mask = batch.answer_mask[i]
        assert int(mask.sum()) == len(a) + 1
        assert batch.tokens[i][mask].tolist() == [ID[t] for t in a] + [ID["[EOS]"]]


def test_deterministic_for_a_seed():
    a = generate_task("reverse", 8, 5, seed=1)
    b = generate_task("reverse", 8, 5, seed=1)
    c = generate_task("reverse", 8, 5, seed=2)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)


def test_length_range_pads():
    batch = generate_task("copy", 50, (2, 9), seed=0)
    assert batch.lengths.min() >= 2 and batch.lengths.max() <= 9 and len(set(batch.lengths.tolist())) > 1
    assert batch.tokens.shape == (50, 2 * 9 + 3)
    pad = batch.tokens == ID["[PAD]"]
    assert not (pad & batch.answer_mask).any()
    # each row: 2n + 3 real tokens, then padding
    assert torch.equal((~pad).sum(-1), 2 * batch.lengths + 3)


def test_sort_and_parity_examples():
    batch = generate_task("sort", 200, 6, seed=3)
    answers = {" ".join(_parts(batch, i)[1]) for i in range(200)}
    assert len(answers) > 100  # not one fixed answer
    parity = generate_task("parity", 400, 5, seed=3)
    bits = [_parts(parity, i)[1][0] for i in range(400)]
    assert 150 < bits.count("1") < 250  # both answers, about equally often
    assert parity.tokens.shape == (400, 5 + 4)  # [BOS] 5 bits [SEP] bit [EOS]


def test_reverse_answer_addition():
    fwd = generate_task("addition", 5, 3, seed=4)
    rev = generate_task("addition", 5, 3, seed=4, reverse_answer=True)
    for i in range(5):
        assert _parts(rev, i)[1] == _parts(fwd, i)[1][::-1]


def test_exact_match():
    batch = generate_task("copy", 3, 4, seed=0)
    pred = batch.tokens.clone()
    assert exact_match(pred, batch.tokens, batch.answer_mask).tolist() == [True, True, True]
    pred[0, 1] = ID["7"] if pred[0, 1] != ID["7"] else ID["8"]  # a question token: does not count
    answer_pos = batch.answer_mask[1].nonzero()[0, 0]
    pred[1, answer_pos] = ID["[PAD]"]  # an answer token: example 1 now wrong
    assert exact_match(pred, batch.tokens, batch.answer_mask).tolist() == [True, False, True]


def test_errors():
    valid = "copy, reverse, addition, addition_reversed, sort, parity"
    with pytest.raises(ValueError, match=f"unknown task 'scan'; valid tasks: {valid}"):
        generate_task("scan", 1, 3)
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        generate_task("copy", 1, 0)
    with pytest.raises(ValueError, match=r"length range \(5, 2\) is empty"):
        generate_task("copy", 1, (5, 2))
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['reverse_answer'\] for task 'copy'"):
        generate_task("copy", 1, 3, reverse_answer=True)
    with pytest.raises(TypeError, match="n_examples must be an int"):
        generate_task("copy", 1.5, 3)
    b = generate_task("copy", 2, 3)
    with pytest.raises(ValueError, match="must have the same shape"):
        exact_match(b.tokens[:1], b.tokens, b.answer_mask)
    with pytest.raises(TypeError, match="answer_mask must be a bool tensor"):
        exact_match(b.tokens, b.tokens, b.answer_mask.long())


def test_score_answers_separates_digits_from_the_end_token():
    """Teacher-forced predictions of two copy answers: one right, one ending after 2 of 3 digits."""
    from posenc.text.tasks import EOS, score_answers

    ex = generate_task("copy", 2, 3, seed=0)
    tokens, mask = ex.tokens[:, 1:], ex.answer_mask[:, 1:]  # targets [2, s - 1]
    pred = tokens.clone()
    third = mask[1].nonzero()[2].item()  # example 1's third answer digit
    pred[1, third] = EOS
    sc = score_answers(pred, tokens, mask)
    assert sc.exact.tolist() == [True, False] and sc.digits.tolist() == [3, 3]
    assert sc.digits_right.tolist() == [3, 2] and sc.early_end.tolist() == [-1, 2]
