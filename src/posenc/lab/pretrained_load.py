"""A model the lab did not train, and the text as that model reads it.

:func:`load_pretrained` reads a posenc save or a Hugging Face checkpoint folder (no network) into a
posenc ``TransformerLM``; :func:`read_text` reads a corpus as that model's ids: with the
``tokenizer.json`` beside the model (:func:`posenc.text.load_tokenizer`; nothing is downloaded) its
token ids, scored in **bits per token**; without one the UTF-8 bytes (ids 0-255), scored in **bits
per byte**, which needs a byte-level vocabulary (at most :data:`BYTE_VOCAB_LIMIT` ids: the 256 bytes
and special ids). The corpus is split by document as the lab splits it.

Shapes: token tensors are ``[n]`` (uint8 bytes or int64 token ids).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "BYTE_VOCAB_LIMIT",
    "PretrainedText",
    "checked_model",
    "load_pretrained",
    "model_tokenizer",
    "position_limit",
    "read_text",
    "trained_length",
]

#: The largest vocabulary read as bytes without a tokenizer: the 256 byte values and up to 256
#: special ids. Real subword vocabularies are far larger (GPT-2: 50,257), so a checkpoint that
#: lost its ``tokenizer.json`` is refused rather than fed bytes as if they were its tokens.
BYTE_VOCAB_LIMIT = 512


# ----------------------------------------------------------------------------------------------
# The model and its tokenizer
# ----------------------------------------------------------------------------------------------
def load_pretrained(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
):
    """A posenc model folder (:func:`posenc.model.save_model`, a training checkpoint) or a Hugging Face
    checkpoint folder, as a posenc ``TransformerLM`` in eval mode.

    Raises:
        ValueError: the path is missing, a folder holds no ``config.json``, or its ``model_type`` is
            not a family posenc reads (each message names the path and the fix).
    """
    from ..model import load_model
    from ..model.hf import from_transformers
    from ..model.hf.families import family_for
    from ..model.hf.files import read_json

    path = Path(path)
    if not path.exists():
        raise ValueError(
            f"--model {str(path)!r} does not exist; give a Hugging Face checkpoint folder or a posenc save"
        )
    config = path / "config.json"
    if path.is_dir():
        _check_regular(config, "the model's configuration")
    if path.is_dir() and not config.is_file():
        raise ValueError(
            f"--model {str(path)!r} holds no config.json; give a Hugging Face checkpoint folder "
            "(save_pretrained) or a folder written by posenc.save_model"
        )
    if path.is_dir() and "posenc_model" not in (fields := read_json(config)):
        family_for(fields.get("model_type"), str(config))  # an unknown architecture, before any weight
        return from_transformers(path, device=device, dtype=dtype)
    return load_model(path, device=device, dtype=dtype)


def model_tokenizer(path: str | os.PathLike | None):
    """The :class:`posenc.text.Tokenizer` of the ``tokenizer.json`` beside the model (``None``: the
    model has none, or ``path`` is not a folder)."""
    from ..text import load_tokenizer

    if path is None or not Path(path).is_dir() or not os.path.lexists(Path(path) / "tokenizer.json"):
        return None
    # present but unreadable: refused, since reading the text as bytes instead would score a
    # subword model on ids it never saw, under the wrong unit
    _check_regular(Path(path) / "tokenizer.json", "the model's tokenizer")
    return load_tokenizer(path)


def _check_regular(path: Path, what: str) -> None:
    """``ValueError`` when ``path`` exists (or is a link) but is not a regular file: a folder, a
    device, a pipe or a broken link. A link to a regular file is read (Hugging Face's cache links
    every file of a checkpoint)."""
    if os.path.lexists(path) and not path.is_file():
        raise ValueError(
            f"{str(path)!r} is not a regular file (a folder, a device, a pipe or a broken link), so "
            f"{what} cannot be read from it; replace it with the checkpoint's own {path.name}"
        )


def _check_finite(model, where: str) -> None:
    """``ValueError`` naming the first weight that holds NaN or an infinity (a broken checkpoint
    would otherwise be scored, or fail later with a message that names no file)."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"{where}: the weight {name!r} holds NaN or infinite values; the checkpoint is broken"
            )


def position_limit(model) -> int | None:
    """The longest input the model's positions allow (a learned table's length), else ``None``."""
    schemes = (model.decoder.embed.position, model.decoder.scheme(0))
    limits = [x for x in (getattr(s, "max_len", None) for s in schemes) if x is not None]
    return min(limits) if limits else None


def checked_model(model: Any, device: str | torch.device):
    """``(model, tokenizer)``: ``model`` (or the one saved at that path) in eval mode on
    ``device`` and the tokenizer saved with it (``None``: bytes)."""
    from ..model import TransformerLM

    tokenizer, where = None, "the model"
    if not isinstance(model, TransformerLM):
        tokenizer, where = model_tokenizer(model), f"--model {str(model)!r}"
        model = load_pretrained(model, device=device)
    _check_finite(model, where)
    vocab = model.config.vocab_size
    if tokenizer is not None and tokenizer.vocab_size > vocab:
        raise ValueError(
            f"the model's tokenizer.json has {tokenizer.vocab_size:,} ids but the model only "
            f"{vocab:,}; the folder mixes a model and another model's tokenizer"
        )
    if tokenizer is None and not 256 <= vocab <= BYTE_VOCAB_LIMIT:
        raise ValueError(
            f"the model's vocabulary has {vocab:,} ids and its folder no tokenizer.json; without "
            f"one posenc reads text as bytes (ids 0-255), which needs a byte-level model (256 to "
            f"{BYTE_VOCAB_LIMIT} ids): put the checkpoint's tokenizer.json in the folder"
        )
    return model.to(device).eval(), tokenizer


# ----------------------------------------------------------------------------------------------
# The text
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PretrainedText:
    """The corpus as the model reads it: token ids (or bytes) of its training and validation
    documents.

    Attributes:
        unit: ``"byte"`` or ``"token"`` (scores are bits per ``unit``).
        train: ``[m]`` integer ids of the training documents (uint8 bytes, or int64 tokens).
        val: ``[n]`` the same for the validation documents.
        val_names, val_starts: each validation document's name and first index in ``val``.
        summary: one line naming the corpus (and the tokenizer).
        info: the corpus record (:class:`posenc.text.CorpusInfo` as a dict).
        data_id: the corpus hash and split (what a fine-tuned model trained on).
    """

    unit: str
    train: torch.Tensor
    val: torch.Tensor
    val_names: tuple[str, ...]
    val_starts: tuple[int, ...]
    summary: str
    info: dict[str, Any]
    data_id: str


def _token_ids(docs, tokenizer) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``docs`` tokenized and joined by the corpus's document separator: ``([n] int64, starts)``."""
    from ..text.corpus import DOC_SEPARATOR

    sep = tokenizer.encode_tensor(DOC_SEPARATOR, add_special_tokens=False)
    parts, starts, at = [], [], 0
    for i, doc in enumerate(docs):
        ids = tokenizer.encode_tensor(doc.text, add_special_tokens=False)
        if i + 1 < len(docs):
            ids = torch.cat([ids, sep])
        starts.append(at)
        parts.append(ids)
        at += ids.numel()
    return (torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)), tuple(starts)


def trained_length(model) -> int:
    """``L`` from the model's config (``max_len``: Hugging Face's ``max_position_embeddings``)."""
    length = model.config.max_len
    if length is None:
        raise ValueError("the model's config holds no trained length (max_len); give it with --train-len")
    return length


def read_text(
    corpus: str | os.PathLike = "stdlib",
    tokenizer: Any = None,
    *,
    vocab_size: int | None = None,
    max_chars: int | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
) -> PretrainedText:
    """The corpus (:func:`posenc.text.load_corpus`) as bytes, or as ``tokenizer``'s ids (checked to
    be below ``vocab_size``)."""
    from ..text import load_corpus

    text = load_corpus(corpus, max_chars=max_chars, seed=split_seed, val_fraction=val_fraction)
    names = tuple(d.name for d in text.val)
    data_id = f"{text.info.sha256}:split{split_seed}"
    info = dataclasses.asdict(text.info)
    if tokenizer is None:
        summary = text.info.summary() + "; read as bytes"
        return PretrainedText(
            "byte", text.train_bytes, text.val_bytes, names, text.val_starts, summary, info, data_id
        )
    train, _ = _token_ids(text.train, tokenizer)
    val, starts = _token_ids(text.val, tokenizer)
    top = int(max(train.max() if train.numel() else 0, val.max() if val.numel() else 0))
    if vocab_size is not None and top >= vocab_size:
        raise ValueError(
            f"the tokenizer gives id {top:,} but the model has {vocab_size:,} ids; the tokenizer.json "
            "is not this model's"
        )
    per_token = text.val_bytes.numel() / max(1, val.numel())  # to turn bits per token into bits per byte
    summary = (
        f"{text.info.summary()}; {val.numel():,} validation tokens ({tokenizer.kind} tokenizer.json, "
        f"{per_token:.2f} bytes per token)"
    )
    info = {**info, "tokenizer": tokenizer.kind, "tokenizer_vocab": tokenizer.vocab_size}
    data_id = f"{data_id}:{tokenizer.kind}{tokenizer.vocab_size}"
    return PretrainedText("token", train, val, names, starts, summary, info, data_id)
