"""Tests of posenc.text.corpus: the stdlib corpus, file corpora, the document split, byte views."""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.text.corpus import (
    CORPORA,
    DOC_SEPARATOR,
    SPLIT_GAP_CHARS,
    STDLIB_SKIP_DIRS,
    Document,
    file_documents,
    load_corpus,
    split_documents,
    stdlib_docstrings,
    stdlib_documents,
)

SMALL = 300_000  # characters of stdlib read by most tests (a fixed sorted-order subset, fast)


@pytest.fixture(scope="module")
def stdlib_small():
    return load_corpus("stdlib", max_chars=SMALL, seed=0)


def test_stdlib_reads_the_running_interpreter(stdlib_small):
    c = stdlib_small
    root = Path(sysconfig.get_paths()["stdlib"])
    assert c.info.source == str(root) and c.info.name == "stdlib"
    assert c.info.python_version == ".".join(map(str, sys.version_info[:3]))
    names = [d.name for d in c.documents]
    assert all(n.endswith(".py") for n in names)
    assert not any(STDLIB_SKIP_DIRS.intersection(Path(n).parts[:-1]) for n in names)
    # documents are the files' own text, read straight from disk
    first = min(c.documents, key=lambda d: d.name)
    assert first.text == (root / first.name).read_text(encoding="utf-8")
    assert c.info.n_chars >= SMALL and c.info.n_documents == c.info.n_train + c.info.n_val


def test_stdlib_hash_is_an_independent_sha256(stdlib_small):
    docs, _ = stdlib_documents(max_chars=SMALL)
    h = hashlib.sha256()
    for d in docs:  # the documented recipe, written out again
        for part in (d.name.encode(), d.text.encode()):
            h.update(len(part).to_bytes(8, "little") + part)
    assert stdlib_small.info.sha256 == h.hexdigest()
    # the hash does not depend on the split...
    assert load_corpus("stdlib", max_chars=SMALL, seed=7, val_fraction=0.3).info.sha256 == h.hexdigest()
    # ...but does on the content
    assert load_corpus("stdlib", max_chars=1000, val_fraction=0.0).info.sha256 != h.hexdigest()


def test_split_is_deterministic_and_disjoint(stdlib_small):
    again = load_corpus("stdlib", max_chars=SMALL, seed=0)
    assert [d.name for d in again.val] == [d.name for d in stdlib_small.val]
    other = load_corpus("stdlib", max_chars=SMALL, seed=1)
    assert [d.name for d in other.val] != [d.name for d in stdlib_small.val]
    train, val = {d.name for d in stdlib_small.train}, {d.name for d in stdlib_small.val}
    assert not train & val
    assert len(train) + len(val) == stdlib_small.info.n_documents


@settings(deadline=None, max_examples=50)
@given(n=st.integers(2, 60), frac=st.floats(0.01, 0.9), seed=st.integers(0, 2**31))
def test_split_properties(n, frac, seed):
    docs = [Document(f"d{i}", f"text {i}") for i in range(n)]
    n_val = max(1, round(n * frac))
    if n_val >= n:
        with pytest.raises(ValueError, match="cannot split"):
            split_documents(docs, frac, seed)
        return
    train, val = split_documents(docs, frac, seed)
    assert len(val) == n_val and len(train) == n - n_val
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(docs)
    # each part keeps the input order
    assert [docs.index(d) for d in train] == sorted(docs.index(d) for d in train)
    assert split_documents(docs, frac, seed) == (train, val)


def test_byte_views(stdlib_small):
    c = stdlib_small
    for part, docs in ((c.train_bytes, c.train), (c.val_bytes, c.val)):
        assert part.dtype == torch.uint8 and part.dim() == 1
        expected = DOC_SEPARATOR.join(d.text for d in docs).encode("utf-8")
        assert bytes(part.numpy().tobytes()) == expected
    assert c.train_bytes is c.train_bytes  # computed once


def test_split_zero_and_errors():
    docs = [Document("a", "x"), Document("b", "y")]
    train, val = split_documents(docs, 0.0, 0)
    assert train == tuple(docs) and val == ()
    with pytest.raises(ValueError, match=r"cannot split the single document 'a' \(1 chars\) by position"):
        split_documents(docs[:1], 0.1, 0)
    with pytest.raises(ValueError, match=r"val_fraction must be in \[0, 1\), got 1.5"):
        split_documents(docs, 1.5, 0)
    with pytest.raises(TypeError, match="seed must be an int"):
        split_documents(docs, 0.5, "0")


def test_file_corpus(tmp_path):
    (tmp_path / "a.txt").write_text("The cat sat on the mat.\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("Ünïcödé text\n", encoding="utf-8")
    (tmp_path / "sub" / "c.txt").write_bytes("caf\xe9 in Latin-1\n".encode("latin-1"))
    (tmp_path / "blob.bin").write_bytes(b"\x89PNG\x00\x00\x01\x02")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.txt").write_text("secret")
    with pytest.warns(UserWarning) as record:
        c = load_corpus(tmp_path, val_fraction=0.0)
    messages = " ".join(str(w.message) for w in record)
    assert "skipping binary file" in messages and "blob.bin" in messages
    assert "not valid UTF-8; read as Latin-1" in messages
    assert [d.name for d in c.documents] == ["a.txt", "sub/b.md", "sub/c.txt"]
    assert c.documents[2].text == "café in Latin-1\n"
    assert c.info.skipped == (str(tmp_path / "blob.bin"),)
    # a single file, a list of paths, and an extension filter
    assert load_corpus(str(tmp_path / "a.txt"), val_fraction=0.0).texts == ["The cat sat on the mat.\n"]
    docs, _ = file_documents([tmp_path / "a.txt", tmp_path / "sub"], extensions=[".md"])
    assert [d.name for d in docs] == ["b.md"]


def test_corpus_errors(tmp_path):
    with pytest.raises(
        ValueError, match=r"unknown corpus 'wikitext': not a corpus name \(stdlib, stdlib-docs\)"
    ):
        load_corpus("wikitext")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "only.bin").write_bytes(b"\x00\x01")
    with (
        pytest.warns(UserWarning, match="skipping binary file"),
        pytest.raises(ValueError, match=r"no text documents found in '.*empty' \(1 binary files skipped\)"),
    ):
        load_corpus(empty)
    with pytest.raises(ValueError, match="does not exist"):
        file_documents(tmp_path / "missing")
    with pytest.raises(ValueError, match="extensions applies to file corpora"):
        load_corpus("stdlib", extensions=[".py"])
    with pytest.raises(ValueError, match="max_chars must be a positive int or None, got 0"):
        load_corpus("stdlib", max_chars=0)
    assert "stdlib" in CORPORA


@pytest.mark.slow
def test_full_stdlib_loads():
    c = load_corpus("stdlib")
    assert c.info.n_documents > 100 and c.train_bytes.numel() > 1_000_000 and c.val_bytes.numel() > 0
    assert c.train_bytes.numel() + c.val_bytes.numel() >= c.info.n_chars  # UTF-8 is >= 1 byte per char


def test_a_single_document_is_split_by_position_with_a_gap():
    text = "".join(f"line {i:05d}\n" for i in range(3000))  # 33,000 chars
    train, val = split_documents([Document("big.txt", text)], 0.1, 0)
    (tr,), (va,) = train, val
    assert va.text == text[-3300:] and tr.text == text[: 33000 - 3300 - SPLIT_GAP_CHARS]
    assert text.index(va.text) - len(tr.text) == SPLIT_GAP_CHARS  # nothing shared, a gap between
    assert tr.name == "big.txt[:28676]" and va.name == "big.txt[29700:]"
    small = split_documents([Document("s", "x" * 100)], 0.2, 0)
    assert len(small[0][0].text) == 100 - 20 - 5  # the gap is at most 5% of a short text


def test_stdlib_docs_is_the_english_of_the_stdlibs_docstrings():
    docs, root = stdlib_docstrings(max_chars=50_000)
    assert root == sysconfig.get_paths()["stdlib"] and sum(len(d.text) for d in docs) >= 50_000
    source = {d.name: d.text for d in stdlib_documents(max_chars=2_000_000)[0]}
    for doc in docs:  # every docstring corpus document is made of its file's triple-quoted strings
        assert doc.name in source and doc.text.split("\n\n")[0] in source[doc.name]
    assert load_corpus("stdlib-docs", max_chars=50_000, val_fraction=0.0).info.name == "stdlib-docs"
