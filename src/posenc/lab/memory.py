"""Memory: estimate a run's peak memory and refuse one that cannot fit, before it starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .._alloc import InsufficientMemoryError, available_memory, format_gib

__all__ = ["InsufficientMemoryError", "MemoryEstimate", "available_memory", "check_memory", "estimate_memory"]


# ----------------------------------------------------------------------------------------------
# Memory: refuse a run that cannot fit, before it starts
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """A rough upper estimate of a run's peak memory, in bytes, by part."""

    weights: int
    grads: int
    optimizer: int
    activations: int
    detail: str = ""

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations

    def summary(self) -> str:
        parts = [
            ("weights", self.weights),
            ("grads", self.grads),
            ("AdamW", self.optimizer),
            ("activations", self.activations),
        ]
        inner = ", ".join(f"{k} {format_gib(v)}" for k, v in parts if v)
        return f"{format_gib(self.total)} ({inner}{'; ' + self.detail if self.detail else ''})"


def estimate_memory(
    model_config: Any,
    batch_size: int,
    seq_len: int,
    *,
    training: bool = True,
    num_params: int | None = None,
    bytes_per_value: int = 4,
) -> MemoryEstimate:
    """Estimate the peak memory of training (or evaluating) a :class:`~posenc.model.TransformerLM`.

    The model is float32; AdamW keeps two moments per parameter. Per layer and token a pre-LN
    block keeps about ``10 d + 2 d_ff`` values for the backward pass; attention with a score
    bias or an explicit softmax holds ``h s^2`` values per window (counted as if every window
    materialised its attention matrix, an upper bound for fused kernels); the output layer holds
    logits, their softmax and its gradient, ``3 V`` per token.

    Args:
        model_config: a :class:`~posenc.model.ModelConfig` (``d_model``, ``num_layers``,
            ``num_heads``, ``ffn_dim``, ``vocab_size``).
        batch_size: windows per process (not the global batch).
        seq_len: ``s``.
        training: with gradients and optimizer state (False: inference, one layer alive at a time).
        num_params: the exact parameter count if known (default: from the config).
    """
    c = model_config
    d, f, h, L, V = c.d_model, c.ffn_dim, c.num_heads, c.num_layers, c.vocab_size
    if num_params is None:
        num_params = c.approx_num_params()
    bpv = bytes_per_value
    tokens = batch_size * seq_len
    attention = batch_size * h * seq_len * seq_len * bpv  # [b, h, s, s] probabilities/logits of one layer
    logits = tokens * V * bpv * 3
    weights = num_params * bpv
    if training:
        per_layer = tokens * (10 * d + 2 * f) * bpv + attention
        return MemoryEstimate(
            weights,
            weights,
            2 * weights,
            L * per_layer + logits,
            f"batch {batch_size} x seq {seq_len}, {L} layers",
        )
    per_layer = tokens * (6 * d + f) * bpv + 2 * attention  # live tensors of the layer being computed
    return MemoryEstimate(weights, 0, 0, per_layer + logits, f"inference, batch {batch_size} x seq {seq_len}")


def check_memory(
    estimate: MemoryEstimate,
    device: str | torch.device = "cpu",
    *,
    available: int | None = None,
    what: str = "this run",
    headroom: float = 0.9,
) -> None:
    """Raise :class:`InsufficientMemoryError` when ``estimate`` does not fit in ``headroom`` of the
    free memory of ``device`` (``available`` overrides the measurement, e.g. in tests)."""
    free = available_memory(device) if available is None else available
    if estimate.total > headroom * free:
        raise InsufficientMemoryError(
            f"{what} would not fit in memory: it needs about {estimate.summary()}, but only "
            f"{format_gib(free)} is free on {torch.device(device)}. Reduce the batch size (or evaluate in "
            "smaller chunks), the sequence length or the model size, or use a device with more memory."
        )
