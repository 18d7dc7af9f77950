"""Tests of posenc.lab.memory: estimate_memory grows with batch, length and training state, and
check_memory refuses a run that would not fit with a message naming the sizes and the fix."""

from __future__ import annotations

import pytest

from _lab_toys import tiny_config
from posenc.lab import InsufficientMemoryError, check_memory, estimate_memory


def test_memory_estimate_grows_with_batch_length_and_training():
    c = tiny_config()
    small = estimate_memory(c, 2, 16)
    assert estimate_memory(c, 4, 16).activations > small.activations
    assert estimate_memory(c, 2, 64).activations > 4 * small.activations  # attention is quadratic
    inference = estimate_memory(c, 2, 16, training=False)
    assert inference.grads == inference.optimizer == 0 and inference.total < small.total
    assert small.optimizer == 2 * small.weights  # AdamW's two moments


def test_memory_check_message():
    estimate = estimate_memory(tiny_config(), 8, 2048)
    with pytest.raises(
        InsufficientMemoryError,
        match=r"would not fit in memory: it needs about .* but only "
        r"1.0 MiB is free on cpu\. Reduce the batch size",
    ):
        check_memory(estimate, "cpu", available=2**20)
    check_memory(estimate, "cpu", available=2**40)  # fits: no error
