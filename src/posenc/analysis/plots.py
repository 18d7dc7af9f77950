"""Plots of any positional scheme (matplotlib, Agg backend, PNG or SVG).

One entry per plot kind in :data:`PLOT_KINDS`; each says which schemes it applies to (by hook,
never by name) and draws on a fresh figure:

================  ============================================================  =====================
kind              shows                                                         applies to
================  ============================================================  =====================
``heatmap``       the encoding ``e(p)_i``: positions x dimensions               ``embed``, ``rotate``
``waves``         a few dimensions ``e(p)_i`` as curves over position           ``embed``, ``rotate``
``similarity``    cosine similarity ``cos(e(m), e(n))``                          ``embed``, ``rotate``
``frequencies``   wavelength ``2 pi / theta_i`` per frequency pair (log)        ``embed``, ``rotate``
``surface``       3-D surface of the first dimensions over position             ``embed``, ``rotate``
``kernel``        the positional kernel ``K(m, n)`` as a heatmap                 any hook
``kernel_curve``  ``K`` against relative distance ``m - n``                      any hook
``bias``          the bias per head against relative distance                   ``score_bias``
``scalings``      wavelengths under each rotary scaling, side by side           ``rotate`` + ``scaling``
``grid``          ``K(centre, point)`` over each plane of a grid, as images      grid schemes
``axes``          which grid axis turns each head dimension, and how fast       grid ``rotate``
================  ============================================================  =====================

Grid schemes (``position_dims`` > 1) are drawn on their grid by ``grid`` and ``axes``;
the other kinds read them along their first axis.

``e(p)`` is :func:`~posenc.analysis.kernel.encodings`; ``K`` is in units of the scaled attention
logit. Legend: ``h`` heads, ``m``/``n`` query/key positions, ``r = m - n``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from .._validate import check_choice
from ..base import PositionalScheme
from .grid import is_grid
from .grid_plots import draw_grid_axes, draw_grid_kernel
from .kernel import Probe, display_kernel, encodings, kernel_curve, make_probe, positional_kernel
from .measures import PROPERTIES
from .spectrum import roformer_bound, scheme_frequencies

__all__ = [
    "FORMATS",
    "PLOT_KINDS",
    "SCALING_FACTOR",
    "PlotKind",
    "applicable_kinds",
    "plot",
    "render",
    "save",
    "scaling_probes",
]

FORMATS = (".png", ".svg")

#: How many times its trained length each scaling of the ``scalings`` plot extends a scheme to.
SCALING_FACTOR = 4.0


def scaling_probes(probe: Probe) -> dict[str, Probe]:
    """The scheme of ``probe`` as built (``"none"``: ``probe`` itself) and under each evaluation
    variant it declares (:attr:`~posenc.base.PositionalScheme.eval_variants`: its own options with
    the variant's ``variant_options`` for :data:`SCALING_FACTOR` times the context length L):
    label -> probe. Variants whose frequencies follow the current length (the scheme then declares
    ``needs_unrotated_cache``) are left out: at L they are the scheme as built.

    ``probe`` must have been built by name (:func:`~posenc.analysis.kernel.make_probe` with a
    registry name and options), so its options are known; ``ValueError`` otherwise."""
    why = _scaling_key(probe)
    if why is not None:
        raise ValueError(f"no scalings to compare: {why}")
    cls = type(probe.scheme)
    ctx = {
        "d_model": probe.d_model,
        "head_dim": probe.head_dim,
        "num_heads": probe.num_heads,
        "max_len": probe.nominal_len,
        "causal": probe.causal,
    }
    probes = {"none": probe}
    for variant in cls.eval_variants:
        options = {**probe.options, **cls.variant_options(variant, SCALING_FACTOR, probe.nominal_len)}
        scaled = make_probe(probe.name, ctx, options)
        if not scaled.scheme.needs_unrotated_cache:
            probes[variant] = scaled
    return probes


@dataclass(frozen=True)
class PlotKind:
    """A plot kind: its title, which schemes it applies to, and how to draw it."""

    name: str
    title: str
    applies: Callable[[Probe], str | None]
    draw: Callable[[Figure, Probe], None]
    size: tuple[float, float] = (7.0, 4.6)


def _has_frequencies(probe: Probe) -> str | None:
    return PROPERTIES["wavelengths"].applies(probe)  # frequencies exist where wavelengths can be read


def _vectors(probe: Probe) -> str | None:
    if not probe.has_vectors:
        return f"needs an 'embed' or 'rotate' hook; {probe.name!r} has {list(probe.hooks) or 'no hooks'}"
    return None


def _any_hook(probe: Probe) -> str | None:
    return None if probe.hooks else f"{probe.name!r} has no positional hooks: its kernel is zero"


def _bias_hook(probe: Probe) -> str | None:
    return None if "score_bias" in probe.hooks else f"needs a 'score_bias' hook; {probe.name!r} has none"


def _scaling_key(probe: Probe) -> str | None:
    if not probe.rotates:
        return f"needs a 'rotate' hook; {probe.name!r} has {list(probe.hooks) or 'no hooks'}"
    if not type(probe.scheme).eval_variants:
        return f"{probe.name!r} declares no scalings (evaluation variants) to compare"
    if probe.options is None:  # a module given as it is: its options are not known to rebuild it
        return (
            f"the scalings rebuild {probe.name!r} under each variant, so it must be given by its "
            "registry name and options (make_probe(name, context, options)), not as a module"
        )
    return None


def _grid_hook(probe: Probe) -> str | None:
    if not is_grid(probe):
        return f"needs grid positions (position_dims > 1); {probe.name!r} encodes 1-D positions"
    return _any_hook(probe)


def _grid_rotation(probe: Probe) -> str | None:
    return _grid_hook(probe) or (None if probe.rotates else f"{probe.name!r} does not rotate q and k")


def _what(probe: Probe) -> str:
    return "PE(p)" if "embed" in probe.hooks else "R_p·u (u = 1/√d_h)"


def _n(probe: Probe, cap: int) -> int:
    return min(probe.nominal_len, cap)


# ---------------------------------------------------------------------------------------------- kinds
def _heatmap(fig: Figure, probe: Probe) -> None:
    n = _n(probe, 128)
    enc = encodings(probe, n).float()  # [s, d]
    ax = fig.add_subplot()
    im = ax.imshow(
        enc.numpy(),
        aspect="auto",
        cmap="RdBu_r",
        origin="lower",
        interpolation="nearest",
        vmin=-float(enc.abs().max()),
        vmax=float(enc.abs().max()),
    )
    ax.set_xlabel("dimension i")
    ax.set_ylabel("position p (tokens)")
    ax.set_title(f"{probe.name}: encoding {_what(probe)}, first {n} positions")
    fig.colorbar(im, ax=ax, label="value")


def _waves(fig: Figure, probe: Probe) -> None:
    n = _n(probe, 256)
    enc = encodings(probe, n).float()  # [s, d]
    d = enc.shape[1]
    # pairs from a wavelength of about 20 tokens (d/8) to the slowest; the first pairs turn every
    # ~6 tokens, which over 256 positions reads as noise
    dims = sorted({2 * (d // 16), 2 * (d // 8), 2 * (3 * d // 16), 2 * (d // 4), d - 2} - {0})
    ax = fig.add_subplot()
    for i in dims:
        ax.plot(range(n), enc[:, i].numpy(), lw=1.4, label=f"dim {i}")
    ax.set_xlabel("position p (tokens)")
    ax.set_ylabel("value")
    ax.set_title(f"{probe.name}: per-dimension waveforms of {_what(probe)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=10, frameon=False)
    ax.grid(alpha=0.3)


def _similarity(fig: Figure, probe: Probe) -> None:
    n = _n(probe, 128)
    enc = encodings(probe, n).double()
    unit = enc / enc.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    sim = (unit @ unit.T).float()  # [s, s]
    ax = fig.add_subplot()
    lo = min(float(sim.min()), 0.99)  # the values' own range (they often sit in 0.5..1), up to 1
    im = ax.imshow(sim.numpy(), cmap="viridis", origin="lower", vmin=lo, vmax=1, interpolation="nearest")
    ax.set_xlabel("position n (tokens)")
    ax.set_ylabel("position m (tokens)")
    ax.set_title(f"{probe.name}: cosine similarity of {_what(probe)}")
    fig.colorbar(im, ax=ax, label="cos(e(m), e(n))")


def _frequencies(fig: Figure, probe: Probe) -> None:
    theta, how = scheme_frequencies(probe)
    lam = (2 * math.pi / theta).numpy()
    ax = fig.add_subplot()
    ax.semilogy(range(len(lam)), lam, "o-", ms=3, lw=1.2, label=f"wavelength 2π/θᵢ ({how})")
    ax.axhline(probe.nominal_len, color="tab:red", ls="--", lw=1, label=f"context L = {probe.nominal_len}")
    ax.axhline(2 * math.pi, color="grey", ls=":", lw=1, label="2π (θ = 1 rad/token)")
    ax.set_xlabel("frequency pair i (dimensions 2i, 2i+1 or i, i + d/2)")
    ax.set_ylabel("wavelength (tokens, log)")
    ax.set_title(f"{probe.name}: wavelength per dimension pair")
    ax.legend(fontsize=10, loc="upper left")
    ax.grid(alpha=0.3, which="both")


def _surface(fig: Figure, probe: Probe) -> None:
    """Eight dimensions spread over the spectrum (every d/8-th, fastest first) over position, as a
    3-D waterfall: one curve per dimension (a mesh across dimensions would interpolate between
    unrelated ones and look jagged)."""
    n = _n(probe, 64)
    enc = encodings(probe, n).float()  # [s, d]
    d = enc.shape[1]
    dims = sorted({2 * ((j * d // 8) // 2) for j in range(8)})  # even (sin) dims across the spectrum
    ax = fig.add_subplot(projection="3d")
    lim = float(enc[:, dims].abs().max()) or 1.0
    pos = torch.arange(n).numpy()
    for row, i in enumerate(dims):
        ax.plot(pos, [row] * n, enc[:, i].numpy(), lw=1.6, color=plt.cm.viridis(row / max(len(dims) - 1, 1)))
    ax.set_yticks(range(len(dims)), [str(i) for i in dims])
    ax.set_zlim(-lim, lim)
    ax.set_xlabel("position p (tokens)", labelpad=6)
    ax.set_ylabel("dimension i", labelpad=10)
    ax.set_zlabel("value", labelpad=4)
    ax.set_title(f"{probe.name}: {len(dims)} dimensions across the spectrum over position")
    ax.view_init(elev=28, azim=-60)


def _kernel(fig: Figure, probe: Probe) -> None:
    n = _n(probe, 128)
    k, content = display_kernel(probe, n)  # [h, n, n]
    k = k.float()
    heads = [0] if k.shape[0] == 1 else [0, k.shape[0] - 1]
    if len(heads) == 1:  # one square panel: a figure its width, not half a blank canvas
        fig.set_size_inches(4.9, fig.get_size_inches()[1])
    axes = fig.subplots(1, len(heads), squeeze=False)[0]
    for ax, h in zip(axes, heads):
        vmax = float(k[h].abs().max()) or 1.0  # one colour scale per head: slopes differ by 2^8 in ALiBi
        im = ax.imshow(
            k[h].numpy(), cmap="RdBu_r", origin="lower", vmin=-vmax, vmax=vmax, interpolation="nearest"
        )
        ax.set_xlabel("key position n (tokens)")
        ax.set_ylabel("query position m (tokens)")
        ax.set_title(f"head {h}" if k.shape[0] > 1 else "all heads")
        fig.colorbar(im, ax=ax, label="logit change (scaled-logit units)", shrink=0.9)
    fig.suptitle(
        f"{probe.name}: positional kernel K(m, n)" + (" (one random query)" if content == "random" else "")
    )


def _kernel_curve(fig: Figure, probe: Probe) -> None:
    n = _n(probe, 256)
    ax = fig.add_subplot()
    kern, content = display_kernel(probe, n)
    r, curve = kernel_curve(kern)  # [2n-1], [h, 2n-1]
    heads = range(curve.shape[0]) if curve.shape[0] <= 8 else range(0, curve.shape[0], curve.shape[0] // 8)
    for h in heads:
        label = f"{content} content" if curve.shape[0] == 1 else f"head {h}"
        ax.plot(r.numpy(), curve[h].numpy(), lw=1.3, label=label)
    if probe.rotates:
        rr, rc = kernel_curve(positional_kernel(probe, n, content="random", seed=0))
        ax.plot(rr.numpy(), rc[0].numpy(), lw=0.8, alpha=0.7, label="one random q, k")
    ax.set_xlabel("relative distance m − n (tokens; > 0: key before query)")
    ax.set_ylabel("mean K (scaled-logit units)")
    ax.set_title(
        f"{probe.name}: kernel against relative distance"
        + (" (one random query)" if content == "random" else "")
    )
    ax.grid(alpha=0.3)
    if probe.rotates:  # RoFormer's bound on a twin axis
        from .kernel import rotation_frequencies

        dist = torch.arange(0, n)
        bound = roformer_bound(rotation_frequencies(probe), dist)
        ax2 = ax.twinx()
        ax2.plot(
            dist.numpy(),
            bound.numpy(),
            color="black",
            ls="--",
            lw=1,
            label="RoFormer bound B(r) (right axis)",
        )
        ax2.set_ylabel("RoFormer bound B(r)")
    handles = [h for a in fig.axes for h in a.get_legend_handles_labels()[0]]
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=10, frameon=False
    )


def _bias(fig: Figure, probe: Probe) -> None:
    n = _n(probe, 128)
    kern, content = display_kernel(probe, n)
    r, curve = kernel_curve(kern)  # [2n-1], [h, 2n-1]
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    vmax = float(curve.abs().max()) or 1.0
    im = ax1.imshow(
        curve.numpy(),
        aspect="auto",
        cmap="magma",
        origin="lower",
        interpolation="nearest",
        extent=(float(r[0]) - 0.5, float(r[-1]) + 0.5, -0.5, curve.shape[0] - 0.5),
        vmin=-vmax if float(curve.min()) < 0 and float(curve.max()) > 0 else None,
        vmax=vmax if float(curve.min()) < 0 and float(curve.max()) > 0 else None,
    )
    ax1.set_xlabel("relative distance m − n (tokens)")
    ax1.set_ylabel("head")
    ax1.set_title("bias per head")
    fig.colorbar(im, ax=ax1, label="bias (scaled-logit units)")
    heads = curve.shape[0]
    norm = matplotlib.colors.Normalize(vmin=0, vmax=max(heads - 1, 1))
    for h in range(heads):
        ax2.plot(r.numpy(), curve[h].numpy(), lw=1, color=plt.cm.viridis(norm(h)))
    fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap="viridis"), ax=ax2, label="head")
    ax2.set_xlabel("relative distance m − n (tokens)")
    ax2.set_ylabel("bias")
    ax2.set_title("one curve per head")
    ax2.grid(alpha=0.3)
    fig.suptitle(
        f"{probe.name}: attention bias against distance"
        + (" (one random query)" if content == "random" else "")
    )


def _scalings(fig: Figure, probe: Probe) -> None:
    curves = {label: 2 * math.pi / scheme_frequencies(p)[0] for label, p in scaling_probes(probe).items()}
    ax1, ax2 = fig.subplots(1, 2)
    ref = curves.get("none")
    for idx, (label, lam) in enumerate(curves.items()):
        color = f"C{idx}"
        ax1.semilogy(range(len(lam)), lam.numpy(), lw=1.3, label=label, color=color)
        if ref is not None and label != "none":
            ax2.plot(range(len(lam)), (lam / ref).numpy(), lw=1.3, label=label, color=color)
    for ax in (ax1,):
        ax.axhline(probe.nominal_len, color="tab:red", ls="--", lw=1, label=f"L = {probe.nominal_len}")
        ax.axhline(
            4 * probe.nominal_len, color="tab:red", ls=":", lw=1, label=f"4L = {4 * probe.nominal_len}"
        )
    ax1.set_xlabel("frequency pair i")
    ax1.set_ylabel("wavelength (tokens, log)")
    ax1.set_title("wavelength per pair")
    ax1.legend(fontsize=10, loc="upper left")
    ax2.set_xlabel("frequency pair i")
    ax2.set_ylabel("scaled / unscaled wavelength")
    ax2.set_title("how each scaling stretches (factor 4)")
    ax2.legend(fontsize=10, loc="upper left")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"{probe.name}: long-context scalings side by side")


PLOT_KINDS: dict[str, PlotKind] = {
    k.name: k
    for k in (
        PlotKind("heatmap", "encoding heatmap", _vectors, _heatmap),
        PlotKind("waves", "per-dimension waveforms", _vectors, _waves, (8.0, 4.2)),
        PlotKind("similarity", "position similarity", _vectors, _similarity, (6.0, 4.8)),
        PlotKind("frequencies", "wavelength per dimension", _has_frequencies, _frequencies),
        PlotKind("surface", "3-D view of dimensions across the spectrum", _vectors, _surface, (7.0, 5.2)),
        PlotKind("kernel", "positional kernel heatmap", _any_hook, _kernel, (8.5, 4.2)),
        PlotKind("kernel_curve", "kernel against distance", _any_hook, _kernel_curve, (8.5, 4.2)),
        PlotKind("bias", "bias per head", _bias_hook, _bias, (10.0, 4.2)),
        PlotKind("scalings", "rotary scalings side by side", _scaling_key, _scalings, (10.0, 4.4)),
        PlotKind("grid", "kernel on the grid", _grid_hook, draw_grid_kernel, (13.0, 4.0)),
        PlotKind("axes", "axes of the head", _grid_rotation, draw_grid_axes, (8.5, 4.6)),
    )
}


def _probe(scheme: str | PositionalScheme | Probe, context: dict[str, Any] | None) -> Probe:
    return scheme if isinstance(scheme, Probe) else make_probe(scheme, context)


def applicable_kinds(
    scheme: str | PositionalScheme | Probe, context: dict[str, Any] | None = None
) -> list[str]:
    """The plot kinds that apply to a scheme."""
    probe = _probe(scheme, context)
    return [name for name, k in PLOT_KINDS.items() if k.applies(probe) is None]


def render(
    scheme: str | PositionalScheme | Probe, kind: str, *, context: dict[str, Any] | None = None
) -> Figure:
    """Draw one plot kind for one scheme on a new figure (close it with ``plt.close(fig)``).

    Raises:
        ValueError: unknown kind (lists the kinds) or a kind that does not apply (says why).
    """
    spec = PLOT_KINDS[check_choice(kind, "plot kind", PLOT_KINDS)]
    probe = _probe(scheme, context)
    reason = spec.applies(probe)
    if reason is not None:
        raise ValueError(
            f"plot kind {kind!r} does not apply to {probe.name!r}: {reason}; applicable kinds: "
            + (", ".join(applicable_kinds(probe)) or "none")
        )
    fig = plt.figure(figsize=spec.size, layout="constrained")
    try:
        spec.draw(fig, probe)
    except BaseException:
        plt.close(fig)
        raise
    return fig


def save(fig: Figure, path: str | Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` as PNG or SVG (by the suffix of ``path``) and close it."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        plt.close(fig)
        raise ValueError(f"output file {str(path)!r} must end in {' or '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot(
    scheme: str | PositionalScheme | Probe,
    kind: str,
    path: str | Path,
    *,
    context: dict[str, Any] | None = None,
) -> Path:
    """Render ``kind`` for ``scheme`` and write it to ``path`` (``.png`` or ``.svg``)."""
    if Path(path).suffix.lower() not in FORMATS:
        raise ValueError(f"output file {str(path)!r} must end in {' or '.join(FORMATS)}")
    return save(render(scheme, kind, context=context), path)
