"""Tests of posenc.lab.distributed: configure_threads sets torch's threads (a given count, or the
free cores) and refuses a count below one. DDP itself runs in test_lab_train's torchrun test."""

from __future__ import annotations

import os

import pytest
import torch

from posenc.lab import configure_threads


def test_configure_threads():
    old = torch.get_num_threads()
    try:
        assert configure_threads(1) == 1 and torch.get_num_threads() == 1
        auto = configure_threads()
        assert 1 <= auto <= (os.cpu_count() or 1)
        with pytest.raises(ValueError, match="num_threads must be >= 1"):
            configure_threads(0)
    finally:
        torch.set_num_threads(old)
