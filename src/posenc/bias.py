"""Attention biases from relative position alone: ALiBi and T5's bucketed bias (the ``score_bias`` hook).

Both add a term that depends only on the distance between a query at position ``i`` and a key
at position ``j`` to the scaled attention logits (``softmax(q k^T / sqrt(d_h) + bias)``):

* **ALiBi** (Press et al. 2022): ``bias_h(i, j) = -m_h * |i - j|``, with fixed head slopes
  ``m_h = 2^(-8h/n)`` for ``n`` a power of two (see :func:`alibi_slopes` for other head counts).
  On the keys a causal mask keeps (``j <= i``) this is the paper's ``-m_h * (i - j)``; a key after
  the query gets its distance's penalty too, never the paper's ``+m_h * (j - i)``, so attention
  without a causal mask never favours far-future tokens. One form serves decoders and encoders, so
  ALiBi takes no ``causal`` argument.
* **T5** (Raffel et al. 2020): ``bias_h(i, j) = B[bucket(j - i), h]`` with one learned scalar per
  (bucket, head); exact buckets for small distances, logarithmic ones up to ``max_distance``
  (see :func:`t5_relative_bucket`).

Nothing ``O(s^2)`` is kept between calls: the bias is computed from the positions in each call.
Positions may be any integers, ``[s]`` or per batch row ``[b, s]`` (packed documents, left
padding, KV-cache offsets); only their differences matter.

Legend: ``b`` batch, ``h`` heads, ``s_q``/``s_k`` query/key lengths.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ._alloc import factory_kwargs
from ._precision import autocast_off
from ._validate import check_int, check_positive_float
from .base import PositionalScheme
from .positions import check_positions

__all__ = [
    "ALiBi",
    "T5RelativeBias",
    "alibi_bias",
    "alibi_slopes",
    "default_max_distance",
    "relative_positions",
    "t5_relative_bucket",
]


# ----------------------------------------------------------------------------------------------
# Shared: autocast off, positions -> relative positions
# ----------------------------------------------------------------------------------------------
def check_relative_positions(positions: object, name: str) -> torch.Tensor:
    if not isinstance(positions, torch.Tensor):
        raise TypeError(
            f"{name} must be an integer tensor [s] or [b, s], got {type(positions).__name__}; "
            "use torch.arange(s)"
        )
    return check_positions(positions, positions.shape[-1] if positions.dim() else -1, name=name)


def relative_positions(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """``k_positions[j] - q_positions[i]`` (T5's ``memory_position - query_position``), exact in int64.

    Args:
        q_positions: ``[s_q]`` or ``[b, s_q]`` integer positions of the queries.
        k_positions: ``[s_k]`` or ``[b, s_k]`` integer positions of the keys.

    Returns:
        int64 ``[1, s_q, s_k]`` when both are 1-D, else ``[b, s_q, s_k]``.

    Raises:
        TypeError: positions that are not integer tensors.
        ValueError: positions with more than two dims, or batch sizes that differ (and are not 1).
    """
    q = check_relative_positions(q_positions, "q_positions")
    k = check_relative_positions(k_positions, "k_positions")
    q = q if q.dim() == 2 else q[None]  # [s_q] -> [1, s_q]
    k = k if k.dim() == 2 else k[None]  # [s_k] -> [1, s_k]
    if q.shape[0] != k.shape[0] and 1 not in (q.shape[0], k.shape[0]):
        raise ValueError(
            f"q_positions and k_positions have batch sizes {q.shape[0]} and {k.shape[0]}; "
            "pass [s] positions or [b, s] positions with the same b"
        )
    return k[:, None, :] - q[:, :, None]  # [b|1, 1, s_k] - [b|1, s_q, 1] -> [b|1, s_q, s_k]


# ----------------------------------------------------------------------------------------------
# ALiBi
# ----------------------------------------------------------------------------------------------
def _power_of_two_slopes(n: int) -> list[float]:
    # 2^(-8/n), 2^(-16/n), ..., 2^(-8): a geometric sequence whose ratio equals its start.
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def alibi_slopes(
    num_heads: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """ALiBi's head slopes ``m_h`` (Press et al. 2022, section 3).

    For ``n`` a power of two, ``m_h = 2^(-8h/n)`` for ``h = 1..n``. For other head counts the
    official code (ofirpress/attention_with_linear_biases, ``get_slopes``; HF Bloom's
    ``build_alibi_tensor``) takes the ``n'`` slopes of the closest smaller power of two ``n'`` and
    appends every other slope (the 1st, 3rd, ...) of ``2n'`` until there are ``n``.

    Args:
        num_heads: ``h``, the number of heads (>= 1).
        dtype, device: of the result; the slopes are computed in float64 and cast.

    Returns:
        ``[h]`` slopes, all in ``(0, 1)``.
    """
    n = check_int(num_heads, "num_heads")
    base = 2 ** math.floor(math.log2(n))
    slopes = _power_of_two_slopes(base)
    if base != n:
        slopes += _power_of_two_slopes(2 * base)[0::2][: n - base]
    return torch.tensor(slopes, dtype=torch.float64, device=device).to(dtype)


def alibi_bias(slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """The ALiBi bias ``-m_h |i - j|`` for given slopes and positions (pure function): the paper's
    ``-m_h (i - j)`` on every key at or before the query, and the distance's penalty on a key after
    it (the paper's form would give it ``+m_h (j - i)``, favouring the far future wherever no causal
    mask removes it), so decoders and encoders use the same bias.

    Args:
        slopes: ``[h]`` head slopes (:func:`alibi_slopes`).
        q_positions: ``[s_q]`` or ``[b, s_q]`` integer positions ``i``.
        k_positions: ``[s_k]`` or ``[b, s_k]`` integer positions ``j``.

    Returns:
        ``[b | 1, h, s_q, s_k]`` in the dtype of ``slopes`` (float32 or float64).
    """
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1 or not slopes.is_floating_point():
        raise TypeError("slopes must be a float tensor [h]; use posenc.alibi_slopes(num_heads)")
    rel = relative_positions(q_positions, k_positions)  # [b|1, s_q, s_k] = j - i, exact int64
    neg_dist = rel.abs().neg()  # -|i - j| (ints: no -0.0); = j - i wherever j <= i
    with autocast_off(rel.device):
        # [b | 1, 1, s_q, s_k] * [1, h, 1, 1] -> [b | 1, h, s_q, s_k]
        return neg_dist[:, None].to(slopes.dtype) * slopes[None, :, None, None]


#: The fixes named to a caller who passes ALiBi a form (it has one) or T5 its ``bidirectional``
#: (posenc's one argument is ``causal``, its negation).
_ALIBI_FORM_FIX = "drop it: ALiBi's bias is -m_h |i - j| in decoders and encoders alike"
_CAUSAL_FIX = "pass causal=not bidirectional (causal=True: a decoder's one-directional buckets)"


def _refuse_removed(what: str, given: dict[str, Any], fixes: dict[str, str]) -> None:
    """A ``TypeError`` naming the fix for a keyword argument ``what`` no longer takes."""
    for key in given:
        fix = fixes.get(key)
        raise TypeError(
            f"{what} no longer takes {key}=: {fix}"
            if fix
            else f"{what} got an unexpected keyword argument {key!r}"
        )


class ALiBi(PositionalScheme):
    """Attention with Linear Biases (Press et al. 2022): a fixed, per-head linear distance penalty.

    Args:
        num_heads: ``h``, the number of attention heads.

    One form serves decoders, encoders and cross-attention: the bias is ``-m_h |i - j|``, the
    paper's ``-m_h (i - j)`` on the keys a causal mask keeps, and never larger for a key after the
    query than for the query itself, so a model that forgets the causal mask does not favour
    far-future tokens. (Hence no ``causal`` argument: it could not change a value.)

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k])
    -> [b | 1, h, s_q, s_k]`` float32. No parameters and no buffers: the slopes are recomputed
    from ``num_heads`` each call (cheap), so ``module.to(torch.bfloat16)`` cannot round them.
    """

    name = "alibi"
    hooks = ("score_bias",)
    summary = "fixed per-head linear distance penalty on the logits (Press et al. 2022); any length"

    def __init__(self, num_heads: int, **removed: Any) -> None:
        super().__init__()
        _refuse_removed("ALiBi", removed, {"causal": _ALIBI_FORM_FIX})
        self.num_heads = check_int(num_heads, "num_heads")

    def slopes(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The float32 slopes ``[h]``."""
        return alibi_slopes(self.num_heads, device=device)

    def score_bias(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, q: torch.Tensor | None = None
    ) -> torch.Tensor:
        device = q_positions.device if isinstance(q_positions, torch.Tensor) else None
        return alibi_bias(self.slopes(device), q_positions, k_positions)

    def distance_bias(self, distance: torch.Tensor) -> torch.Tensor:
        """``[n]`` distances ``j - i`` -> ``[h, n]``: :meth:`score_bias`'s values, bit for bit."""
        neg_dist = distance.abs().neg()  # as alibi_bias: exact ints
        with autocast_off(distance.device):
            slopes = self.slopes(distance.device)  # [h], float32 (as score_bias's)
            return neg_dist[None].to(slopes.dtype) * slopes[:, None]  # [1, n] * [h, 1] -> [h, n]

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


# ----------------------------------------------------------------------------------------------
# T5
# ----------------------------------------------------------------------------------------------
def _check_buckets(causal: bool, num_buckets: int, max_distance: int) -> None:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} ({causal!r})")
    check_int(num_buckets, "num_buckets", minimum=2 if causal else 4)
    if not causal and num_buckets % 2:
        raise ValueError(
            f"num_buckets must be even when causal=False (half per direction), got {num_buckets}; "
            f"use {num_buckets + 1}"
        )
    max_exact = (num_buckets if causal else num_buckets // 2) // 2
    check_int(
        max_distance,
        "max_distance",
        minimum=max_exact + 1,
        hint=f" (it must exceed the {max_exact} exact buckets of num_buckets={num_buckets})",
    )


def t5_relative_bucket(
    relative_position: torch.Tensor,
    *,
    causal: bool = False,
    num_buckets: int = 32,
    max_distance: int = 128,
    **removed: Any,
) -> torch.Tensor:
    """T5's bucket of each relative position (Raffel et al. 2020; Mesh TensorFlow, HF ``T5Attention``).

    ``relative_position = memory_position - query_position`` (key minus query). Distances below
    ``max_exact = n/2`` (``n`` = buckets per direction: ``num_buckets`` if causal, else
    ``num_buckets/2``) get a bucket each; larger ones share logarithmically wider buckets up to
    ``max_distance``, beyond which all fall in the last bucket. Not causal (T5's encoder, its
    ``bidirectional=True``): keys after the query (``relative_position > 0``) use buckets
    ``n..2n-1``. Causal (T5's decoder): keys after the query are clipped to distance 0.

    Args:
        relative_position: integer tensor of any shape ``[...]``.
        causal: whether the buckets serve a decoder (keys after the query are not distinguished)
            or an encoder (default False: they are). T5's code calls this ``bidirectional = not causal``.
        num_buckets: total number of buckets (T5: 32). Even unless ``causal``.
        max_distance: distance from which every position shares the last bucket (T5: 128).

    Returns:
        int64 ``[...]`` bucket ids in ``[0, num_buckets)``.
    """
    if not isinstance(relative_position, torch.Tensor):
        raise TypeError(
            f"relative_position must be an integer tensor, got {type(relative_position).__name__}"
        )
    if (
        relative_position.is_floating_point()
        or relative_position.is_complex()
        or (relative_position.dtype == torch.bool)
    ):
        raise TypeError(
            f"relative_position must be an integer tensor, got dtype {relative_position.dtype}; "
            "pass e.g. (k_positions[None, :] - q_positions[:, None]).long()"
        )
    _refuse_removed("t5_relative_bucket", removed, {"bidirectional": _CAUSAL_FIX})
    _check_buckets(causal, num_buckets, max_distance)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    n = num_buckets
    if not causal:
        n //= 2
        buckets = buckets + (rel > 0).long() * n  # keys after the query: upper half
        dist = rel.abs()
    else:
        dist = (-rel).clamp_min(0)  # keys after the query count as distance 0
    max_exact = n // 2
    is_small = dist < max_exact
    # The same float32 operations, in the same order, as T5 (so boundaries round identically);
    # clamping to max_exact first avoids log(0) where the exact branch is used anyway.
    large = (
        max_exact
        + (
            torch.log(dist.clamp_min(max_exact).float() / max_exact)
            / math.log(max_distance / max_exact)
            * (n - max_exact)
        ).long()
    )
    large = large.clamp_max(n - 1)
    return buckets + torch.where(is_small, dist, large)


#: T5's ``max_distance`` (Raffel et al. 2020).
T5_MAX_DISTANCE = 128


def default_max_distance(num_buckets: int, max_len: int | None, *, causal: bool = False) -> int:
    """T5's 128, capped at half the trained length ``max_len`` so every bucket is trained, and
    kept above the exact buckets (which need ``max_distance > max_exact``; ``causal`` as in
    :func:`t5_relative_bucket`)."""
    if max_len is None:
        return T5_MAX_DISTANCE
    check_int(max_len, "max_len")
    max_exact = (num_buckets if causal else num_buckets // 2) // 2
    return max(max_exact + 1, min(T5_MAX_DISTANCE, max_len // 2))


class T5RelativeBias(PositionalScheme):
    """T5's relative position bias: one learned scalar per (bucket, head), added to the logits.

    Args:
        num_heads: ``h``.
        num_buckets: number of buckets (T5: 32).
        max_distance: distance where the last bucket starts. Default: T5's 128, or half the
            trained length ``max_len`` when that is shorter (see below).
        causal: False (default, T5's encoder) for encoders; True for decoders (T5's decoder; a
            model's decoder passes it): keys after the query share distance 0's bucket, so a
            future key never gets more bias than the present one. (T5's code names the encoder
            form ``bidirectional``; posenc has one ``causal`` argument.)
        init_std: std of the normal initialisation of the ``[num_buckets, h]`` table.
        max_len: the length the model is trained at (a model offers its ``max_len``). Used only
            to choose the default ``max_distance``; T5 buckets themselves have no length limit.

    Why ``max_distance <= max_len / 2`` by default: a bucket whose distances never occur in
    training keeps its initial value (~0). With ``max_distance >= max_len`` the far buckets are
    untrained while the trained mid-range ones learn negative values, so past the trained length
    the farthest keys get a *higher* bias than mid-range ones and the preference for near tokens
    flips (measured in ``posenc extrapolate``: docs/lab.md). At half the trained length every
    bucket, the last one included, is seen in every training window.

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k])
    -> [b | 1, h, s_q, s_k]`` float32. T5 computes the bias in the first layer and shares it with
    every layer; a model does that by reusing one instance (or builds one per layer).
    """

    name = "t5"
    hooks = ("score_bias",)
    summary = "learned scalar per (log-bucketed distance, head) on the logits (Raffel et al. 2020)"

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int | None = None,
        *,
        causal: bool = False,
        init_std: float = 0.02,
        max_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **removed: Any,
    ) -> None:
        super().__init__()
        _refuse_removed("T5RelativeBias", removed, {"bidirectional": _CAUSAL_FIX})
        self.num_heads = check_int(num_heads, "num_heads")
        if max_distance is None:
            _check_buckets(causal, num_buckets, 2**62)  # the other arguments first, for clear errors
            max_distance = default_max_distance(num_buckets, max_len, causal=causal)
        _check_buckets(causal, num_buckets, max_distance)
        self.num_buckets, self.max_distance, self.causal = num_buckets, max_distance, causal
        self.init_std = check_positive_float(init_std, "init_std")
        self.relative_attention_bias = nn.Embedding(
            num_buckets, self.num_heads, **factory_kwargs(device, dtype)
        )  # [buckets, h]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.relative_attention_bias.weight, std=self.init_std)

    def score_bias(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, q: torch.Tensor | None = None
    ) -> torch.Tensor:
        rel = relative_positions(q_positions, k_positions)  # [b|1, s_q, s_k]
        buckets = t5_relative_bucket(
            rel, causal=self.causal, num_buckets=self.num_buckets, max_distance=self.max_distance
        )
        values = self.relative_attention_bias(buckets)  # [b|1, s_q, s_k, h]
        # float32 at least (a bf16 table's values are exact in float32); a float64 table stays float64
        out_dtype = torch.promote_types(values.dtype, torch.float32)
        return values.permute(0, 3, 1, 2).to(out_dtype)  # [b|1, s_q, s_k, h] -> [b|1, h, s_q, s_k]

    def distance_bias(self, distance: torch.Tensor) -> torch.Tensor:
        """``[n]`` distances ``j - i`` -> ``[h, n]``: :meth:`score_bias`'s values (differentiable)."""
        buckets = t5_relative_bucket(
            distance, causal=self.causal, num_buckets=self.num_buckets, max_distance=self.max_distance
        )
        values = self.relative_attention_bias(buckets)  # [n, h]
        return values.t().to(torch.promote_types(values.dtype, torch.float32))  # [n, h] -> [h, n]

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, causal={self.causal}"
        )
