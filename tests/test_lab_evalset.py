"""Tests of posenc.lab.evalset: windows spread over every document, fixed by the split seed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from _lab_toys import write_corpus
from posenc.lab.evalset import sample_eval_set
from posenc.text import load_corpus


def _docs(n_docs: int, size: int):
    starts = [i * size for i in range(n_docs)]
    return [f"doc{i}" for i in range(n_docs)], starts


def test_windows_cover_many_documents(tmp_path):
    """A prefix of the validation bytes lies in one or two files; stratified anchors reach most."""
    corpus = load_corpus(write_corpus(tmp_path, n_docs=40, size=3000), val_fraction=0.5, seed=0)
    val = corpus.val_bytes
    es = sample_eval_set(
        val, 16, 256, seed=0, doc_names=[d.name for d in corpus.val], doc_starts=corpus.val_starts
    )
    record = es.record()
    assert record["windows"] == 16 and len(corpus.val) == 20
    assert record["n_documents"] >= 12 and record["largest_document_share"] <= 2 / 16
    # every anchor's document is the one whose text holds that byte
    for a, name in zip(es.anchors.tolist(), es.documents):
        doc = next(d for d in corpus.val if d.name == name)
        start = corpus.val_starts[[d.name for d in corpus.val].index(name)]
        assert start <= a < start + len(doc.text.encode()) + 1


@given(st.integers(300, 5000), st.integers(1, 40), st.integers(1, 256), st.integers(0, 10))
def test_anchors_are_stratified_and_fit_every_window(n, k, max_len, seed):
    assume(n - max_len >= k)
    tokens = torch.arange(n) % 251
    es = sample_eval_set(tokens, k, max_len, seed)
    a = es.anchors
    assert a.numel() == k and bool((a >= max_len).all()) and bool((a <= n - 1).all())
    assert torch.equal(a, a.sort().values) and a.unique().numel() == k  # one per stratum
    edges = torch.linspace(0, n - max_len, k + 1, dtype=torch.float64).floor().long() + max_len
    assert bool(((a >= edges[:-1]) & (a < edges[1:].clamp_min(edges[:-1] + 1))).all())


def test_same_targets_at_every_length_and_seed_fixes_the_set():
    tokens = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    es = sample_eval_set(tokens, 8, 512, seed=3)
    short, long = es.windows(64), es.windows(512)  # [8, 65], [8, 513]
    assert short.shape == (8, 65) and long.shape == (8, 513)
    assert torch.equal(short[:, -33:], long[:, -33:])  # the last targets are the same bytes
    assert torch.equal(long[:, -1], tokens[es.anchors].long())
    assert torch.equal(sample_eval_set(tokens, 8, 512, seed=3).anchors, es.anchors)
    assert not torch.equal(sample_eval_set(tokens, 8, 512, seed=4).anchors, es.anchors)


def test_errors():
    tokens = torch.zeros(100, dtype=torch.uint8)
    with pytest.raises(ValueError, match="too few for 8 windows of up to 96 tokens"):
        sample_eval_set(tokens, 8, 96, seed=0)
    es = sample_eval_set(tokens, 4, 32, seed=0)
    with pytest.raises(ValueError, match="length 64 is longer than the evaluation set allows"):
        es.windows(64)
    with pytest.raises(TypeError, match="n_windows must be an int"):
        sample_eval_set(tokens, 2.0, 32, seed=0)
