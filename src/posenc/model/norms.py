"""The normalisation layers of a block: LayerNorm or RMSNorm (``ModelConfig.norm_type``).

RMSNorm (Zhang and Sennrich 2019; Llama, Mistral, Qwen, Phi-3) divides by the root mean square
over the last dim and multiplies by a learned weight; it has no mean subtraction and no bias.

Legend: ``d`` the normalised width (``d_model``, or ``d_h`` for query/key norms).
"""

from __future__ import annotations

import torch
from torch import nn

from .._validate import check_int, check_positive_float
from .config import ModelConfig

__all__ = ["RMSNorm", "make_norm"]


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim: ``[..., d] -> [..., d]``.

    The statistic and the division are computed in float32 at least (float64 stays float64) and
    rounded once to the input's dtype before the weight multiplies it, as Hugging Face's
    ``LlamaRMSNorm``, so bf16 models give its bits.

    Args:
        dim: ``d``.
        eps: added to the mean square.
        device, dtype: factory kwargs of the weight (initialised to ones).
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        self.eps = check_positive_float(eps, "eps")
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"RMSNorm(dim={self.dim}) got {tuple(x.shape)}: the last dim must be {self.dim}")
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        y = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., d]
        return self.weight * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    """The norm ``config.norm_type`` over ``dim`` (default ``d_model``) with ``config.norm_eps``."""
    dim = config.d_model if dim is None else dim
    if config.norm_type == "rmsnorm":
        return RMSNorm(dim, config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps)
