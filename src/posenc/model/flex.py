"""Attention with a positional bias through PyTorch's FlexAttention, on CUDA.

FlexAttention (``torch.nn.attention.flex_attention``) compiles the attention of a ``score_mod``
(a function of ``(score, b, h, q_idx, kv_idx)``) and a block mask into one fused kernel: the bias is
read inside the kernel instead of being materialised as ``[b | 1, h, s_q, s_k]`` and handed to SDPA,
and blocks the mask hides entirely (the future of a causal decoder) are skipped.

The ``score_mod`` comes from what the scheme declares, never from its name:

* a scheme whose bias depends only on ``k_pos - q_pos`` (``distance_bias`` answers: ALiBi, T5,
  KERPLE) gives one ``[h, n]`` table per distance: with positions ``[s]`` in unit steps (a plain
  sequence, a KV cache offset) ``n = s_q + s_k - 1`` and the kernel reads
  ``table[h, kv_idx - q_idx + s_q - 1]``; with other positions (left padding: ``[b, s]``; packed
  documents) it reads ``table[h, k_pos[kv_idx] - q_pos[q_idx] - d_min]`` over the distances that
  occur;
* every other bias (FIRE, Shaw's and Transformer-XL's content terms) is materialised once by
  ``score_bias`` and looked up, ``bias[b, h, q_idx, kv_idx]``: the same memory as SDPA's float mask,
  with the masked blocks still skipped.

The block mask is the plan's: ``q_idx + s_k - s_q >= kv_idx`` for a causal decoder after a cache of
``s_k - s_q`` keys, the plan's boolean mask (padding, packed documents) otherwise, none for an
unmasked encoder. FlexAttention must be compiled to be fast (eager it computes the whole score
matrix): the compiled function is made once per process and kept at module level.

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q``/``s_k`` query/key
lengths, ``d_h`` head width, ``n`` distances in a table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..base import PositionalScheme
from ..kernels import eager, enabled
from .biased import BiasedAttention
from .blocked import distance_speaks_for_bias, distance_table, unit_steps

__all__ = [
    "FLEX_DTYPES",
    "FLEX_HEAD_DIMS",
    "FLEX_MIN_QUERIES",
    "FlexBiasedAttention",
    "bias_lookup_mod",
    "block_mask",
    "flex_attention_function",
    "score_mod",
    "usable",
]

#: fewest queries for which a model takes FlexAttention: below one of its 128-query tiles (decoding
#: one token at a time, short prompts) the materialised bias is at most ``128 x s_k`` per head and
#: SDPA takes it as it is, with no block mask to build (not measured against FlexAttention there)
FLEX_MIN_QUERIES = 128
#: dtypes a model sends through FlexAttention: float32, the one checked on a GPU (an H100, torch
#: 2.11: within 1e-6 of SDPA with the full bias, forward and gradients). In bf16 the compiled kernel
#: failed there (Inductor: "No valid triton configs ... out of resource" for the fused
#: FlexAttention kernel at d_h = 64), so bf16/fp16 keep SDPA with the full bias, as float64 does.
FLEX_DTYPES = (torch.float32,)
#: head widths a model sends through FlexAttention: 64, the width checked on a GPU (an H100);
#: other powers of two tile without padding but need more shared memory, and were not reached by
#: benchmarks/device/flex_check.py there (its budget ran out), so they keep SDPA with the full bias
FLEX_HEAD_DIMS = (64,)


@functools.cache
def _available() -> bool:
    """Whether this torch has FlexAttention (imported only on a CUDA decision: it loads dynamo)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def usable(q: torch.Tensor) -> bool:
    """Whether a model should take FlexAttention for queries ``q`` ``[b, h, s_q, d_h]``: plain eager
    CUDA tensors (not while ``torch.compile`` traces a model: its graph keeps the full-bias path)
    of :data:`FLEX_DTYPES`, at least :data:`FLEX_MIN_QUERIES` queries, a head width of
    :data:`FLEX_HEAD_DIMS`, fast paths not switched off (``POSENC_C_KERNELS=0``) and a torch that
    has FlexAttention."""
    if q.device.type != "cuda" or torch.compiler.is_compiling() or not eager(q):
        return False
    if q.dtype not in FLEX_DTYPES:
        return False
    return q.shape[-2] >= FLEX_MIN_QUERIES and q.shape[-1] in FLEX_HEAD_DIMS and enabled() and _available()


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    """``torch.compile(flex_attention)``, made once per process (compiling is per shape, cached by
    torch; a module-level function, so no forward pass holds compiler state)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_attention_function(device: torch.device) -> Callable[..., torch.Tensor]:
    """FlexAttention for tensors on ``device``: compiled on CUDA; elsewhere PyTorch's eager
    implementation (it computes the whole score matrix; on CPU it has no backward): what the tests
    compare on a CPU."""
    if torch.device(device).type == "cuda":
        return _compiled_flex()
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


# ----------------------------------------------------------------------------------------------
# score_mod: the bias inside the kernel
# ----------------------------------------------------------------------------------------------
def _distance_mod(table: torch.Tensor, offset: torch.Tensor) -> Callable:
    """``score + table[h, kv_idx - q_idx + offset]`` (positions in unit steps)."""

    def mod(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx - q_idx + offset]

    return mod


def _positions_mod(table: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, d_min: torch.Tensor):
    """``score + table[h, k_pos[b, kv_idx] - q_pos[b, q_idx] - d_min]`` (positions ``[b | 1, s]``)."""
    if q_pos.shape[0] == 1:

        def mod(score, b, h, q_idx, kv_idx):
            return score + table[h, k_pos[0, kv_idx] - q_pos[0, q_idx] - d_min]

        return mod

    def mod_rows(score, b, h, q_idx, kv_idx):
        return score + table[h, k_pos[b, kv_idx] - q_pos[b, q_idx] - d_min]

    return mod_rows


def bias_lookup_mod(bias: torch.Tensor) -> Callable:
    """A ``score_mod`` that adds a materialised bias ``[b | 1, h, s_q, s_k]``:
    ``score + bias[b, h, q_idx, kv_idx]``."""
    if bias.shape[0] == 1:

        def mod(score, b, h, q_idx, kv_idx):
            return score + bias[0, h, q_idx, kv_idx]

        return mod

    def mod_rows(score, b, h, q_idx, kv_idx):
        return score + bias[b, h, q_idx, kv_idx]

    return mod_rows


def _as_rows(positions: torch.Tensor) -> torch.Tensor:
    """``[s]`` or ``[b, s]`` -> ``[b | 1, s]``."""
    return positions[None] if positions.dim() == 1 else positions


def score_mod(
    scheme: PositionalScheme,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    q: torch.Tensor | None = None,
) -> Callable:
    """The scheme's bias as a FlexAttention ``score_mod`` (see the module docstring).

    Args:
        scheme: a scheme with the ``score_bias`` hook that does not read the keys.
        q_positions: ``[s_q]`` or ``[b, s_q]``; k_positions: ``[s_k]`` or ``[b, s_k]``.
        q: ``[b, h, s_q, d_h]`` queries before rotation, for a bias that reads them (the bias is then
            materialised); None for a content-free bias.

    Returns:
        ``mod(score, b, h, q_idx, kv_idx) -> score + bias``; gradients reach the scheme's parameters
        through the tensors it reads (a trainable T5 table, KERPLE's ``r1``/``r2``).
    """
    s_q, s_k = q_positions.shape[-1], k_positions.shape[-1]
    if q is None and unit_steps(q_positions) and unit_steps(k_positions):
        table = distance_table(scheme, q_positions, k_positions)  # [h, s_q + s_k - 1]
        if table is not None:
            return _distance_mod(table, torch.tensor(s_q - 1, device=q_positions.device))
    if q is None and distance_speaks_for_bias(scheme):
        qp, kp = _as_rows(q_positions), _as_rows(k_positions)  # [b | 1, s_q], [b | 1, s_k]
        d_min = int(kp.min()) - int(qp.max())
        n = int(kp.max()) - int(qp.min()) - d_min + 1
        if n <= s_q * s_k:  # a table no larger than the bias itself (positions spread without bound)
            distance = torch.arange(d_min, d_min + n, device=qp.device)  # [n]
            table = scheme.distance_bias(distance)  # [h, n], or None: not a distance bias
            if table is not None:
                if qp.shape[0] != kp.shape[0]:  # one of them shared by the rows
                    rows = max(qp.shape[0], kp.shape[0])
                    qp, kp = qp.expand(rows, -1), kp.expand(rows, -1)
                return _positions_mod(table, qp, kp, torch.tensor(d_min, device=qp.device))
    bias = scheme.score_bias(q_positions, k_positions, q)  # [b | 1, h, s_q, s_k]
    return bias_lookup_mod(bias)


# ----------------------------------------------------------------------------------------------
# The block mask: causal, padding, packing
# ----------------------------------------------------------------------------------------------
def block_mask(keep: torch.Tensor | None, causal_prefix: bool, s_q: int, s_k: int, device: torch.device):
    """The FlexAttention ``BlockMask`` of an attention plan, or None (nothing masked).

    Args:
        keep: ``[b | 1, 1, s_q, s_k]`` bool, True where a query may see a key (padding, packed
            documents); None when nothing beyond ``causal_prefix`` is masked.
        causal_prefix: query ``i`` sees exactly keys ``0 .. s_k - s_q + i`` (a causal decoder after
            a cache of ``s_k - s_q`` keys, no padding): a closed form, ``keep`` unused.
        s_q, s_k: query and key lengths.
        device: where the mask lives.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if causal_prefix:
        offset = torch.tensor(s_k - s_q, device=device)

        def causal(b, h, q_idx, kv_idx):
            return q_idx + offset >= kv_idx

        return create_block_mask(causal, None, None, s_q, s_k, device=device)
    if keep is None:
        return None
    keep = keep.expand(keep.shape[0], 1, s_q, s_k)  # a mask shared by the queries: read as a view
    if keep.shape[0] == 1:

        def shared(b, h, q_idx, kv_idx):
            return keep[0, 0, q_idx, kv_idx]

        return create_block_mask(shared, None, None, s_q, s_k, device=device)

    def per_row(b, h, q_idx, kv_idx):
        return keep[b, 0, q_idx, kv_idx]

    return create_block_mask(per_row, keep.shape[0], None, s_q, s_k, device=device)


# ----------------------------------------------------------------------------------------------
# What a model calls
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlexBiasedAttention(BiasedAttention):
    """Attention with a positional bias through FlexAttention, as a model calls it:
    ``attention(q [b, h, s_q, d_h], k, v [b, h_kv, s_k, d_h], dropout_p=0.0) -> [b, h, s_q, d_h]``.

    FlexAttention has no attention dropout: ``takes_dropout`` is False and a model in training with
    dropout calls ``full_bias()`` (``[b | 1, h, s_q, s_k]``) and SDPA instead.

    Attributes:
        score_mod: from :func:`score_mod`.
        block_mask: from :func:`block_mask` (None: nothing masked).
        full_bias: the scheme's bias as a tensor, for the dropout path.
    """

    score_mod: Callable
    block_mask: Any
    full_bias: Callable[[], torch.Tensor]
    takes_dropout = False

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0
    ) -> torch.Tensor:
        if dropout_p:
            raise ValueError(
                f"FlexAttention has no attention dropout (dropout_p={dropout_p}): use full_bias() with SDPA"
            )
        flex = flex_attention_function(q.device)
        return flex(
            q, k, v, score_mod=self.score_mod, block_mask=self.block_mask, enable_gqa=q.shape[1] != k.shape[1]
        )
