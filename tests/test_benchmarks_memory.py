"""Tests of posenc.benchmarks.memory: the peak memory of one call, from a fresh process."""

from __future__ import annotations

import pytest
import torch

from posenc.benchmarks import memory

pytestmark = pytest.mark.skipif(not memory.supported(), reason="needs Linux /proc")


def test_peak_counts_what_one_call_allocates(monkeypatch):
    """In process: a call that allocates and touches 64 MiB peaks at about that over its start
    (Linux updates its resident counters in batches: a few hundred kB either way)."""
    from posenc.benchmarks import harness

    def case():
        return harness.Case("fake", "", 8, [harness.Impl("big", lambda: torch.ones(16 << 20))])

    monkeypatch.setattr("posenc.benchmarks.select", lambda names, quick: {"fake": case})
    assert 60 << 20 <= memory._measure("fake", "big", True) <= 72 << 20
    with pytest.raises(ValueError, match="no implementation 'small'"):
        memory._measure("fake", "small", True)


def test_peak_bytes_runs_a_shipped_case_in_a_fresh_process():
    peak = memory.peak_bytes("embedding_eval", "posenc_input_embedding", quick=True, threads=1)
    assert isinstance(peak, int) and 0 <= peak < 64 << 20
    with pytest.raises(RuntimeError, match="error: case 'embedding_eval' has no implementation 'nothing'"):
        memory.peak_bytes("embedding_eval", "nothing", quick=True)
    assert memory.main(["nonsense_case", "x", "--quick"]) == 2  # one line, no traceback
