"""Corpora: documents of text, a deterministic train/validation split by document, and byte views.

Three sources, in the registry :data:`CORPORA` (plus any file or folder path):

* ``"stdlib"``: the Python standard library's own ``*.py`` source, read from the running
  interpreter (``sysconfig.get_paths()["stdlib"]``), so it exists on every machine, offline. Its
  content changes with the Python version, so :class:`CorpusInfo` records the version and a
  sha256 of the content: two runs with the same hash saw the same bytes.
* ``"stdlib-docs"``: the documentation strings of those files (English prose, one document per
  file), on which ``posenc encode`` trains its tokenizers so that common words stay whole.
* a path (or several): a text file, or a folder searched recursively. Files are read as UTF-8,
  falling back to Latin-1 with a warning; binary files (a NUL byte in the first 8 KiB) are skipped
  with a warning; nothing readable -> ``ValueError``.

The split is by document (a file never straddles train and validation): the documents are shuffled
with ``random.Random(seed)`` and the first ``round(n * val_fraction)`` (at least one) form the
validation set; both sets keep the sorted file order. A corpus of one document (one big file) is
split by position instead: its first part trains, its last ``val_fraction`` validates, with a gap of
:data:`SPLIT_GAP_CHARS` characters between them. For byte-level language models,
``Corpus.train_bytes`` / ``val_bytes`` are ``torch.uint8`` tensors ``[n_bytes]`` of the UTF-8 text
of the documents joined by :data:`DOC_SEPARATOR`.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

__all__ = [
    "CORPORA",
    "DOC_SEPARATOR",
    "SPLIT_GAP_CHARS",
    "STDLIB_SKIP_DIRS",
    "TRIPLE_QUOTED",
    "Corpus",
    "CorpusInfo",
    "Document",
    "file_documents",
    "load_corpus",
    "split_documents",
    "stdlib_docstrings",
    "stdlib_documents",
]

#: Joins documents in the byte view (a blank line between files).
DOC_SEPARATOR = "\n"

#: Folders of the standard library left out of the ``stdlib`` corpus: installed packages, and the
#: test suites (large, full of deliberately odd encodings and generated data).
STDLIB_SKIP_DIRS: frozenset[str] = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)

#: A triple-quoted string (its text in group 1 or 2), read by the ``stdlib-docs`` corpus.
TRIPLE_QUOTED = re.compile(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', re.S)

_BINARY_PROBE = 8192


@dataclass(frozen=True)
class Document:
    """One document: ``name`` (its path relative to the corpus root, posix style) and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class CorpusInfo:
    """Where a corpus came from and what it holds, enough to tell whether two runs saw the same data.

    ``sha256`` hashes every document's name and UTF-8 text in order (before the split), so it
    changes with any file's content, name or order but not with ``seed``/``val_fraction``.
    """

    name: str
    source: str
    python_version: str
    n_documents: int
    n_train: int
    n_val: int
    n_chars: int
    sha256: str
    seed: int
    val_fraction: float
    skipped: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for logs and reports."""
        return (
            f"corpus {self.name!r}: {self.n_documents} documents "
            f"({self.n_train} train, {self.n_val} val), {self.n_chars:,} chars, "
            f"sha256 {self.sha256[:12]}, Python {self.python_version}"
        )


@dataclass(frozen=True)
class Corpus:
    """Documents split into train and validation, with text and byte views.

    Shapes: ``train_bytes`` ``[n_train_bytes]``, ``val_bytes`` ``[n_val_bytes]``, ``torch.uint8``.
    """

    train: tuple[Document, ...]
    val: tuple[Document, ...]
    info: CorpusInfo

    @property
    def documents(self) -> tuple[Document, ...]:
        """Every document, train then validation."""
        return self.train + self.val

    @property
    def train_texts(self) -> list[str]:
        return [d.text for d in self.train]

    @property
    def val_texts(self) -> list[str]:
        return [d.text for d in self.val]

    @property
    def texts(self) -> list[str]:
        """All document texts (train then validation), e.g. to train a tokenizer."""
        return [d.text for d in self.documents]

    @cached_property
    def train_bytes(self) -> torch.Tensor:
        """``[n]`` uint8: the UTF-8 bytes of the training documents joined by :data:`DOC_SEPARATOR`."""
        return _to_bytes(self.train)

    @cached_property
    def val_bytes(self) -> torch.Tensor:
        """``[n]`` uint8: the UTF-8 bytes of the validation documents joined by :data:`DOC_SEPARATOR`."""
        return _to_bytes(self.val)

    @cached_property
    def val_starts(self) -> tuple[int, ...]:
        """Where each validation document starts in :attr:`val_bytes` (one index per document)."""
        return _starts(self.val)


def _starts(docs: Sequence[Document]) -> tuple[int, ...]:
    sep = len(DOC_SEPARATOR.encode("utf-8"))
    starts, at = [], 0
    for d in docs:
        starts.append(at)
        at += len(d.text.encode("utf-8")) + sep
    return tuple(starts)


def _to_bytes(docs: Sequence[Document]) -> torch.Tensor:
    data = bytearray(DOC_SEPARATOR.join(d.text for d in docs).encode("utf-8"))
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8)  # owns `data` (kept alive by the tensor)


# ---------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------
def _read_text(path: Path) -> str | None:
    """The text of ``path``, or ``None`` (with a warning) for a binary file."""
    raw = path.read_bytes()
    if b"\x00" in raw[:_BINARY_PROBE]:
        warnings.warn(
            f"skipping binary file {str(path)!r} (NUL byte in its first {_BINARY_PROBE} bytes)", stacklevel=3
        )
        return None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        warnings.warn(f"{str(path)!r} is not valid UTF-8; read as Latin-1", stacklevel=3)
        return raw.decode("latin-1")


def stdlib_documents(max_chars: int | None = None) -> tuple[list[Document], str]:
    """The standard library's ``*.py`` files of the running interpreter, sorted by relative path.

    Skips :data:`STDLIB_SKIP_DIRS`. Returns ``(documents, root)``. ``max_chars`` keeps the first
    files (in sorted order) until that many characters are reached: a fixed, deterministic subset.
    """
    root = _stdlib_root()
    docs: list[Document] = []
    total = 0
    for doc in _stdlib_files(root):
        if max_chars is not None and total >= max_chars:
            break
        docs.append(doc)
        total += len(doc.text)
    return docs, str(root)


def _stdlib_root() -> Path:
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():  # pragma: no cover - a broken interpreter install
        raise ValueError(f"the standard library folder {str(root)!r} does not exist in this Python")
    return root


def _stdlib_files(root: Path) -> Iterator[Document]:
    """The stdlib's non-empty ``*.py`` files under ``root`` as documents, sorted by relative path,
    read one at a time (skipping :data:`STDLIB_SKIP_DIRS`)."""
    paths = sorted(
        (p for p in root.rglob("*.py") if not STDLIB_SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    for p in paths:
        text = _read_text(p)
        if text is not None and text.strip():
            yield Document(p.relative_to(root).as_posix(), text)


def stdlib_docstrings(max_chars: int | None = None) -> tuple[list[Document], str]:
    """The documentation strings (English prose) of the standard library's ``*.py`` files: one
    document per file, its triple-quoted strings (docstrings, and the few long text literals
    written the same way) joined by blank lines.

    Every Python installation has them, so a tokenizer trained on them learns English words
    (``cat``, ``mat``) without a download. Files in :func:`stdlib_documents`' order; ``max_chars``
    stops once that many characters are gathered. Returns ``(documents, root)``.
    """
    root = _stdlib_root()
    docs: list[Document] = []
    total = 0
    for doc in _stdlib_files(root):
        if max_chars is not None and total >= max_chars:
            break
        text = "\n\n".join(a or b for a, b in TRIPLE_QUOTED.findall(doc.text))
        if text.strip():
            docs.append(Document(doc.name, text))
            total += len(text)
    return docs, str(root)


def file_documents(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    extensions: Sequence[str] | None = None,
    max_chars: int | None = None,
) -> tuple[list[Document], list[str]]:
    """Documents from files and folders (folders searched recursively, hidden entries skipped).

    Args:
        paths: one path or several.
        extensions: keep only files ending with one of these (``[".py", ".md"]``); default all.
        max_chars: stop after this many characters (files in sorted order).

    Returns:
        ``(documents, skipped)``; names are relative to the folder given (or the file name).

    Raises:
        ValueError: a path does not exist, or no text was found (the message says where it looked).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("paths is empty: give at least one file or folder")
    docs: list[Document] = []
    skipped: list[str] = []
    total = 0
    for base in paths:
        if not base.exists():
            raise ValueError(
                f"corpus path {str(base)!r} does not exist; valid corpus names: {', '.join(CORPORA)}"
            )
        if base.is_file():
            files = [(base, base.name)]
        else:
            found = (p for p in base.rglob("*") if p.is_file())
            rel = ((p, p.relative_to(base)) for p in found)
            files = sorted(
                ((p, r.as_posix()) for p, r in rel if not any(x.startswith(".") for x in r.parts)),
                key=lambda t: t[1],
            )
        for p, name in files:
            if extensions is not None and not name.endswith(tuple(extensions)):
                continue
            if max_chars is not None and total >= max_chars:
                break
            text = _read_text(p)
            if text is None:
                skipped.append(str(p))
            elif text.strip():
                docs.append(Document(name, text))
                total += len(text)
    if not docs:
        where = ", ".join(repr(str(p)) for p in paths)
        ext = f" with extensions {list(extensions)}" if extensions is not None else ""
        raise ValueError(
            f"no text documents found in {where}{ext} ({len(skipped)} binary files skipped); "
            "point at text files or a folder that holds some"
        )
    return docs, skipped


# ---------------------------------------------------------------------------------------------
# Split and load
# ---------------------------------------------------------------------------------------------
#: characters left out between the train and validation parts of a single document split by position
SPLIT_GAP_CHARS = 1024


def _split_by_position(
    doc: Document, val_fraction: float
) -> tuple[tuple[Document, ...], tuple[Document, ...]]:
    """One document -> its first part (train) and its last ``val_fraction`` (validation), with a gap
    of ``SPLIT_GAP_CHARS`` (at most 5% of the text) left out between them."""
    n = len(doc.text)
    gap = min(SPLIT_GAP_CHARS, n // 20)
    n_val = round(n * val_fraction)
    if n_val < 1 or n - n_val - gap < 1:
        raise ValueError(
            f"cannot split the single document {doc.name!r} ({n:,} chars) by position with "
            f"val_fraction={val_fraction}: give a longer text, more files, or val_fraction=0"
        )
    train = Document(f"{doc.name}[:{n - n_val - gap}]", doc.text[: n - n_val - gap])
    val = Document(f"{doc.name}[{n - n_val}:]", doc.text[n - n_val :])
    return (train,), (val,)


def split_documents(
    docs: Sequence[Document], val_fraction: float = 0.1, seed: int = 0
) -> tuple[tuple[Document, ...], tuple[Document, ...]]:
    """Split by document, deterministically for ``seed``: ``(train, val)``, no document in both.

    ``val`` holds ``round(n * val_fraction)`` documents (at least 1 when ``val_fraction > 0``);
    both keep the input order. ``val_fraction=0`` puts everything in train. A single document is
    split by position (its last ``val_fraction`` validates, after a gap of :data:`SPLIT_GAP_CHARS`).
    """
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
        raise TypeError(f"val_fraction must be a number in [0, 1), got {type(val_fraction).__name__}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} ({seed!r})")
    n = len(docs)
    if n == 1 and val_fraction > 0:
        return _split_by_position(docs[0], val_fraction)
    n_val = 0 if val_fraction == 0 else max(1, round(n * val_fraction))
    if n_val >= n:
        raise ValueError(
            f"cannot split {n} document(s) into train and validation with val_fraction={val_fraction}: "
            "the split is by document, so give more files or a smaller val_fraction (or 0)"
        )
    order = list(range(n))
    random.Random(seed).shuffle(order)
    val_idx = set(order[:n_val])
    train = tuple(d for i, d in enumerate(docs) if i not in val_idx)
    val = tuple(d for i, d in enumerate(docs) if i in val_idx)
    return train, val


def _hash(docs: Sequence[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        name, text = d.name.encode("utf-8"), d.text.encode("utf-8")
        # length-prefixed, so ("ab", "c") and ("a", "bc") hash differently
        h.update(len(name).to_bytes(8, "little") + name + len(text).to_bytes(8, "little") + text)
    return h.hexdigest()


def _stdlib(max_chars: int | None) -> tuple[list[Document], str, list[str]]:
    docs, root = stdlib_documents(max_chars)
    return docs, root, []


def _stdlib_docs(max_chars: int | None) -> tuple[list[Document], str, list[str]]:
    docs, root = stdlib_docstrings(max_chars)
    return docs, root, []


#: corpus name -> loader ``(max_chars) -> (documents, source, skipped)``.
CORPORA: dict[str, Callable[[int | None], tuple[list[Document], str, list[str]]]] = {
    "stdlib": _stdlib,
    "stdlib-docs": _stdlib_docs,
}


def _documents(name_or_path, max_chars: int | None, extensions: Sequence[str] | None):
    """``(documents, skipped files, name, source)`` of a built-in corpus or of files/folders."""
    if isinstance(name_or_path, str) and name_or_path in CORPORA:
        if extensions is not None:
            raise ValueError(
                f"extensions applies to file corpora, not to the built-in corpus {name_or_path!r}"
            )
        docs, source, skipped = CORPORA[name_or_path](max_chars)
        return docs, skipped, name_or_path, source
    if isinstance(name_or_path, str) and not Path(name_or_path).exists():
        raise ValueError(
            f"unknown corpus {name_or_path!r}: not a corpus name ({', '.join(CORPORA)}) "
            "and no such file or folder"
        )
    docs, skipped = file_documents(name_or_path, extensions=extensions, max_chars=max_chars)
    if isinstance(name_or_path, (str, os.PathLike)):
        source = str(Path(name_or_path).resolve())
    else:
        source = ", ".join(str(Path(p).resolve()) for p in name_or_path)
    return docs, skipped, source, source


def load_corpus(
    name_or_path: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    val_fraction: float = 0.1,
    seed: int = 0,
    max_chars: int | None = None,
    extensions: Sequence[str] | None = None,
) -> Corpus:
    """Load a corpus by name (a key of :data:`CORPORA`) or from files/folders, split by document.

    Args:
        name_or_path: ``"stdlib"``, a file or folder path, or a list of paths.
        val_fraction: share of documents held out for validation, in ``[0, 1)``.
        seed: the split's seed (same seed, same split).
        max_chars: keep only the first documents (sorted order) up to about this many characters,
            a fixed subset for quick runs.
        extensions: for paths, keep only files with these endings.

    Returns:
        a :class:`Corpus`; ``corpus.train_bytes`` / ``val_bytes`` are uint8 tensors ``[n]``.

    Example::

        >>> c = load_corpus("stdlib")
        >>> c.info.summary()  # doctest: +SKIP
        "corpus 'stdlib': 734 documents (661 train, 73 val), 12,037,... chars, sha256 ..., Python 3.11.7"
    """
    bad_max = isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1
    if max_chars is not None and bad_max:
        raise ValueError(f"max_chars must be a positive int or None, got {max_chars!r}")
    docs, skipped, name, source = _documents(name_or_path, max_chars, extensions)
    train, val = split_documents(docs, val_fraction, seed)
    info = CorpusInfo(
        name=name,
        source=source,
        python_version=".".join(map(str, sys.version_info[:3])),
        n_documents=len(docs),
        n_train=len(train),
        n_val=len(val),
        n_chars=sum(len(d.text) for d in docs),
        sha256=_hash(docs),
        seed=seed,
        val_fraction=float(val_fraction),
        skipped=tuple(skipped),
    )
    return Corpus(train=train, val=val, info=info)
