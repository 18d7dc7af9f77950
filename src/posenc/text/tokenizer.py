"""Tokenizers: text -> token ids, on Hugging Face ``tokenizers`` (nothing hand-written, nothing downloaded).

Three kinds, in the registry :data:`TOKENIZER_KINDS`:

=============  ==========================================================================
kind           what it is
=============  ==========================================================================
``wordpiece``  BERT-style WordPiece: lowercase, accents stripped, ``[PAD] [UNK] [CLS] [SEP]
               [MASK]``, a post-processor that wraps every sequence as ``[CLS] ... [SEP]``.
               Trained on any iterable of texts.
``bpe``        GPT-2-style byte-level BPE: every UTF-8 byte is in the base alphabet, so no
               ``[UNK]`` is ever needed. Trained on any iterable of texts.
``byte``       one id per UTF-8 byte (ids 0..255 are the byte values), optional special tokens
               from id 256 on. Needs no training and round-trips any text.
=============  ==========================================================================

Every kind is a :class:`Tokenizer` (encode -> ids and tokens, decode, ``vocab_size``,
``token_to_id``, ``save``), saved as a standard ``tokenizer.json`` that
:func:`load_tokenizer` (and ``tokenizers.Tokenizer.from_file``) reads back.

Shapes: :meth:`Tokenizer.encode_tensor` returns ids ``[s]`` (int64), ``s`` = number of tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._validate import check_int

__all__ = [
    "BERT_SPECIAL_TOKENS",
    "TOKENIZER_KINDS",
    "Encoding",
    "Tokenizer",
    "build_tokenizer",
    "byte_symbols",
    "byte_tokenizer",
    "load_tokenizer",
    "train_bpe",
    "train_wordpiece",
]

#: The special tokens of a BERT-style WordPiece vocabulary, in id order (ids 0..4).
BERT_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


#: The largest vocabulary trained here: the Rust trainer aborts the process (no Python error) on
#: absurd sizes such as 10^9, and real tokenizers stay well below (Gemma: 256k).
MAX_TRAINED_VOCAB = 1_000_000


def _check_vocab_cap(vocab_size: int) -> None:
    if vocab_size > MAX_TRAINED_VOCAB:
        raise ValueError(
            f"vocab_size={vocab_size:,} is larger than {MAX_TRAINED_VOCAB:,}; train a smaller "
            "vocabulary (a corpus rarely supports even 100,000 tokens)"
        )


def _hf() -> Any:
    """The ``tokenizers`` package, or an ImportError saying how to install it."""
    try:
        import tokenizers
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "posenc.text tokenizers need the `tokenizers` package: pip install 'posenc[text]'"
        ) from err
    return tokenizers


@dataclass(frozen=True)
class Encoding:
    """One encoded text: ``ids[i]`` is the id of ``tokens[i]`` (special tokens included)."""

    ids: list[int]
    tokens: list[str]

    def __len__(self) -> int:
        return len(self.ids)


class Tokenizer:
    """A thin wrapper over a ``tokenizers.Tokenizer`` giving every kind the same small interface.

    Args:
        hf: the Hugging Face tokenizer.
        kind: a key of :data:`TOKENIZER_KINDS` (``"wordpiece"``, ``"bpe"``, ``"byte"``).

    Build one with :func:`train_wordpiece`, :func:`train_bpe`, :func:`byte_tokenizer`,
    :func:`build_tokenizer` or :func:`load_tokenizer` rather than directly.
    """

    def __init__(self, hf: Any, kind: str) -> None:
        if kind not in TOKENIZER_KINDS:
            raise ValueError(f"unknown tokenizer kind {kind!r}; valid kinds: {', '.join(TOKENIZER_KINDS)}")
        self.hf = hf
        self.kind = kind

    # -- encoding ------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        """``text`` -> :class:`Encoding` (ids and tokens). WordPiece adds ``[CLS] ... [SEP]``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            enc = self.hf.encode(text, add_special_tokens=add_special_tokens)
        except BaseException as err:  # a Rust panic (PanicException derives from BaseException)
            if type(err).__name__ != "PanicException":
                raise
            raise ValueError(
                f"the tokenizer failed on this text ({str(err).splitlines()[0][:200]}); its pre-tokenizer "
                "(e.g. a Split regex) cannot run on it: use another tokenizer.json"
            ) from None
        return Encoding(ids=list(enc.ids), tokens=list(enc.tokens))

    def encode_tensor(self, text: str, add_special_tokens: bool = True) -> torch.Tensor:
        """``text`` -> ids ``[s]`` as an int64 tensor."""
        return torch.tensor(self.encode(text, add_special_tokens).ids, dtype=torch.long)

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        """ids ``[s]`` -> text. Byte-level kinds give back the exact text they encoded."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """``V``: the number of ids, special tokens included (ids lie in ``[0, V)``)."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``, or ``None`` if it is not in the vocabulary."""
        return self.hf.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        """The token of id ``index``, or ``None`` outside the vocabulary."""
        return self.hf.id_to_token(index)

    @property
    def special_tokens(self) -> list[str]:
        """The special tokens (``[CLS]``, ...), in id order."""
        added = self.hf.get_added_tokens_decoder()
        return [tok.content for _, tok in sorted(added.items()) if tok.special]

    @property
    def pad_id(self) -> int | None:
        """The id of ``[PAD]`` if the vocabulary has one."""
        return self.token_to_id("[PAD]")

    # -- files ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` to ``path`` (a file path, or a directory to put it in)."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        # a temporary file renamed over the name: atomic, and a symbolic link at ``path`` is
        # replaced, never written through (its target may lie outside the folder)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            self.hf.save(str(tmp))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"


# ---------------------------------------------------------------------------------------------
# Builders (the registry's entries)
# ---------------------------------------------------------------------------------------------
def _check_texts(texts: Iterable[str], name: str = "texts") -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError(
            f"{name} must be an iterable of str (documents), not a single "
            f"{type(texts).__name__}; wrap it in a list"
        )
    out = list(texts)
    bad = next((i for i, t in enumerate(out) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}] must be a str, got {type(out[bad]).__name__}")
    if not any(t.strip() for t in out):
        raise ValueError(f"{name} is empty (no non-blank text): a tokenizer needs text to train on")
    return out


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 4000,
    *,
    min_frequency: int = 2,
    lowercase: bool = True,
) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer on ``texts``.

    Lowercases and strips accents (BERT's normaliser), splits on whitespace and punctuation,
    continues words with ``##`` pieces, and wraps every encoded sequence as ``[CLS] ... [SEP]``
    (pairs as ``[CLS] a [SEP] b [SEP]``). Special ids: ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``,
    then the other tokens in code-point order.

    Caveat (measured): Hugging Face's trainer breaks ties between equally frequent merges in
    hash-map order, which changes from process to process; on a 2 MB stdlib subset with a 4000
    vocabulary about 2 tokens differ between runs. For exact reproducibility, save the tokenizer
    and load it. :func:`train_bpe` and :func:`byte_tokenizer` are deterministic.

    Args:
        texts: the training documents.
        vocab_size: the target vocabulary size (the result may be smaller on a tiny corpus).
        min_frequency: a merge must occur at least this often.
        lowercase: lowercase the text first (BERT uncased).
    """
    hf = _hf()
    texts = _check_texts(texts)
    check_int(vocab_size, "vocab_size", minimum=len(BERT_SPECIAL_TOKENS) + 1)
    _check_vocab_cap(vocab_size)
    check_int(min_frequency, "min_frequency")
    tok = hf.Tokenizer(hf.models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = hf.normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    tok.pre_tokenizer = hf.pre_tokenizers.BertPreTokenizer()
    tok.decoder = hf.decoders.WordPiece(prefix="##")
    trainer = hf.trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BERT_SPECIAL_TOKENS),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # The trainer numbers tokens in hash-map order, so the same corpus gives different ids from run
    # to run. WordPiece's greedy longest-match only looks at the token set, so renumber: special
    # tokens first (ids 0..4), then the rest in code-point order. Same set -> same ids.
    vocab = tok.get_vocab()
    rest = sorted(t for t in vocab if t not in BERT_SPECIAL_TOKENS)
    tok.model = hf.models.WordPiece(
        vocab={t: i for i, t in enumerate([*BERT_SPECIAL_TOKENS, *rest])}, unk_token="[UNK]"
    )
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = hf.processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return Tokenizer(tok, "wordpiece")


def train_bpe(
    texts: Iterable[str],
    vocab_size: int = 4000,
    *,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = ("<|endoftext|>",),
) -> Tokenizer:
    """Train a GPT-2-style byte-level BPE tokenizer on ``texts``.

    The 256 byte symbols are always in the vocabulary, so any text encodes without ``[UNK]`` and
    decodes back exactly. No post-processor: nothing is added around a sequence.

    Args:
        texts: the training documents.
        vocab_size: the target size (>= 256 + number of special tokens).
        min_frequency: a merge must occur at least this often.
        special_tokens: added first, with ids ``0..len-1``.
    """
    hf = _hf()
    texts = _check_texts(texts)
    check_int(
        vocab_size,
        "vocab_size",
        minimum=256 + len(special_tokens),
        hint=" (a byte-level BPE holds all 256 bytes plus its special tokens)",
    )
    _check_vocab_cap(vocab_size)
    check_int(min_frequency, "min_frequency")
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return Tokenizer(tok, "bpe")


def byte_symbols() -> list[str]:
    """The printable stand-in character of each byte, indexed by byte value (GPT-2's table).

    The ``ByteLevel`` pre-tokenizer replaces every byte of the text by one printable character:
    bytes that are printable Latin-1 (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for
    themselves, the other 68 take ``chr(256 + n)`` in byte order. The tests check this table
    against the library's own ``ByteLevel.alphabet()`` and its pre-tokenizer output.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def byte_tokenizer(special_tokens: Sequence[str] = ()) -> Tokenizer:
    """A tokenizer with one id per UTF-8 byte: ids ``0..255`` are the byte values; no training.

    Args:
        special_tokens: optional extra tokens, ids ``256, 257, ...`` (they are matched in the
            input text, so pick strings that do not occur in it, e.g. ``"<|bos|>"``).

    ``decode(encode(t).ids) == t`` for every str ``t`` (tested with hypothesis).
    """
    hf = _hf()
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a sequence of str, e.g. ['<|bos|>'], not a single str")
    vocab = {sym: b for b, sym in enumerate(byte_symbols())}  # stand-in char -> byte value = id
    tok = hf.Tokenizer(hf.models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = hf.decoders.ByteLevel()
    if special_tokens:
        tok.add_special_tokens(list(special_tokens))
    return Tokenizer(tok, "byte")


#: kind -> builder. ``wordpiece`` and ``bpe`` take ``(texts, vocab_size=..., ...)``; ``byte`` takes
#: only optional ``special_tokens``.
TOKENIZER_KINDS: dict[str, Callable[..., Tokenizer]] = {
    "wordpiece": train_wordpiece,
    "bpe": train_bpe,
    "byte": byte_tokenizer,
}

_TRAINED = ("wordpiece", "bpe")


def build_tokenizer(kind: str, texts: Iterable[str] | None = None, **options: Any) -> Tokenizer:
    """Build a tokenizer of ``kind`` (a key of :data:`TOKENIZER_KINDS`).

    ``wordpiece`` and ``bpe`` are trained on ``texts``; ``byte`` needs none.
    """
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; valid kinds: {', '.join(TOKENIZER_KINDS)}")
    if kind in _TRAINED:
        if texts is None:
            raise ValueError(
                f"tokenizer kind {kind!r} is trained: pass texts=[...] (e.g. load_corpus('stdlib').texts)"
            )
        return TOKENIZER_KINDS[kind](texts, **options)
    if texts is not None:
        raise ValueError(f"tokenizer kind {kind!r} needs no training; do not pass texts")
    return TOKENIZER_KINDS[kind](**options)


def _kind_of(hf_tok: Any) -> str:
    """Tell the kind of a loaded tokenizer from its model and pre-tokenizer."""
    spec = json.loads(hf_tok.to_str())
    model = (spec.get("model") or {}).get("type")
    if model == "WordPiece":
        return "wordpiece"
    if model == "BPE":
        pre = spec.get("pre_tokenizer") or {}
        if pre.get("type") == "ByteLevel" and not spec["model"].get("merges"):
            return "byte"
        return "bpe"
    raise ValueError(
        f"unsupported tokenizer model {model!r}: posenc reads WordPiece and BPE tokenizer.json files"
    )


#: The largest tokenizer.json read (bytes): real ones are a few MB (a 256k vocabulary: ~35 MB).
MAX_TOKENIZER_FILE = 256 * 2**20
#: Ids of a loaded tokenizer stay below this: ``tokenizers`` builds a table up to the largest id,
#: so one id of 10^9 in a file would cost gigabytes (real vocabularies: up to ~256k).
MAX_TOKEN_ID = 1 << 22
#: The longest fixed padding or truncation length a loaded tokenizer may ask for.
MAX_TOKENIZER_LENGTH = 1 << 20


def _in_range(value: Any, top: int) -> bool:
    """``value`` is an int (not a bool) in ``[0, top]``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def _check_tokenizer_spec(spec: Any, where: str) -> None:
    """Refuse what would make ``tokenizers`` allocate without bound or abort: ids past
    :data:`MAX_TOKEN_ID`, fixed padding or truncation past :data:`MAX_TOKENIZER_LENGTH`, fields of
    the wrong type. Each error names the file and the field."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must hold a JSON object, got {type(spec).__name__}")
    model = spec.get("model")
    if model is None:
        raise ValueError(f"{where} is not a valid tokenizer.json: it has no 'model'")
    if not isinstance(model, dict):
        raise ValueError(f"{where}: 'model' must be an object, got {type(model).__name__}")
    vocab = model.get("vocab", {})
    ids = vocab.values() if isinstance(vocab, dict) else None
    if ids is None:
        raise ValueError(
            f"{where}: 'model.vocab' must be an object of token -> id, got {type(vocab).__name__}"
        )
    added = spec.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise ValueError(f"{where}: 'added_tokens' must be a list of objects")
    for field, values in (("model.vocab", list(ids)), ("added_tokens[].id", [t.get("id") for t in added])):
        bad = [v for v in values if not _in_range(v, MAX_TOKEN_ID - 1)]
        if bad:
            raise ValueError(
                f"{where}: '{field}' holds the id {bad[0]!r}; ids are ints in [0, {MAX_TOKEN_ID:,})"
            )
    for field in ("padding", "truncation"):
        part = spec.get(field)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise ValueError(f"{where}: '{field}' must be an object or null, got {type(part).__name__}")
        strategy = part.get("strategy")
        lengths = [part.get("max_length")] if field == "truncation" else []
        if isinstance(strategy, dict):
            lengths.append(strategy.get("Fixed"))
        for n in lengths:
            if n is not None and not _in_range(n, MAX_TOKENIZER_LENGTH):
                raise ValueError(
                    f"{where}: '{field}' asks for length {n!r}; posenc reads lengths up to "
                    f"{MAX_TOKENIZER_LENGTH:,}"
                )


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Read a ``tokenizer.json`` (a file, or a directory holding one) written by :meth:`Tokenizer.save`
    or by Hugging Face ``tokenizers``.

    The file is checked before ``tokenizers`` reads it: at most :data:`MAX_TOKENIZER_FILE` bytes,
    JSON nested at most 32 deep, ids below :data:`MAX_TOKEN_ID`, padding and truncation lengths
    at most :data:`MAX_TOKENIZER_LENGTH`.

    Raises:
        ValueError: the path does not exist, or the file is not a valid tokenizer.json; the
            message names the path.
    """
    from ..model.io import parse_json

    hf = _hf()
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ValueError(
            f"tokenizer file {str(path)!r} does not exist; train one and save it, "
            "or use a built-in kind: " + ", ".join(TOKENIZER_KINDS)
        )
    size = path.stat().st_size
    if size > MAX_TOKENIZER_FILE:
        raise ValueError(
            f"tokenizer file {str(path)!r} is {size:,} bytes; posenc reads tokenizer.json files up to "
            f"{MAX_TOKENIZER_FILE:,} bytes"
        )
    text = path.read_bytes()
    where = f"tokenizer file {str(path)!r}"
    _check_tokenizer_spec(parse_json(text, where), where)
    try:
        hf_tok = hf.Tokenizer.from_str(text.decode("utf-8"))
    except Exception as err:  # the Rust side raises a plain Exception for bad JSON/schema
        raise ValueError(f"{where} is not a valid tokenizer.json: {err}") from None
    try:
        kind = _kind_of(hf_tok)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return Tokenizer(hf_tok, kind)
