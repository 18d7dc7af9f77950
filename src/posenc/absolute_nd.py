"""Sinusoidal encodings of grid positions (image patches, video, volumes), channels last.

Each of the ``n`` spatial axes gets its own 1D sinusoidal encoding (:mod:`posenc.absolute`), and
the axes' encodings are concatenated: the convention of the ``positional-encodings`` package.

Legend: ``b`` batch, ``grid`` the spatial sizes ``(x, y)`` or ``(x, y, z)``, ``n`` their count,
``c`` channels (``d_model``).
"""

from __future__ import annotations

import math

import torch

from ._precision import angle_dtype
from ._validate import check_int, check_positive_float
from .absolute import sinusoidal_table
from .base import PositionalScheme

__all__ = ["Sinusoidal2D", "Sinusoidal3D", "SinusoidalND", "sinusoidal_nd_table"]


def sinusoidal_nd_table(
    shape: tuple[int, ...] | torch.Tensor,
    channels: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Multi-dimensional sinusoidal encoding (images, volumes), channels last.

    Each of the ``n`` axes gets its own 1D ``"vaswani"`` encoding of width
    ``c_a = 2 * ceil(channels / (2n))``; the axes' encodings are concatenated and cut to
    ``channels`` (the convention of the ``positional-encodings`` package).

    Args:
        shape: the grid size ``(x, y)`` / ``(x, y, z)``, or an integer tensor of coordinates
            ``[..., n]`` (e.g. ``[x, y, 2]``) for arbitrary grid positions.
        channels: ``c``, the channel count.

    Returns:
        ``[*shape, c]`` for a grid size, ``[..., c]`` for coordinates.
    """
    if isinstance(shape, torch.Tensor):
        coords = shape
        if coords.is_floating_point() or coords.dtype == torch.bool or coords.dim() < 1:
            raise TypeError(f"coordinates must be an integer tensor [..., n], got {coords.dtype}")
    else:
        if not isinstance(shape, (tuple, list)) or not shape:
            raise TypeError(f"shape must be a non-empty tuple of ints, got {shape!r}")
        for i, n in enumerate(shape):
            check_int(n, f"shape[{i}]")
        axes = torch.meshgrid(*(torch.arange(n) for n in shape), indexing="ij")
        coords = torch.stack(axes, dim=-1)  # [*shape, n]
    ndim = coords.shape[-1]
    check_int(channels, "channels")
    per_axis = 2 * math.ceil(channels / (2 * ndim))
    parts = [sinusoidal_table(coords[..., a], per_axis, base, dtype=dtype) for a in range(ndim)]
    return torch.cat(parts, dim=-1)[..., :channels]  # n x [..., c_a] -> [..., n c_a] -> [..., c]


class SinusoidalND(PositionalScheme):
    """Sinusoidal encoding of 2D/3D grid positions (image patches, video, volumes), channels last.

    Args:
        d_model: ``c``, the channel count.
        ndim: the number of spatial axes ``n`` (2 or 3).
        base: wavelength base.

    Shapes: ``embed(x [b, *grid, c], positions [*grid, n] | [b, *grid, n]) -> [b, *grid, c]``
    where ``grid`` is ``(x, y)`` or ``(x, y, z)``; positions default to the grid coordinates.
    """

    name = "sinusoidal_nd"
    hooks = ("embed",)
    summary = "sinusoidal per spatial axis for images and volumes, channels last"

    def __init__(self, d_model: int, ndim: int = 2, base: float = 10000.0) -> None:
        super().__init__()
        self.d_model = check_int(d_model, "d_model")
        self.ndim = check_int(ndim, "ndim")
        if self.ndim not in (2, 3):
            raise ValueError(f"ndim must be 2 or 3, got {ndim}")
        self.base = check_positive_float(base, "base")

    def embed(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != self.ndim + 2 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape [b, {', '.join('xyz'[: self.ndim])}, {self.d_model}] (channels last), "
                f"got {tuple(x.shape)}"
            )
        grid = tuple(x.shape[1:-1])
        if positions is None:
            pe = sinusoidal_nd_table(grid, self.d_model, self.base, dtype=angle_dtype(x.dtype)).to(x.device)
        else:
            if positions.shape[-1] != self.ndim or tuple(positions.shape[-1 - self.ndim : -1]) != grid:
                raise ValueError(
                    f"positions must have shape [*grid, {self.ndim}] or [b, *grid, {self.ndim}] with "
                    f"grid={grid}, got {tuple(positions.shape)}"
                )
            pe = sinusoidal_nd_table(positions, self.d_model, self.base, dtype=angle_dtype(x.dtype))
        return x + pe.to(x.dtype)  # pe: [*grid, c] float32 (float64 for float64 x)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, ndim={self.ndim}, base={self.base}"


class Sinusoidal2D(SinusoidalND):
    """:class:`SinusoidalND` for 2D grids: ``embed(x [b, x, y, c]) -> [b, x, y, c]``."""

    name = "sinusoidal_2d"
    position_dims = 2
    axis_names = ("x", "y")  # what each coordinate is (drawn by the analysis)
    summary = "sinusoidal per axis for 2D grids (image patches), channels last"

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__(d_model, 2, base)


class Sinusoidal3D(SinusoidalND):
    """:class:`SinusoidalND` for 3D grids: ``embed(x [b, x, y, z, c]) -> [b, x, y, z, c]``."""

    name = "sinusoidal_3d"
    position_dims = 3
    axis_names = ("x", "y", "z")  # what each coordinate is (drawn by the analysis)
    summary = "sinusoidal per axis for 3D grids (video, volumes), channels last"

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__(d_model, 3, base)
