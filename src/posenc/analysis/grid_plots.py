"""Drawings of grid schemes on their grid (matplotlib): the plot kinds ``grid`` and ``axes``
of :data:`~posenc.analysis.plots.PLOT_KINDS`.

Legend: ``G`` points per side of a plane, ``d_h`` head width.
"""

from __future__ import annotations

import math

import matplotlib
import torch
from matplotlib.figure import Figure

from .grid import axis_names, grid_planes, plane_kernel, rotation_axes
from .kernel import Probe

__all__ = ["draw_grid_axes", "draw_grid_kernel"]


def draw_grid_kernel(fig: Figure, probe: Probe) -> None:
    """One image per plane through the centre point: ``K(centre, point)`` of head 0, offsets from
    the centre on both axes, the centre marked."""
    names = axis_names(probe)
    planes = grid_planes(probe.scheme.position_dims)
    if len(planes) == 1:  # one square panel: a figure its width
        fig.set_size_inches(5.4, fig.get_size_inches()[1])
    axes = fig.subplots(1, len(planes), squeeze=False)[0]
    for ax, (a, b) in zip(axes, planes):
        k = plane_kernel(probe, (a, b))[0].float()  # [G, G]
        c = k.shape[0] // 2
        lo, hi = float(k.min()), float(k.max())
        if lo < 0 < hi or lo == hi:  # signed: diverging around 0
            cmap, hi = "RdBu_r", max(abs(lo), abs(hi)) or 1.0
            lo = -hi
        else:  # one sign: the values' own range, so a small change still shows
            cmap = "viridis"
        im = ax.imshow(
            k.numpy(),
            cmap=cmap,
            origin="lower",
            vmin=lo,
            vmax=hi,
            interpolation="nearest",
            extent=(-c - 0.5, c + 0.5, -c - 0.5, c + 0.5),
        )
        ax.plot([0], [0], marker="+", color="white" if cmap == "viridis" else "black", ms=10, mew=1.5)
        ax.set_xlabel(f"{names[b]} offset from the centre")
        ax.set_ylabel(f"{names[a]} offset from the centre")
        ax.set_title(f"{names[a]} × {names[b]}")
        fig.colorbar(im, ax=ax, label="K (scaled-logit units)", shrink=0.85)
    fig.suptitle(f"{probe.name}: kernel between the centre (+) and every grid point")


_AXIS_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


def draw_grid_axes(fig: Figure, probe: Probe) -> None:
    """Per dimension of the head: the axis that turns it (colour) and its wavelength in steps."""
    axis, angle = rotation_axes(probe)  # [d_h], [d_h]
    names = axis_names(probe)
    top, strip = fig.subplots(2, 1, gridspec_kw={"height_ratios": [4, 1]}, sharex=True)
    dims = torch.arange(axis.numel())
    for a, label in enumerate(names):
        sel = axis == a
        lam = (2 * math.pi / angle[sel]).numpy()
        top.semilogy(
            dims[sel].numpy(), lam, "o", ms=4, color=_AXIS_COLORS[a], label=f"{label}: {int(sel.sum())} dims"
        )
    if bool((axis < 0).any()):
        sel = axis < 0
        top.plot(dims[sel].numpy(), [1.0] * int(sel.sum()), "x", color="grey", label="not rotated")
    top.set_ylabel("wavelength (steps, log)")
    top.set_title("wavelength of each dimension along the axis that turns it")
    top.legend(fontsize=10, loc="upper left")
    top.grid(alpha=0.3, which="both")
    colors = matplotlib.colors.ListedColormap(["lightgrey", *_AXIS_COLORS[: len(names)]])
    strip.imshow(
        (axis + 1)[None].numpy(),
        cmap=colors,
        vmin=0,
        vmax=len(names),
        aspect="auto",
        interpolation="nearest",
        extent=(-0.5, axis.numel() - 0.5, 0, 1),
    )
    strip.set_yticks([])
    strip.set_xlabel("dimension j of the head (q and k)")
    strip.set_title("the head, coloured by axis", fontsize=10)
    fig.suptitle(f"{probe.name}: which axis turns each dimension")
