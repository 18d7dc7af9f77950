"""How a Hugging Face checkpoint's tensors map onto posenc's: :class:`Link` (one HF tensor and the
posenc tensor(s) it holds, with the layout change between them) and :class:`Family` (one HF
architecture: its config both ways and its links).

Legend: ``h`` heads, ``d_h`` head width.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ModelConfig
from .files import HFConfig, HFWeights

__all__ = ["OLD_BUFFERS", "TOKEN_TABLE", "Family", "Link", "expand", "no_export", "norm_links"]

#: The posenc name of the token table.
TOKEN_TABLE = "decoder.embed.token.weight"


@dataclass(frozen=True)
class Link:
    """One HF tensor and the posenc tensor(s) it holds.

    Attributes:
        hf: the HF name (``{i}`` = layer index).
        posenc: the posenc name(s) (``{i}`` = layer index).
        how: ``"same"``; ``"transpose"`` (GPT-2's Conv1D stores ``[in, out]``); ``"rows"`` (the
            parts stacked along dim 0: Phi-3's ``qkv_proj``); ``"transpose_rows"`` (GPT-2's
            ``c_attn``); ``"heads"`` (per head ``[q_h; k_h; v_h]``: GPT-NeoX, Bloom).
        heads: ``h`` for ``"heads"``.
    """

    hf: str
    posenc: tuple[str, ...]
    how: str = "same"
    heads: int = 0

    def hf_shape(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The HF tensor's shape given its posenc parts' shapes."""
        if self.how == "transpose" or self.how == "transpose_rows":
            rows = sum(s[0] for s in shapes)
            return (shapes[0][1], rows) if len(shapes[0]) == 2 else (rows,)
        if self.how in ("rows", "heads"):
            return (sum(s[0] for s in shapes), *shapes[0][1:])
        return shapes[0]

    def to_posenc(self, t: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        if self.how == "same":
            return [t]
        if self.how == "transpose" or (self.how == "transpose_rows" and t.dim() == 1):
            return [t.t()] if self.how == "transpose" else list(t.split([s[0] for s in shapes]))
        if self.how == "transpose_rows":
            return list(t.t().split([s[0] for s in shapes]))
        if self.how == "rows":
            return list(t.split([s[0] for s in shapes]))
        per_head = t.unflatten(0, (self.heads, len(shapes), -1))  # [h, n, d_h, ...]
        return [per_head[:, j].flatten(0, 1) for j in range(len(shapes))]

    def to_hf(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if self.how == "same":
            return parts[0]
        if self.how == "transpose":
            return parts[0].t()
        if self.how == "transpose_rows":
            joined = torch.cat(parts)
            return joined.t() if joined.dim() == 2 else joined
        if self.how == "rows":
            return torch.cat(parts)
        return torch.stack([p.unflatten(0, (self.heads, -1)) for p in parts], dim=1).flatten(0, 2)


@dataclass(frozen=True)
class Family:
    """One HF architecture.

    Attributes:
        name: the ``model_type`` it writes (export).
        model_types: the ``model_type`` values it reads.
        config_in: ``(HFConfig, HFWeights) -> ModelConfig`` (the weights answer which biases exist).
        links: ``ModelConfig -> [Link]`` for every tensor of the model.
        config_out: ``(ModelConfig, rope options) -> config.json dict``; ``ValueError`` saying why a
            config does not fit this family.
        export_config: the config whose tensors the export writes (e.g. every bias on: missing
            posenc biases are written as zeros).
        ignore: HF name suffixes that are buffers, not weights.
        architecture: the class name HF's ``architectures`` field gets, or one per ``model_type``
            the family writes (a Llama block goes out as Mistral or Qwen2 with their classes).
    """

    name: str
    model_types: tuple[str, ...]
    config_in: Callable[[HFConfig, HFWeights], ModelConfig]
    links: Callable[[ModelConfig], list[Link]]
    config_out: Callable[[ModelConfig], dict[str, Any]]
    export_config: Callable[[ModelConfig], ModelConfig]
    architecture: str | Mapping[str, str]
    ignore: tuple[str, ...] = ()

    def architecture_of(self, model_type: str) -> str:
        """The class name written beside ``model_type`` in ``architectures``."""
        if isinstance(self.architecture, str):
            return self.architecture
        return self.architecture[model_type]


def norm_links(hf: str, posenc: str) -> list[Link]:
    """A LayerNorm's weight and bias under the two names."""
    return [Link(f"{hf}.{s}", (f"{posenc}.{s}",)) for s in ("weight", "bias")]


def no_export(name: str) -> Callable[[ModelConfig], dict[str, Any]]:
    """A ``config_out`` for a family posenc reads but does not write."""

    def refuse(cfg: ModelConfig) -> dict[str, Any]:
        raise ValueError(f"{name}: export to this family is not implemented; export reads it only")

    return refuse


#: HF name suffixes that older checkpoints saved as tensors but are buffers, not weights.
OLD_BUFFERS = (
    "attn.bias",
    "attn.masked_bias",
    "attn.embed_positions",
    "rotary_emb.inv_freq",
    "attention.bias",
    "attention.masked_bias",
)


def expand(links: list[Link], num_layers: int) -> list[Link]:
    """Links with ``{i}`` expanded for every layer."""
    out = []
    for link in links:
        if "{i}" not in link.hf:
            out.append(link)
            continue
        for i in range(num_layers):
            out.append(
                dataclasses.replace(
                    link, hf=link.hf.format(i=i), posenc=tuple(p.format(i=i) for p in link.posenc)
                )
            )
    return out
