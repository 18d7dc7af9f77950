"""Tests of posenc.lab.evalset: windows spread over every document, fixed by the split seed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from _lab_toys import write_corpus
from posenc.lab.evalset import SHINGLE, TrainingShingles, sample_eval_set, shingle_hashes
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


# ----------------------------------------------------------------------------------------------
# Near-duplicates of the training bytes, the document cap, the record
# ----------------------------------------------------------------------------------------------
def _random_bytes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).to(torch.uint8)


def test_shingle_hashes_match_a_plain_reference():
    x = _random_bytes(300, 0)
    for n in (1, 2, 3, 5, 32):
        ref = []
        for i in range(300 - n + 1):
            h = 0
            for j in range(n):
                h = (h * 0x100000001B3 + int(x[i + j]) + 1) % 2**64
            ref.append(h)
        assert shingle_hashes(x, n).tolist() == ref
    assert shingle_hashes(x[:10], 32).size == 0


def test_windows_copied_from_training_are_dropped_and_counted():
    """Half the validation text repeats training bytes: no window whose scored targets lie there
    survives, and the record counts what was found."""
    train = _random_bytes(20_000, 1)
    fresh = _random_bytes(20_000, 2)
    val = torch.cat([train[5_000:15_000], fresh[:10_000]])  # [20000]: copied half, then new bytes
    es = sample_eval_set(val, 32, 64, seed=0, train_tokens=train, score_len=16)
    assert bool((es.anchors >= 10_000 + SHINGLE).all())  # every window scores new bytes
    share = TrainingShingles(train).share(val, es.anchors, 16)
    assert float(share.max()) == 0.0
    dup = es.record()["near_duplicates"]
    assert dup["candidates"] == 128 and dup["kept"] == 0
    assert 55 <= dup["found"] <= 70 and dup["found"] == dup["dropped"]  # about half the candidates
    # without the training bytes the copied half is sampled too
    assert bool((sample_eval_set(val, 32, 64, seed=0).anchors < 10_000).any())


def test_a_small_corpus_keeps_its_least_copied_windows_and_says_so():
    train = _random_bytes(5_000, 3)
    val = torch.cat([train[:3_000], _random_bytes(40, 4)])  # only the last 40 bytes are new
    es = sample_eval_set(val, 8, 64, seed=0, train_tokens=train, score_len=8)
    dup = es.record()["near_duplicates"]
    assert es.anchors.numel() == 8 and dup["kept"] >= 1 and dup["found"] > dup["dropped"]


def test_no_document_holds_more_than_its_share():
    """One document of 60% of the bytes: stratified sampling alone gives it ~60% of the windows;
    the cap keeps it to 3% of 100 windows (3)."""
    sizes = [60_000] + [1_000] * 40  # one large file, 40 small ones
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    names = [f"doc{i}" for i in range(len(sizes))]
    tokens = _random_bytes(sum(sizes), 5)
    es = sample_eval_set(tokens, 100, 64, seed=0, doc_names=names, doc_starts=starts)
    record = es.record()
    assert record["windows"] == 100 and record["document_cap"] == 3
    assert record["largest_document_share"] <= 0.03 and record["n_documents"] == 41
    assert "resamples of the documents" in record["intervals"]
    # window_documents: one index per window, equal for windows of the same document
    wd = record["window_documents"]
    assert len(wd) == 100 and all(
        (a == b) == (x == y) for a, x in zip(wd, es.documents) for b, y in zip(wd, es.documents)
    )
    # too few documents for the share: the cap rises only as far as needed
    few = sample_eval_set(tokens[:62_000], 100, 64, seed=0, doc_names=names[:3], doc_starts=starts[:3])
    counts = sorted(few.record()["documents"].values())
    assert sum(counts) == 100 and few.record()["document_cap"] == counts[-1] and counts[-1] < 100


def test_hostile_arguments():
    tokens = _random_bytes(2_000, 6)
    with pytest.raises(ValueError, match="max_document_share=0 must be in \\(0, 1\\]"):
        sample_eval_set(tokens, 4, 32, seed=0, doc_names=["a"], doc_starts=[0], max_document_share=0)
    with pytest.raises(ValueError, match="score_len is needed"):
        sample_eval_set(tokens, 4, 32, seed=0, train_tokens=tokens)
    with pytest.raises(ValueError, match="doc_names \\(2\\) and doc_starts \\(1\\) differ"):
        sample_eval_set(tokens, 4, 32, seed=0, doc_names=["a", "b"], doc_starts=[0])
