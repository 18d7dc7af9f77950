"""Positional surgery: the same model with another positional scheme or other scheme options (a
RoPE scaling, a new original length), every other weight kept.

::

    lm = from_transformers("llama-folder")
    long = with_position(lm, {"scaling": {"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 4096}}, max_len=16384)
    long.save_pretrained("llama-yarn4")            # posenc's own format
    save_transformers(long, "llama-yarn4-hf")      # or back to Hugging Face's
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .._validate import check_int
from .transformer import TransformerLM

__all__ = ["with_position"]


def with_position(
    model: TransformerLM,
    position_options: dict[str, Any] | None = None,
    *,
    position: str | None = None,
    max_len: int | None = None,
) -> TransformerLM:
    """A copy of ``model`` whose positional scheme is rebuilt; the original is untouched.

    Args:
        model: a posenc :class:`TransformerLM`.
        position_options: with ``position`` None, merged over the model's current options (so
            ``{"scaling": {...}}`` changes the RoPE scaling alone); with a new ``position``, the new
            scheme's options.
        position: another scheme name (``posenc list``); None keeps the scheme.
        max_len: a new nominal length (``config.max_len``); None keeps it.

    Returns:
        a model of the same class, device, dtype and train/eval mode. Shapes are the model's:
        ``forward(ids [b, s]).logits -> [b, s, V]``.

    Raises:
        ValueError: options the scheme refuses (its own message), or a change that drops or adds
            trained positional parameters (e.g. learned positions to RoPE): those have no values
            to keep.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"with_position takes a posenc TransformerLM, got {type(model).__name__}")
    if position_options is not None and not isinstance(position_options, dict):
        raise TypeError(f"position_options must be a dict, got {type(position_options).__name__}")
    old = model.config
    if max_len is not None:
        check_int(max_len, "max_len")
    if position is None:
        options = {**old.position_options, **(position_options or {})}
        position = old.position
    else:
        options = dict(position_options or {})
    config = dataclasses.replace(
        old, position=position, position_options=options, max_len=old.max_len if max_len is None else max_len
    )
    weight = next(model.parameters())
    new = TransformerLM(config, device=weight.device, dtype=weight.dtype)
    _carry_weights(model, new, position)
    return new.train(model.training)


def _carry_weights(model: TransformerLM, new: TransformerLM, position: str) -> None:
    """Copy every tensor of ``model`` into ``new``; they must have the same names and shapes."""
    state, target = model.state_dict(), new.state_dict()
    if set(state) != set(target):
        added, dropped = sorted(set(target) - set(state)), sorted(set(state) - set(target))
        raise ValueError(
            f"position={position!r} changes the trained positional parameters (adds {added[:3]}, "
            f"drops {dropped[:3]}): they have no values to keep; change to a scheme with the same "
            "parameters (e.g. another RoPE scaling)"
        )
    for name, tensor in state.items():
        if tensor.shape != target[name].shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} in the model and {tuple(target[name].shape)} "
                "with the new options; keep the sizes of trained tables (max_len of learned positions)"
            )
    with torch.no_grad():
        new.load_state_dict(state)
