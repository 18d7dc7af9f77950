"""Sinusoidal positions: posenc (computed on the fly from positions) vs x-transformers and the
classic precomputed buffer, in one run.

* ``sinusoidal_table``: the ``[s, d]`` table for a long sequence. posenc's
  :func:`posenc.sinusoidal_table` (both layouts); x-transformers' ``ScaledSinusoidalEmbedding``
  (computes ``[sin | cos]`` times its gain); the classic ``pe[:s]`` of a buffer precomputed at
  construction (a view: nothing is computed per call, but the buffer costs ``max_len * d`` memory
  and nothing past ``max_len`` can be encoded). Bytes: the table written.
* ``sinusoidal_embed``: ``x + PE`` for input embeddings ``x [b, s, d]`` (the ``embed`` hook).
  posenc's ``SinusoidalPE.embed``; the classic ``x + pe[:s]``; x-transformers'
  ``x + ScaledSinusoidalEmbedding(x)`` and ``x + AbsolutePositionalEmbedding(x)`` (learned).
  Bytes: ``x`` read, the result written.

Checks: each implementation is compared with posenc's table of its layout (float32, within 1e-6
absolute: angles up to ``s`` radians). x-transformers' embeddings are labelled "same work,
different numbers": its scaled sinusoid multiplies by a learned gain (``d^-1/2`` at
initialisation) and spaces its frequencies by ``1/(d/2)`` rather than tensor2tensor's
``1/(d/2 - 1)``; its absolute embedding is a learned table.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .harness import Case, Impl, no_grad_case, tensor_bytes
from .rope import optional_import

__all__ = ["cases"]

_XT_SCALED = "same work, different numbers: a learned gain d^-1/2 and frequencies spaced 1/(d/2)"


def _table_case(name: str, s: int, d: int) -> Case:
    import posenc

    positions_buffer = posenc.sinusoidal_table(s, d)  # classic: precomputed once, [max_len, d]
    refs = {
        "interleaved": positions_buffer.clone(),
        "concatenated": posenc.sinusoidal_table(s, d, variant="tensor2tensor"),
    }
    x = torch.empty(1, s, d)  # x-transformers takes x only for its length and device
    impls = [
        Impl("posenc_vaswani", lambda: posenc.sinusoidal_table(s, d), "posenc", "interleaved"),
        Impl(
            "posenc_tensor2tensor",
            lambda: posenc.sinusoidal_table(s, d, variant="tensor2tensor"),
            "posenc",
            "concatenated",
        ),
        Impl(
            "classic_buffer_slice",
            lambda: positions_buffer[:s],
            "peer",
            "interleaved",
            "pe[:s] of a precomputed buffer: a view, no work per call (memory max_len*d, no extrapolation)",
        ),
    ]
    skipped: dict[str, str] = {}
    xt, why = optional_import("x_transformers.x_transformers")
    if xt is None:
        skipped["x_transformers_scaled_sinusoidal"] = why
    else:
        scaled = xt.ScaledSinusoidalEmbedding(d)  # type: ignore[attr-defined]
        impls.append(
            Impl(
                "x_transformers_scaled_sinusoidal",
                lambda: scaled(x),
                "peer",
                "concatenated",
                "ScaledSinusoidalEmbedding(d)(x): [sin | cos] * gain",
                form="table",
                agrees=_XT_SCALED,
            )
        )
    nbytes = s * d * 4
    for impl in impls:
        impl.form = "table"
    return Case(
        name,
        f"[{s}, {d}] float32 table",
        nbytes,
        impls,
        {"s": s, "d": d},
        skipped,
        reference=lambda: refs,
        atol=1e-6,
    )


def _embed_case(name: str, b: int, s: int, d: int) -> Case:
    import posenc

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, s, d, generator=gen)
    pe = posenc.SinusoidalPE(d)
    kept = posenc.SinusoidalPE(d, precompute=s)  # rows of 0..s-1 kept from build time
    buffer = posenc.sinusoidal_table(s, d)  # [max_len, d]
    impls = [
        Impl(
            "posenc_sinusoidal",
            lambda: pe.embed(x),
            "posenc",
            "interleaved",
            "SinusoidalPE.embed: table computed from positions each call",
        ),
        Impl(
            "posenc_sinusoidal_precomputed",
            lambda: kept.embed(x),
            "posenc",
            "interleaved",
            f"SinusoidalPE(d, precompute={s}).embed: rows kept from build time, like the buffer",
        ),
        Impl(
            "classic_buffer", lambda: x + buffer[:s], "peer", "interleaved", "x + pe[:s], precomputed buffer"
        ),
    ]
    skipped: dict[str, str] = {}
    xt, why = optional_import("x_transformers.x_transformers")
    if xt is None:
        skipped["x_transformers_scaled_sinusoidal"] = skipped["x_transformers_absolute"] = why
    else:
        scaled = xt.ScaledSinusoidalEmbedding(d)  # type: ignore[attr-defined]
        learned = xt.AbsolutePositionalEmbedding(d, s)  # type: ignore[attr-defined]
        impls.append(
            Impl(
                "x_transformers_scaled_sinusoidal",
                lambda: x + scaled(x),
                "peer",
                "concatenated",
                agrees=_XT_SCALED,
            )
        )
        impls.append(
            Impl(
                "x_transformers_absolute",
                lambda: x + learned(x),
                "peer",
                "learned",
                "AbsolutePositionalEmbedding: a learned table lookup",
                agrees="same work, different numbers: a learned table",
            )
        )
    nbytes = 2 * tensor_bytes(x)
    params = {"b": b, "s": s, "d": d}
    want = x + buffer[:s]
    return Case(
        name,
        f"x + PE for x [{b}, {s}, {d}] float32",
        nbytes,
        impls,
        params,
        skipped,
        reference=lambda: want,
        atol=1e-6,
    )


def cases(quick: bool) -> dict[str, Callable[[], Case]]:
    """The sinusoidal cases (``quick``: tiny shapes)."""
    s_long, d_long = (256, 32) if quick else (65536, 512)
    b, s, d = (2, 16, 32) if quick else (8, 2048, 768)
    return {
        "sinusoidal_table": no_grad_case(lambda: _table_case("sinusoidal_table", s_long, d_long)),
        "sinusoidal_embed": no_grad_case(lambda: _embed_case("sinusoidal_embed", b, s, d)),
    }
