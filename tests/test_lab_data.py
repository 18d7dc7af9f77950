"""Tests of posenc.lab.data: what the cells of a study read (task batches and their curriculum)."""

from __future__ import annotations

import torch

from posenc.lab.data import curriculum_len, task_batch_fn
from posenc.text.tasks import EOS, SEP


def test_task_batches_score_answers_only():
    batch = task_batch_fn("reverse", 8, 5, seed=0)
    ids, targets = batch(3, 0, 1)
    again = batch(3, 0, 1)
    assert torch.equal(ids, again[0]) and torch.equal(targets, again[1])  # pure in the step
    assert ids.shape == targets.shape and ids.shape[0] == 8
    for row_ids, row_targets in zip(ids, targets):
        sep = int((row_ids == SEP).nonzero()[0])
        question = row_ids[1:sep].tolist()  # BOS q1..qn SEP ...
        assert 1 <= len(question) <= 5
        scored = row_targets[row_targets != -100].tolist()
        assert scored == [*question[::-1], EOS]  # exactly the answer and EOS count
    top, bottom = batch(3, 0, 2), batch(3, 1, 2)
    assert torch.equal(torch.cat((top[0], bottom[0])), ids)  # ranks partition the global batch


def test_curriculum_grows_the_questions_from_one_digit_to_max_len():
    assert [curriculum_len(t, 9, 100) for t in (0, 12, 13, 50, 99, 100, 5000)] == [1, 1, 2, 5, 8, 9, 9]
    assert curriculum_len(0, 9, 0) == 9  # no curriculum: every length from the start
    batch = task_batch_fn("copy", 64, 9, seed=0, curriculum_steps=100)
    longest = [int(((batch(t, 0, 1)[1] != -100).sum(-1) - 1).max()) for t in (0, 50, 100)]
    assert longest == [1, 5, 9]  # answer tokens (without EOS) = question length
    plain = task_batch_fn("copy", 64, 9, seed=0)
    assert torch.equal(batch(100, 0, 1)[0], plain(100, 0, 1)[0])  # after it: the same batches


def test_the_study_data_reads_the_studys_corpus_and_split(tmp_path):
    """Every corpus field reaches the data the cells read (a study's --val-fraction was once
    dropped on the way: its cells split the corpus at the default 0.1)."""
    from _lab_toys import tiny_study, write_corpus
    from posenc.lab.data import study_data

    corpus = write_corpus(tmp_path, n_docs=20, size=2000)
    plain = study_data(tiny_study(corpus))
    assert plain.record["corpus"]["source"] == str(corpus) and plain.record["corpus"]["n_val"] == 2
    wider = study_data(tiny_study(corpus, val_fraction=0.25))
    assert wider.record["corpus"]["n_val"] == 5
    assert wider.train_bytes.numel() < plain.train_bytes.numel()
