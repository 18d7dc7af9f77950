"""Tests of posenc.model.attention: masks, positions, the KV cache, MHA/GQA and the scheme hooks.

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
from _model_toys import CAUSAL_TOYS, TOYS, register_toys
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
# Planning: masks and positions
# ---------------------------------------------------------------------------------------------
def test_causal_mask_with_a_cache_aligns_queries_to_the_last_slots():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())


def test_plan_left_padding_positions_and_pad_queries_see_themselves():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    plan = plan_attention(2, 4, torch.device("cpu"), causal=True, attention_mask=mask)
    assert plan.q_positions.tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    keep = plan.mask[:, 0]  # [b, s, s_k]
    assert keep[0].tolist() == [
        [True, False, False, False],  # a padding query sees only itself
        [False, True, False, False],
        [False, False, True, False],  # the first real token sees itself, not the padding
        [False, False, True, True],
    ]
    assert torch.equal(keep[1], causal_mask(4, 4))


def test_plan_with_cache_offsets_positions_per_row():
    cache = KVCache(1)
    plan = plan_attention(
        2, 3, torch.device("cpu"), causal=True, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]])
    )
    cache.update(0, torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))
    cache.advance(plan, torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert cache.offset().tolist() == [2, 3]
    step = plan_attention(2, 1, torch.device("cpu"), causal=True, **cache.past())
    assert step.q_positions.tolist() == [[2], [3]]
    assert step.k_positions.tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]
    assert step.mask[:, 0, 0].tolist() == [[False, True, True, True], [True, True, True, True]]


def test_plan_packed_documents_is_block_diagonal_and_restarts_positions():
    plan = plan_attention(1, 5, torch.device("cpu"), causal=True, cu_seqlens=torch.tensor([0, 3, 5]))
    assert plan.q_positions.tolist() == [0, 1, 2, 0, 1]
    want = torch.zeros(5, 5, dtype=torch.bool)
    want[:3, :3] = causal_mask(3, 3)
    want[3:, 3:] = causal_mask(2, 2)
    assert torch.equal(plan.mask[0, 0], want)
    encoder = plan_attention(1, 5, torch.device("cpu"), causal=False, cu_seqlens=torch.tensor([0, 3, 5]))
    assert encoder.mask[0, 0, 0].tolist() == [True, True, True, False, False]


def test_plan_errors():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="cannot be combined with a KV cache"):
        plan_attention(
            1, 2, cpu, causal=True, cu_seqlens=torch.tensor([0, 2]), past_positions=torch.arange(2)
        )
    with pytest.raises(TypeError, match="attention_mask must be a bool/int tensor"):
        plan_attention(1, 2, cpu, causal=True, attention_mask=[[1, 1]])
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        plan_attention(1, 2, cpu, causal=True, positions=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="num_layers must be an int >= 1"):
        KVCache(0)


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention and the KV cache
# ---------------------------------------------------------------------------------------------
def _cfg(**kw):
    base = dict(vocab_size=11, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, position="nope")
    base.update(kw)
    return ModelConfig(**base)


def test_gqa_equals_mha_with_each_kv_head_repeated_for_its_group():
    torch.manual_seed(0)
    gqa = MultiHeadAttention(_cfg(num_kv_heads=2))
    mha = MultiHeadAttention(_cfg(num_kv_heads=None))
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
    attn = MultiHeadAttention(_cfg())
    x = torch.randn(1, 4, 32)
    for name, rotated in (("toy_rotate", True), ("toy_dynamic", False)):
        scheme = build_with_context(name, {"head_dim": 8})
        cache = KVCache(1)
        plan = plan_attention(1, 4, x.device, causal=True, **cache.past())
        attn(x, plan, scheme, cache=cache)
        _, k_raw, _ = attn.project(x)
        expect = scheme.rotate(k_raw, k_raw, torch.arange(4), torch.arange(4))[1] if rotated else k_raw
        torch.testing.assert_close(cache.keys[0], expect)


def test_cache_appends_in_place_into_growing_buffers():
    """Appending writes only the new slots of a buffer that grows by a quarter (at least 256 slots)
    when full; the keys/values are those of concatenation, and views handed out earlier keep their
    values."""
    gen = torch.Generator().manual_seed(0)
    cache = KVCache(2)
    steps = [5, 1, 1, 3, 1, 7, 1, 300]  # a prefill, decode steps and chunks
    seen_k, seen_v, handed_out, capacity = [], [], [], []
    with torch.no_grad():
        for n in steps:
            k, v = torch.randn(2, 3, n, 4, generator=gen), torch.randn(2, 3, n, 4, generator=gen)
            seen_k.append(k)
            seen_v.append(v)
            got_k, got_v = cache.update(1, k, v)
            torch.testing.assert_close(got_k, torch.cat(seen_k, dim=2), rtol=0, atol=0)
            torch.testing.assert_close(got_v, torch.cat(seen_v, dim=2), rtol=0, atol=0)
            handed_out.append((got_k, got_k.clone()))
            capacity.append(got_k.untyped_storage().nbytes() // (2 * 3 * 4 * 4))  # slots of the buffer
    for view, copy in handed_out:
        assert torch.equal(view, copy)
    # lengths 5, 6, 7, 10, 11, 18, 19, 319: exact at the prefill, then 5 + 256, then 261 + 256
    assert capacity == [5, 261, 261, 261, 261, 261, 261, 517]
    assert cache.keys[0] is None  # the other layer untouched


def test_cache_filled_under_inference_mode_keeps_working_outside_it():
    cache = KVCache(1)
    ks = [torch.randn(1, 2, n, 4) for n in (3, 1, 1)]
    with torch.inference_mode():
        cache.update(0, ks[0], ks[0])
        cache.update(0, ks[1], ks[1])  # capacity 6: room left in an inference tensor
    with torch.no_grad():
        keys, _ = cache.update(0, ks[2], ks[2])
    assert torch.equal(keys, torch.cat(ks, dim=2))


def test_cache_refuses_keys_of_another_batch():
    cache = KVCache(1)
    cache.update(0, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"must agree in b, h_kv and d_h \(use a new KVCache"):
        cache.update(0, torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))


def test_cache_takes_keys_assigned_from_outside_into_new_buffers():
    """A rollback, a strided selection or a sliding window assigned to keys[layer]: the next update
    builds on exactly those keys, and no view handed out before is written."""
    with torch.no_grad():
        for select in (lambda t: t[:, :, ::2], lambda t: t[:, :, 1:], lambda t: t[:, :, :3]):
            cache = KVCache(1)
            first = torch.arange(6.0).view(1, 1, 6, 1).expand(1, 1, 6, 2).contiguous()
            cache.update(0, first, first)
            held, _ = cache.update(0, torch.full((1, 1, 1, 2), 6.0), torch.full((1, 1, 1, 2), 6.0))
            held_copy = held.clone()
            cache.keys[0], cache.values[0] = select(cache.keys[0]), select(cache.values[0])
            want = torch.cat((cache.keys[0].clone(), torch.full((1, 1, 1, 2), 9.0)), dim=2)
            keys, values = cache.update(0, torch.full((1, 1, 1, 2), 9.0), torch.full((1, 1, 1, 2), 9.0))
            assert torch.equal(keys, want) and torch.equal(values, want)
            assert torch.equal(held, held_copy)


def test_cache_never_writes_in_place_with_grad_enabled():
    """Training through a cache with frozen k/v projections (only q trainable, as with LoRA on q):
    SDPA keeps the cached keys for backward, so appending must not write into them."""
    torch.manual_seed(0)
    model = TransformerLM(_cfg(position="toy_rotate", num_layers=1, d_model=32))
    for name, p in model.named_parameters():
        p.requires_grad_("q_proj" in name)
    ids = torch.randint(0, 11, (1, 8))
    cache = model.new_cache()
    loss = model(ids[:, :4], cache=cache).logits.sum()
    for i in range(4, 7):
        loss = loss + model(ids[:, i : i + 1], cache=cache).logits.sum()
    loss.backward()  # raised "modified by an inplace operation" when the cache wrote into its buffers
    q_grad = model.decoder.blocks[0].attn.q_proj.weight.grad
    assert q_grad is not None and q_grad.abs().sum() > 0


def test_cache_concatenates_when_keys_carry_gradients():
    cache = KVCache(1)
    k = torch.randn(1, 2, 3, 4, requires_grad=True)
    cache.update(0, k, k.detach())
    k2 = torch.randn(1, 2, 1, 4, requires_grad=True)
    keys, _ = cache.update(0, k2, k2.detach())
    keys.sum().backward()
    assert k.grad is not None and torch.equal(k.grad, torch.ones_like(k))
    assert torch.equal(k2.grad, torch.ones_like(k2))


def test_unrotated_cache_is_what_makes_length_dependent_rotations_exact(monkeypatch):
    """Sensitivity check: caching rotated keys for toy_dynamic breaks incremental == prefix forward."""
    torch.manual_seed(0)
    model = TransformerLM(_cfg(position="toy_dynamic", num_layers=2, d_model=32)).eval()
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
    attn = MultiHeadAttention(_cfg())
    scheme = build_with_context("toy_alibi", {"num_heads": 4})
    x = torch.randn(1, 5, 32)
    plan = plan_attention(1, 5, x.device, causal=True)
    q, k, _ = attn.project(x)
    k = k.repeat_interleave(2, dim=1)
    want = q @ k.transpose(-1, -2) / math.sqrt(8) + scheme.score_bias(torch.arange(5), torch.arange(5))
    torch.testing.assert_close(attn.logits(x, plan, scheme), want)


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
    cfg = _cfg(position=position, max_len=64)
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
    [("rope", {}), ("xpos", {}), ("alibi", {}), ("transformer_xl", {}), ("shaw", {"values": True}),
     ("rope", {"scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}})],
)  # fmt: skip
def test_bshd_attention_gives_the_same_model(position, options):
    import dataclasses

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         position=position, position_options=options)  # fmt: skip
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
