"""``posenc encode TEXT``: the input pipeline on a sentence, step by step.

Kept apart from :mod:`posenc.cli` and imported only when the command runs, so ``import posenc``
and ``posenc list`` never load ``tokenizers``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from .. import __version__

__all__ = [
    "DEFAULT_TRAIN_CHARS",
    "DEFAULT_VOCAB",
    "encode_args",
    "encode_run",
    "resolve_tokenizer",
    "tokenizer_cache_dir",
]

#: ``posenc encode`` trains its WordPiece/BPE on this many characters of the standard library's
#: documentation strings (English prose; the first files in sorted order) into a vocabulary of
#: :data:`DEFAULT_VOCAB`, so that common words are whole tokens ("The cat sat on the mat, and the
#: dog sat on the log." has no word split at Python 3.11).
DEFAULT_TRAIN_CHARS = 1_000_000
DEFAULT_VOCAB = 8000


def tokenizer_cache_dir() -> Path:
    """Where trained default tokenizers are kept: ``$XDG_CACHE_HOME/posenc/tokenizers``
    (``~/.cache/posenc/tokenizers`` when unset).

    WordPiece training breaks ties in an order that changes from process to process, so two
    trainings on the same text can number a token differently; keeping the first one makes
    ``posenc encode`` and ``posenc report`` print the same ids on a machine.
    """
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "posenc" / "tokenizers"


def _save_atomic(tok, path: Path) -> None:
    """Save ``tok`` to ``path`` through a temporary file and a rename (a reader never sees half a
    file; two writers leave one whole file). A cache that cannot be written is skipped."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tok.hf.save(tmp)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def resolve_tokenizer(spec: str, vocab_size: int = DEFAULT_VOCAB, train_chars: int = DEFAULT_TRAIN_CHARS):
    """A tokenizer from ``spec``: a kind (``wordpiece``/``bpe`` are trained on the stdlib's docstrings,
    ``byte`` needs nothing) or a path to a ``tokenizer.json`` (or a folder holding one).

    Returns ``(tokenizer, description)``.
    """
    from .corpus import load_corpus
    from .tokenizer import TOKENIZER_KINDS, build_tokenizer, load_tokenizer

    if spec == "byte":
        return build_tokenizer("byte"), "byte-level: ids 0..255 are the UTF-8 bytes (no training)"
    if spec in TOKENIZER_KINDS:
        t0 = time.perf_counter()
        corpus = load_corpus("stdlib-docs", max_chars=train_chars, val_fraction=0.0)
        info = corpus.info
        cached = tokenizer_cache_dir() / f"{spec}-V{vocab_size}-{info.sha256[:16]}-{__version__}.json"
        if cached.is_file():
            tok, how = load_tokenizer(cached), "read from the cache (trained once)"
        else:
            tok = build_tokenizer(spec, corpus.texts, vocab_size=vocab_size)
            _save_atomic(tok, cached)
            how = f"trained in {time.perf_counter() - t0:.2f} s"
        return tok, (
            f"{spec} {how} on {info.n_chars:,} chars of the Python {info.python_version} standard "
            f"library's docstrings (sha256 {info.sha256[:12]}), V={tok.vocab_size}"
        )
    path = Path(spec)
    if not path.exists():
        raise ValueError(
            f"--tokenizer {spec!r} is neither a kind ({', '.join(TOKENIZER_KINDS)}) "
            "nor an existing tokenizer.json path"
        )
    tok = load_tokenizer(path)
    return tok, f"{tok.kind} loaded from {spec}, V={tok.vocab_size}"


#: The most tokens ``posenc encode`` takes: the attention step of a bias scheme is an ``[s, s]``
#: table (a 40 KB text was a 13 GB one); 2048 tokens make it 16 MB.
MAX_ENCODE_TOKENS = 2048


def encode_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``posenc encode``."""
    p.add_argument("text", help='the text to encode, e.g. "The cat sat on the mat."')
    p.add_argument(
        "--tokenizer",
        default="wordpiece",
        help="wordpiece (default; trained on the standard library's docstrings in a few seconds), bpe, "
        "byte, or a tokenizer.json",
    )
    p.add_argument("--scheme", default="sinusoidal", help="positional scheme (default sinusoidal)")
    p.add_argument("--d-model", type=int, default=16, help="model width d (default 16)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout rate (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the dropout mask (default 0)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=DEFAULT_VOCAB,
        help=f"vocabulary size when training a tokenizer (default {DEFAULT_VOCAB})",
    )
    p.add_argument("--columns", type=int, default=6, help="dimensions printed per token (default 6)")
    p.add_argument("--digits", type=int, default=3, help="decimal digits (default 3)")
    p.add_argument("--rows", type=int, default=12, help="tokens printed per step (default 12)")
    p.add_argument("--all", action="store_true", help="print every token of every step (no row limit)")
    p.add_argument("--plot", default=None, metavar="FILE", help="write a figure of each step's [s, d] matrix")


def encode_run(args: argparse.Namespace) -> int:
    """Run ``posenc encode``; bad input raises ValueError/TypeError (the CLI prints them)."""
    from .pipeline import encode_text, format_pipeline, plot_pipeline

    if not args.text.strip():
        raise ValueError(f'TEXT is empty ({args.text!r}): give a sentence, e.g. "The cat sat on the mat."')
    if args.columns < 1 or args.digits < 0 or args.rows < 1:
        raise ValueError(
            f"--columns and --rows must be >= 1 and --digits >= 0, got {args.columns}, {args.rows} "
            f"and {args.digits}"
        )
    if args.plot:
        from .pipeline import plot_path

        plot_path(args.plot)  # checked before the tokenizer trains
    tok, how = resolve_tokenizer(args.tokenizer, vocab_size=args.vocab_size)
    count = len(tok.encode(args.text).ids)
    if count > MAX_ENCODE_TOKENS:
        raise ValueError(
            f"TEXT has {count:,} tokens; posenc encode walks through at most {MAX_ENCODE_TOKENS:,} (a scheme "
            "acting inside attention is shown as its [tokens, tokens] table): give a shorter text"
        )
    print(f"tokenizer: {how}")
    result = encode_text(
        args.text, tok, scheme=args.scheme, d_model=args.d_model, dropout=args.dropout, seed=args.seed
    )
    rows = None if args.all else args.rows
    print(format_pipeline(result, digits=args.digits, columns=args.columns, rows=rows))
    if args.plot:
        print(f"figure written to {plot_pipeline(result, args.plot)}")
    return 0
