"""Tests of posenc.lab.probe: the repeated-string effective-context probe scores retrieval alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posenc.lab.probe import PREFIX, probe_distances, probe_summary, repeated_string_probe
from posenc.model.transformer import LMOutput


class Uniform(nn.Module):
    """The same probability for every byte: 8 bits each, whatever the context."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor) -> LMOutput:
        return LMOutput(torch.zeros(*ids.shape, 256) + 0 * self.weight)


class Lookback(Uniform):
    """Predicts the byte that came ``d`` bytes before the next one: retrieves at distance ``d`` only."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def forward(self, ids: torch.Tensor) -> LMOutput:
        back = torch.roll(ids, self.d - 1, dims=1)  # position t: ids[t + 1 - d]
        return LMOutput(20.0 * nn.functional.one_hot(back, 256).float() + 0 * self.weight)


def _text() -> torch.Tensor:
    return (torch.arange(5000) % 97 + 32).to(torch.uint8)  # ordinary-looking bytes


def test_a_model_that_cannot_retrieve_scores_8_bits():
    rows = repeated_string_probe(Uniform(), _text(), [32, 64], trials=8)
    assert [r["distance"] for r in rows] == [32, 64] and [r["length"] for r in rows] == [
        PREFIX + 48,
        PREFIX + 80,
    ]
    for r in rows:
        assert r["bits"]["mean"] == pytest.approx(8.0) and len(r["trial_bits"]) == 8
        assert r["gain"]["mean"] == pytest.approx(0.0, abs=1e-9)  # nothing retrieved


def test_retrieval_is_found_at_its_distance_only():
    rows = {r["distance"]: r for r in repeated_string_probe(Lookback(64), _text(), [32, 64, 128], trials=16)}
    assert rows[64]["accuracy"]["mean"] == 1.0 and rows[64]["bits"]["mean"] < 1e-6
    assert rows[32]["accuracy"]["mean"] < 0.1 and rows[128]["accuracy"]["mean"] < 0.1
    assert rows[32]["bits"]["mean"] > 8  # confidently wrong costs more than uniform
    assert rows[64]["gain"]["mean"] > 25 and abs(rows[32]["gain"]["mean"]) < 5  # retrieval at 64 only


def test_the_same_trials_for_every_model_and_a_summary_across_seeds():
    a = repeated_string_probe(Uniform(), _text(), [32], trials=4, seed=3)
    b = repeated_string_probe(Lookback(32), _text(), [32], trials=4, seed=3)
    assert a[0]["length"] == b[0]["length"]
    runs = [
        {"name": "x", "seed": s, "eval": [{"length": 8}, {"length": 64, "probe": p}]}
        for s, p in ((0, a), (1, b))
    ]
    (row,) = probe_summary(runs)
    assert row["seeds"] == [0, 1] and row["bits"]["mean"] == pytest.approx((8.0 + b[0]["bits"]["mean"]) / 2)
    assert row["bits"]["over"] == "seeds"


def test_distances_fit_the_window_and_errors():
    assert probe_distances(1024, 16) == [32, 64, 128, 256, 512]
    assert probe_distances(40, 16) == []
    with pytest.raises(ValueError, match="distance 8 is shorter than string_len=16"):
        repeated_string_probe(Uniform(), _text(), [8])
    with pytest.raises(ValueError, match="too few for a probe window"):
        repeated_string_probe(Uniform(), _text()[:100], [512])
    with pytest.raises(ValueError, match="string_len must be >= 2"):
        repeated_string_probe(Uniform(), _text(), [32], string_len=1)
