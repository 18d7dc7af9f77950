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
        total: the vocabulary size ``V``.
        lowercased: tokens found only by their lowercase form.
        missing: up to 20 of the tokens not found (initialised as a fresh model's).
        unused: words of the file that no token matched.
    """

    found: int
    total: int
    lowercased: int = 0
    missing: list[str] = field(default_factory=list)
    unused: int = 0

    @property
    def fraction(self) -> float:
        return self.found / self.total if self.total else 0.0

    def __str__(self) -> str:
        text = f"found {self.found:,} of {self.total:,} tokens ({100 * self.fraction:.1f}%"
        text += f", {self.lowercased:,} lowercased)" if self.lowercased else ")"
        if self.missing:
            text += "; missing e.g. " + ", ".join(repr(t) for t in self.missing[:5])
        return text + f"; {self.unused:,} words of the file unused"


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
    """Read a word2vec/GloVe text file: ``(words [n], vectors [n, d] float32)``.

    Args:
        path: the text file (UTF-8); a first line of two integers (``count d``) is a header.
        limit: read at most this many words (files list the frequent words first).

    Raises:
        ValueError: a line whose number of values differs from the first one's, or a value that
            is not a number (naming the line).
    """
    if not Path(path).is_file():
        raise ValueError(f"no vector file at {str(path)!r}")
    words: list[str] = []
    rows: list[list[float]] = []
    width = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            parts = line.rstrip("\n").rstrip().split(" ")
            if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                width = int(parts[1])  # word2vec header: count d
                continue
            if not line.strip():
                continue
            if width is None:
                width = len(parts) - 1
            if len(parts) - 1 != width or width < 1:
                raise ValueError(
                    f"{str(path)!r} line {number}: {len(parts) - 1} values after the word, expected {width}"
                    " (word2vec/GloVe text: 'word v1 ... vd' per line)"
                )
            try:
                rows.append([float(v) for v in parts[1:]])
            except ValueError:
                raise ValueError(f"{str(path)!r} line {number}: a value is not a number") from None
            words.append(parts[0])
            if limit is not None and len(words) >= limit:
                break
    if not words:
        raise ValueError(f"{str(path)!r} holds no word vectors")
    return words, torch.tensor(rows, dtype=torch.float32)


def _vocabulary(vocab: Any) -> list[str | None]:
    """Token strings by id from a posenc Tokenizer, a sequence of tokens, or a ``{token: id}`` map."""
    if hasattr(vocab, "id_to_token") and hasattr(vocab, "vocab_size"):
        return [vocab.id_to_token(i) for i in range(vocab.vocab_size)]
    if isinstance(vocab, Mapping):
        tokens: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
        for token, index in vocab.items():
            tokens[index] = token
        return tokens
    if isinstance(vocab, Sequence) and not isinstance(vocab, str):
        return list(vocab)
    raise TypeError(
        "vocab must be a posenc tokenizer, a list of tokens or a {token: id} dict, "
        f"got {type(vocab).__name__}"
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
        vocab: a posenc tokenizer, a list of tokens (index = id) or a ``{token: id}`` dict.
        init_std: std of the tokens not found; default 1.0, what a fresh
            :class:`~posenc.TokenEmbedding` with ``scale=None`` uses (``1 / scale``).
        padding_idx: a row set to zero (the padding token), found or not.
        generator: for the random rows.

    Returns:
        ``(weight [V, d] float32, coverage)``.
    """
    if vectors.dim() != 2 or vectors.shape[0] != len(words):
        raise ValueError(
            f"vectors must be [n, d] with n = len(words) = {len(words)}, got {tuple(vectors.shape)}"
        )
    tokens = _vocabulary(vocab)
    weight = torch.empty(len(tokens), vectors.shape[1], dtype=torch.float32)
    with torch.no_grad():
        weight.normal_(0.0, 1.0 if init_std is None else float(init_std), generator=generator)
    index = {w: i for i, w in enumerate(words)}
    lower: dict[str, int] = {}
    for i, w in enumerate(words):
        lower.setdefault(w.lower(), i)
    found, lowercased, missing, used = 0, 0, [], set()
    for token_id, token in enumerate(tokens):
        row = None if token is None else index.get(token)
        if row is None and token is not None:
            row = lower.get(token.lower())
            lowercased += row is not None
        if row is None:
            missing.append(str(token))
            continue
        weight[token_id] = vectors[row]
        found, used = found + 1, used | {row}
    if padding_idx is not None:
        weight[padding_idx].zero_()
    coverage = VectorCoverage(found, len(tokens), lowercased, missing[:20], len(words) - len(used))
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
