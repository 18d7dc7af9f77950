"""Absolute positional encodings: added to the input embeddings (the ``embed`` hook).

The fixed sinusoidal encoding of Vaswani et al. (2017), for position ``p`` and pair ``i``::

    PE(p, 2i)   = sin(p * w_i)        w_i = base^(-2i/d)          (variant "vaswani")
    PE(p, 2i+1) = cos(p * w_i)

The tensor2tensor/fairseq variant puts all sines first, then all cosines, with frequencies
``w_i = base^(-i/(d/2 - 1))`` so that the lowest frequency is exactly ``1/base``::

    PE(p) = [sin(p w_0), ..., sin(p w_{d/2-1}), cos(p w_0), ..., cos(p w_{d/2-1})]

Both are computed on the fly from integer positions in float32 (float64 on request) with
autocast off, so there is no ``max_len`` wall and a bf16 model keeps every position distinct.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width (``d_model``), ``...`` any leading
dims of the positions tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ._alloc import check_allocation, factory_kwargs
from ._precision import angle_dtype, autocast_off, gather_kept, position_angles, wide_dtype
from ._validate import check_choice, check_int, check_positive_float
from .base import PositionalScheme
from .positions import resolve_positions

__all__ = [
    "SINUSOIDAL_VARIANTS",
    "LearnedPE",
    "NoPE",
    "ScaledSinusoidalPE",
    "SinusoidalPE",
    "sinusoidal_frequencies",
    "sinusoidal_table",
]


# ----------------------------------------------------------------------------------------------
# Pure functions
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SinusoidalVariant:
    """One sinusoidal convention: how frequencies are spaced and how sin/cos are laid out."""

    exponents: Callable[[int], torch.Tensor]  # half -> [half] exponents e_i, w_i = base^(-e_i)
    interleaved: bool  # True: [sin0, cos0, sin1, cos1, ...]; False: [sin..., cos...]
    min_dim: int
    reference: str


def _vaswani_exponents(half: int) -> torch.Tensor:
    return torch.arange(half, dtype=torch.float64, device="cpu") * 2.0 / (2 * half)  # 2i/d


def _t2t_exponents(half: int) -> torch.Tensor:
    return torch.arange(half, dtype=torch.float64, device="cpu") / (half - 1)  # i/(d/2 - 1)


SINUSOIDAL_VARIANTS: dict[str, SinusoidalVariant] = {
    "vaswani": SinusoidalVariant(
        _vaswani_exponents,
        interleaved=True,
        min_dim=2,
        reference="Vaswani et al. 2017, section 3.5 (and the seeds): sin/cos interleaved",
    ),
    "tensor2tensor": SinusoidalVariant(
        _t2t_exponents,
        interleaved=False,
        min_dim=4,
        reference="tensor2tensor get_timing_signal_1d / fairseq SinusoidalPositionalEmbedding: "
        "[sin | cos] concatenated",
    ),
}


def sinusoidal_frequencies(
    dim: int,
    base: float = 10000.0,
    variant: str = "vaswani",
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Angular frequencies ``w_i`` (radians per position) of a sinusoidal encoding.

    Args:
        dim: ``d``, the encoding width (even).
        base: the wavelength base (10000 in the paper).
        variant: ``"vaswani"`` (``w_i = base^(-2i/d)``) or ``"tensor2tensor"``
            (``w_i = base^(-i/(d/2-1))``).

    Returns:
        ``[d/2]`` tensor, from 1 (wavelength 2*pi, dimension 0) down to about ``1/base``.
    """
    spec = SINUSOIDAL_VARIANTS[check_choice(variant, "variant", SINUSOIDAL_VARIANTS)]
    check_int(dim, "dim", minimum=spec.min_dim, even=True)
    base = check_positive_float(base, "base")
    # Exponents in float64 on the CPU (tiny), then cast: the frequencies are exact to float32 rounding.
    inv_freq = torch.exp(-spec.exponents(dim // 2) * math.log(base))  # [d/2]
    return inv_freq.to(device=device, dtype=dtype)


def sinusoidal_table(
    positions: int | torch.Tensor,
    dim: int,
    base: float = 10000.0,
    variant: str = "vaswani",
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The sinusoidal encoding of the given positions.

    Args:
        positions: an int ``n`` (positions ``0..n-1``) or an integer tensor ``[...]`` of any shape,
            e.g. ``[s]`` or ``[b, s]``. Any integer position works: there is no ``max_len``.
        dim: ``d``, the encoding width (even; >= 4 for ``"tensor2tensor"``).
        base: wavelength base, 10000 in the paper.
        variant: ``"vaswani"`` (interleaved sin/cos, the paper and the seeds) or
            ``"tensor2tensor"`` (``[sin | cos]``, tensor2tensor and fairseq).
        dtype: dtype of the result. Angles are computed in float32 (float64 if ``dtype`` is
            float64) with autocast off, and cast at the end.

    Returns:
        ``[..., d]``: ``[n, d]`` for an int, ``positions.shape + (d,)`` for a tensor.
    """
    if isinstance(positions, bool):
        raise TypeError("positions must be an int or an integer tensor, got bool")
    if isinstance(positions, int):
        if positions < 0:
            raise ValueError(f"positions as an int is a count and must be >= 0, got {positions}")
        positions = torch.arange(positions)
    elif not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be an int or an integer tensor, got {type(positions).__name__}")
    elif positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(
            f"positions must be an integer tensor, got dtype {positions.dtype}; pass e.g. positions.long()"
        )
    spec = SINUSOIDAL_VARIANTS[check_choice(variant, "variant", SINUSOIDAL_VARIANTS)]
    adt = angle_dtype(dtype)
    # float64 frequencies: a float32-rounded frequency times a position near 2^24 is off by a radian
    wide = wide_dtype(positions.device)
    inv_freq = sinusoidal_frequencies(dim, base, variant, dtype=wide, device=positions.device)
    with autocast_off(positions.device):
        angles = position_angles(positions, inv_freq, adt)  # [...] x [d/2] -> [..., d/2], any position
        # sin and cos of the contiguous angles, then one copy into the table's layout: writing
        # them straight into strided columns (out=) ran 1.3-2.6x slower on an AVX2 host
        sin, cos = torch.sin(angles), torch.cos(angles)  # [..., d/2] each
        if spec.interleaved and angles.device.type == "cpu" and not torch.compiler.is_compiling():
            # (sin, cos) as the real and imaginary parts: one vectorized pass, 3x faster than stack
            pairs = torch.view_as_real(torch.complex(sin, cos))  # [..., d/2, 2], the angles' strides
            return pairs.flatten(-2).to(dtype).contiguous()  # [..., d/2, 2] -> [..., d]
        if spec.interleaved:
            return torch.stack((sin, cos), dim=-1).flatten(-2).to(dtype)  # [..., d/2, 2] -> [..., d]
        return torch.cat((sin, cos), dim=-1).to(dtype)  # [..., d/2] ++ [..., d/2] -> [..., d]


def init_table_(weight: torch.Tensor, std: float, padding_idx: int | None = None) -> None:
    """Initialise an embedding table ``[n, d]`` in place from ``N(0, std^2)``, with row
    ``padding_idx`` (if any) set to zero. Shared by learned positions and token embeddings."""
    nn.init.normal_(weight, std=std)
    if padding_idx is not None:
        with torch.no_grad():
            weight[padding_idx].zero_()


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------
class NoPE(PositionalScheme):
    """No positional encoding at all (Kazemnejad et al. 2023): a causal mask alone orders tokens."""

    name = "nope"
    hooks = ()
    summary = "no positional information; a causal decoder still infers order from its mask"

    def __init__(self) -> None:
        super().__init__()


class SinusoidalPE(PositionalScheme):
    """Fixed sinusoidal encoding added to the input (Vaswani et al. 2017).

    Args:
        d_model: ``d``, the model width (even).
        base: wavelength base (10000).
        variant: ``"vaswani"`` (interleaved, the paper) or ``"tensor2tensor"`` (``[sin | cos]``).
        precompute: ``n > 0`` computes the rows of positions ``0..n-1`` when the module is built
            and whenever it moves or is cast (float32; float64 in a float64 module); inputs of up
            to ``n`` tokens at the default positions read them, and explicit positions inside
            ``0..n-1`` (a model's) gather them on CPU in eager mode: the same numbers without a
            per-call ``sin``/``cos``, for ``n * d`` floats of memory. Default 0: nothing is kept.

    Shapes: ``embed(x [b, s, d], positions [s] | [b, s]) -> [b, s, d]``.
    """

    name = "sinusoidal"
    hooks = ("embed",)
    additive_table = True
    summary = "fixed sin/cos of position (Vaswani 2017), added to the input; any length"

    def __init__(
        self, d_model: int, base: float = 10000.0, variant: str = "vaswani", precompute: int = 0
    ) -> None:
        super().__init__()
        spec = SINUSOIDAL_VARIANTS[check_choice(variant, "variant", SINUSOIDAL_VARIANTS)]
        self.d_model = check_int(d_model, "d_model", minimum=spec.min_dim, even=True)
        self.base = check_positive_float(base, "base")
        self.variant = variant
        self.precompute = check_int(precompute, "precompute", minimum=0)
        rows = self._precomputed(torch.get_default_device(), torch.float32)  # [n, d] or None; meta is fine
        self.register_buffer("rows", rows, persistent=False)  # read in forward, never written there

    def _precomputed(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Rows ``[n, d]`` of positions ``0..n-1`` at a table's precision for ``dtype``, or None."""
        if not self.precompute:
            return None
        fix = "pass a smaller precompute (0 computes the table in each call)"
        check_allocation((self.precompute, self.d_model), dtype, "precomputed rows", fix, device=device)
        dtype = angle_dtype(dtype)
        return self.table(torch.arange(self.precompute, device=device), dtype).to(dtype)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        """Move or cast as usual, then recompute the rows where they now are (a cast would round
        float32 rows to bf16; a table keeps float32 in a bf16 model)."""
        super()._apply(fn, recurse)
        if self.rows is not None:
            self.rows = self._precomputed(self.rows.device, self.rows.dtype)
        return self

    def _pe(self, positions: torch.Tensor | None, like: torch.Tensor, batch: int | None) -> torch.Tensor:
        """The table ``[s, d]`` (or ``[b, s, d]`` for ``[b, s]`` positions) that ``like``
        ``[b, s, d]`` gets, at the precision of its dtype: the precomputed rows where they serve."""
        s, rows = like.shape[1], self.rows
        usable = rows is not None and rows.device == like.device and rows.dtype == angle_dtype(like.dtype)
        if positions is None and usable and s <= rows.shape[0]:  # the table's precision
            return rows[:s]  # [n, d] -> [s, d], a view
        pos = resolve_positions(positions, s, like.device, batch=batch)
        picked = gather_kept(rows, pos) if usable and positions is not None else None  # [..., d]
        return self.table(pos, like.dtype) if picked is None else picked

    def table(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The encoding ``[..., d]`` of integer positions ``[...]``, in float32 (float64 angles and
        values when ``dtype`` is float64)."""
        return sinusoidal_table(positions, self.d_model, self.base, self.variant, dtype=angle_dtype(dtype))

    def _check_width(self, x: torch.Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape [b, s, {self.d_model}], got {tuple(x.shape)}")

    def embed(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        self._check_width(x)
        return x + self._pe(positions, x, x.shape[0]).to(x.dtype)  # [b, s, d] + ([s, d] | [b, s, d])

    def additive_rows(self, like: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        self._check_width(like)
        return self._pe(positions, like, None).to(like.dtype)  # [s, d]: what embed adds

    def extra_repr(self) -> str:
        extra = f", precompute={self.precompute}" if self.precompute else ""
        return f"d_model={self.d_model}, base={self.base}, variant={self.variant!r}{extra}"


class ScaledSinusoidalPE(SinusoidalPE):
    """Sinusoidal encoding times one learned scalar gain (Hua et al. 2022, "FLASH").

    Args:
        d_model, base, variant, precompute: as :class:`SinusoidalPE`.
        init_gain: the gain's initial value; default ``d_model ** -0.5`` as in Hua et al. and
            x-transformers. Use 1.0 to start from the plain sinusoidal encoding.

    Shapes: ``embed(x [b, s, d], positions [s] | [b, s]) -> [b, s, d]``.
    """

    name = "scaled_sinusoidal"
    hooks = ("embed",)
    summary = "sinusoidal times a learned scalar gain (Hua et al. 2022)"

    def __init__(
        self,
        d_model: int,
        base: float = 10000.0,
        variant: str = "vaswani",
        init_gain: float | None = None,
        *,
        precompute: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(d_model, base, variant, precompute)
        if self.rows is not None and (device is not None or dtype is not None):  # where the gain lives
            target = torch.device(device) if device is not None else self.rows.device
            self.rows = self._precomputed(target, dtype or self.rows.dtype)
        gain = d_model**-0.5 if init_gain is None else check_positive_float(init_gain, "init_gain")
        self.gain = nn.Parameter(torch.tensor(float(gain), **factory_kwargs(device, dtype)))

    def embed(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        self._check_width(x)
        table = self._pe(positions, x, x.shape[0])  # float32, float64 for a float64 model
        return x + (table * self.gain.to(table.dtype)).to(x.dtype)

    def additive_rows(self, like: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        self._check_width(like)
        table = self._pe(positions, like, None)
        return (table * self.gain.to(table.dtype)).to(like.dtype)  # [s, d]: what embed adds


class LearnedPE(PositionalScheme):
    """Learned absolute position embeddings (BERT, GPT-2): one trained vector per position.

    Args:
        d_model: ``d``, the model width.
        max_len: the number of positions in the table; positions must be in ``[0, max_len)``.
            Learned positions cannot extrapolate: a longer input raises ``ValueError``.
        init_std: std of the normal initialisation (0.02, as BERT).
        padding_idx: fairseq's convention: when given, position ``p`` uses row
            ``p + padding_idx + 1`` and row ``padding_idx`` is a zero, untrained padding row, so
            fairseq/RoBERTa-style tables (``max_len + padding_idx + 1`` rows) load directly.

    Shapes: ``embed(x [b, s, d], positions [s] | [b, s]) -> [b, s, d]``.
    """

    name = "learned"
    hooks = ("embed",)
    additive_table = True
    summary = "a trained vector per position (BERT, GPT-2); cannot run past max_len"

    def __init__(
        self,
        d_model: int,
        max_len: int,
        init_std: float = 0.02,
        padding_idx: int | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = factory_kwargs(device, dtype)
        self.d_model = check_int(d_model, "d_model")
        self.max_len = check_int(max_len, "max_len")
        self.init_std = check_positive_float(init_std, "init_std")
        if padding_idx is not None:
            check_int(padding_idx, "padding_idx", minimum=0)
        self.padding_idx = padding_idx
        self.offset = 0 if padding_idx is None else padding_idx + 1
        shape = (self.max_len + self.offset, self.d_model)
        check_allocation(
            shape, dtype, f"max_len={max_len}, d_model={d_model}", "use a smaller max_len", device=device
        )
        self.weight = nn.Parameter(torch.empty(shape, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_table_(self.weight, self.init_std, self.padding_idx)

    def _past_table(self, what: str) -> ValueError:
        return ValueError(
            f"{what} is past the learned position table (max_len={self.max_len}): learned positions "
            "cannot extrapolate. Build it with a larger max_len, or use a scheme that runs at any "
            "length (sinusoidal, rope, alibi, t5)."
        )

    def lookup(self, positions: torch.Tensor) -> torch.Tensor:
        """Rows for integer positions ``[...]`` -> ``[..., d]``."""
        # Values are checked where they exist: a meta tensor (shape-only) and a compiled graph have none.
        if not torch.compiler.is_compiling() and not positions.is_meta and positions.numel():
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0:
                raise ValueError(f"positions must be >= 0 for learned embeddings, got {lo}")
            if hi >= self.max_len:
                raise self._past_table(f"position {hi}")
        return nn.functional.embedding(positions + self.offset, self.weight, self.padding_idx)

    def embed(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape [b, s, {self.d_model}], got {tuple(x.shape)}")
        if positions is None and x.shape[1] > self.max_len:  # a shape check: also holds under compile
            raise self._past_table(f"sequence length {x.shape[1]}")
        pos = resolve_positions(positions, x.shape[1], x.device, batch=x.shape[0])
        return x + self.lookup(pos).to(x.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, padding_idx={self.padding_idx}"
