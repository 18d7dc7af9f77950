"""The Hugging Face families posenc converts, in the order export tries them, and the family
that reads a ``model_type``.

Each family is where one HF architecture's choices are written down once (:mod:`posenc.model.hf.llama`,
:mod:`posenc.model.hf.gpt`, :mod:`posenc.model.hf.bloom`); the mapping machinery is in
:mod:`posenc.model.hf.links`, the shared config readers in :mod:`posenc.model.hf.fields`.
"""

from __future__ import annotations

from .bloom import BLOOM
from .gpt import GPT2, GPT_NEOX, GPTJ
from .links import Family
from .llama import LLAMA, PHI3

__all__ = ["FAMILIES", "family_for"]

#: Every family, in the order export tries them.
FAMILIES: tuple[Family, ...] = (LLAMA, GPT_NEOX, GPT2, PHI3, GPTJ, BLOOM)


def family_for(model_type: object, source: str) -> Family:
    """The family that reads ``model_type``; ``ValueError`` naming the supported ones."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = sorted(t for f in FAMILIES for t in f.model_types)
    if model_type is None:
        raise ValueError(
            f"{source} has no model_type, so it is not a Hugging Face checkpoint; a folder written by "
            "posenc's save_pretrained loads with posenc.load_model"
        )
    raise ValueError(
        f"{source}: model_type {model_type!r} is not one posenc converts; supported: {', '.join(known)}"
    )
