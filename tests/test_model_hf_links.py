"""Tests of posenc.model.hf.links: each layout change between an HF tensor and its posenc parts is
a bijection with the documented placement (per-head fusing, stacked rows, Conv1D transposes), and
``{i}`` links expand per layer."""

from __future__ import annotations

import pytest
import torch

from posenc.model.hf.links import Link, expand


def _parts(shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in shapes]


@pytest.mark.parametrize(
    ("how", "shapes", "hf_shape"),
    [
        ("same", [(6, 4)], (6, 4)),
        ("transpose", [(6, 4)], (4, 6)),
        ("rows", [(8, 4), (2, 4), (2, 4)], (12, 4)),
        ("rows", [(8,), (2,)], (10,)),
        ("transpose_rows", [(4, 4), (4, 4), (4, 4)], (4, 12)),
        ("transpose_rows", [(4,), (4,), (4,)], (12,)),
        ("heads", [(8, 4), (8, 4), (8, 4)], (24, 4)),
        ("heads", [(8,), (8,), (8,)], (24,)),
    ],
)
def test_each_layout_round_trips(how, shapes, hf_shape):
    link = Link("hf", tuple(f"p{j}" for j in range(len(shapes))), how, heads=2)
    parts = _parts(shapes)
    assert link.hf_shape(shapes) == hf_shape
    joined = link.to_hf(parts)
    assert tuple(joined.shape) == hf_shape
    for got, want in zip(link.to_posenc(joined, shapes), parts):
        assert torch.equal(got, want)


def test_heads_layout_places_each_heads_q_k_v_together():
    """GPT-NeoX/Bloom: rows [q_0; k_0; v_0; q_1; k_1; v_1] for 2 heads of width 1."""
    q, k, v = torch.tensor([[0.0], [3.0]]), torch.tensor([[1.0], [4.0]]), torch.tensor([[2.0], [5.0]])
    fused = Link("hf", ("q", "k", "v"), "heads", heads=2).to_hf([q, k, v])
    assert fused.flatten().tolist() == [0, 1, 2, 3, 4, 5]


def test_transpose_rows_is_gpt2s_c_attn():
    """Conv1D computes x @ W; c_attn's columns are [q | k | v]."""
    q, k, v = _parts([(3, 2), (3, 2), (3, 2)])
    w = Link("c_attn", ("q", "k", "v"), "transpose_rows").to_hf([q, k, v])  # [d_in=2, 9]
    x = torch.randn(5, 2)
    torch.testing.assert_close(x @ w, torch.cat([x @ q.t(), x @ k.t(), x @ v.t()], dim=1))


def test_expand_formats_each_layer():
    links = expand([Link("a.{i}.w", ("b.{i}.w",)), Link("n", ("m",))], 2)
    assert [(x.hf, x.posenc) for x in links] == [("a.0.w", ("b.0.w",)), ("a.1.w", ("b.1.w",)), ("n", ("m",))]
