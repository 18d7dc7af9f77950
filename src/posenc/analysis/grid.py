"""Schemes of grid positions (image patches, video, volumes) seen on their grid.

A scheme whose positions are coordinates (``position_dims`` = ``D`` > 1: 2-D sinusoidal, axial
2-D RoPE, multimodal RoPE) is measured on the grid itself: the positional kernel between the
centre point and every point of a plane through it (:func:`plane_kernel`), one plane per pair of
axes, and, for a rotation, which axis turns each dimension of the head
(:func:`~posenc.analysis.kernel.rotation_axes`).

Axes are named by the scheme's declared ``axis_names`` where it has them (multimodal RoPE:
time, height, width), else ``axis 0``, ``axis 1``, ...

Legend: ``D`` position axes, ``G`` points per side of a plane, ``h`` heads, ``d_h`` head width.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from ..base import PositionalScheme
from .kernel import Probe, make_probe, positional_kernel, rotate_rows

__all__ = [
    "GRID_SIZE",
    "SHOW_MAX_HEAD_DIM",
    "axes_text",
    "axis_names",
    "grid_planes",
    "is_grid",
    "plane_coordinates",
    "plane_kernel",
    "rotation_axes",
]

#: Points per side of a drawn plane (odd: the centre point is a grid point).
GRID_SIZE = 33


def is_grid(probe: Probe) -> bool:
    """Whether the scheme's positions are grid coordinates (``position_dims`` > 1)."""
    return probe.scheme.position_dims > 1


def axis_names(probe: Probe) -> tuple[str, ...]:
    """One name per position axis: the scheme's declared ``axis_names``, or ``axis 0``, ..."""
    dims = probe.scheme.position_dims
    names = getattr(probe.scheme, "axis_names", None)  # declared by a grid scheme that names its axes
    if isinstance(names, (tuple, list)) and len(names) == dims and all(isinstance(n, str) for n in names):
        return tuple(names)
    return tuple(f"axis {a}" for a in range(dims))


def grid_planes(dims: int) -> list[tuple[int, int]]:
    """The planes drawn for ``dims`` axes: every pair of axes ``(a, b)``, ``a < b``."""
    return list(itertools.combinations(range(dims), 2))


def plane_coordinates(dims: int, axes: tuple[int, int], size: int = GRID_SIZE) -> torch.Tensor:
    """Coordinates of the plane through the centre spanned by ``axes``: int64 ``[G * G, D]``, row-major
    (axis ``axes[0]`` slow, ``axes[1]`` fast), every other coordinate at the centre ``G // 2``."""
    a, b = axes
    if not (0 <= a < dims and 0 <= b < dims and a != b):
        raise ValueError(f"axes must be two different axes of 0..{dims - 1}, got {axes!r}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    coords = torch.full((size, size, dims), size // 2, dtype=torch.long)  # [G, G, D]
    coords[..., a] = torch.arange(size)[:, None]
    coords[..., b] = torch.arange(size)[None, :]
    return coords.reshape(size * size, dims)


def plane_kernel(probe: Probe, axes: tuple[int, int], size: int = GRID_SIZE) -> torch.Tensor:
    """``K(centre, point)`` for every point of the plane spanned by ``axes`` through the centre:
    float64 ``[h, G, G]`` (row ``i``: coordinate ``i`` on ``axes[0]``; column ``j``: on ``axes[1]``).

    Raises:
        ValueError: the scheme is not a grid scheme.
    """
    dims = probe.scheme.position_dims
    if dims < 2:
        raise ValueError(f"scheme {probe.name!r} encodes 1-D positions (position_dims = 1), not a grid")
    points = plane_coordinates(dims, axes, size)  # [G*G, D]
    centre = torch.full((1, dims), size // 2, dtype=torch.long)  # [1, D]
    kern = positional_kernel(probe, centre, points)  # [h, 1, G*G]
    return kern[:, 0].reshape(-1, size, size)


def rotation_axes(
    scheme: str | PositionalScheme | Probe, context: dict[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which position axis turns each dimension of the head, and by how much per step.

    For each axis ``a`` of a ``rotate`` scheme with ``D = position_dims`` axes, the basis vectors
    ``e_j`` are rotated at the coordinate one step along ``a`` (the others 0); dimension ``j`` turns
    with ``a`` when ``R e_j != e_j``, by the angle between ``e_j`` and ``R e_j`` (a pair turning
    by ``theta`` moves both its dimensions by ``theta``, whatever the layout).

    Returns:
        ``(axis [d_h]`` int64, -1 for a dimension no axis turns; ``angle [d_h]`` float64, radians
        per step, 0 where unturned``)``.
    """
    probe = scheme if isinstance(scheme, Probe) else make_probe(scheme, context)
    if not probe.rotates:
        raise ValueError(
            f"scheme {probe.name!r} does not rotate q and k with position: it has no 'rotate' hook "
            f"(hooks: {list(probe.hooks) or 'none'})"
        )
    dims = probe.scheme.position_dims
    eye = torch.eye(probe.head_dim)  # [d_h, d_h]: one basis vector per row
    axis = torch.full((probe.head_dim,), -1, dtype=torch.long)
    angle = torch.zeros(probe.head_dim, dtype=torch.float64)
    for a in range(dims):
        step = torch.zeros(1, dims, dtype=torch.long)  # one step along axis a: [1, D]
        step[0, a] = 1
        if dims == 1:
            step = step[:, 0]  # [1]
        q, _ = rotate_rows(probe, eye, step, None)  # [d_h, 1, d_h]: row j = R e_j
        moved = q[:, 0, :].double()  # [d_h, d_h]
        cos = moved.diagonal()  # [d_h]: e_j . R e_j
        sin = (moved - torch.diag(cos)).norm(dim=-1)  # [d_h]: |R e_j - (e_j . R e_j) e_j|, exact when small
        theta = torch.atan2(sin, cos)
        turned = theta > 1e-6
        axis[turned] = a
        angle[turned] = theta[turned]
    return axis, angle


#: The widest head ``posenc show`` maps (the map rotates ``d_h`` basis vectors: ``d_h^2`` values).
SHOW_MAX_HEAD_DIM = 4096


def axes_text(probe: Probe, digits: int = 4, rows: int | None = None) -> str:
    """Which position axis turns each dimension of a rotating scheme's head, as text: a one-line
    drawing of the head (one letter per dimension) and a table of dimension, axis, angle per step
    and wavelength (the first ``rows`` dimensions; all by default).

    Raises:
        ValueError: the scheme does not rotate q and k with position.
    """
    axis, angle = rotation_axes(probe)  # [d_h], [d_h]
    dims = probe.scheme.position_dims
    names = axis_names(probe) if dims > 1 else ("position",)
    initials = [n[0].upper() for n in names]
    letters = initials if len(set(initials)) == len(initials) else [str(a) for a in range(dims)]
    drawing = "".join("." if a < 0 else letters[a] for a in axis.tolist())
    key = ", ".join(f"{letter} {name}" for letter, name in zip(letters, names))
    if bool((axis < 0).any()):
        key += ", . not rotated"
    counts = ", ".join(f"{name} {int((axis == a).sum())}" for a, name in enumerate(names))
    lines = [
        f"{probe.name}: rotates q and k; {dims} position "
        + (f"axes ({', '.join(names)})" if dims > 1 else "axis")
        + f"; head_dim = {axis.numel()}; dimensions per axis: {counts}",
        f"head: {drawing}  ({key})",
        f"{'dim':>5}  {'axis':<10} {'angle/step (rad)':>18} {'wavelength (steps)':>20}",
    ]
    shown = axis.numel() if rows is None else min(rows, axis.numel())
    for j in range(shown):
        a, theta = int(axis[j]), float(angle[j])
        lam = f"{2 * math.pi / theta:,.{digits}f}" if theta > 0 else "–"
        lines.append(f"{j:>5}  {names[a] if a >= 0 else '–':<10} {theta:>18.{digits}f} {lam:>20}")
    return "\n".join(lines)
