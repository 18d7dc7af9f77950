"""Tests of posenc.relative: Shaw et al. 2018 and Transformer-XL (Dai et al. 2019).

No package ships these as reusable modules, so the references are float64 loops written here from
the papers: Shaw et al. eq. (3)-(5) (e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z),
z_i = sum_j alpha_ij (x_j W^V + a^V_ij), a_ij = w_{clip(j - i, k)}) and Dai et al. section 3.3
(the four terms (a)-(d) with R in the official code's [sin | cos] layout).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.relative import ShawRelative, TransformerXLRelative

FAST = settings(deadline=None, max_examples=30)


def _rows(p, b):
    p = p if p.dim() == 2 else p[None]
    return [p[i % p.shape[0]].tolist() for i in range(b)]


# ---------------------------------------------------------------------------------------------- Shaw
def _shaw_reference(q, k, v, wk, wv, qp, kp, clip):
    """Logits and outputs of Shaw attention with plain loops in float64 (no mask)."""
    b, h, s_q, d_h = q.shape
    s_k = k.shape[2]
    q, k, v, wk = q.double(), k.double(), v.double(), wk.double()
    logits = torch.zeros(b, h, s_q, s_k, dtype=torch.float64)
    qrows, krows = _rows(qp, b), _rows(kp, b)
    for bb in range(b):
        for hh in range(h):
            for i in range(s_q):
                for j in range(s_k):
                    r = max(-clip, min(clip, krows[bb][j] - qrows[bb][i]))
                    logits[bb, hh, i, j] = (q[bb, hh, i] @ (k[bb, hh, j] + wk[r + clip])) / math.sqrt(d_h)
    out = None
    if wv is not None:
        probs = logits.softmax(-1)
        out = torch.zeros(b, h, s_q, d_h, dtype=torch.float64)
        for bb in range(b):
            for hh in range(h):
                for i in range(s_q):
                    for j in range(s_k):
                        r = max(-clip, min(clip, krows[bb][j] - qrows[bb][i]))
                        out[bb, hh, i] += probs[bb, hh, i, j] * (v[bb, hh, j] + wv[r + clip].double())
    return logits, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shaw_matches_paper_reference(dtype):
    g = torch.Generator().manual_seed(1)
    b, h, s_q, s_k, d_h, clip = 2, 3, 5, 8, 4, 2
    scheme = posenc.build("shaw", head_dim=d_h, num_heads=h, max_relative_position=clip, values=True)
    scheme.to(dtype)
    q, k, v = (torch.randn(b, h, n, d_h, generator=g, dtype=dtype) for n in (s_q, s_k, s_k))
    qp = torch.tensor([[3, 4, 5, 6, 7], [10, 30, 31, 32, 50]])  # per-row, non-contiguous
    kp = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [9, 10, 11, 12, 13, 29, 33, 60]])
    ref_logits, ref_out = _shaw_reference(
        q, k, v, scheme.key_embeddings.detach(), scheme.value_embeddings.detach(), qp, kp, clip
    )
    bias = scheme.score_bias(qp, kp, q)
    assert bias.shape == (b, h, s_q, s_k) and bias.dtype == dtype
    logits = q @ k.transpose(-1, -2) / math.sqrt(d_h) + bias
    # torch's default float32 tolerances for float32 runs (compared in float64, so stated explicitly).
    tol = {"rtol": 1.3e-6, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(logits.double(), ref_logits, **tol)
    probs = logits.softmax(-1)
    out = probs @ v + scheme.relative_value_output(probs, qp, kp).to(dtype)
    torch.testing.assert_close(out.double(), ref_out, **tol)
    # The materialised a^V (contract form) gives the same output term.
    a_v = scheme.relative_values(qp, kp)  # [b, 1, s_q, s_k, d_h]
    assert a_v.shape == (b, 1, s_q, s_k, d_h)
    torch.testing.assert_close((probs[..., None] * a_v).sum(-2), scheme.relative_value_output(probs, qp, kp))
    assert scheme.relative_values(torch.arange(s_q), torch.arange(s_k)).shape == (s_q, s_k, d_h)
    assert scheme.has_relative_values


def test_shaw_clipping_and_sharing_across_heads():
    scheme = ShawRelative(head_dim=4, num_heads=2, max_relative_position=3)
    q = torch.randn(1, 1, 1, 4).expand(1, 2, 1, 4)  # the same query in both heads
    bias = scheme.score_bias(torch.tensor([50]), torch.arange(101), q)[0, :, 0]  # [h, s_k]
    assert torch.equal(bias[0], bias[1])  # one table shared by the heads
    assert bool((bias[:, :47] == bias[:, :1]).all()) and bool((bias[:, 53:] == bias[:, -1:]).all())
    assert scheme.relative_values(torch.arange(2), torch.arange(2)) is None and not scheme.has_relative_values


@FAST
@given(pos=st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=8), shift=st.integers(-(10**6), 10**6))
def test_shaw_translation_invariance(pos, shift):
    torch.manual_seed(0)
    scheme = ShawRelative(head_dim=4, num_heads=2, max_relative_position=3, values=True)
    p = torch.tensor(pos)
    q = torch.randn(2, 2, len(pos), 4)
    assert torch.equal(scheme.score_bias(p, p, q), scheme.score_bias(p + shift, p + shift, q))
    assert torch.equal(scheme.relative_values(p, p), scheme.relative_values(p + shift, p + shift))


def test_shaw_gradients():
    scheme = ShawRelative(head_dim=3, num_heads=2, max_relative_position=2, values=True).double()
    qp, kp = torch.tensor([2, 3, 4]), torch.arange(6)
    q = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: scheme.score_bias(qp, kp, x), (q,))
    probs = torch.rand(1, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p: scheme.relative_value_output(p, qp, kp), (probs,))
    (scheme.score_bias(qp, kp, q).sum() + scheme.relative_value_output(probs, qp, kp).sum()).backward()
    assert scheme.key_embeddings.grad.abs().sum() > 0 and scheme.value_embeddings.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------ Transformer-XL
def _xl_reference(q, k, u, v, w_official, qp, kp, d_model):
    """A_ij = (a) q.k + (b) q.W_R R_{i-j} + (c) u.k + (d) v.W_R R_{i-j}, all / sqrt(d_h), in float64.

    R_delta in the official code's layout: [sin(delta w_0..), cos(delta w_0..)], w_f = 10000^(-2f/d).
    """
    b, h, s_q, d_h = q.shape
    q, k, u, v = q.double(), k.double(), u.double(), v.double()
    w = w_official.double().view(h, d_h, d_model)  # per head W_R
    freqs = [10000.0 ** (-2.0 * f / d_model) for f in range(d_model // 2)]
    out = torch.zeros(b, h, s_q, k.shape[2], dtype=torch.float64)
    qrows, krows = _rows(qp, b), _rows(kp, b)
    for bb in range(b):
        for i in range(s_q):
            for j in range(k.shape[2]):
                delta = qrows[bb][i] - krows[bb][j]
                r = torch.tensor(
                    [math.sin(delta * f) for f in freqs] + [math.cos(delta * f) for f in freqs],
                    dtype=torch.float64,
                )
                for hh in range(h):
                    wr = w[hh] @ r  # W_R R_{i-j}: [d_h]
                    terms = (q[bb, hh, i] @ k[bb, hh, j], q[bb, hh, i] @ wr, u[hh] @ k[bb, hh, j], v[hh] @ wr)
                    out[bb, hh, i, j] = sum(terms) / math.sqrt(d_h)
    return out


def _xl_logits(scheme, q, k, qp, kp):
    """What a model computes: the queries hook (adds u), scaled q.k, plus the score bias from the raw q."""
    return scheme.queries(q, qp) @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + scheme.score_bias(qp, kp, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_xl_matches_four_term_reference_with_memory(dtype):
    g = torch.Generator().manual_seed(2)
    b, h, d_h, d = 2, 2, 4, 12
    scheme = posenc.build("transformer_xl", d_model=d, num_heads=h, head_dim=d_h)
    w_official = torch.randn(h * d_h, d, generator=g) * 0.3
    scheme.load_official_r_net(w_official)
    with torch.no_grad():
        scheme.r_w_bias.normal_(generator=g)
        scheme.r_r_bias.normal_(generator=g)
    scheme.to(dtype)
    # A segment of 4 queries at positions 6..9 attending to 6 memory keys (0..5) plus itself: s_k > s_q.
    qp, kp = torch.arange(6, 10), torch.arange(10)
    q = torch.randn(b, h, 4, d_h, generator=g, dtype=dtype)
    k = torch.randn(b, h, 10, d_h, generator=g, dtype=dtype)
    ref = _xl_reference(q, k, scheme.r_w_bias.detach(), scheme.r_r_bias.detach(), w_official, qp, kp, d)
    got = _xl_logits(scheme, q, k, qp, kp)
    assert got.dtype == dtype and scheme.score_bias(qp, kp, q).shape == (b, h, 4, 10)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(got.double(), ref, **tol)


def test_xl_batched_arbitrary_and_large_positions():
    g = torch.Generator().manual_seed(3)
    scheme = TransformerXLRelative(d_model=8, num_heads=2, head_dim=4)
    q, k = torch.randn(2, 2, 3, 4, generator=g), torch.randn(2, 2, 5, 4, generator=g)
    qp = torch.tensor([[5, 9, 20], [100_000, 100_001, 100_050]])  # far past any trained length
    kp = torch.tensor([[0, 3, 5, 9, 21], [99_990, 100_000, 100_020, 100_049, 100_051]])
    w_off = scheme.r_net.weight.detach().view(8, 4, 2).transpose(1, 2).reshape(8, 8)  # back to [sin | cos]
    ref = _xl_reference(q, k, scheme.r_w_bias.detach(), scheme.r_r_bias.detach(), w_off, qp, kp, 8)
    torch.testing.assert_close(_xl_logits(scheme, q, k, qp, kp).double(), ref, rtol=1e-5, atol=1e-5)


@FAST
@given(pos=st.lists(st.integers(-(10**5), 10**5), min_size=1, max_size=6), shift=st.integers(-(10**6), 10**6))
def test_xl_translation_invariance(pos, shift):
    torch.manual_seed(0)
    scheme = TransformerXLRelative(d_model=8, num_heads=2, head_dim=4)
    p = torch.tensor(pos)
    q = torch.randn(1, 2, len(pos), 4)
    torch.testing.assert_close(scheme.score_bias(p, p, q), scheme.score_bias(p + shift, p + shift, q))


def test_xl_queries_hook_adds_u_and_keys_are_untouched():
    scheme = TransformerXLRelative(d_model=8, num_heads=2, head_dim=4)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 5, 4)  # grouped-query keys: 1 KV head
    torch.testing.assert_close(scheme.queries(q) - q, scheme.r_w_bias.detach()[None, :, None, :].expand_as(q))
    # u is position-free: the same at any positions; rotate is not a hook of this scheme (refused,
    # naming queries: it would return q without u)
    torch.testing.assert_close(scheme.queries(q, torch.tensor([7, 90, 10**6])), scheme.queries(q))
    assert scheme.hooks == ("queries", "score_bias") and "rotate" not in scheme.hooks
    with pytest.raises(TypeError, match=r"call scheme.queries\(q, q_positions\)"):
        scheme.rotate(q, k)


def test_xl_gradients():
    scheme = TransformerXLRelative(d_model=6, num_heads=2, head_dim=3).double()
    qp, kp = torch.tensor([3, 4]), torch.arange(5)
    q = torch.randn(1, 2, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: scheme.score_bias(qp, kp, x), (q,))
    k = torch.randn(1, 2, 5, 3, dtype=torch.float64)
    _xl_logits(scheme, q, k, qp, kp).pow(2).sum().backward()
    for p in (scheme.r_w_bias, scheme.r_r_bias, scheme.r_net.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("build", "exc", "match"),
    [
        (
            lambda: ShawRelative(4, 2, max_relative_position=0),
            ValueError,
            "max_relative_position must be >= 1, got 0",
        ),
        (lambda: ShawRelative(4, 0), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: ShawRelative(0, 2), ValueError, "head_dim must be >= 1, got 0"),
        (lambda: ShawRelative(4, 2, values=1), TypeError, "values must be a bool"),
        (lambda: TransformerXLRelative(7, 2, 4), ValueError, "d_model must be even"),
        (lambda: TransformerXLRelative(8, 0, 4), ValueError, "num_heads must be >= 1"),
        (lambda: TransformerXLRelative(8, 2, 4, init_std=-1.0), ValueError, "init_std must be a finite"),
        (lambda: posenc.build("shaw", head_dim=4), ValueError, "needs num_heads"),
    ],
)
def test_construction_errors(build, exc, match):
    with pytest.raises(exc, match=match):
        build()


@pytest.mark.parametrize(
    "scheme",
    [ShawRelative(4, 2, 2, values=True), TransformerXLRelative(8, 2, 4)],
    ids=["shaw", "transformer_xl"],
)
def test_call_errors(scheme):
    p, q = torch.arange(3), torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="needs the queries: pass q="):
        scheme.score_bias(p, p)
    with pytest.raises(ValueError, match=r"q must have shape \[b, 2, 3, 4\].*got \(1, 2, 3, 5\)"):
        scheme.score_bias(p, p, torch.randn(1, 2, 3, 5))  # head_dim mismatch
    with pytest.raises(ValueError, match=r"q must have shape \[b, 2, 3, 4\]"):
        scheme.score_bias(p, p, torch.randn(1, 3, 3, 4))  # heads mismatch
    with pytest.raises(TypeError, match="q must be a float tensor"):
        scheme.score_bias(p, p, torch.ones(1, 2, 3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="q_positions must be an integer tensor"):
        scheme.score_bias(p.float(), p, q)
    with pytest.raises(ValueError, match="q has batch size 2 but the positions have 3"):
        scheme.score_bias(p, torch.zeros(3, 3, dtype=torch.long), torch.randn(2, 2, 3, 4))


def test_shaw_value_output_errors():
    p = torch.arange(3)
    with pytest.raises(ValueError, match="build it with values=True"):
        ShawRelative(4, 2, 2).relative_value_output(torch.rand(1, 2, 3, 3), p, p)
    with pytest.raises(ValueError, match=r"probs must have shape \[b, 2, 3, 3\]"):
        ShawRelative(4, 2, 2, values=True).relative_value_output(torch.rand(1, 2, 3, 4), p, p)
    with pytest.raises(TypeError, match="probs must be a float tensor"):
        probs = torch.ones(1, 2, 3, 3, dtype=torch.int)
        ShawRelative(4, 2, 2, values=True).relative_value_output(probs, p, p)
    with pytest.raises(ValueError, match=r"weight must have shape \[8, 8\]"):
        TransformerXLRelative(8, 2, 4).load_official_r_net(torch.zeros(8, 6))
    with pytest.raises(ValueError, match=r"q must have shape \[b, 2, s_q, 4\]"):
        TransformerXLRelative(8, 2, 4).queries(torch.randn(1, 2, 3, 5))


# -------------------------------------------------------------------------------------- compile/meta/dtype
def test_registry_meta_and_bf16():
    assert {"shaw", "transformer_xl"} <= set(posenc.schemes())
    assert posenc.describe("transformer_xl")["hooks"] == ["queries", "score_bias"]
    with torch.device("meta"):
        shaw = posenc.build("shaw", head_dim=4, num_heads=2, values=True)
        xl = posenc.build("transformer_xl", d_model=8, num_heads=2, head_dim=4)
    assert shaw.key_embeddings.is_meta and xl.r_net.weight.is_meta
    xl = TransformerXLRelative(8, 2, 4).to(torch.bfloat16)
    shaw = ShawRelative(4, 2, 2).to(torch.bfloat16)
    q, p = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16), torch.arange(3)
    assert xl.score_bias(p, p, q).dtype == torch.float32 and shaw.score_bias(p, p, q).dtype == torch.float32


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    shaw = ShawRelative(4, 2, 2, values=True)
    xl = TransformerXLRelative(8, 2, 4)

    def f(q, qp, kp):
        probs = (shaw.score_bias(qp, kp, q) + xl.score_bias(qp, kp, q)).softmax(-1)
        return shaw.relative_value_output(probs, qp, kp) + xl.queries(q, qp)

    q, qp, kp = torch.randn(2, 2, 3, 4), torch.tensor([4, 5, 9]), torch.tensor([0, 4, 5, 9])
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, qp, kp), f(q, qp, kp))


def test_transformer_xl_queries_in_bshd():
    torch.manual_seed(0)
    txl = posenc.build("transformer_xl", d_model=16, num_heads=2, head_dim=8)
    q = torch.randn(1, 2, 5, 8)
    ref = txl.queries(q)
    got = txl.queries(q.transpose(1, 2), qk_layout="bshd")
    torch.testing.assert_close(got.transpose(1, 2), ref, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"q must have shape \[b, s_q, 2, 8\]"):
        txl.queries(q, qk_layout="bshd")
