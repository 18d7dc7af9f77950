"""The maths the property checks and plots share: the least-squares shift map ``e(p + k) ~ M_k
e(p)``, a scheme's angular frequencies, and RoFormer's decay bound.

Legend: ``s`` positions, ``d`` width, ``r`` relative distance.
"""

from __future__ import annotations

import torch

from .kernel import Probe, encodings, rotation_frequencies

__all__ = ["fit_shift_map", "fit_shift_maps", "roformer_bound", "scheme_frequencies"]


def _lstsq(x: torch.Tensor, ys: list[torch.Tensor], rcond: float = 1e-10) -> list[torch.Tensor]:
    """Minimum-norm least-squares ``B`` with ``x B ~ y`` for each ``y``, from one SVD of ``x [n, d]``.

    Singular values below ``rcond * max`` are dropped (rank-deficient trajectories: constant or
    duplicated dimensions). LAPACK's ``gelsy`` mis-estimates the rank on exact duplicates.
    """
    u, sv, vh = torch.linalg.svd(x, full_matrices=False)  # [n, r], [r], [r, d]
    inv = torch.where(sv > rcond * sv.max(), 1.0 / sv, torch.zeros_like(sv))  # [r]
    return [vh.T @ (inv[:, None] * (u.T @ y)) for y in ys]  # [d, r] @ [r, d'] -> [d, d']


def fit_shift_maps(enc: torch.Tensor, shifts: list[int]) -> dict[int, tuple[torch.Tensor, float]]:
    """:func:`fit_shift_map` for several shifts on the same starting rows ``e(0..s-1-max(k))``."""
    e = enc.double()
    top = max(shifts)
    x = e[: e.shape[0] - top]  # [s - K, d]: e(p)
    ys = [e[k : e.shape[0] - top + k] for k in shifts]  # [s - K, d] each: e(p + k)
    out = {}
    for k, y, sol in zip(shifts, ys, _lstsq(x, ys)):
        resid = torch.linalg.norm(y - x @ sol) / torch.linalg.norm(y).clamp_min(1e-300)
        out[k] = (sol.T, float(resid))
    return out


def fit_shift_map(enc: torch.Tensor, shift: int) -> tuple[torch.Tensor, float]:
    """Least-squares linear map ``M`` with ``e(p + k) ~ M e(p)`` and its relative residual.

    Args:
        enc: ``[s, d]`` encodings of positions ``0..s-1``.
        shift: ``k`` >= 1, less than ``s``.

    Returns:
        ``(M [d, d], residual)`` with ``residual = |E_{+k} - E M^T|_F / |E_{+k}|_F`` (float64),
        the minimum-norm solution when ``E`` is rank-deficient.
    """
    if not 1 <= shift < enc.shape[0]:
        raise ValueError(
            f"shift must be in [1, {enc.shape[0] - 1}] for {enc.shape[0]} positions, got {shift}"
        )
    return fit_shift_maps(enc, [shift])[shift]


def scheme_frequencies(probe: Probe) -> tuple[torch.Tensor, str]:
    """Angular frequencies ``theta_i`` (rad/position, high to low) of a scheme, and how they were found.

    ``rotate``: exact eigen-angles of the one-step rotation (:func:`rotation_frequencies`).
    ``embed``: eigen-angles of the one-step map ``M_1`` fitted by least squares on pairs
    ``(PE(p), PE(p+1))`` for ``p`` spread over ``[0, 131072)`` (every 64th), so that wavelengths up to
    ~1.3e5 positions complete a period inside the fit. Valid when ``relative_linear`` holds;
    eigenvalues far from the unit circle (directions the fit cannot determine) are dropped and
    their pairs reported as ``nan``.

    Returns:
        (float64 ``[d/2]``, ``"exact"`` or ``"fitted"``); ``0`` for dimensions that never move.
    """
    if "frequencies" not in probe.cache:
        probe.cache["frequencies"] = _frequencies(probe)
    return probe.cache["frequencies"]


def _frequencies(probe: Probe) -> tuple[torch.Tensor, str]:
    if probe.rotates:
        return rotation_frequencies(probe), "exact"
    if "embed" not in probe.hooks:
        raise ValueError(f"scheme {probe.name!r} has no per-position vector to read frequencies from")
    # [n] starting points: the whole table, or every 64th position of [0, 131072)
    pos = torch.arange(probe.nominal_len - 1) if probe.bounded_length else torch.arange(0, 131072, 64)
    x, y = encodings(probe, pos).double(), encodings(probe, pos + 1).double()  # [n, d] each
    m = _lstsq(x, [y])[0].T  # [d, d]: y ~ x M^T
    eig = torch.linalg.eigvals(m)  # [d]
    keep = (eig.abs() - 1).abs() < 0.05  # a rotation's eigenvalues lie on the unit circle
    angles = torch.sort(eig[keep].angle().abs(), descending=True).values[0::2]  # one per +-pair
    half = x.shape[-1] // 2
    out = torch.full((half,), float("nan"), dtype=torch.float64)
    out[: min(half, angles.numel())] = angles[:half]
    return out, "fitted"


def roformer_bound(inv_freq: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """RoFormer's long-term decay curve (Su et al. 2021, section 3.4.3, eq. 37).

    ``B(r) = (1 / (d/2)) sum_{j=1}^{d/2} |S_j(r)|`` with ``S_j(r) = sum_{i<j} e^{i r theta_i}``;
    ``|q^T R_r k| <= max_i |h_{i+1} - h_i| * (d/2) * B(r)``, so ``B`` bounds how much a relative
    distance ``r`` can contribute.

    Args:
        inv_freq: ``theta`` ``[d/2]`` in RoFormer's order (``theta_0 = 1`` first).
        distances: ``[r]`` relative distances.

    Returns:
        float64 ``[r]``.
    """
    theta = inv_freq.double()
    phase = distances.double()[:, None] * theta[None, :]  # [r, d/2]
    re, im = torch.cos(phase).cumsum(-1), torch.sin(phase).cumsum(-1)  # S_j for j = 1..d/2: [r, d/2]
    return torch.sqrt(re**2 + im**2).mean(-1)  # [r]
