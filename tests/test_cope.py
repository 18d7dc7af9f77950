"""Tests of posenc.cope: CoPE against x-transformers' ``CoPE`` with copied weights (bit for bit in
float32), against the paper's equations in float64, the mask deciding which keys count (cache,
packing, left padding), GQA, gradients, compile and float64, the encoder refusal and ``posenc verify``."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from _scheme_invariants import check_all, check_compiled, tiny_lm
from posenc.cope import CoPE
from posenc.model import Encoder, ModelConfig

F64 = torch.float64


def perturb(scheme) -> None:
    scheme.pos_emb.copy_(torch.randn(scheme.pos_emb.shape))  # zeros at init would make every test trivial


def ref_cope(q, k, pos_emb, max_pos: int) -> torch.Tensor:
    """The paper's equations, one (query, key) pair at a time in float64: [b, h, s, s] (causal)."""
    b, h, s, d = q.shape
    out = torch.zeros(b, h, s, s, dtype=F64)
    for bi in range(b):
        for hi in range(h):
            for i in range(s):
                gates = [
                    1 / (1 + math.exp(-float(q[bi, hi, i] @ k[bi, hi, t]) / math.sqrt(d))) for t in range(s)
                ]
                for j in range(i + 1):
                    p = min(sum(gates[j : i + 1]), max_pos - 1)
                    lo, hi_ = math.floor(p), math.ceil(p)
                    w = p - lo
                    z_lo, z_hi = float(q[bi, hi, i] @ pos_emb[lo]), float(q[bi, hi, i] @ pos_emb[hi_])
                    out[bi, hi, i, j] = (1 - w) * z_lo + w * z_hi
    return out


def test_matches_x_transformers_bit_for_bit():
    """x-transformers adds CoPE(q, sim) to its masked, scaled logits; posenc's bias is the same tensor."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(0)
    b, h, s, d = 2, 4, 12, 16
    theirs = xt.CoPE(dim=d, heads=h, max_pos=6)
    ours = posenc.build("cope", head_dim=d, num_heads=h, max_pos=6)
    with torch.no_grad():
        theirs.pos_emb.normal_()
        ours.pos_emb.copy_(theirs.pos_emb)
    q, k = torch.randn(b, h, s, d), torch.randn(b, h, s, d) * 2  # large logits: counts reach max_pos
    sim = torch.einsum("bhid,bhjd->bhij", q, k) * d**-0.5
    sim = sim.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -torch.finfo(sim.dtype).max)
    want = theirs(q, sim)
    got = ours.score_bias(torch.arange(s), torch.arange(s), q, k=k)
    assert torch.equal(got, want)
    assert float(ours.positions(q, k, torch.ones(s, s, dtype=torch.bool).tril()).max()) == 5  # clamped


def test_matches_the_papers_equations_in_float64_with_gqa():
    torch.manual_seed(1)
    scheme = CoPE(8, num_heads=4, max_pos=5, dtype=F64)
    with torch.no_grad():
        perturb(scheme)
    q, k = torch.randn(2, 4, 7, 8, dtype=F64), torch.randn(2, 2, 7, 8, dtype=F64)  # 2 kv heads
    got = scheme.score_bias(torch.arange(7), torch.arange(7), q, k=k)
    assert got.dtype == F64
    want = ref_cope(q, k.repeat_interleave(2, dim=1), scheme.pos_emb.detach(), 5)
    keep = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., keep], want[..., keep], rtol=1e-12, atol=1e-12)


def test_the_mask_decides_which_keys_count():
    """keep hides keys from the count: a hidden key changes nothing at the visible ones; without a
    mask, keys after the query (by position) are closed."""
    torch.manual_seed(2)
    scheme = CoPE(8, num_heads=2, max_pos=16)
    with torch.no_grad():
        perturb(scheme)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.equal(scheme.score_bias(pos, pos, q, k=k), scheme.score_bias(pos, pos, q, k=k, keep=keep))
    hidden = keep.clone()
    hidden[:, 1] = False  # key 1 is padding for every query
    alone = scheme.score_bias(
        pos[[0, 2, 3, 4]], pos[[0, 2, 3, 4]], q[:, :, [0, 2, 3, 4]], k=k[:, :, [0, 2, 3, 4]]
    )
    masked = scheme.score_bias(pos, pos, q, k=k, keep=hidden)
    torch.testing.assert_close(masked[:, :, [0, 2, 3, 4]][..., [0, 2, 3, 4]], alone)


def test_gradients():
    scheme = CoPE(4, num_heads=2, max_pos=4, dtype=F64)
    q, k = torch.randn(1, 2, 5, 4, dtype=F64, requires_grad=True), torch.randn(1, 2, 5, 4, dtype=F64)
    emb = torch.randn(4, 4, dtype=F64, requires_grad=True)

    def bias(q, emb):
        del scheme.pos_emb
        scheme.pos_emb = emb  # a plain tensor, so gradcheck differentiates it
        return scheme.score_bias(torch.arange(5), torch.arange(5), q, k=k)

    assert torch.autograd.gradcheck(bias, (q, emb))


def test_model_invariants_and_float64():
    check_all("cope", perturb)


def test_compiled_model_and_hook():
    check_compiled(tiny_lm("cope", perturb))


def test_encoder_refuses_and_bad_inputs_raise():
    with pytest.raises(ValueError, match="defined for causal attention only"):
        Encoder(ModelConfig(vocab_size=11, d_model=16, num_heads=2, position="cope"))
    scheme = CoPE(8, num_heads=2)
    pos, q = torch.arange(3), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="needs the queries"):
        scheme.score_bias(pos, pos)
    with pytest.raises(ValueError, match=r"k has 3 heads, which must divide the 2 query heads"):
        scheme.score_bias(pos, pos, q, k=torch.randn(1, 3, 3, 8))
    with pytest.raises(ValueError, match=r"q must have shape \[b, 2, s, 8\]"):
        scheme.score_bias(pos, pos, torch.randn(1, 2, 3, 4))
    with pytest.raises(ValueError, match="q and k must have the same batch size, got 1 and 2"):
        scheme.score_bias(pos, pos, q, k=torch.randn(2, 2, 3, 8))
    with pytest.raises(ValueError, match=r"keep must be a bool mask .* got torch.int64 \(3, 3\)"):
        scheme.score_bias(pos, pos, q, k=q, keep=torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"keep must be a bool mask .* got torch.bool \(3, 2\)"):
        scheme.score_bias(pos, pos, q, k=q, keep=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="max_pos must be >= 2"):
        CoPE(8, num_heads=2, max_pos=1)


def test_registered_and_verified():
    assert posenc.describe("cope")["required"] == ["head_dim", "num_heads"]
    from posenc.analysis import verify

    results = verify(["cope"])
    assert results and not [r for r in results if r.status == "FAIL"]
    assert any(r.applies for r in results)  # built and probed, not skipped
