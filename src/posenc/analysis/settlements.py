"""Measurements that settle the report's common misreadings: each returns one sentence quoting
numbers posenc computes when the page is built (the scheme built by name at its default sizes),
so no settlement types a measured number. :data:`~posenc.analysis.lessons.LESSONS` names which
misreading each settles.
"""

from __future__ import annotations

import math

import torch

from .kernel import encodings, make_probe, positional_kernel

__all__ = [
    "settle_alibi",
    "settle_kerple_log",
    "settle_mrope",
    "settle_nope_temperature",
    "settle_shaw",
    "settle_sinusoidal",
    "settle_xpos",
]


def settle_sinusoidal() -> str:
    from .spectrum import scheme_frequencies

    probe = make_probe("sinusoidal")
    lam = 2 * math.pi / scheme_frequencies(probe)[0]  # fastest first
    return (
        f"posenc measures (d = {probe.d_model}): pair 0 repeats every {float(lam[0]):.3g} positions, the "
        f"last pair every {float(lam[-1]):,.0f}."
    )


def settle_alibi() -> str:
    probe = make_probe("alibi")
    bias = positional_kernel(probe, [1000], [0, 999])[:, 0, :]  # [h, 2]: keys 1000 and 1 back
    steep = int(bias[:, 0].argmin())
    far, near = float(bias[steep, 0]), float(bias[steep, 1])
    return (
        f"posenc measures ({probe.num_heads} heads): the steepest head's bias is {far:,.4g} for a key "
        f"1,000 tokens back and {near:.3g} one token back, so the far key gets e<sup>{far - near:,.4g}"
        f"</sup> of the near one's weight for the same content; the flattest head's is "
        f"{float(bias[:, 0].max()):,.4g}."
    )


def settle_kerple_log() -> str:
    probe = make_probe("kerple_log")
    bias = positional_kernel(probe, [1000], [0])[:, 0, 0]  # [h]
    return (
        f"posenc measures, at initialisation ({probe.num_heads} heads), a bias of {float(bias.max()):.3g} to "
        f"{float(bias.min()):.3g} for a key 1,000 tokens back."
    )


def settle_xpos() -> str:
    probe = make_probe("xpos")
    last = probe.nominal_len - 1
    norms = encodings(probe, [0, last]).double().norm(dim=-1)  # [2]: |R_p u| of a unit u
    return (
        f"posenc measures |R<sub>p</sub>u| = {float(norms[0]):.3g} at p = 0 and {float(norms[1]):.3g} at "
        f"p = {last}."
    )


def settle_shaw() -> str:
    probe = make_probe("shaw")
    mean = float(positional_kernel(probe, 64).abs().max())  # mean-content kernel
    return f"posenc measures the largest |K| of its mean-content kernel over 64 positions: {mean:.3g}."


def settle_mrope() -> str:
    from ..registry import build_with_context

    probe = make_probe("mrope")
    plain = build_with_context(
        "rope",
        {"d_model": probe.d_model, "head_dim": probe.head_dim, "num_heads": 1, "max_len": 256},
        {"base": probe.scheme.base},
    )
    q = torch.randn(1, 1, 256, probe.head_dim, generator=torch.Generator().manual_seed(0))  # [1, 1, s, d_h]
    pos = torch.arange(256)
    with torch.no_grad():
        a, b = probe.scheme.rotate(q, q, pos, pos)[0], plain.rotate(q, q, pos, pos)[0]
    diff = float((a - b).abs().max())
    return (
        f"posenc measures the largest difference between its multimodal RoPE on text positions 0..255 "
        f"and its RoPE (d<sub>h</sub> = {probe.head_dim}, same base): {diff:.3g}."
    )


def settle_nope_temperature() -> str:
    probe = make_probe("nope_temperature")
    n = 1 << 15
    q = torch.ones(1, 1, n, 1)  # [1, 1, s, 1]: the factor itself
    with torch.no_grad():
        factor = probe.scheme.queries(q, torch.arange(n))[0, 0, :, 0]  # [s]
    above = (factor != 1).nonzero()
    if above.numel() == 0:
        return f"posenc measures a factor of exactly 1 at every position below {n:,}."
    first = int(above[0])
    return (
        f"posenc measures a factor of exactly 1 at positions 0 to {first - 1:,} and "
        f"{float(factor[first]):.4g} at {first:,}."
    )
