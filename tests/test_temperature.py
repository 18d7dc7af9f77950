"""Tests of posenc.temperature: Llama 4's query temperature (its ``queries`` hook) against its
formula, per-row positions, both q/k layouts, the bf16 rounding (factor in float32, one rounding),
and validation."""

from __future__ import annotations

import math

import pytest
import torch

import posenc


def test_query_temperature_formula_and_positions():
    scheme = posenc.build("nope_temperature", floor_scale=4.0, attn_scale=0.1)
    q, k = torch.randn(2, 3, 10, 8), torch.randn(2, 1, 10, 8)
    pos = torch.tensor([0, 1, 2, 3, 4, 7, 8, 100, 8191, 2**40])
    rq = scheme.queries(q, pos)
    assert scheme.hooks == ("queries",)
    with pytest.raises(TypeError, match="transforms the queries alone"):  # nothing rotates
        scheme.rotate(q, k, pos, pos)
    factor = torch.tensor([math.log1p(math.floor((p + 1) / 4)) * 0.1 + 1 for p in pos.tolist()])
    torch.testing.assert_close(rq, q * factor[:, None], rtol=1e-6, atol=0)
    assert torch.equal(rq[:, :, :3], q[:, :, :3])  # factor exactly 1 below floor_scale - 1
    rows = torch.stack([pos, pos + 5])  # [b, s]: each row its own positions
    both = scheme.queries(q, rows)
    torch.testing.assert_close(both[1], scheme.queries(q[1:], pos + 5)[0])
    bshd = scheme.queries(q.transpose(1, 2), pos, qk_layout="bshd")
    assert torch.equal(bshd.transpose(1, 2), rq)
    assert torch.equal(scheme(q, pos), rq)  # calling the scheme runs its one hook
    half = scheme.queries(q.bfloat16(), pos)  # factor in float32, one rounding
    assert half.dtype == torch.bfloat16 and torch.equal(
        half, (q.bfloat16().float() * factor[:, None]).bfloat16()
    )


def test_registered_and_validated():
    assert posenc.describe("nope_temperature")["optional"] == {
        "floor_scale": 8192.0,
        "attn_scale": 0.1,
        "qk_layout": "bhsd",
    }
    with pytest.raises(ValueError, match="floor_scale must be a finite number > 0"):
        posenc.build("nope_temperature", floor_scale=0.0)
    with pytest.raises(TypeError, match="q must be a float tensor"):
        posenc.build("nope_temperature").queries(torch.zeros(2, 3))
    from posenc.analysis import verify

    assert not [r for r in verify(["nope_temperature"]) if r.status == "FAIL"]
