"""What to notice in each per-scheme figure of the report, written from that scheme's own numbers.

A caption is true of the panel above it: :func:`figure_caption` measures the scheme (its table,
its frequencies, its kernel) with the same functions that draw the figure, and words the caption
from what it finds (random initial values read as noise, a linear bias as linear, diagonals as
constant only where they are). Every number quoted is computed here; no caption is shared by two
schemes unless it is true of both.

Legend: ``s`` positions, ``d`` model width, ``h`` heads, ``r`` distance ``m - n``, ``L`` the
scheme's nominal context length.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .grid import GRID_SIZE, axis_names, grid_planes, plane_kernel, rotation_axes
from .kernel import Probe, display_kernel, encodings, kernel_curve
from .page import esc
from .spectrum import scheme_frequencies

__all__ = ["CAPTIONS", "figure_caption", "trained_kernel_note", "trained_table_note"]


def _n(probe: Probe, cap: int) -> int:
    return min(probe.nominal_len, cap)


def _untrained(probe: Probe) -> bool:
    """Whether the panel shows random initial values (the per-scheme sections draw schemes as
    built: a trainable scheme there is at its initialisation)."""
    return probe.trainable


def _wavelengths(probe: Probe) -> torch.Tensor | None:
    """Wavelengths ``2 pi / theta_i`` of the scheme's moving pairs, fastest first, or None."""
    try:
        theta, _ = scheme_frequencies(probe)
    except (ValueError, TypeError):
        return None
    theta = theta[torch.isfinite(theta) & (theta > 0)]
    return None if theta.numel() == 0 else 2 * math.pi / theta


def _neighbours(probe: Probe, n: int) -> float:
    """Mean cosine between the vectors of neighbouring positions ``p, p + 1`` for ``p < n - 1``."""
    enc = encodings(probe, n).double()  # [s, d]
    unit = enc / enc.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return float((unit[1:] * unit[:-1]).sum(-1).mean())


def trained_table_note(initial: Probe, trained: Probe, train_len: int) -> str:
    """How alike neighbouring positions' vectors are before and after training (from the tables)."""
    before, after = _neighbours(initial, train_len), _neighbours(trained, train_len)
    change = (
        "about as alike as before"
        if abs(after - before) < 0.005
        else "more alike"
        if after > before
        else "less alike"
    )
    return (
        f"<i>{esc(trained.name)}</i>: the mean cosine between neighbouring positions' vectors goes from "
        f"{before:.2f} at initialisation to {after:.2f} after training: neighbours end up {change}."
    )


def _heatmap(probe: Probe) -> str:
    n = _n(probe, 128)
    enc = encodings(probe, n).double()  # [s, d]
    neighbours = _neighbours(probe, n)
    what = "PE(p)" if "embed" in probe.hooks else "R_p·u"
    head = f"Rows are positions 0 to {n - 1} (0 at the bottom), columns the dimensions of {what}. "
    lam = _wavelengths(probe)
    if _untrained(probe) and lam is None:
        return head + (
            f"At initialisation the table is random numbers (std {float(enc.std()):.3f}): no pattern runs "
            f"along the positions, and neighbouring rows are as alike as distant ones (mean cosine of "
            f"neighbours {neighbours:.2f}). Training gives it structure; see the trained section."
        )
    if lam is None:
        return head + f"Mean cosine between neighbouring rows: {neighbours:.2f}."
    L = probe.nominal_len
    gain = ""
    if _untrained(probe):
        gain = (
            f" Its values span ±{float(enc.abs().max()):.3g}: the fixed waves times a learned gain at "
            "its start value."
        )
    return head + (
        f"The fastest pair repeats every {float(lam[0]):.1f} positions, so its columns flicker from row "
        f"to row; the slowest repeats every {float(lam[-1]):,.0f} positions ({float(lam[-1]) / L:.0f}× the "
        f"context L = {L}), so its columns barely change over these {n} rows. Together they give every "
        f"row its own pattern: neighbours are alike (mean cosine {neighbours:.2f}) but never equal.{gain}"
    )


def _frequencies(probe: Probe) -> str:
    lam = _wavelengths(probe)
    if lam is None:
        return "This scheme has no frequencies to read."
    L = probe.nominal_len
    inside = int((lam <= L).sum())
    return (
        f"Each pair's wavelength, log scale, against the context L = {L} (dashed). {inside} of its "
        f"{lam.numel()} pairs turn at least once inside L and tell near positions apart; the other "
        f"{lam.numel() - inside} move by less than a turn and tell far positions apart. "
        + (
            f"The slowest wavelength, {float(lam[-1]):,.0f} tokens, stays above L, so no two positions "
            "inside the context alias."
            if float(lam[-1]) > L
            else f"Even the slowest wavelength, {float(lam[-1]):,.0f} tokens, is inside L: far positions "
            "alias."
        )
    )


def _kernel_curve(probe: Probe) -> str:
    n = _n(probe, 256)
    kern, _ = display_kernel(probe, n)
    r, curve = kernel_curve(kern)  # [2n-1], [h, 2n-1]
    mean = curve.mean(0)
    at0 = float(mean[r == 0])
    far = float(mean[r.abs() >= n // 2].abs().mean())
    verdict = "nearby keys are favoured, far ones not switched off" if far < abs(at0) else "no decay"
    return (
        f"K against distance for mean content (blue) and one random q, k (orange), up to ±{n - 1}. At "
        f"r = 0 it is {at0:.2f}; its ripples settle to a mean |K| of {far:.2f} beyond |r| = {n // 2} "
        f"({far / max(abs(at0), 1e-30):.0%} of that): {verdict}. The "
        "dashed line is RoFormer's bound, which falls with distance: the rotation alone makes the "
        "largest possible logit shrink as keys move away."
    )


def _bias(probe: Probe) -> str:
    n = _n(probe, 128)
    kern, content = display_kernel(probe, n)
    r, curve = kernel_curve(kern)  # [2n-1], [h, 2n-1]
    lo, hi = float(curve.min()), float(curve.max())
    random_q = (
        " (for one random query: this bias is a dot product with the query)" if content == "random" else ""
    )
    if _untrained(probe):
        return (
            f"Left: each head's bias against distance as an image; right: one curve per head{random_q}. At "
            f"initialisation the values are random, between {lo:.3g} and {hi:.3g}: no head prefers near "
            "keys yet. What training makes of them is in the trained section."
        )
    back = r >= 0
    slopes = []
    for h in range(curve.shape[0]):
        y = curve[h, back]
        x = r[back].double()
        slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
        fit = y.mean() + slope * (x - x.mean())
        slopes.append((slope, float((y - fit).abs().max()) / max(float(y.abs().max()), 1e-30)))
    steep = min(range(len(slopes)), key=lambda h: slopes[h][0])
    flat = max(range(len(slopes)), key=lambda h: slopes[h][0])
    linear = all(err < 1e-6 for _, err in slopes)
    shape = "falls linearly with distance" if linear else "changes with distance"
    return (
        f"Left: each head's bias against distance m − n as an image; right: one curve per head{random_q}. "
        f"Each head's bias {shape}: head {steep} by {-slopes[steep][0]:.3g} per token (it attends "
        f"locally), head {flat} by {-slopes[flat][0]:.3g} (it sees across the whole context); at "
        f"{n - 1} tokens back they differ by {float(curve[flat, -1] - curve[steep, -1]):.3g} logit units."
    )


def _kernel(probe: Probe) -> str:
    n = _n(probe, 128)
    kern, content = display_kernel(probe, n)  # [h, n, n]
    scale = float(kern.abs().max()) or 1.0
    drift = float((kern[:, 1:, 1:] - kern[:, :-1, :-1]).abs().max()) / scale  # along the diagonals
    random_q = " for one random query" if content == "random" else ""
    head = (
        f"K(m, n){random_q} as an image, query m up the side and key n along the bottom, position 0 at "
        "the bottom left, each head on its own colour scale. "
        + (
            "Above the diagonal are keys after the query, which a causal decoder masks: drawn so the "
            "whole function shows, never seen by the model. "
            if probe.causal
            else ""
        )
    )
    if drift < 1e-5:
        return head + (
            f"Every diagonal is constant (largest change along one: {drift:.1e} of the largest |K|): "
            "this scheme sees only the distance m − n."
        )
    why = " (random initial values)" if _untrained(probe) else ""
    return head + (
        f"The diagonals are not constant: moving both positions by one changes K by up to {drift:.0%} "
        f"of its largest value{why}, so this kernel also depends on where the pair sits, not only on m − n."
    )


def _scalings(probe: Probe) -> str:
    from .plots import scaling_probes

    probes = scaling_probes(probe)
    base = _wavelengths(probes.pop("none"))
    parts = []
    for label, scaled in probes.items():
        lam = _wavelengths(scaled)
        if lam is None or base is None or lam.numel() != base.numel():
            continue
        ratio = lam / base
        parts.append(
            f"{esc(label)} ×{float(ratio[0]):.2g} on the fastest pair, ×{float(ratio[-1]):.2g} on the slowest"
        )
    return (
        "How each long-context scaling (factor 4) stretches each pair's wavelength: "
        + "; ".join(parts)
        + ". A uniform stretch slows the fast pairs that tell neighbours apart; the others keep them."
    )


def _grid_kernel(probe: Probe) -> str:
    names = axis_names(probe)
    c = GRID_SIZE // 2
    parts = []
    for a, b in grid_planes(probe.scheme.position_dims):
        k = plane_kernel(probe, (a, b))[0]  # [G, G]
        centre = float(k[c, c])
        span_a = float(k[:, c].max() - k[:, c].min())  # along axis a through the centre
        span_b = float(k[c, :].max() - k[c, :].min())
        text = (
            f"{names[a]} × {names[b]}: K is {centre:.3g} at the centre and falls to {float(k.min()):.3g}; "
            f"moving ±{c} along {names[a]} changes it by {span_a:.3g}, along {names[b]} by {span_b:.3g}"
        )
        low, high = sorted(((span_a, names[a]), (span_b, names[b])))
        if low[0] < 0.1 * high[0]:
            text += f" (stripes: over these offsets {low[1]} barely moves the logit, {high[1]} does)"
        parts.append(text)
    return (
        f"Each image is one plane of the grid through its centre (+), {GRID_SIZE} × {GRID_SIZE} points: "
        "the colour is K between a query at the centre and a key at that point (mean content), each "
        "panel on its own colour scale. " + "; ".join(parts) + "."
    )


def _steps(v: float) -> str:
    """A wavelength in steps: three significant digits, whole steps with separators from 100."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _axes(probe: Probe) -> str:
    axis, angle = rotation_axes(probe)  # [d_h], [d_h]
    names = axis_names(probe)
    parts, fastest = [], {}
    for a, name in enumerate(names):
        sel = axis == a
        if not bool(sel.any()):
            parts.append(f"{name} turns none")
            continue
        lam = 2 * math.pi / angle[sel]
        fastest[name] = float(lam.min())
        parts.append(
            f"{name} turns {int(sel.sum())} of the {axis.numel()} dimensions (wavelengths "
            f"{_steps(float(lam.min()))} to {_steps(float(lam.max()))} steps)"
        )
    idle = int((axis < 0).sum())
    best = min(fastest.values())
    sharp = [n for n, v in fastest.items() if v <= best * (1 + 1e-6)]
    verdict = (
        f"{sharp[0]} holds the fastest turning dimensions, so it tells neighbours apart most sharply; "
        f"the others start at slower wavelengths and tell mostly far points apart"
        if len(sharp) == 1
        else f"{' and '.join(sharp)} start at the same fastest wavelength, so they tell neighbours apart "
        "equally sharply"
    )
    return (
        "Top: each dimension of the head at the wavelength it turns with, coloured by the position axis "
        "that turns it; bottom: the head as a strip of those colours (a rotated pair's two dimensions "
        "share a colour). "
        + "; ".join(parts)
        + (f"; {idle} turn with no axis" if idle else "")
        + f". {verdict}."
    )


#: Caption writer per static plot kind of the per-scheme sections.
CAPTIONS: dict[str, Callable[[Probe], str]] = {
    "heatmap": _heatmap,
    "frequencies": _frequencies,
    "kernel_curve": _kernel_curve,
    "bias": _bias,
    "kernel": _kernel,
    "scalings": _scalings,
    "grid": _grid_kernel,
    "axes": _axes,
}


def figure_caption(probe: Probe, kind: str) -> str:
    """What to notice in ``probe``'s figure of ``kind``, as HTML, from the scheme's own numbers
    (beginning with the scheme's name: two schemes with the same numbers share a sentence, not a
    caption)."""
    return f"<i>{esc(probe.name)}</i>: {CAPTIONS[kind](probe)}" if kind in CAPTIONS else ""


def _span_change(initial: float, trained: float) -> str:
    """How far head 0's kernel reaches (max |K|) before and after training, as the titles show it."""
    if initial == 0.0:
        return (
            f"head 0's K is exactly 0 at initialisation (a uniform panel: nothing varies yet) and "
            f"reaches {trained:.3g} after training."
        )
    ratio = trained / initial

    def times(x: float) -> str:
        return f"{x:,.0f}x" if x >= 1000 else f"{x:.3g}x"

    change = (
        f"{times(ratio)} larger"
        if ratio >= 1.5
        else f"{times(1 / ratio)} smaller"
        if ratio <= 1 / 1.5
        else "about as large"
    )
    return f"head 0's K reaches {initial:.3g} at initialisation and {trained:.3g} after training ({change})."


def trained_kernel_note(initial: Probe, trained: Probe, train_len: int) -> str:
    """What training did to a scheme's kernel, from its numbers: the head-mean kernel at distance
    0 and at the far end of the trained window, before and after, and whether it now falls with
    distance (recency)."""
    out, spans = [], []
    for probe in (initial, trained):
        kern, _ = display_kernel(probe, train_len)  # [h, L, L]
        spans.append(float(kern[0].abs().max()))  # head 0, as the heatmaps show it
        r, curve = kernel_curve(kern)  # [2L-1], [h, 2L-1]
        mean = curve.mean(0)
        near = float(mean[(r >= 0) & (r <= 2)].mean())  # the key itself and its two predecessors
        far = float(mean[r >= train_len // 2].mean())  # the far half of the window
        out.append((near, far, float(curve.std(0).mean()) if curve.shape[0] > 1 else None))
    (n0, f0, _), (n1, f1, spread) = out
    trend = (
        "falls with distance: near keys are preferred (recency)" if n1 > f1 else "does not fall with distance"
    )
    heads = "" if spread is None else f" Heads differ by {spread:.3g} logit units on average."
    return (
        f"<i>{esc(trained.name)}</i>: {_span_change(*spans)} "
        f"Head-mean K at distances 0-2 against the far half of the window: "
        f"{n0:.3g} against {f0:.3g} at initialisation, {n1:.3g} against {f1:.3g} after training; the "
        f"trained kernel {trend}.{heads}"
    )
