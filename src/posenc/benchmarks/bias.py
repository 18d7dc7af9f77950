"""Causal attention with a positional bias (ALiBi, T5), the bias built on every call, against causal
SDPA without any bias (the limit: a bias can at best cost nothing).

Implementations (q, k, v ``[b, h, s, d_h]`` float32):

* ``sdpa_causal_no_bias``: ``scaled_dot_product_attention(..., is_causal=True)``, the limit;
* ``posenc_<scheme>_full``: ``scheme.score_bias`` for all ``s x s`` pairs, ``-inf`` above the
  diagonal, SDPA with that float mask (the path of ``torch.compile``d and GPU models);
* ``posenc_<scheme>_blocked``: :func:`posenc.model.blocked.causal_attention_with_bias`,
  what ``posenc.model``'s attention runs on a CPU: the bias and causal mask of each block of
  queries gathered from one per-distance table, future keys skipped;
* ALiBi peers: HF Bloom's ``build_alibi_tensor`` (the key-only ``m_h * j`` form, which relies on
  softmax's shift invariance) plus the causal mask; x-transformers' ``AlibiPositionalBias``
  (it keeps the ``[h, s, s]`` table in a buffer after its first call: not rebuilt per call);
* T5 peer: x-transformers' ``RelativePositionBias`` (causal buckets, T5's 32 buckets and max
  distance 128), given posenc's table weights so that both compute the same bias; posenc's T5 is
  built as a decoder's (``causal=True``, ``max_distance=128``).

Checks: every implementation against attention with the scheme's ``score_bias`` and the causal mask
over every key, computed 512 queries at a time (no view, no skipped keys), within 1e-5 (absolute
and relative: SDPA's blocking and Bloom's shifted bias round differently). Peak memory: each implementation's
peak resident growth in one call, measured in a fresh process (``peak_mb``).

Bytes: q, k, v read and the output written (attention is compute-bound: read the times).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .harness import Case, Impl, no_grad_case, tensor_bytes
from .rope import optional_import

__all__ = ["cases"]


def _sdpa_masked(q, k, v, bias: torch.Tensor) -> torch.Tensor:
    """SDPA with ``bias`` where ``j <= i`` and ``-inf`` above the diagonal (one float mask)."""
    s = q.shape[2]
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)  # [s, s], True above the diagonal
    mask = bias.to(q.dtype).masked_fill(future, float("-inf"))  # [b | 1, h, s, s]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _reference(q, k, v, scheme, pos: torch.Tensor, rows: int = 512) -> torch.Tensor:
    """Attention with the scheme's ``score_bias`` and the ``-inf`` causal mask over every key, ``rows``
    queries at a time: the full-table arithmetic in O(h * rows * s) memory (``[b, h, s, d_h]``)."""
    s, outs = q.shape[2], []
    for q0 in range(0, s, rows):
        q1 = min(q0 + rows, s)
        future = torch.arange(s)[None, :] > torch.arange(q0, q1)[:, None]  # [n, s]: keys after the query
        mask = scheme.score_bias(pos[q0:q1], pos).masked_fill(future, float("-inf"))  # [1, h, n, s]
        outs.append(F.scaled_dot_product_attention(q[:, :, q0:q1], k, v, attn_mask=mask))
    return torch.cat(outs, dim=2)  # [b, h, s, d_h]


def _case(
    name: str, scheme_name: str, shape: tuple[int, int, int, int], block_size: int | None, peers: bool = True
) -> Case:
    import posenc
    from posenc.model.blocked import causal_attention_with_bias, scheme_bias_fn

    _, h, s, _ = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    pos = torch.arange(s)
    kw = {"causal": True, "max_distance": 128} if scheme_name == "t5" else {}
    scheme = posenc.build(scheme_name, num_heads=h, **kw)
    blocks = block_size or "automatic (posenc.model's)"
    impls = [
        Impl(
            "sdpa_causal_no_bias",
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "baseline",
            None,
            "the limit: no positional bias at all",
            agrees="the limit computes attention without the bias",
        ),
        Impl(
            f"posenc_{scheme_name}_full",
            lambda: _sdpa_masked(q, k, v, scheme.score_bias(pos, pos)),
            "posenc",
            None,
            "score_bias [1, h, s, s] + -inf mask + SDPA (posenc.model's path)",
        ),
        Impl(
            f"posenc_{scheme_name}_blocked",
            lambda: causal_attention_with_bias(
                q, k, v, scheme_bias_fn(scheme, pos, pos), block_size=block_size
            ),
            "posenc",
            None,
            f"model.blocked, {blocks} queries per block",
        ),
    ]
    skipped: dict[str, str] = {}
    if peers:
        peer_impls = _alibi_peers if scheme_name == "alibi" else _t5_peers
        impls += peer_impls(q, k, v, scheme, skipped)
    else:  # long inputs: the full-table path and the peers build [h, s, s] masks (GBs)
        impls.pop(1)
        skipped["others"] = "full-table path and peers not run at this length: each builds an [h, s, s] mask"
    nbytes = 4 * tensor_bytes(q)
    params = {"shape": list(shape), "scheme": scheme_name, "block_size": block_size, "dtype": "float32"}

    def reference() -> torch.Tensor:  # built only when the case is checked (not in memory probes)
        with torch.no_grad():
            return _reference(q, k, v, scheme, pos)

    description = f"causal attention with {scheme_name} bias, q/k/v {list(shape)}"
    return Case(
        name,
        description,
        nbytes,
        impls,
        params,
        skipped,
        baselines=False,
        reference=reference,
        atol=1e-5,
        rtol=1e-5,
        limit="sdpa_causal_no_bias",
        memory=True,
    )


def _alibi_peers(q, k, v, scheme, skipped: dict[str, str]) -> list[Impl]:
    """HF Bloom's ALiBi (key-only form) and x-transformers' AlibiPositionalBias, each + mask + SDPA."""
    b, h, s, _ = q.shape
    impls: list[Impl] = []
    bloom, why_bloom = optional_import("transformers.models.bloom.modeling_bloom")
    if bloom is None:
        skipped["hf_bloom_alibi"] = why_bloom
    else:
        ones = torch.ones(b, s)

        def bloom_attention() -> torch.Tensor:
            alibi = bloom.build_alibi_tensor(ones, h, q.dtype)  # type: ignore[attr-defined]  # [b h, 1, s]
            return _sdpa_masked(q, k, v, alibi.view(b, h, 1, s))  # m_h * j, broadcast over queries

        doc = "build_alibi_tensor (m_h * j) + causal mask + SDPA"
        # m_h * j is rounded at its own size (up to m_h * s), not at the size of m_h * (j - i)
        atol = 1e-5 + 4 * 2.0**-24 * float(scheme.slopes().max()) * s
        impls.append(Impl("hf_bloom_alibi", bloom_attention, "peer", None, doc, tolerance=(atol, 1e-5)))
    xt, why = optional_import("x_transformers.x_transformers")
    if xt is None:
        skipped["x_transformers_alibi"] = why
    else:
        alibi = xt.AlibiPositionalBias(h)  # type: ignore[attr-defined]
        doc = "AlibiPositionalBias (cached table after the first call) + mask + SDPA"
        impls.append(
            Impl("x_transformers_alibi", lambda: _sdpa_masked(q, k, v, alibi(s, s)), "peer", None, doc)
        )
    return impls


def _t5_peers(q, k, v, scheme, skipped: dict[str, str]) -> list[Impl]:
    """x-transformers' RelativePositionBias with posenc's table weights, + mask + SDPA."""
    h, s = q.shape[1], q.shape[2]
    xt, why = optional_import("x_transformers.x_transformers")
    if xt is None:
        skipped["x_transformers_t5"] = why
        return []
    rel = xt.RelativePositionBias(scale=1.0, causal=True, heads=h)  # type: ignore[attr-defined]
    with torch.no_grad():  # the same weights: both compute the same bias
        rel.relative_attention_bias.weight.copy_(scheme.relative_attention_bias.weight)
    doc = "RelativePositionBias (causal buckets) + mask + SDPA"
    return [Impl("x_transformers_t5", lambda: _sdpa_masked(q, k, v, rel(s, s)), "peer", None, doc)]


def cases(quick: bool) -> dict[str, Callable[[], Case]]:
    """The attention-bias cases (``quick``: tiny shapes)."""
    big = (1, 2, 32, 8) if quick else (2, 16, 2048, 64)
    lab = (2, 4, 16, 8) if quick else (32, 4, 128, 32)
    blk = 8 if quick else None  # None: the automatic blocks posenc.model uses

    def long_shape(length: int) -> tuple[int, int, int, int]:
        return (1, 2, length // 128, 8) if quick else (1, 16, length, 64)

    return {
        "bias_alibi": no_grad_case(lambda: _case("bias_alibi", "alibi", big, blk)),
        "bias_t5": no_grad_case(lambda: _case("bias_t5", "t5", big, blk)),
        "bias_alibi_lab": no_grad_case(lambda: _case("bias_alibi_lab", "alibi", lab, blk)),
        **{
            f"bias_{scheme}_{length}": no_grad_case(
                lambda scheme=scheme, length=length: _case(
                    f"bias_{scheme}_{length}", scheme, long_shape(length), blk, peers=False
                )
            )
            for scheme in ("alibi", "t5")
            for length in (4096, 8192)
        },
    }
