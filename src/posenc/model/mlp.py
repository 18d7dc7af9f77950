"""The position-wise MLP of a block: plain ``down(act(up(x)))`` or gated
``down(act(gate(x)) * up(x))`` (SwiGLU with SiLU, GeGLU with GELU; Shazeer 2020).

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``f`` hidden width (``d_ff``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig

__all__ = ["ACTIVATIONS", "MLP"]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


#: ``ModelConfig.activation`` -> the function (names described in ``posenc.model.config.ACTIVATION_NAMES``).
ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": _gelu_tanh, "silu": F.silu, "relu": F.relu}


class MLP(nn.Module):
    """Position-wise feed-forward: ``[b, s, d] -> [b, s, d]``.

    ``Linear(d, f) -> act -> Linear(f, d)``, or with ``config.gated_mlp``
    ``down(act(gate(x)) * up(x))``. ``f`` is ``config.ffn_dim``, ``act`` ``config.activation``,
    biases ``config.projection_bias("mlp")``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.projection_bias("mlp")
        self.gate = nn.Linear(config.d_model, config.ffn_dim, bias=bias) if config.gated_mlp else None
        self.up = nn.Linear(config.d_model, config.ffn_dim, bias=bias)
        self.down = nn.Linear(config.ffn_dim, config.d_model, bias=bias)
        self.act = ACTIVATIONS[config.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)  # [b, s, d] -> [b, s, f]
        h = self.act(h) if self.gate is None else self.act(self.gate(x)) * h
        return self.down(h)  # [b, s, f] -> [b, s, d]
