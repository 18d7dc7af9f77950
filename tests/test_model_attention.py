"""Tests of posenc.model.attention: attend (SDPA and the explicit path with Shaw's relative values),
MultiHeadAttention (GQA, torch's MultiheadAttention, the keys it caches rotated or raw, the blocked
CPU bias path) and the scheme hooks (translation invariance, the bshd layout).

References are written plainly in float64 here: ``softmax(q k^T / sqrt(d_h) + bias, masked) v``
per head, key/value head ``i // (h / h_kv)`` for query head ``i`` (GQA, Ainslie et al. 2023), and
Shaw et al. 2018's value term ``sum_j p_ij a^V_ij``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _model_helpers import config, count_calls, ids_, mha_config
from _model_toys import CAUSAL_TOYS, TOYS, register_toys
from posenc.kernels import set_enabled
from posenc.model import (
    AttentionPlan,
    KVCache,
    ModelConfig,
    MultiHeadAttention,
    TransformerLM,
    attend,
    causal_mask,
    plan_attention,
)
from posenc.registry import build_with_context, scheme_class


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread is fastest, and avoids OpenMP spinning on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reference_attention(q, k, v, keep=None, bias=None, rel_values=None):
    """float64 attention written from the definitions, one query head at a time.

    q ``[b, h, s, d_h]``, k/v ``[b, h_kv, s_k, d_h]``, keep bool broadcastable to ``[b, h, s, s_k]``,
    bias broadcastable to ``[b, h, s, s_k]``, rel_values ``[s, s_k, d_h]``.
    """
    q, k, v = q.double(), k.double(), v.double()
    b, h, s, d_h = q.shape
    group = h // k.shape[1]
    out = torch.empty(b, h, s, d_h, dtype=torch.float64)
    for head in range(h):
        kv = head // group  # the key/value head this query head reads
        scores = q[:, head] @ k[:, kv].transpose(-1, -2) / math.sqrt(d_h)  # [b, s, s_k]
        if bias is not None:
            scores = scores + bias.double().expand(b, h, s, k.shape[2])[:, head]
        if keep is not None:
            scores = scores.masked_fill(~keep.expand(b, h, s, k.shape[2])[:, head], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        out[:, head] = p @ v[:, kv]
        if rel_values is not None:
            out[:, head] += torch.einsum("bqk,qkd->bqd", p, rel_values.double())
    return out


# ---------------------------------------------------------------------------------------------
# attend: the pure computation
# ---------------------------------------------------------------------------------------------
@settings(deadline=None, max_examples=40)
@given(
    b=st.integers(1, 2),
    h_kv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2, 3]),
    s=st.integers(1, 5),
    s_p=st.integers(0, 4),
    with_bias=st.booleans(),
    pad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_attend_matches_float64_reference(b, h_kv, group, s, s_p, with_bias, pad, seed):
    g = torch.Generator().manual_seed(seed)
    h, d_h, s_k = h_kv * group, 4, s + s_p
    q = torch.randn(b, h, s, d_h, generator=g)
    k, v = torch.randn(2, b, h_kv, s_k, d_h, generator=g)
    bias = torch.randn(1, h, s, s_k, generator=g) if with_bias else None
    valid = None
    if pad:  # left padding of the past keys in row 0
        valid = torch.ones(b, s_p, dtype=torch.bool)
        valid[0, : s_p // 2] = False
    plan = plan_attention(
        b,
        s,
        torch.device("cpu"),
        causal=True,
        past_positions=torch.arange(s_p) if s_p else None,
        past_valid=valid if s_p else None,
        offset=s_p,
    )
    keep = plan.keep(s, s_k, torch.device("cpu"))
    got = attend(q, k, v, plan=plan, bias=bias)
    want = reference_attention(q, k, v, keep=keep, bias=bias)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@settings(deadline=None, max_examples=25)
@given(group=st.sampled_from([1, 2]), s=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_explicit_path_with_relative_values_matches_reference(group, s, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2 * group, s, 4, generator=g)
    k, v = torch.randn(2, 2, 2, s, 4, generator=g)
    rel = torch.randn(s, s, 4, generator=g)
    bias = torch.randn(1, 2 * group, s, s, generator=g)
    plan = plan_attention(2, s, torch.device("cpu"), causal=True)
    got = attend(q, k, v, plan=plan, bias=bias, relative_values=rel)
    want = reference_attention(q, k, v, keep=causal_mask(s, s), bias=bias, rel_values=rel)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # [h, s, s_k, d_h] and [1, 1, s, s_k, d_h] forms give the same result
    per_head = rel.expand(2 * group, s, s, 4)
    torch.testing.assert_close(attend(q, k, v, plan=plan, bias=bias, relative_values=per_head), got)
    torch.testing.assert_close(attend(q, k, v, plan=plan, bias=bias, relative_values=rel[None, None]), got)


def test_explicit_path_stays_float64_and_passes_gradcheck():
    """A float64 model computes in float64: the explicit-softmax path (Shaw's relative values) must
    not round its scores to float32 (that made float64 gradcheck fail)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    rel = torch.randn(4, 4, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(1, 2, 4, 4, generator=g, dtype=torch.float64)
    plan = plan_attention(1, 4, torch.device("cpu"), causal=True)
    out = attend(q, k, v, plan=plan, bias=bias, relative_values=rel)
    want = reference_attention(
        q.detach(), k.detach(), v.detach(), keep=causal_mask(4, 4), bias=bias, rel_values=rel
    )
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.detach(), want, rtol=1e-12, atol=1e-12)

    def f(a, b, c):
        return attend(a, b, c, plan=plan, bias=bias, relative_values=rel)

    assert torch.autograd.gradcheck(f, (q, k, v))
    lm = TransformerLM(
        ModelConfig(
            vocab_size=11,
            d_model=8,
            num_layers=1,
            num_heads=2,
            position="shaw",
            position_options={"values": True},
        )
    ).double()
    assert lm(torch.randint(0, 11, (1, 5))).logits.dtype == torch.float64


def test_relative_values_of_a_wrong_shape_raise():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"relative_values must return \[s, s_k, d_h\]"):
        attend(q, q, q, relative_values=torch.zeros(3, 4))


def test_causal_fast_path_equals_explicit_mask_and_bias_path():
    q, k, v = torch.randn(3, 2, 4, 6, 8)
    fast = attend(q, k, v, plan=AttentionPlan(torch.arange(6), torch.arange(6), None, True))
    explicit = attend(
        q, k, v, plan=AttentionPlan(torch.arange(6), torch.arange(6), causal_mask(6, 6)[None, None], False)
    )
    zero_bias = attend(
        q,
        k,
        v,
        plan=AttentionPlan(torch.arange(6), torch.arange(6), None, True),
        bias=torch.zeros(1, 4, 6, 6),
    )
    torch.testing.assert_close(fast, explicit)
    torch.testing.assert_close(fast, zero_bias)


def test_bias_is_cast_to_the_attention_dtype():
    q, k, v = torch.randn(3, 1, 2, 5, 8, dtype=torch.bfloat16)
    bias = torch.randn(1, 2, 5, 5)  # float32, as schemes return it
    out = attend(q, k, v, plan=plan_attention(1, 5, torch.device("cpu"), causal=True), bias=bias)
    assert out.dtype == torch.bfloat16
    want = reference_attention(q, k, v, keep=causal_mask(5, 5), bias=bias.bfloat16())
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention: GQA, what it puts in the cache, logits
# ---------------------------------------------------------------------------------------------


def test_gqa_equals_mha_with_each_kv_head_repeated_for_its_group():
    torch.manual_seed(0)
    gqa = MultiHeadAttention(mha_config(num_kv_heads=2))
    mha = MultiHeadAttention(mha_config(num_kv_heads=None))
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for name in ("k_proj", "v_proj"):  # [h_kv * d_h, d] -> [h, d_h, d], head i from kv head i // 2
            w = getattr(gqa, name).weight.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
            getattr(mha, name).weight.copy_(w)
    x = torch.randn(2, 5, 32)
    plan = plan_attention(2, 5, x.device, causal=True)
    torch.testing.assert_close(gqa(x, plan), mha(x, plan))


def test_cache_holds_keys_rotated_once_or_raw_for_length_dependent_schemes():
    torch.manual_seed(0)
    attn = MultiHeadAttention(mha_config())
    x = torch.randn(1, 4, 32)
    for name, rotated in (("toy_rotate", True), ("toy_dynamic", False)):
        scheme = build_with_context(name, {"head_dim": 8})
        cache = KVCache(1)
        plan = plan_attention(1, 4, x.device, causal=True, **cache.past())
        attn(x, plan, scheme, cache=cache)
        _, k_raw, _ = attn.project(x)
        expect = scheme.rotate(k_raw, k_raw, torch.arange(4), torch.arange(4))[1] if rotated else k_raw
        torch.testing.assert_close(cache.keys[0], expect)


def test_unrotated_cache_is_what_makes_length_dependent_rotations_exact(monkeypatch):
    """Sensitivity check: caching rotated keys for toy_dynamic breaks incremental == prefix forward."""
    torch.manual_seed(0)
    model = TransformerLM(mha_config(position="toy_dynamic", num_layers=2, d_model=32)).eval()
    with torch.no_grad():  # larger q/k weights, so that logits (and rotations) matter
        for block in model.decoder.blocks:
            block.attn.q_proj.weight.mul_(30)
            block.attn.k_proj.weight.mul_(30)
    ids = torch.randint(0, 11, (1, 10))

    def last_step_error():
        cache = model.new_cache()
        model(ids[:, :9], cache=cache)
        want = model(ids).logits[:, -1]
        return ((model(ids[:, 9:], cache=cache).logits[:, -1] - want).abs().max() / want.abs().max()).item()

    with torch.no_grad():
        exact = last_step_error()
        monkeypatch.setattr(TOYS["toy_dynamic"], "needs_unrotated_cache", False)
        stale = last_step_error()
    assert exact < 1e-5  # relative error: float32 rounding, with logits ~30x larger than at init
    assert stale > 20 * exact, (stale, exact)  # keys rotated with an outdated base: a real error


def test_logits_are_scaled_dot_products_plus_bias():
    torch.manual_seed(0)
    attn = MultiHeadAttention(mha_config())
    scheme = build_with_context("toy_alibi", {"num_heads": 4})
    x = torch.randn(1, 5, 32)
    plan = plan_attention(1, 5, x.device, causal=True)
    q, k, _ = attn.project(x)
    k = k.repeat_interleave(2, dim=1)
    want = q @ k.transpose(-1, -2) / math.sqrt(8) + scheme.score_bias(torch.arange(5), torch.arange(5))
    torch.testing.assert_close(attn.logits(x, plan, scheme), want)


def test_nope_attention_matches_torch_multihead_attention():
    """posenc's MHA with no scheme is torch.nn.MultiheadAttention (same weights, causal mask)."""
    from posenc.model import MultiHeadAttention, plan_attention

    torch.manual_seed(0)
    ours = MultiHeadAttention(config("nope", num_kv_heads=None)).eval()
    ref = torch.nn.MultiheadAttention(32, 4, bias=False, batch_first=True).eval()
    with torch.no_grad():  # in_proj_weight is [q; k; v] stacked: [3 d, d]
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.out_proj.weight.copy_(ours.o_proj.weight)
        x = torch.randn(2, 7, 32)
        want = ref(x, x, x, attn_mask=~torch.ones(7, 7, dtype=torch.bool).tril(), need_weights=False)[0]
        got = ours(x, plan_attention(2, 7, x.device, causal=True))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "position", ["alibi", "t5", "transformer_xl", "toy_content", "toy_alibi", "fire", "kerple_log"]
)
def test_blocked_cpu_bias_path_equals_the_full_table_path(position, monkeypatch):
    """The model's blocked causal attention (model.blocked, 256 queries per block) gives the
    logits and gradients of the full-table path (POSENC_C_KERNELS=0), for a sequence of three blocks
    and for a chunked prefill after a cache."""
    from posenc.model import blocked

    blocked_calls = count_calls(monkeypatch, blocked, "causal_attention_with_bias")
    torch.manual_seed(0)
    model = TransformerLM(config(position, max_len=1024))
    model.train(False)
    ids = ids_(2, 600)

    def run(fast: str):
        monkeypatch.setenv("POSENC_C_KERNELS", fast)
        set_enabled(None)  # the switch is read once per process: read it again
        blocked_calls.clear()
        model.zero_grad()
        logits = model(ids).logits
        (logits.square().mean()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        with torch.no_grad():
            cache = model.new_cache()
            model(ids[:, :300], cache=cache)
            chunk = model(ids[:, 300:], cache=cache).logits  # 300 queries after 300 cached keys: 2 blocks
        # one call per layer and forward (forward, prefill, chunk) on the fast path, none without
        assert len(blocked_calls) == (3 * model.config.num_layers if fast == "1" else 0)
        return logits.detach(), grads, chunk

    fast, slow = run("1"), run("0")
    torch.testing.assert_close(fast[0], slow[0], rtol=1e-5, atol=1e-5)
    assert len(fast[1]) == len(slow[1]) > 0
    for a, b in zip(fast[1], slow[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fast[2], slow[0][:, 300:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(slow[2], slow[0][:, 300:], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Generic: translation invariance of every relative scheme
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("position", [*posenc.schemes(), *CAUSAL_TOYS, "toy_bidir"])
def test_attention_logits_of_relative_schemes_are_translation_invariant(position):
    cls = scheme_class(position)
    if "embed" in cls.hooks:
        pytest.skip(f"{position} is absolute: it adds positions to the input")
    if cls.position_dims != 1:
        pytest.skip(f"{position} encodes {cls.position_dims}-D grids, not sequences")
    if cls.needs_unrotated_cache:
        pytest.skip(
            f"{position}'s rotation depends on the current length, so shifting every position changes it"
        )
    torch.manual_seed(0)
    cfg = mha_config(position=position, max_len=64)
    scheme = build_with_context(position, cfg.scheme_context(causal=cls.causal_ok), cfg.position_options)
    attn = MultiHeadAttention(cfg)
    x = torch.randn(2, 6, 32)
    for shift in (1, 7, 30):
        for batched in (False, True):
            pos = torch.arange(6) + shift
            pos = pos.expand(2, 6) if batched else pos
            plan = plan_attention(2, 6, x.device, causal=cls.causal_ok, positions=pos)
            shifted = attn.logits(x, plan, scheme)
            base = attn.logits(x, plan_attention(2, 6, x.device, causal=cls.causal_ok), scheme)
            torch.testing.assert_close(shifted, base, msg=f"{position}: shift {shift}, batched={batched}")


@pytest.mark.parametrize(
    "position, options",
    [
        ("rope", {}),
        ("xpos", {}),
        ("alibi", {}),
        ("transformer_xl", {}),
        ("shaw", {"values": True}),
        ("rope", {"scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}}),
    ],
)
def test_bshd_attention_gives_the_same_model(position, options):
    import dataclasses

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=40,
        d_model=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        position=position,
        position_options=options,
    )
    a = TransformerLM(config).eval()
    b = TransformerLM(dataclasses.replace(config, qk_layout="bshd")).eval()
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, 40, (2, 12))
    torch.testing.assert_close(b(ids).logits, a(ids).logits, rtol=0, atol=0)
    torch.testing.assert_close(
        b.generate(ids[:, :4], 5, temperature=0), a.generate(ids[:, :4], 5, temperature=0)
    )
    with pytest.raises(ValueError, match="unknown qk_layout 'bhds'"):
        ModelConfig(vocab_size=40, qk_layout="bhds")


def _move_off_init(scheme: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(11)
    for p in scheme.parameters():  # Transformer-XL's u, v and W_R: u at init is small but not the point
        p.copy_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize(
    ("position", "options"), [("transformer_xl", {}), ("nope_temperature", {"floor_scale": 2.0})]
)
def test_a_query_transform_applies_to_the_queries_alone(position, options):
    """A scheme's ``queries`` hook (Transformer-XL's u, Llama 4's temperature) changes the queries
    the logits use, after rotate; the bias reads the raw queries; keys and the KV cache are untouched,
    so a cache, packing, left padding, float64 and compile give the full forward's numbers."""
    from _scheme_invariants import check_all, check_compiled, tiny_lm

    cfg = config(position, position_options=options)
    attn = MultiHeadAttention(cfg).eval()
    scheme = build_with_context(position, cfg.scheme_context(True), options)
    assert "queries" in scheme.hooks and "rotate" not in scheme.hooks
    with torch.no_grad():
        _move_off_init(scheme)
        x, pos = torch.randn(2, 6, 32), torch.arange(7, 13)  # factor (p + 1) // 2 > 1: not 1
        plan = plan_attention(2, 6, x.device, causal=True, positions=pos)
        q, k, _ = attn.project(x)  # [b, h, s, d_h], [b, h_kv, s, d_h]
        k = k.repeat_interleave(2, dim=1)  # GQA: 2 query heads per kv head
        moved = scheme.queries(q, pos)
        assert not torch.allclose(moved, q)
        want = moved @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim)  # [b, h, s, s]
        if "score_bias" in scheme.hooks:
            want = want + scheme.score_bias(pos, pos, q)  # from the raw queries
        torch.testing.assert_close(attn.logits(x, plan, scheme), want)
    check_all(position, _move_off_init, position_options=options)
    check_compiled(tiny_lm(position, _move_off_init, position_options=options))
