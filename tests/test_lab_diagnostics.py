"""Tests of posenc.lab.diagnostics: attention entropy, attended distance and mass beyond L, read
through the model's own logits path, against closed forms (uniform attention; ALiBi's bias alone),
with no hook left behind; and in a study: results.json, the tables and attention.png."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _lab_toys import tiny_study, write_corpus
from posenc.bias import alibi_slopes
from posenc.lab.diagnostics import attention_stats
from posenc.lab.extrapolate import run_study
from posenc.lab.tables import format_table
from posenc.model import ModelConfig, TransformerLM


def _blind_model(position: str, layers: int = 2) -> TransformerLM:
    """A model whose queries and keys are zero: its logits are the scheme's bias alone."""
    torch.manual_seed(0)
    model = TransformerLM(
        ModelConfig(vocab_size=64, d_model=16, num_layers=layers, num_heads=2, position=position)
    )
    for block in model.decoder.blocks:
        torch.nn.init.zeros_(block.attn.q_proj.weight)
    return model.eval()


def test_uniform_attention_matches_the_closed_form():
    """NoPE with zero queries attends uniformly to the i + 1 keys it may see."""
    E, S, L = 12, 5, 4
    stats = attention_stats(_blind_model("nope"), torch.randint(0, 64, (3, E)), train_len=L, score_len=S)
    slots = torch.arange(E - S, E, dtype=torch.float64)  # the scored queries
    entropy = float(torch.log2(slots + 1).mean())
    distance = float((slots / 2).mean())  # mean of 0..i
    beyond = float(((slots - L + 1).clamp(min=0) / (slots + 1)).mean())  # keys with i - j >= L
    assert stats["attn_entropy"] == pytest.approx(entropy, abs=1e-5)
    assert stats["attn_distance"] == pytest.approx(distance, abs=1e-5)
    assert stats["attn_beyond"] == pytest.approx(beyond, abs=1e-6)
    assert len(stats["entropy_bits"]) == 2 and len(stats["entropy_bits"][0]) == 2  # [layers][heads]


def test_alibi_bias_alone_matches_its_softmax():
    E, S, L = 16, 4, 6
    stats = attention_stats(
        _blind_model("alibi", layers=1), torch.randint(0, 64, (2, E)), train_len=L, score_len=S
    )
    for head, slope in enumerate(alibi_slopes(2).tolist()):
        ent, dist, beyond = [], [], []
        for i in range(E - S, E):
            d = torch.arange(i, -1, -1, dtype=torch.float64)  # distances of keys 0..i
            p = torch.softmax(-slope * d, 0)
            ent.append(float(-(p * p.log2()).sum()))
            dist.append(float((p * d).sum()))
            beyond.append(float(p[d >= L].sum()))
        assert stats["entropy_bits"][0][head] == pytest.approx(sum(ent) / S, abs=1e-4)
        assert stats["distance"][0][head] == pytest.approx(sum(dist) / S, abs=1e-4)
        assert stats["beyond_l"][0][head] == pytest.approx(sum(beyond) / S, abs=1e-5)


def test_no_hook_is_left_and_the_forward_pass_is_unchanged():
    model = _blind_model("rope")
    ids = torch.randint(0, 64, (1, 10))
    before = model(ids).logits
    stats = attention_stats(model, ids, train_len=10, score_len=10)
    assert stats["attn_beyond"] == 0.0  # no key is L or more back inside a window of L
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert torch.equal(model(ids).logits, before)


def test_a_study_records_diagnostics_per_length_with_intervals(tmp_path):
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    config = tiny_study(
        corpus, schemes=("alibi", "rope"), seeds=(0, 1), variants=("yarn",), diagnostic_windows=2
    )
    study = run_study(config, out=tmp_path / "out", log=None)
    results = study.to_dict()
    point = results["runs"][0]["eval"][1]  # alibi, seed 0, E = 16
    assert (
        point["attention"]["windows"] == 2 and len(point["attention"]["distance"]) == 1
    )  # [1 layer][2 heads]
    row = next(r for r in results["summary"] if r["name"] == "rope+yarn" and r["length"] == 32)
    assert row["attn_entropy"]["n"] == 2 and row["attn_entropy"]["low"] < row["attn_entropy"]["high"]
    at_l = next(r for r in results["summary"] if r["name"] == "alibi" and r["length"] == 8)
    assert at_l["attn_beyond"]["mean"] == 0.0
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["summary"][1]["attn_distance"] == results["summary"][1]["attn_distance"]
    assert (tmp_path / "out" / "attention.png").stat().st_size > 0
    text = format_table(study)
    assert "mean attended distance in tokens" in text and "share of the attention on keys >= L=8" in text
    assert math.isfinite(row["attn_distance"]["mean"])
