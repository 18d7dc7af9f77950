"""Tests of posenc.model.plan: causal_mask, plan_attention (left padding, a cache's offsets, packed
documents, errors), plan_cross_attention, and the AttentionPlan's bias choices (a content-free bias
built once per forward, the blocked CPU path's builder made once and skipped under torch.func)."""

from __future__ import annotations

import pytest
import torch

from _model_helpers import V, config, count_calls, ids_
from _model_toys import register_toys
from posenc.model import KVCache, TransformerLM, causal_mask, plan_attention, plan_cross_attention


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


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


def test_plan_cross_attention_masks_only_the_encoder_padding():
    cpu = torch.device("cpu")
    plain = plan_cross_attention(2, 3, 5, cpu)
    assert plain.q_positions.tolist() == [0, 1, 2] and plain.k_positions.tolist() == [0, 1, 2, 3, 4]
    assert plain.mask is None and plain.is_causal is False and plain.keep(3, 5, cpu) is None
    context_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    plan = plan_cross_attention(2, 3, 5, cpu, context_mask)
    assert plan.mask.shape == (2, 1, 1, 5) and plan.is_causal is False
    assert plan.mask[:, 0, 0].tolist() == [[True, True, True, False, False], [True] * 5]
    with pytest.raises(TypeError, match="context_mask must be a bool/int tensor"):
        plan_cross_attention(2, 3, 5, cpu, [[1, 1, 1, 1, 1]] * 2)
    with pytest.raises(ValueError, match=r"must have shape \[b, s\] = \[2, 5\]"):
        plan_cross_attention(2, 3, 5, cpu, torch.ones(2, 3, dtype=torch.bool))  # the decoder's length


@pytest.mark.parametrize(
    ("position", "share", "expected"),
    [("alibi", True, 1), ("t5", True, 1), ("alibi", False, 3), ("toy_content", True, 3), ("shaw", True, 3)],
)
def test_content_free_bias_is_computed_once_per_forward(position, share, expected, monkeypatch):
    """A shared bias that does not read q is built once per forward, not once per layer (the
    full-table path; the blocked CPU path is counted in the next test)."""
    monkeypatch.setenv("POSENC_C_KERNELS", "0")
    torch.manual_seed(0)
    model = TransformerLM(config(position, num_layers=3, share_position=share)).eval()
    calls = []  # one list for every scheme: all score_bias calls of the forward
    for scheme in model.decoder.schemes:
        count_calls(monkeypatch, scheme, "score_bias", calls)
    ids = ids_(2, 6)
    with torch.no_grad():
        out = model(ids).logits
        assert len(calls) == expected
        cache = model.new_cache()
        model(ids[:, :4], cache=cache)  # a new forward plans (and builds) its bias anew
        assert len(calls) == 2 * expected
        torch.testing.assert_close(model(ids[:, 4:], cache=cache).logits, out[:, 4:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("position", "share", "expected"),
    [("alibi", True, 1), ("t5", True, 1), ("alibi", False, 3), ("toy_content", True, 3)],
)
def test_block_bias_builder_is_made_once_per_forward(position, share, expected, monkeypatch):
    """On the blocked CPU path a content-free scheme's block builder (with its scratch buffers) is
    made once per forward and shared by the layers sharing the scheme; a bias reading q gets one
    builder per layer."""
    from posenc.model import blocked

    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    made = count_calls(monkeypatch, blocked, "scheme_bias_fn")
    torch.manual_seed(0)
    model = TransformerLM(config(position, num_layers=3, share_position=share, max_len=512)).eval()
    ids = ids_(1, blocked.BLOCK_SIZE + 10)  # two query blocks: the blocked path is taken
    with torch.no_grad():
        model(ids)
        assert len(made) == expected
        model(ids)
        assert len(made) == 2 * expected


def test_torch_func_transforms_take_the_full_table_path(monkeypatch):
    """torch.func.grad wraps tensors without storage: the blocked path steps aside for them."""
    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    torch.manual_seed(0)
    model = TransformerLM(config("alibi", num_layers=1, max_len=512)).eval()
    ids = ids_(1, 300)
    params = dict(model.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (ids,)).logits.square().mean())(
        params
    )
    model.zero_grad()
    model(ids).logits.square().mean().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("position", ["transformer_xl", "alibi"])
def test_blocked_path_with_a_memory_equals_a_full_forward(position, monkeypatch):
    """Transformer-XL memory before 300 new queries (two blocks): the same logits as one forward."""
    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    torch.manual_seed(0)
    model = TransformerLM(config(position, memory_len=300, max_len=1024)).eval()
    ids = ids_(1, 600)
    with torch.no_grad():
        first = model(ids[:, :300])
        second = model(ids[:, 300:], memory=first.memory)
        full = model(ids).logits
    torch.testing.assert_close(torch.cat((first.logits, second.logits), dim=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("share", [True, False])
def test_rotary_tables_are_built_once_per_forward_and_scheme(share, monkeypatch):
    """RoPE's cos/sin tables are built once per forward pass for layers sharing the scheme (the
    plan hands them to each layer), once per layer otherwise; a cached decoding step builds anew."""
    torch.manual_seed(0)
    model = TransformerLM(config("rope", num_layers=3, share_position=share)).eval()
    calls = []
    for scheme in model.decoder.schemes:
        count_calls(monkeypatch, scheme, "rotary_tables", calls)
    ids = ids_(2, 6)
    with torch.no_grad():
        out = model(ids).logits
        per_forward = 1 if share else 3
        assert len(calls) == per_forward
        cache = model.new_cache()
        model(ids[:, :4], cache=cache)
        step = model(ids[:, 4:], cache=cache).logits
        assert len(calls) == 3 * per_forward
    torch.testing.assert_close(step, out[:, 4:], rtol=1e-4, atol=1e-4)


def test_a_rotary_subclass_overriding_rotate_alone_gets_no_tables():
    """A scheme that overrides rotate (not rotary_tables) is called without tables= (its signature
    may not take them); the model runs and rotates through it."""
    calls = []

    from posenc import RotaryEmbedding

    class Logged(RotaryEmbedding):
        def rotate(self, q, k, q_positions=None, k_positions=None, *, qk_layout=None):
            calls.append(1)
            return super().rotate(q, k, q_positions, k_positions, qk_layout=qk_layout)

    model = TransformerLM(config("rope", num_layers=2, share_position=True)).eval()
    model.decoder.schemes[0] = Logged(model.decoder.schemes[0].head_dim)
    with torch.no_grad():
        model(ids_(1, 5))
    assert len(calls) >= 1


def test_bias_path_is_chosen_by_device_and_declared_capability(monkeypatch):
    """bias_blocks: FlexAttention where it is usable (CUDA; forced here) for every scheme with a
    score_bias that does not read the keys, whatever its name; on a CPU the blocked path for a
    causal plan without padding, nothing for a padded plan; never for a bias that reads the keys."""
    import posenc
    from posenc.model import blocked, flex
    from posenc.model.biased import BiasedAttention

    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    q = torch.randn(2, 4, blocked.BLOCK_SIZE + 4, 16)
    s = q.shape[2]
    causal = plan_attention(2, s, torch.device("cpu"), causal=True)
    padded = plan_attention(
        2, s, torch.device("cpu"), causal=True, attention_mask=torch.ones(2, s, dtype=torch.long)
    )
    schemes = {"alibi": {}, "t5": {}, "kerple_log": {}, "fire": {}, "shaw": {"head_dim": 16}}
    for name, kw in schemes.items():
        scheme = posenc.build(name, num_heads=4, **kw)
        assert isinstance(causal.bias_blocks(scheme, q), blocked.BlockedAttention), name
        assert padded.bias_blocks(scheme, q) is None, name
    cope = posenc.build("cope", num_heads=4, head_dim=16)
    assert cope.score_bias_uses_keys
    monkeypatch.setattr(flex, "usable", lambda q: True)
    for name, kw in schemes.items():
        scheme = posenc.build(name, num_heads=4, **kw)
        for plan in (causal, padded):
            chosen = plan.bias_blocks(scheme, q)
            assert isinstance(chosen, flex.FlexBiasedAttention) and isinstance(chosen, BiasedAttention), name
    assert causal.bias_blocks(cope, q) is None


def test_flex_block_mask_and_content_free_score_mod_are_built_once_per_forward(monkeypatch):
    """On the FlexAttention path the block mask is made once per forward for every layer, and a
    content-free scheme's score_mod once for the layers sharing it."""
    from posenc.model import flex

    monkeypatch.setattr(flex, "usable", lambda q: True)
    monkeypatch.setattr(flex, "flex_attention_function", lambda device: lambda q, k, v, **kw: q)
    masks = count_calls(monkeypatch, flex, "block_mask")
    mods = count_calls(monkeypatch, flex, "score_mod")
    model = TransformerLM(config("alibi", num_layers=3, max_len=512)).eval()
    with torch.no_grad():
        model(ids_(1, 130))
    assert (len(masks), len(mods)) == (1, 1)


def test_flex_is_not_built_for_a_call_with_attention_dropout(monkeypatch):
    """FlexAttention has no attention dropout: a training call with dropout gets no Flex object
    (its bias would be built, then thrown away for the full-bias path)."""
    import posenc
    from posenc.model import flex

    monkeypatch.setattr(flex, "usable", lambda q: True)
    plan = plan_attention(1, 160, torch.device("cpu"), causal=True)
    scheme = posenc.build("alibi", num_heads=2)
    q = torch.randn(1, 2, 160, 64)
    assert isinstance(plan.bias_blocks(scheme, q), flex.FlexBiasedAttention)
    assert not isinstance(plan.bias_blocks(scheme, q, dropout_p=0.1), flex.FlexBiasedAttention)


# ----------------------------------------------------------------------------------------------
# Sliding-window attention
# ----------------------------------------------------------------------------------------------
def test_the_window_keeps_a_band_of_w_slots_ending_at_each_query():
    got = causal_mask(3, 6, window=2)  # 3 new queries after 3 cached keys: slots 3, 4, 5
    want = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(got, want)
    assert torch.equal(causal_mask(5, 5, window=99), causal_mask(5, 5))  # a window past s: plain causal


def test_a_window_plan_masks_prefill_decode_padding_and_packing():
    plan = plan_attention(1, 6, torch.device("cpu"), causal=True, sliding_window=3)
    assert not plan.is_causal and not plan.causal_prefix  # the blocked bias path reads no band
    assert torch.equal(plan.mask[0, 0], causal_mask(6, 6, window=3))
    short = plan_attention(1, 3, torch.device("cpu"), causal=True, sliding_window=3)
    assert short.is_causal and short.mask is None  # nothing hidden: SDPA's causal fast path
    step = plan_attention(
        1, 1, torch.device("cpu"), causal=True, past_positions=torch.arange(5), sliding_window=2
    )
    assert step.mask[0, 0, 0].tolist() == [False, False, False, False, True, True]
    padded = plan_attention(
        2,
        4,
        torch.device("cpu"),
        causal=True,
        attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
        sliding_window=2,
    )
    assert padded.mask[1, 0, 3].tolist() == [False, False, True, True]
    assert padded.mask[0, 0, 0].tolist() == [True, False, False, False]  # a padding query sees itself
    packed = plan_attention(
        1, 5, torch.device("cpu"), causal=True, cu_seqlens=torch.tensor([0, 2, 5]), sliding_window=2
    )
    assert packed.mask[0, 0, 4].tolist() == [False, False, False, True, True]
    with pytest.raises(ValueError, match="needs causal attention"):
        plan_attention(1, 4, torch.device("cpu"), causal=False, sliding_window=2)
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        plan_attention(1, 4, torch.device("cpu"), causal=True, sliding_window=0)
    with pytest.raises(TypeError, match="sliding_window must be an int"):
        plan_attention(1, 4, torch.device("cpu"), causal=True, sliding_window=2.0)
    # packed documents check the window as every other plan does
    docs = torch.tensor([0, 2, 4])
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        plan_attention(1, 4, torch.device("cpu"), causal=True, cu_seqlens=docs, sliding_window=0)
    with pytest.raises(TypeError, match="sliding_window must be an int"):
        plan_attention(1, 4, torch.device("cpu"), causal=True, cu_seqlens=docs, sliding_window=2.5)
    with pytest.raises(ValueError, match="needs causal attention"):
        plan_attention(1, 4, torch.device("cpu"), causal=False, cu_seqlens=docs, sliding_window=2)


@pytest.mark.parametrize(
    ("window", "error", "message"),
    [
        (0, ValueError, "window must be >= 1, got 0"),
        (-1, ValueError, "window must be >= 1, got -1"),
        (True, TypeError, "window must be an int, got bool"),
        (2.5, TypeError, "window must be an int, got float"),
        ("2", TypeError, "window must be an int, got str"),
    ],
)
def test_causal_mask_refuses_a_window_that_is_not_a_count(window, error, message):
    with pytest.raises(error, match=message):
        causal_mask(3, 3, window=window)


def test_a_window_wider_than_any_int64_is_the_plain_mask():
    assert torch.equal(causal_mask(3, 5, window=10**30), causal_mask(3, 5))
    model = TransformerLM(config(position="rope", sliding_window=10**30)).eval()
    ids = ids_(2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():  # the padded plan builds a band too
        out = model(ids, attention_mask=mask).logits
    assert torch.isfinite(out).all()


def test_a_token_outside_every_layers_window_changes_nothing():
    """With W = 3 and 2 layers a token reads at most 2 * (W - 1) = 4 slots back: changing token 0
    changes the logits at positions 0..4 and none after; the cached decode gives the same logits."""
    torch.manual_seed(0)
    model = TransformerLM(config(position="rope", sliding_window=3)).eval()
    ids = ids_(1, 10)
    other = ids.clone()
    other[0, 0] = (ids[0, 0] + 1) % V
    with torch.no_grad():
        a, b = model(ids).logits, model(other).logits
        cache = model.new_cache()
        steps = [model(ids[:, :4], cache=cache).logits] + [
            model(ids[:, t : t + 1], cache=cache).logits for t in range(4, 10)
        ]
    assert not torch.allclose(a[0, 4], b[0, 4]) and torch.equal(a[0, 5:], b[0, 5:])
    torch.testing.assert_close(torch.cat(steps, 1), a, atol=1e-5, rtol=0)


def test_an_encoder_refuses_a_window():
    from posenc.model import Encoder

    with pytest.raises(ValueError, match="an encoder sees every token"):
        Encoder(config(position="rope", sliding_window=3))
