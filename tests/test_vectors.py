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
    # the padding row is zero whatever the file holds: neither found nor reported missing
    assert (coverage.found, coverage.total, coverage.lowercased, coverage.unused) == (3, 4, 1, 1)
    assert coverage.missing == ["dog"]
    assert str(coverage).startswith("found 3 of 4 tokens (75.0%, 1 lowercased); missing e.g. 'dog'")
    w = emb.weight.detach()
    torch.testing.assert_close(w[1:4], torch.tensor([WORDS["the"], WORDS["cat"], WORDS["Mat"]]))
    assert torch.equal(w[0], torch.zeros(3))  # padding row
    assert w[4].abs().sum() > 0  # unknown: drawn as a fresh model's row (N(0, 1) for scale None)


def test_unknown_rows_follow_the_init_std(tmp_path):
    words, vectors = ["a"], torch.ones(1, 64)
    weight, coverage = align_vectors(
        words,
        vectors,
        [f"t{i}" for i in range(2000)],
        init_std=0.05,
        generator=torch.Generator().manual_seed(0),
    )
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


def test_padding_row_is_not_reported_missing():
    """With padding_idx=0 the coverage listed '[PAD]' as missing although its row is zero by design."""
    weight, coverage = align_vectors(["a", "[PAD]"], torch.ones(2, 3), ["[PAD]", "a", "b"], padding_idx=0)
    assert coverage.missing == ["b"] and (coverage.found, coverage.total) == (1, 2)
    assert torch.equal(weight[0], torch.zeros(3)) and torch.equal(weight[1], torch.ones(3))
    with pytest.raises(ValueError, match="padding_idx must be in"):
        align_vectors(["a"], torch.ones(1, 3), ["a"], padding_idx=5)


def test_hugging_face_tokenizers_are_vocabularies(tmp_path):
    """A tokenizers.Tokenizer and a transformers tokenizer used to be refused as vocab; their
    get_vocab() ({token: id}, added tokens included) is read."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[PAD]": 0, "[UNK]": 1, "the": 2, "cat": 3, "mat": 4}
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    path = tmp_path / "glove.txt"
    _write_text(path, header=False)
    emb, coverage = posenc.pretrained_embedding(
        path, hf, padding_idx=0, generator=torch.Generator().manual_seed(0)
    )
    assert emb.weight.shape == (5, 3) and coverage.found == 3 and coverage.missing == ["[UNK]"]
    torch.testing.assert_close(emb.weight[3], torch.tensor(WORDS["cat"]))
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=hf, pad_token="[PAD]", unk_token="[UNK]")
    emb2, coverage2 = posenc.pretrained_embedding(
        path, fast, padding_idx=fast.pad_token_id, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(emb2.weight, emb.weight) and coverage2 == coverage
    with pytest.raises(TypeError, match=r"get_vocab\(\) is used"):
        posenc.pretrained_embedding(path, 42)


def test_a_vocabulary_with_a_huge_id_is_refused_not_allocated():
    with pytest.raises(ValueError, match="ids up to 1000000000"):
        align_vectors(["a"], torch.ones(1, 2), {"a": 0, "b": 10**9})
    with pytest.raises(ValueError, match="ints >= 0"):
        align_vectors(["a"], torch.ones(1, 2), {"a": -1})


def test_glove_lines_are_parsed_from_the_right(tmp_path):
    """GloVe 840B holds words with spaces ('. . .'): the last d fields are the values."""
    path = tmp_path / "840b.txt"
    path.write_text("the 0.1 0.2\n. . . 1 2\nat&t inc 3 4\n", encoding="utf-8")
    words, vectors = read_word_vectors(path)
    assert words == ["the", ". . .", "at&t inc"]
    assert torch.equal(vectors, torch.tensor([[0.1, 0.2], [1, 2], [3, 4]]))


def test_text_file_habits(tmp_path):
    """A byte-order mark is not part of the first word; tabs separate fields like spaces; CRLF ends;
    a repeated word keeps its first vector and is counted."""
    path = tmp_path / "v.txt"
    path.write_bytes("\ufeffthe\t1 2\r\ncat 3\t4\r\nthe 5 6\r\n".encode())
    words, vectors = read_word_vectors(path)
    assert words == ["the", "cat", "the"] and vectors[2].tolist() == [5, 6]
    weight, coverage = align_vectors(words, vectors, ["the", "cat"])
    assert weight[0].tolist() == [1, 2] and coverage.duplicates == 1 and coverage.unused == 0
    assert "1 repeated words (first vector kept)" in str(coverage)
    header = tmp_path / "w2v.txt"
    header.write_bytes("\ufeff2 2\nthe 1 2\ncat 3 4\n".encode())
    assert read_word_vectors(header)[0] == ["the", "cat"]


def test_limit_reads_that_many_words(tmp_path):
    path = tmp_path / "v.txt"
    _write_text(path, header=True)
    assert read_word_vectors(path, limit=2)[0] == ["the", "cat"]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="limit must be None or an int >= 1"):
            read_word_vectors(path, limit=bad)


@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity"])
def test_nan_and_inf_are_refused(tmp_path, value):
    path = tmp_path / "v.txt"
    path.write_text(f"the 1 2\ncat {value} 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: a value of 'cat' is NaN or infinite"):
        read_word_vectors(path)


def test_latin1_is_named_with_its_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("the 1 2\ncaf\u00e9 3 4\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt' line 2: byte 0xe9 at column 4 is not UTF-8"):
        read_word_vectors(path)


def _write_binary(path, words, vectors, newline=True):
    with open(path, "wb") as fh:
        fh.write(f"{len(words)} {vectors.shape[1]}\n".encode())
        for word, row in zip(words, vectors):
            fh.write(word.encode() + b" " + row.numpy().astype("<f4").tobytes() + (b"\n" if newline else b""))


@pytest.mark.parametrize("newline", [True, False])
def test_binary_word2vec_is_read(tmp_path, newline):
    words = ["the", "cat", "caf\u00e9"]
    vectors = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "w2v.bin"
    _write_binary(path, words, vectors, newline)
    got_words, got = read_word_vectors(path)
    assert got_words == words and torch.equal(got, vectors)
    assert read_word_vectors(path, limit=2)[0] == words[:2]
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ValueError, match="ends inside the vector of word 3"):
        read_word_vectors(path)


def test_reading_streams_in_about_the_tensors_memory(tmp_path):
    """Rows were Python lists of floats: 11x the tensor (774 MB for 69 MB). Now float32 arrays: the
    peak of traced Python allocations stays within about 1.5x the tensor (the words' strings
    included)."""
    import tracemalloc

    n, d = 4000, 100
    path = tmp_path / "big.txt"
    rows = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    path.write_text(
        "".join(f"w{i} " + " ".join(f"{v:.5f}" for v in row.tolist()) + "\n" for i, row in enumerate(rows))
    )
    tracemalloc.start()
    _, vectors = read_word_vectors(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tensor_bytes = 4 * n * d
    assert vectors.shape == (n, d) and peak < 1.5 * tensor_bytes, peak / tensor_bytes


def test_binary_word2vec_nan_is_refused(tmp_path):
    path = tmp_path / "w2v.bin"
    _write_binary(path, ["the", "cat"], torch.tensor([[1.0, 2.0], [float("nan"), 0.0]]))
    with pytest.raises(ValueError, match=r"a value of word 2 \('cat'\) is NaN or infinite"):
        read_word_vectors(path)


def test_the_finite_check_finds_the_first_bad_row_across_blocks():
    from posenc.vectors import _first_non_finite

    t = torch.zeros(10, 3)
    assert _first_non_finite(t, block=4) is None
    t[7, 2], t[9, 0] = float("inf"), float("nan")
    assert _first_non_finite(t, block=4) == 7 and _first_non_finite(t) == 7


def test_a_binary_header_larger_than_the_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "w2v.bin"
    _write_binary(path, ["the"], torch.ones(1, 4))
    data = path.read_bytes()
    path.write_bytes(b"1 1000000000000\n" + data[data.index(b"\n") + 1 :])
    with pytest.raises(ValueError, match="the header says d = 1000000000000, but the file holds"):
        read_word_vectors(path)
