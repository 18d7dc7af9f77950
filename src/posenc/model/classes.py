"""The model classes a saved file can name, by class name (filled by :func:`register_model`).

A leaf module: the savers and loaders read this registry instead of importing the models.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["MODEL_CLASSES", "register_model"]

#: The model classes :func:`posenc.model.load_model` can rebuild, by name.
MODEL_CLASSES: dict[str, type] = {}

T = TypeVar("T", bound=type)


def register_model(cls: T) -> T:
    """Class decorator: make ``cls`` loadable by its name from a saved file."""
    MODEL_CLASSES[cls.__name__] = cls
    return cls
