"""Tests of posenc.vectors and TokenEmbedding.from_pretrained: pretrained vectors from a
safetensors table and from word2vec/GloVe text, aligned to a tokenizer's vocabulary."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

import posenc
from posenc.vectors import align_vectors, read_safetensors_vectors, read_word_vectors

WORDS = {"the": [0.1, 0.2, 0.3], "cat": [1.0, -1.0, 0.5], "Mat": [2.0, 0.0, -2.0], "sat": [0.0, 0.5, 0.25]}


def _write_text(path, header: bool) -> None:
    lines = [f"{len(WORDS)} 3"] if header else []
    lines += [" ".join([w, *(f"{v:g}" for v in vec)]) for w, vec in WORDS.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_token_embedding_from_pretrained_copies_and_freezes():
    weights = torch.randn(5, 3)
    emb = posenc.TokenEmbedding.from_pretrained(weights, freeze=True)
    ids = torch.tensor([[4, 0, 2]])
    torch.testing.assert_close(emb(ids), weights[ids], rtol=0, atol=0)  # scale None: as given
    assert not emb.weight.requires_grad and emb.weight.data_ptr() != weights.data_ptr()
    trainable = posenc.TokenEmbedding.from_pretrained(weights, scale="sqrt_d_model", padding_idx=0)
    assert trainable.weight.requires_grad and trainable.padding_idx == 0
    torch.testing.assert_close(trainable(ids), weights[ids] * 3**0.5)
    with pytest.raises(ValueError, match=r"weights must be a float tensor \[V, d\]"):
        posenc.TokenEmbedding.from_pretrained(torch.zeros(5, dtype=torch.long))


@pytest.mark.parametrize("header", [True, False])  # word2vec writes "count d" first, GloVe does not
def test_text_vectors_align_to_a_vocabulary_with_coverage(tmp_path, header):
    path = tmp_path / "vectors.txt"
    _write_text(path, header)
    words, vectors = read_word_vectors(path)
    assert words == list(WORDS) and vectors.shape == (4, 3)
    vocab = ["[PAD]", "the", "cat", "mat", "dog"]  # "mat" only as "Mat": found lowercased
    emb, coverage = posenc.pretrained_embedding(
        path, vocab, padding_idx=0, generator=torch.Generator().manual_seed(0)
    )
    assert (coverage.found, coverage.total, coverage.lowercased, coverage.unused) == (3, 5, 1, 1)
    assert coverage.missing == ["[PAD]", "dog"]
    assert str(coverage).startswith("found 3 of 5 tokens (60.0%, 1 lowercased); missing e.g. '[PAD]', 'dog'")
    w = emb.weight.detach()
    torch.testing.assert_close(w[1:4], torch.tensor([WORDS["the"], WORDS["cat"], WORDS["Mat"]]))
    assert torch.equal(w[0], torch.zeros(3))  # padding row
    assert w[4].abs().sum() > 0  # unknown: drawn as a fresh model's row (N(0, 1) for scale None)


def test_unknown_rows_follow_the_init_std(tmp_path):
    words, vectors = ["a"], torch.ones(1, 64)
    weight, coverage = align_vectors(words, vectors, [f"t{i}" for i in range(2000)], init_std=0.05,
                                     generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert coverage.found == 0 and abs(float(weight.std()) - 0.05) < 0.002


def test_vocab_from_a_posenc_tokenizer(tmp_path):
    text = pytest.importorskip("posenc.text")
    pytest.importorskip("tokenizers")
    tok = text.build_tokenizer("wordpiece", ["the cat sat on the mat"] * 20, vocab_size=40)
    path = tmp_path / "glove.txt"
    _write_text(path, header=False)
    emb, coverage = posenc.pretrained_embedding(path, tok, freeze=True)
    assert emb.weight.shape == (tok.vocab_size, 3) and not emb.weight.requires_grad
    assert coverage.total == tok.vocab_size and coverage.found >= 3
    torch.testing.assert_close(emb.weight[tok.token_to_id("cat")], torch.tensor(WORDS["cat"]))


def test_safetensors_table(tmp_path):
    table = torch.randn(6, 4)
    safetensors.torch.save_file({"embed": table}, str(tmp_path / "one.safetensors"))
    safetensors.torch.save_file({"a": table, "b": table[:2].clone()}, str(tmp_path / "two.safetensors"))
    emb, coverage = posenc.pretrained_embedding(tmp_path / "one.safetensors")
    assert coverage is None and torch.equal(emb.weight.detach(), table)
    assert torch.equal(read_safetensors_vectors(tmp_path / "two.safetensors", key="a"), table)
    with pytest.raises(ValueError, match=r"holds 2 tensors \['a', 'b'\]; pass key=NAME"):
        read_safetensors_vectors(tmp_path / "two.safetensors")
    with pytest.raises(ValueError, match="has 6 rows but the vocabulary has 3 tokens"):
        posenc.pretrained_embedding(tmp_path / "one.safetensors", ["a", "b", "c"])


def test_bad_files_name_the_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("the 0.1 0.2\ncat 0.3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: 1 values after the word, expected 2"):
        read_word_vectors(path)
    path.write_text("the 0.1 x\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: a value is not a number"):
        read_word_vectors(path)
    with pytest.raises(ValueError, match="no vector file at"):
        read_word_vectors(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="pass vocab"):
        posenc.pretrained_embedding(tmp_path / "bad.txt")
