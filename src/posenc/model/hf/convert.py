"""Hugging Face checkpoints in and out: :func:`from_transformers` reads a ``transformers`` causal LM
(or its ``save_pretrained`` folder) into a posenc :class:`~posenc.model.TransformerLM` with the same
logits; :func:`save_transformers` writes a posenc model as a folder ``transformers`` loads, and
:func:`to_transformers` builds that ``transformers`` model in memory.

Reading and writing folders needs neither ``transformers`` nor a network: ``config.json`` and
safetensors files are read and written directly (:mod:`posenc.model.hf.files`). The families and
their weight layouts are in :mod:`posenc.model.hf.families`.

::

    lm = from_transformers("path/to/llama-folder")          # or an AutoModelForCausalLM instance
    save_transformers(lm, "exported")                       # config.json + model.safetensors
    hf = to_transformers(lm)                                 # needs transformers

Legend: ``V`` vocabulary, ``d`` model width.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from ...rotary.hf import permute_qk_weights
from ..config import ModelConfig
from ..transformer import TransformerLM
from .families import FAMILIES, family_for
from .fields import positions_out
from .files import HFConfig, HFWeights, read_hf_folder, write_hf_folder
from .links import TOKEN_TABLE, Family, expand

__all__ = ["export_state", "from_transformers", "save_transformers", "to_transformers"]


def _read(source: Any) -> tuple[HFConfig, HFWeights]:
    if isinstance(source, (str, os.PathLike)):
        return read_hf_folder(source)
    config = getattr(source, "config", None)
    if not callable(getattr(config, "to_dict", None)) or not callable(getattr(source, "state_dict", None)):
        raise TypeError(
            "from_transformers takes a Hugging Face checkpoint folder or a transformers model "
            f"(with .config and .state_dict()), got {type(source).__name__}"
        )
    name = type(source).__name__
    return HFConfig(config.to_dict(), f"{name}.config"), HFWeights(
        source.state_dict(), f"{name}.state_dict()"
    )


def _shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a posenc model of ``config`` and its shape (built on the meta device)."""
    meta = TransformerLM(config, device="meta")
    return {k: tuple(v.shape) for k, v in meta.state_dict().items()}


def _saved_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype | None:
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def from_transformers(
    source: Any, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> TransformerLM:
    """A posenc :class:`TransformerLM` that computes what a Hugging Face causal LM computes.

    Args:
        source: a folder written by ``save_pretrained`` (``config.json`` + ``model.safetensors`` or
            its shards; pickle ``.bin`` files are refused), or a ``transformers`` model object.
            Families: Llama, Mistral, Qwen2, Qwen3, Phi-3, GPT-NeoX/Pythia, GPT-2, GPT-J, Bloom.
        device: where the model is built.
        dtype: the parameters' dtype; default: the dtype the weights were saved in.

    Returns:
        the model in eval mode. Shapes: ``model(ids [b, s]).logits -> [b, s, V]``.

    Raises:
        ValueError: naming the file and the field or tensor, for a config posenc cannot reproduce
            (an unknown ``model_type`` or activation, a GPT-2 attention scaling posenc lacks) or
            weights that do not match the config (missing, extra, or of the wrong shape).
        TypeError: ``source`` is neither a folder nor a model.
    """
    config, weights = _read(source)
    family = family_for(config.get("model_type"), config.source)
    weights = HFWeights(weights.tensors, weights.source, family.ignore)
    saved = _saved_dtype(weights.tensors)
    model_config = family.config_in(config, weights)
    shapes = _shapes(model_config)
    state: dict[str, torch.Tensor] = {}
    for link in expand(family.links(model_config), model_config.num_layers):
        part_shapes = [shapes[p] for p in link.posenc]
        tensor = weights.take(link.hf, link.hf_shape(part_shapes))
        state.update(zip(link.posenc, link.to_posenc(tensor, part_shapes)))
    if model_config.tie == "output":
        head = weights.tensors.get("lm_head.weight")
        if head is not None and not torch.equal(head, state[TOKEN_TABLE]):
            raise ValueError(
                f"{config.source}: tie_word_embeddings is true (or absent, whose default is tied for "
                f"this family) but {weights.source} holds an lm_head.weight that differs from the "
                "token embedding: set tie_word_embeddings to false to keep the trained output layer"
            )
        weights.drop("lm_head.weight")  # a tied output layer saved beside the embedding
        state["lm_head.weight"] = state[TOKEN_TABLE]
    weights.finish()
    model = TransformerLM(model_config, device=device, dtype=dtype or saved)  # built in its final dtype
    model.load_state_dict(state)
    return model.eval()


def _export_family(model: TransformerLM, family: str | None) -> tuple[Family, dict[str, Any]]:
    names = [f.name for f in FAMILIES]
    if family is not None and family not in names:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(names)}")
    reasons = []
    for fam in FAMILIES:
        if family is not None and fam.name != family:
            continue
        try:
            return fam, {**fam.config_out(model.config), **positions_out(model, fam.name)}
        except ValueError as err:
            reasons.append(str(err))
    raise ValueError("this model fits no Hugging Face family posenc writes: " + "; ".join(reasons))


def export_state(
    model: TransformerLM, family: str | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``config.json`` dict and the HF-named tensors of ``model`` in the first family (or
    ``family``: ``"llama"``, ``"gpt_neox"``, ``"gpt2"``) whose architecture computes the same thing.

    Exact rewrites the export makes: absent biases of a family that always has them are written as
    zeros; a token embedding scale (``embed_scale``) is folded into the input embedding, and a tied
    output layer is then written untied (the output layer keeps the unscaled table); an interleaved
    RoPE's query/key rows are permuted to the half layout HF rotates in.

    Returns:
        ``(config, tensors)``: the ``config.json`` dict and ``{HF name: tensor}`` (e.g.
        ``model.layers.0.self_attn.q_proj.weight [h * d_h, d]``), on the model's device and dtype.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"export takes a posenc TransformerLM, got {type(model).__name__}")
    config = model.config
    fam, hf_config = _export_family(model, family)
    scale = model.decoder.embed.token.scale
    out_config = fam.export_config(config)
    if scale != 1.0 and config.tie == "output":
        out_config = dataclasses.replace(out_config, tie="none")
    dtype = model.decoder.embed.token.weight.dtype
    hf_config.update(
        architectures=[fam.architecture_of(hf_config["model_type"])],
        vocab_size=config.vocab_size,
        tie_word_embeddings=out_config.tie == "output",
        dtype=str(dtype).removeprefix("torch."),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    state = dict(model.state_dict())
    if scale != 1.0:
        state[TOKEN_TABLE] = state[TOKEN_TABLE] * scale
    if hf_config.pop("layout", "half") == "interleaved":  # HF rotates halves: permute q/k rows to match
        _to_half_layout(state, config, model.decoder.scheme(0).rotary_dim)
    shapes = _shapes(out_config)
    tensors = {}
    for link in expand(fam.links(out_config), config.num_layers):
        parts = []
        for name in link.posenc:
            if name not in state and name.endswith(".bias"):  # a bias the family has and this model lacks
                parts.append(torch.zeros(shapes[name], dtype=dtype, device=state[TOKEN_TABLE].device))
            else:
                parts.append(state[name])
        tensors[link.hf] = link.to_hf(parts)
    return hf_config, tensors


def _to_half_layout(state: dict[str, torch.Tensor], config: ModelConfig, rotary_dim: int) -> None:
    """Permute each head's query/key rows (and q/k norm weights) from the interleaved RoPE pairing
    to the half one (:func:`posenc.rotary.permute_qk_weights`): half-layout RoPE on the permuted
    weights gives the same attention logits, so the same model."""
    heads = {
        "attn.q_proj": config.num_heads,
        "attn.k_proj": config.kv_heads,
        "attn.q_norm": 1,
        "attn.k_norm": 1,
    }
    for name in list(state):
        module = ".".join(name.split(".")[-3:-1])  # decoder.blocks.0.attn.q_proj.weight -> attn.q_proj
        if module in heads:  # a norm weight is one head's d_h
            state[name] = permute_qk_weights(state[name], heads[module], to="half", rotary_dim=rotary_dim)


def save_transformers(
    model: TransformerLM, folder: str | os.PathLike, *, family: str | None = None, overwrite: bool = False
) -> Path:
    """Write ``model`` into ``folder`` as a Hugging Face checkpoint (``config.json`` +
    ``model.safetensors``) that ``AutoModelForCausalLM.from_pretrained(folder)`` loads with the same
    logits. Needs no ``transformers``. See :func:`export_state` for ``family``; a folder that
    already holds a checkpoint is refused unless ``overwrite=True``. Returns the folder."""
    config, tensors = export_state(model, family)
    return write_hf_folder(folder, config, tensors, overwrite=overwrite)


def to_transformers(model: TransformerLM, *, family: str | None = None) -> Any:
    """The ``transformers`` model (``AutoModelForCausalLM``) equal to ``model``, in eval mode.
    Needs ``transformers`` (an optional dependency); see :func:`export_state`."""
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "to_transformers needs the transformers package (pip install transformers); "
            "save_transformers(model, folder) writes the same checkpoint without it"
        ) from None
    config, tensors = export_state(model, family)
    hf_config = transformers.AutoConfig.for_model(**config)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=tensors[next(iter(tensors))].dtype)
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if hf_config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"export mismatch: missing {sorted(set(missing) - tied)[:5]}, unexpected {unexpected[:5]}"
        )
    return hf.eval()
