"""Pretrained token vectors: read them from a file and align them to a tokenizer's vocabulary.

Two file formats:

* a safetensors file holding a ``[V, d]`` tensor (:func:`read_safetensors_vectors`), already in the
  vocabulary's order;
* the word2vec / GloVe text format (:func:`read_word_vectors`): one ``word v_1 ... v_d`` line per
  word, with an optional ``count d`` header line (word2vec writes it, GloVe does not).

:func:`align_vectors` puts a word-keyed set of vectors in the order of a vocabulary: each token found
in the file (exactly, else lowercased) takes its vector; every other token is initialised as a fresh
:class:`~posenc.TokenEmbedding` would be (``N(0, init_std^2)``, the padding row zero), and a
:class:`VectorCoverage` says how many were found. :func:`pretrained_embedding` does all of it::

    emb, coverage = posenc.pretrained_embedding("glove.6B.100d.txt", tokenizer, freeze=True)
    print(coverage)   # found 3,612 of 4,000 tokens (90.3%, 41 lowercased); missing e.g. '[CLS]', ...

Legend: ``V`` vocabulary size, ``d`` vector width, ``n`` words in the file.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .embedding import TokenEmbedding

__all__ = [
    "VectorCoverage",
    "align_vectors",
    "pretrained_embedding",
    "read_safetensors_vectors",
    "read_word_vectors",
]


@dataclass
class VectorCoverage:
    """How much of a vocabulary a file of word vectors covers.

    Attributes:
        found: tokens that took a vector from the file (``lowercased`` of them by their lowercase form).
        total: the tokens that take a vector: the vocabulary size ``V``, less the padding row
            (zero whatever the file holds).
        lowercased: tokens found only by their lowercase form.
        missing: up to 20 of the tokens not found (initialised as a fresh model's).
        unused: distinct words of the file that no token matched.
        duplicates: words listed again after their first line (the first vector is kept).
    """

    found: int
    total: int
    lowercased: int = 0
    missing: list[str] = field(default_factory=list)
    unused: int = 0
    duplicates: int = 0

    @property
    def fraction(self) -> float:
        return self.found / self.total if self.total else 0.0

    def __str__(self) -> str:
        text = f"found {self.found:,} of {self.total:,} tokens ({100 * self.fraction:.1f}%"
        text += f", {self.lowercased:,} lowercased)" if self.lowercased else ")"
        if self.missing:
            text += "; missing e.g. " + ", ".join(repr(t) for t in self.missing[:5])
        text += f"; {self.unused:,} words of the file unused"
        return text + (f"; {self.duplicates:,} repeated words (first vector kept)" if self.duplicates else "")


def read_safetensors_vectors(path: str | os.PathLike, key: str | None = None) -> torch.Tensor:
    """The ``[V, d]`` tensor ``key`` of a safetensors file (``key`` may be omitted when the file holds
    one tensor). ``ValueError`` naming the file, the keys it has, or the shape it found."""
    import safetensors.torch

    if not Path(path).is_file():
        raise ValueError(f"no vector file at {str(path)!r}")
    try:
        tensors = safetensors.torch.load_file(str(path))
    except Exception as err:  # SafetensorError and friends: not a readable file
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from None
    if key is None:
        if len(tensors) != 1:
            raise ValueError(f"{str(path)!r} holds {len(tensors)} tensors {sorted(tensors)}; pass key=NAME")
        key = next(iter(tensors))
    if key not in tensors:
        raise ValueError(f"{str(path)!r} has no tensor {key!r}; it has {sorted(tensors)}")
    weight = tensors[key]
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            f"{key!r} in {str(path)!r} is {tuple(weight.shape)} {weight.dtype}; "
            "vectors are a float [V, d] tensor"
        )
    return weight


def read_word_vectors(path: str | os.PathLike, *, limit: int | None = None) -> tuple[list[str], torch.Tensor]:
    """Read a word2vec/GloVe file: ``(words [n], vectors [n, d] float32)``.

    Text (UTF-8, a leading byte-order mark ignored): one ``word v_1 ... v_d`` line per word, fields
    separated by spaces or tabs, an optional ``count d`` header line (word2vec writes it, GloVe
    does not). ``d`` is the header's, or the first line's number of fields less one; every line's
    last ``d`` fields are its values and the rest is the word, so words holding spaces (GloVe
    840B's) are read whole. Binary word2vec (a ``count d`` header, then per word its UTF-8 bytes,
    a space and ``d`` little-endian float32 values) is recognised and read too.

    The file is streamed: memory is about the tensor's own size (``4 n d`` bytes) plus the words.
    Every line is returned, a repeated word too; :func:`align_vectors` keeps a word's first
    vector (files list frequent words first) and counts the repeats.

    Args:
        path: the file.
        limit: read at most this many words (``>= 1``; files list the frequent words first).

    Raises:
        ValueError: naming the file and line: a line whose number of values differs from ``d``, a
            value that is not a finite number (NaN and inf are refused), bytes that are not UTF-8
            (e.g. a Latin-1 file: convert it with ``iconv -f latin1 -t utf-8``), no vectors.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    if not Path(path).is_file():
        raise ValueError(f"no vector file at {str(path)!r}")
    name = str(path)
    with open(path, "rb") as fh:
        first = fh.readline()
        header = _header(first)
        if header is not None and _is_binary(fh.peek(1 << 16)[: 1 << 16], header[1]):
            return _read_binary(fh, name, header, limit)
        fh.seek(0)
        return _read_text(fh, name, header, limit)


def _header(line: bytes) -> tuple[int, int] | None:
    """``(count, d)`` of a word2vec header line ``count d`` (BOM allowed), else None."""
    parts = line.removeprefix(b"\xef\xbb\xbf").split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    return None


def _is_binary(head: bytes, width: int) -> bool:
    """Whether the bytes after a ``count d`` header are binary word2vec: their first line is not
    a UTF-8 text line of a word and ``d`` numbers."""
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    try:
        fields = line.decode("utf-8").replace("\t", " ").strip(" ").rsplit(" ", width)
        [float(v) for v in fields[1:]]  # ValueError: not numbers
    except (UnicodeDecodeError, ValueError):
        return True
    return len(fields) != width + 1


def _read_text(fh, name: str, header: tuple[int, int] | None, limit: int | None):
    words: list[str] = []
    values = array("f")  # float32 rows, one after another: grows by ~1/16, no per-value objects
    lines = array("q")  # each word's line number, for the messages
    width = None if header is None else header[1]
    if width is not None and width < 1:
        raise ValueError(f"{name!r} line 1: the header says d = {width}; vectors need d >= 1")
    for number, raw in enumerate(fh, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{name!r} line {number}: byte {raw[err.start]:#04x} at column {err.start + 1} is not "
                "UTF-8 text; convert the file (e.g. iconv -f latin1 -t utf-8) or pass a UTF-8 one"
            ) from None
        if number == 1:
            line = line.removeprefix("\ufeff")  # a byte-order mark is not part of the first word
            if header is not None:
                continue
        line = line.rstrip("\r\n").replace("\t", " ").strip(" ")
        if not line:
            continue
        if width is None:
            width = line.count(" ") if " " in line else 0
            if width < 1:
                raise ValueError(
                    f"{name!r} line {number}: no values after the word (expected 'word v1 ... vd')"
                )
        fields = line.rsplit(" ", width)  # the last d fields are the values; the word may hold spaces
        if len(fields) != width + 1 or not fields[0]:
            raise ValueError(
                f"{name!r} line {number}: {len(fields) - 1} values after the word, expected {width}"
                " (word2vec/GloVe text: 'word v1 ... vd' per line)"
            )
        word = fields[0].rstrip(" ")
        try:
            values.extend([float(v) for v in fields[1:]])
        except ValueError:
            raise ValueError(f"{name!r} line {number}: a value is not a number") from None
        words.append(word)
        lines.append(number)
        if limit is not None and len(words) >= limit:
            break
    if not words:
        raise ValueError(f"{name!r} holds no word vectors")
    vectors = _as_tensor(values, len(words), width)
    bad = _first_non_finite(vectors)
    if bad is not None:
        raise ValueError(f"{name!r} line {lines[bad]}: a value of {words[bad]!r} is NaN or infinite")
    return words, vectors


def _first_non_finite(vectors: torch.Tensor, block: int = 1 << 20) -> int | None:
    """The first row of ``vectors`` ``[n, d]`` holding NaN or an infinity, or None: one pass in
    blocks of about ``block`` values (``isfinite`` makes temporaries of its input's size)."""
    rows = max(1, block // max(vectors.shape[1], 1))
    for start in range(0, vectors.shape[0], rows):
        finite = torch.isfinite(vectors[start : start + rows]).all(dim=1)  # [rows]
        if not bool(finite.all()):
            return start + int((~finite).nonzero()[0, 0])
    return None


def _read_binary(fh, name: str, header: tuple[int, int], limit: int | None):
    count, width = header
    if width < 1:
        raise ValueError(f"{name!r}: the header says d = {width}; vectors need d >= 1")
    size_left = os.fstat(fh.fileno()).st_size - fh.tell()
    if 4 * width > size_left:  # a header no vector fits: never read (allocate) 4 d bytes for it
        raise ValueError(
            f"{name!r}: the header says d = {width}, but the file holds {size_left} bytes after it: "
            "not one vector of 4 d bytes (binary word2vec)"
        )
    n = count if limit is None else min(count, limit)
    size = 4 * width
    words: list[str] = []
    values = array("f")
    for index in range(count):
        if len(words) >= n:
            break
        word = bytearray()
        while True:
            c = fh.read(1)
            if not c:
                raise ValueError(
                    f"{name!r} ends after {index} of the {count} words its header announces (binary word2vec)"
                )
            if c == b" ":
                break
            if c != b"\n" or word:  # the newline some writers put after each vector
                word += c
        row = fh.read(size)
        if len(row) != size:
            raise ValueError(f"{name!r} ends inside the vector of word {index + 1} (binary word2vec)")
        try:
            text = word.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name!r}: word {index + 1} is not UTF-8 (binary word2vec)") from None
        values.frombytes(row)
        words.append(text)
    if not words:
        raise ValueError(f"{name!r} holds no word vectors")
    if sys.byteorder != "little":
        values.byteswap()
    vectors = _as_tensor(values, len(words), width)
    bad = _first_non_finite(vectors)
    if bad is not None:
        raise ValueError(f"{name!r}: a value of word {bad + 1} ({words[bad]!r}) is NaN or infinite")
    return words, vectors


def _as_tensor(values: array, n: int, width: int) -> torch.Tensor:
    """The float32 values ``[n * d]`` as a ``[n, d]`` tensor sharing their memory (no copy)."""
    return torch.frombuffer(values, dtype=torch.float32).view(n, width)


def _vocabulary(vocab: Any) -> list[str | None]:
    """Token strings by id from a posenc Tokenizer, a Hugging Face tokenizer (``tokenizers.Tokenizer``
    or a transformers tokenizer: their ``get_vocab()``), a sequence of tokens, or a ``{token: id}`` map."""
    if _is_posenc_tokenizer(vocab):
        return [vocab.id_to_token(i) for i in range(vocab.vocab_size)]
    if not isinstance(vocab, Mapping) and callable(getattr(vocab, "get_vocab", None)):
        vocab = vocab.get_vocab()  # Hugging Face: {token: id}, added tokens included
        if not isinstance(vocab, Mapping):
            raise TypeError(f"vocab.get_vocab() must return a {{token: id}} dict, got {type(vocab).__name__}")
    if isinstance(vocab, Mapping):
        bad = [i for i in vocab.values() if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad:
            raise ValueError(f"vocab maps tokens to ids, which must be ints >= 0; got {bad[0]!r}")
        top = max(vocab.values(), default=-1)
        if top >= 2 * len(vocab) + 1024:  # a table of top + 1 rows, mostly without a token
            raise ValueError(
                f"vocab has {len(vocab)} tokens but ids up to {top}: its table would have {top + 1} rows, "
                "mostly without a token; pass a vocabulary whose ids are 0..V-1"
            )
        tokens: list[str | None] = [None] * (top + 1)
        for token, index in vocab.items():
            tokens[index] = token
        return tokens
    if isinstance(vocab, Sequence) and not isinstance(vocab, str):
        return list(vocab)
    raise TypeError(
        "vocab must be a posenc tokenizer, a Hugging Face tokenizer (tokenizers.Tokenizer or a "
        "transformers tokenizer: their get_vocab() is used), a list of tokens or a {token: id} dict, "
        f"got {type(vocab).__name__}"
    )


def _is_posenc_tokenizer(vocab: Any) -> bool:
    """posenc's Tokenizer: ``id_to_token(i)`` below an int ``vocab_size`` (a transformers
    tokenizer's ``vocab_size`` leaves out its added tokens, so it goes by ``get_vocab()``)."""
    return (
        callable(getattr(vocab, "id_to_token", None))
        and isinstance(getattr(vocab, "vocab_size", None), int)
        and not callable(getattr(vocab, "convert_ids_to_tokens", None))
    )


def align_vectors(
    words: Sequence[str],
    vectors: torch.Tensor,
    vocab: Any,
    *,
    init_std: float | None = None,
    padding_idx: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, VectorCoverage]:
    """Vectors ``[n, d]`` keyed by ``words`` -> a table ``[V, d]`` in ``vocab``'s order.

    Args:
        words, vectors: from :func:`read_word_vectors`.
        vocab: a posenc tokenizer, a Hugging Face tokenizer (``tokenizers.Tokenizer`` or a
            transformers tokenizer; its ``get_vocab()``), a list of tokens (index = id) or a
            ``{token: id}`` dict.
        init_std: std of the tokens not found; default 1.0, what a fresh
            :class:`~posenc.TokenEmbedding` with ``scale=None`` uses (``1 / scale``).
        padding_idx: a row set to zero (the padding token); not counted as found or missing.
        generator: for the random rows.

    Returns:
        ``(weight [V, d] float32, coverage)``.
    """
    if vectors.dim() != 2 or vectors.shape[0] != len(words):
        raise ValueError(
            f"vectors must be [n, d] with n = len(words) = {len(words)}, got {tuple(vectors.shape)}"
        )
    tokens = _vocabulary(vocab)
    if padding_idx is not None and not 0 <= padding_idx < len(tokens):
        raise ValueError(f"padding_idx must be in [0, {len(tokens)}) for this vocabulary, got {padding_idx}")
    weight = torch.empty(len(tokens), vectors.shape[1], dtype=torch.float32)
    with torch.no_grad():
        weight.normal_(0.0, 1.0 if init_std is None else float(init_std), generator=generator)
    index: dict[str, int] = {}
    lower: dict[str, int] = {}
    for i, w in enumerate(words):  # a repeated word keeps its first vector (files list frequent words first)
        index.setdefault(w, i)
        lower.setdefault(w.lower(), i)
    found, lowercased, missing, used = 0, 0, [], set()
    for token_id, token in enumerate(tokens):
        if token_id == padding_idx:
            continue  # the padding row is zero, whatever the file holds: neither found nor missing
        row = None if token is None else index.get(token)
        if row is None and token is not None:
            row = lower.get(token.lower())
            lowercased += row is not None
        if row is None:
            missing.append(str(token))
            continue
        weight[token_id] = vectors[row]
        found += 1
        used.add(row)
    if padding_idx is not None:
        weight[padding_idx].zero_()
    total = len(tokens) - (padding_idx is not None)
    coverage = VectorCoverage(
        found, total, lowercased, missing[:20], len(index) - len(used), duplicates=len(words) - len(index)
    )
    return weight, coverage


def pretrained_embedding(
    path: str | os.PathLike,
    vocab: Any = None,
    *,
    freeze: bool = False,
    key: str | None = None,
    scale: str | float | None = None,
    padding_idx: int | None = None,
    init_std: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[TokenEmbedding, VectorCoverage | None]:
    """A :class:`~posenc.TokenEmbedding` from a file of pretrained vectors.

    Args:
        path: a ``.safetensors`` file (a ``[V, d]`` tensor, in the vocabulary's order; ``key`` picks
            one of several tensors) or a word2vec/GloVe text file (aligned to ``vocab``).
        vocab: the tokenizer (or token list / ``{token: id}``) to align a text file to; a
            safetensors table must then have its ``V`` rows.
        freeze: keep the vectors fixed (no gradient), as ``nn.Embedding.from_pretrained``.
        scale: the embedding's output scale; default ``None`` (the vectors as they are).
        padding_idx, init_std, generator: as :func:`align_vectors` / :class:`~posenc.TokenEmbedding`.

    Returns:
        ``(embedding, coverage)``; coverage is ``None`` for a safetensors table.
    """
    if str(path).endswith(".safetensors"):
        weight, coverage = read_safetensors_vectors(path, key), None
        if vocab is not None and len(_vocabulary(vocab)) != weight.shape[0]:
            raise ValueError(
                f"{str(path)!r} has {weight.shape[0]} rows but the vocabulary has {len(_vocabulary(vocab))} "
                "tokens; a safetensors table is used as is, row i for token id i"
            )
    else:
        if vocab is None:
            raise ValueError(
                f"{str(path)!r} is a word-vector text file: pass vocab (the tokenizer) to align it"
            )
        words, vectors = read_word_vectors(path)
        weight, coverage = align_vectors(
            words, vectors, vocab, init_std=init_std, padding_idx=padding_idx, generator=generator
        )
    emb = TokenEmbedding.from_pretrained(weight, freeze=freeze, scale=scale, padding_idx=padding_idx)
    return emb, coverage
