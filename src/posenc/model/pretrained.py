"""``save_pretrained`` / ``from_pretrained``, the names Hugging Face users know, on posenc's model
classes: the folder of :func:`posenc.model.save_model` (``config.json`` + ``model.safetensors``),
with ``tokenizer.json`` beside them when a tokenizer is given. No pickle anywhere.

::

    lm.save_pretrained("my-model")                    # or posenc.save_model(lm, "my-model")
    lm = TransformerLM.from_pretrained("my-model")    # or posenc.load_model("my-model")
    tok = posenc.text.load_tokenizer("my-model")      # when one was saved with it
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .saving import load_model, save_model

__all__ = ["TOKENIZER_FILE", "Pretrained", "from_pretrained", "save_pretrained"]

#: The tokenizer saved beside a model (:func:`posenc.text.load_tokenizer` reads it).
TOKENIZER_FILE = "tokenizer.json"


def save_pretrained(model: torch.nn.Module, folder: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Write ``model`` into ``folder`` (:func:`~posenc.model.save_model`) and, with ``tokenizer``
    (a :class:`posenc.text.Tokenizer`), ``tokenizer.json`` beside it. Returns the folder.

    Raises:
        TypeError: ``model`` is not a posenc model, or ``tokenizer`` is not a tokenizer.
        ValueError: ``folder`` is not a place :func:`~posenc.model.save_model` may write.
    """
    if tokenizer is not None and not callable(getattr(tokenizer, "save", None)):
        raise TypeError(f"tokenizer must be a posenc.text.Tokenizer, got {type(tokenizer).__name__}")
    folder = save_model(model, folder)
    if tokenizer is not None:
        tokenizer.save(folder / TOKENIZER_FILE)
    return folder


def from_pretrained(
    folder: str | os.PathLike,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    expect: type | None = None,
) -> torch.nn.Module:
    """The model saved in ``folder`` (:func:`~posenc.model.load_model`), in eval mode on
    ``device``, in ``dtype`` (default: as saved). ``expect``: the class the caller wants
    (``ValueError`` otherwise)."""
    return load_model(folder, device=device, dtype=dtype, expect=expect)


class Pretrained:
    """``save_pretrained`` / ``from_pretrained`` methods for posenc's model classes."""

    def save_pretrained(self, folder: str | os.PathLike, tokenizer: Any = None) -> Path:
        """Write this model into ``folder``: ``config.json``, ``model.safetensors`` (and
        ``tokenizer.json`` with a tokenizer)."""
        return save_pretrained(self, folder, tokenizer)  # type: ignore[arg-type]

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
    ):
        """The model saved in ``folder`` by :meth:`save_pretrained`, in eval mode on ``device``."""
        return from_pretrained(folder, device=device, dtype=dtype, expect=cls)
