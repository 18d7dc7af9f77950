"""KERPLE (Chi et al. 2022): a learned conditionally positive definite kernel of the distance, added
to the attention logits (the ``score_bias`` hook).

KERPLE reads the attention bias as a kernel of the distance ``|i - j|`` between a query at position
``i`` and a key at position ``j``, and takes the two shift-invariant conditionally positive definite
(CPD) kernels of the paper, each with two learned positive scalars per head:

* **log**: ``bias_h(i, j) = -r1_h * log(1 + r2_h |i - j|)``;
* **power**: ``bias_h(i, j) = -r1_h * |i - j| ^ r2_h`` with ``0 < r2_h <= 2``.

ALiBi is the power kernel with ``r2 = 1`` and fixed ``r1``. The constraints ``r1, r2 >= 0.01``
(and ``r2 <= 2`` for the power kernel) are the paper code's: there it clamps the parameters in place
before each forward pass; here the clamped values are computed in each call (the same bias, and
nothing is written during a forward pass). Initialisation as the paper's code: log ``r1 ~ U(0, 2)``,
``r2 ~ U(0, 1)``; power ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``.

The bias depends on the distance alone, so it answers :meth:`~posenc.base.PositionalScheme.
distance_bias`, runs at any length, with a KV cache (positions are offset), packed documents
(positions restart) and left padding (positions from the mask).

Legend: ``b`` batch, ``h`` heads, ``s_q``/``s_k`` query/key lengths, ``n`` distances.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from ._alloc import factory_kwargs
from ._precision import autocast_off
from ._validate import check_int
from .base import PositionalScheme
from .bias import relative_positions

__all__ = ["KerpleLog", "KerplePower", "kerple_bias"]

#: the paper code's lower bound on both parameters
KERPLE_EPS = 0.01
#: the power kernel's exponent is CPD only up to 2
_MAX_POWER = 2.0
KERNELS = ("log", "power")


def kerple_bias(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, kernel: str) -> torch.Tensor:
    """The KERPLE bias of non-negative distances (pure function; the parameters used as given).

    Args:
        distance: float ``[...]`` distances ``|i - j| >= 0``.
        r1, r2: ``[h]`` positive parameters, in ``distance``'s dtype.
        kernel: ``"log"`` (``-r1 log(1 + r2 d)``) or ``"power"`` (``-r1 d^r2``).

    Returns:
        ``[h, ...]``: one bias per head and distance.
    """
    shape = (-1,) + (1,) * distance.dim()
    r1, r2 = r1.reshape(shape), r2.reshape(shape)  # [h, 1, ..]
    if kernel == "log":
        return -r1 * torch.log1p(r2 * distance)  # [h, 1..] * [...] -> [h, ...]
    # d^r2 at d = 0 is 0, but its gradient in r2 is 0 * log(0) = nan: raise 1 instead and put 0 back
    positive = distance > 0
    safe = torch.where(positive, distance, torch.ones_like(distance))
    return -r1 * torch.where(positive, safe.pow(r2), torch.zeros_like(safe))


class _Kerple(PositionalScheme):
    """KERPLE's shared machinery: two positive parameters per head and a kernel of the distance.

    Args:
        num_heads: ``h``.

    Parameters: ``r1 [h]``, ``r2 [h]`` (see the module docstring for the kernels, bounds and
    initialisation).

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k])
    -> [b | 1, h, s_q, s_k]`` float32 (float64 for float64 parameters);
    ``distance_bias(distance [n]) -> [h, n]``, the same values.
    """

    hooks = ("score_bias",)
    #: a positive kernel of |i - j| that grows with the distance: the bias decays, at any length
    promises: ClassVar[tuple[str, ...] | None] = ("translation_inv", "decay", "beyond_length")
    kernel: ClassVar[str] = "log"
    _init: ClassVar[tuple[float, float]] = (2.0, 1.0)  # r1 ~ U(0, a), r2 ~ U(0, b)

    def __init__(
        self,
        num_heads: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = factory_kwargs(device, dtype)
        self.num_heads = check_int(num_heads, "num_heads")
        self.r1 = nn.Parameter(torch.empty(self.num_heads, **factory))
        self.r2 = nn.Parameter(torch.empty(self.num_heads, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.r1.uniform_(0.0, self._init[0])
            self.r2.uniform_(0.0, self._init[1])

    def parameters_used(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r1, r2)`` ``[h]`` each as the bias uses them: clamped to the kernel's bounds, in float32
        (float64 for float64 parameters)."""
        dtype = torch.promote_types(self.r1.dtype, torch.float32)
        r1 = self.r1.to(dtype).clamp_min(KERPLE_EPS)
        r2 = self.r2.to(dtype).clamp(KERPLE_EPS, _MAX_POWER if self.kernel == "power" else None)
        return r1, r2

    def _bias(self, distance: torch.Tensor) -> torch.Tensor:
        """Integer ``distance`` ``[...]`` (any sign) -> ``[h, ...]``."""
        with autocast_off(distance.device):
            r1, r2 = self.parameters_used()
            return kerple_bias(distance.abs().to(r1.dtype), r1, r2, self.kernel)

    def score_bias(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, q: torch.Tensor | None = None
    ) -> torch.Tensor:
        rel = relative_positions(q_positions, k_positions)  # [b|1, s_q, s_k] = j - i, exact int64
        return self._bias(rel).transpose(0, 1)  # [h, b|1, s_q, s_k] -> [b|1, h, s_q, s_k]

    def distance_bias(self, distance: torch.Tensor) -> torch.Tensor:
        """``[n]`` distances ``j - i`` -> ``[h, n]``: :meth:`score_bias`'s values, bit for bit."""
        return self._bias(distance)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kernel={self.kernel!r}"


class KerpleLog(_Kerple):
    """KERPLE's logarithmic kernel (Chi et al. 2022): ``bias_h(i, j) = -r1_h log(1 + r2_h |i - j|)``,
    learned ``r1_h, r2_h > 0`` per head. The paper's better variant on length extrapolation.

    Args:
        num_heads: ``h``.

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k])
    -> [b | 1, h, s_q, s_k]``; ``distance_bias(distance [n]) -> [h, n]``.
    """

    name = "kerple_log"
    summary = "learned log kernel of the distance on the logits, -r1 log(1 + r2 |i-j|) (Chi et al. 2022)"
    kernel = "log"
    _init = (2.0, 1.0)


class KerplePower(_Kerple):
    """KERPLE's power kernel (Chi et al. 2022): ``bias_h(i, j) = -r1_h |i - j|^r2_h``, learned
    ``r1_h > 0`` and ``0 < r2_h <= 2`` per head (ALiBi is ``r2 = 1`` with fixed slopes).

    Args:
        num_heads: ``h``.

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k])
    -> [b | 1, h, s_q, s_k]``; ``distance_bias(distance [n]) -> [h, n]``.
    """

    name = "kerple_power"
    summary = "learned power kernel of the distance on the logits, -r1 |i-j|^r2 (Chi et al. 2022)"
    kernel = "power"
    _init = (1.0, 2.0)
