"""Attention diagnostics by length: why a scheme degrades past the trained length.

For a trained model read at length ``E``, per layer and head, over the scored queries (the last
``S`` of each window, the bytes the paired delta reads):

* **entropy** (bits) of each query's attention distribution: dilution shows as entropy growing
  with ``E`` (NoPE; T5's far buckets), a collapse as entropy falling;
* **mean attended distance** ``sum_j p_ij (i - j)`` in tokens: ALiBi's locality stays short;
* **mass beyond L**: the attention on keys ``L`` or more tokens back, which no trained query ever
  saw (0 at ``E = L`` by definition).

The probabilities come from the model's own attention path: a forward pre-hook on every
:class:`~posenc.model.MultiHeadAttention` takes the layer's input, positions and scheme, and asks
the layer for its logits (:meth:`~posenc.model.MultiHeadAttention.logits`, the same projections,
rotation and bias as the forward pass), masked by the pass's own plan; no attention maths is
repeated here.

Legend: ``b`` windows, ``h`` heads, ``E`` evaluation length (keys), ``S`` scored queries,
``L`` training length, ``n`` layers.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

__all__ = ["DIAGNOSTIC_METRICS", "attention_stats", "diagnose", "fill_diagnostics"]

#: The per-length means (over layers, heads, queries and windows) summarised across seeds.
DIAGNOSTIC_METRICS = ("attn_entropy", "attn_distance", "attn_beyond")


def _layer_stats(probs: torch.Tensor, train_len: int) -> dict[str, torch.Tensor]:
    """``probs`` ``[b, h, S, E]`` (the last ``S`` query slots of ``E``) -> per head ``[h]``:
    entropy in bits, mean distance in tokens, mass on keys ``>= L`` back."""
    s_q, s_k = probs.shape[-2:]
    query_slot = torch.arange(s_k - s_q, s_k, device=probs.device)[:, None]  # [S, 1]
    distance = (query_slot - torch.arange(s_k, device=probs.device)[None, :]).clamp(min=0)  # [S, E]
    entropy = -torch.special.xlogy(probs, probs).sum(-1) / math.log(2)  # [b, h, S]
    mean_distance = (probs * distance).sum(-1)  # [b, h, S]
    beyond = (probs * (distance >= train_len)).sum(-1)  # [b, h, S]
    return {
        "entropy_bits": entropy.mean(dim=(0, 2)),
        "distance": mean_distance.mean(dim=(0, 2)),
        "beyond_l": beyond.mean(dim=(0, 2)),
    }


@torch.no_grad()
def attention_stats(model: nn.Module, ids: torch.Tensor, train_len: int, score_len: int) -> dict[str, Any]:
    """Attention diagnostics of ``model`` reading ``ids`` ``[b, E]``.

    Args:
        model: a posenc model (its attention layers are :class:`~posenc.model.MultiHeadAttention`).
        ids: ``[b, E]`` token ids.
        train_len: ``L``; keys ``L`` or more tokens before a query count as "beyond L".
        score_len: ``S``, the last queries of each window that are measured.

    Returns:
        ``{"entropy_bits", "distance", "beyond_l"}`` each ``[n][h]`` (lists), plus their means
        over layers and heads as ``attn_entropy``, ``attn_distance``, ``attn_beyond``.
    """
    from ..model import MultiHeadAttention

    layers: list[dict[str, torch.Tensor]] = []

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        x, plan = args[0], args[1]
        scheme = args[2] if len(args) > 2 else kwargs.get("scheme")
        if kwargs.get("kv") is not None or kwargs.get("cache") is not None:
            raise ValueError(
                "attention diagnostics read plain self-attention (no memory, cache or cross-attention)"
            )
        logits = module.logits(x, plan, scheme)[..., -score_len:, :]  # [b, h, S, E], the model's own maths
        keep = plan.keep(x.shape[1], logits.shape[-1], x.device)
        if keep is not None:
            logits = logits.masked_fill(~keep[..., -score_len:, :], float("-inf"))
        layers.append(_layer_stats(logits.float().softmax(-1), train_len))

    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in attention]
    try:
        model(ids)
    finally:
        for handle in handles:
            handle.remove()
    out: dict[str, Any] = {k: [layer[k].tolist() for layer in layers] for k in layers[0]}
    for key, metric in zip(("entropy_bits", "distance", "beyond_l"), DIAGNOSTIC_METRICS):
        out[metric] = float(torch.stack([layer[key] for layer in layers]).mean())
    return out


def diagnose(model: nn.Module, evalset, length: int, config, device: torch.device) -> dict[str, Any]:
    """:func:`attention_stats` on the first ``config.diagnostic_windows`` windows of ``evalset`` at
    ``length``, one window per forward pass (attention ``[h, E, E]`` per layer), averaged; with
    the seconds it took (``wall_s``)."""
    t0, k = time.perf_counter(), config.diagnostic_windows
    runs = []
    for i in range(k):
        window = evalset.windows(length, slice(i, i + 1)).to(device)  # [1, E + 1]
        runs.append(attention_stats(model, window[:, :-1], config.train_len, config.targets_per_window))
    out: dict[str, Any] = {"windows": k, "queries": config.targets_per_window}
    for key in ("entropy_bits", "distance", "beyond_l"):
        out[key] = torch.tensor([r[key] for r in runs]).mean(0).tolist()  # [n][h]
    for metric in DIAGNOSTIC_METRICS:
        out[metric] = sum(r[metric] for r in runs) / k
    out["wall_s"] = time.perf_counter() - t0
    return out


def fill_diagnostics(point, model: nn.Module, config, evalset, device: torch.device) -> None:
    """Put :func:`diagnose` at ``point.length`` into an :class:`~posenc.lab.evaluate.EvalPoint`:
    the means as ``attn_entropy``, ``attn_distance``, ``attn_beyond``, everything as ``attention``."""
    stats = diagnose(model, evalset, point.length, config, device)
    point.attention = stats
    point.attn_entropy, point.attn_distance, point.attn_beyond = (stats[m] for m in DIAGNOSTIC_METRICS)
