"""Blocked causal attention with a positional bias == the full-table path (and a float64 reference)."""

from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.model import blocked
from posenc.model.blocked import PerBlockBias, causal_attention_with_bias, scheme_bias_fn


def full_path(q, k, v, bias):
    """What posenc.model does: the whole [.., s_q, s_k] bias, -inf on future keys, one SDPA call."""
    s_q, s_k = q.shape[2], k.shape[2]
    future = torch.arange(s_k)[None, :] > torch.arange(s_q)[:, None] + (s_k - s_q)  # [s_q, s_k]
    mask = bias.to(q.dtype).masked_fill(future, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def reference64(q, k, v, bias):
    """softmax(q k^T / sqrt(d_h) + bias, future masked) v, in float64 with explicit loops over nothing."""
    q, k, v, bias = q.double(), k.double(), v.double(), bias.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s_q, s_k = q.shape[2], k.shape[2]
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias  # [b, h, s_q, s_k]
    future = torch.arange(s_k)[None, :] > torch.arange(s_q)[:, None] + (s_k - s_q)
    return logits.masked_fill(future, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("scheme_name", ["alibi", "t5"])
@pytest.mark.parametrize("block", [1, 5, 16, 64])
def test_blocked_equals_full_table(scheme_name, block):
    b, h, s, d = 2, 4, 37, 8
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    scheme = posenc.build(scheme_name, num_heads=h)
    pos = torch.arange(s)
    out = causal_attention_with_bias(q, k, v, scheme_bias_fn(scheme, pos, pos), block_size=block)
    bias = scheme.score_bias(pos, pos)
    torch.testing.assert_close(out, full_path(q, k, v, bias), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(out.double(), reference64(q, k, v, bias), rtol=1e-5, atol=1e-5)


@settings(deadline=None, max_examples=40)
@given(s_q=st.integers(1, 5000), size=st.one_of(st.none(), st.integers(1, 3000)), grad_bias=st.booleans())
def test_block_bounds_cover_every_query_once(s_q, size, grad_bias):
    """The blocks tile [0, s_q) in order; automatic blocks are 256 below 4096 queries or for a bias
    that needs a gradient, else 768 with the (smaller) remainder first."""
    bounds = blocked._block_bounds(s_q, size, grad_bias)
    lengths = [q1 - q0 for q0, q1 in pairwise(bounds)]
    assert bounds[0] == 0 and bounds[-1] == s_q and all(n >= 1 for n in lengths)
    if size is not None:
        assert all(n == size for n in lengths[:-1]) and lengths[-1] <= size
    elif s_q < blocked.LONG_QUERIES or grad_bias:
        assert all(n == blocked.BLOCK_SIZE for n in lengths[:-1])
    else:
        assert all(n == blocked.LONG_BLOCK_SIZE for n in lengths[1:])
        assert lengths[0] == (s_q % blocked.LONG_BLOCK_SIZE or blocked.LONG_BLOCK_SIZE)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("scheme_name", ["alibi", "t5"])
def test_automatic_long_blocks_equal_the_full_table(scheme_name, grad, monkeypatch):
    """The automatic schedule for long inputs (shrunk here: BLOCK_SIZE 4, blocks of 7 from 20
    queries) gives the full-table numbers, with a key prefix and the remainder block first; a bias
    that needs a gradient (T5's trainable table, grad on) keeps the short blocks."""
    monkeypatch.setattr(blocked, "BLOCK_SIZE", 4)
    monkeypatch.setattr(blocked, "LONG_QUERIES", 20)
    monkeypatch.setattr(blocked, "LONG_BLOCK_SIZE", 7)
    b, h, s_q, prefix, d = 2, 4, 45, 3, 8
    q = torch.randn(b, h, s_q, d)
    k, v = torch.randn(b, h, s_q + prefix, d), torch.randn(b, h, s_q + prefix, d)
    scheme = posenc.build(scheme_name, num_heads=h)
    kp = torch.arange(s_q + prefix)
    fn = scheme_bias_fn(scheme, kp[prefix:], kp)
    sizes = []
    spy = PerBlockBias(  # fn's own declarations
        lambda q0, q1, k1: sizes.append(q1 - q0) or fn(q0, q1, k1),
        masks_future=True,
        reversed_rows=True,
        bias_requires_grad=fn.bias_requires_grad,
    )
    with torch.set_grad_enabled(grad):
        out = causal_attention_with_bias(q, k, v, spy)
    short = grad and scheme_name == "t5"
    assert sizes == ([4] * 11 + [1] if short else [3] + [7] * 6)
    bias = scheme.score_bias(kp[prefix:], kp)
    torch.testing.assert_close(out, full_path(q, k, v, bias), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(out.double(), reference64(q, k, v, bias), rtol=1e-5, atol=1e-5)


@settings(deadline=None, max_examples=60)
@given(h_kv=st.integers(1, 16), group=st.integers(1, 4), n=st.integers(1, 3000))
def test_head_chunks_cover_the_heads_in_whole_groups(h_kv, group, n):
    """Heads split only for blocks longer than BLOCK_SIZE, into at most ceil(n / BLOCK_SIZE) calls
    of whole key/value groups, covering every head once in order."""
    h = h_kv * group
    chunks = blocked._head_chunks(h, h_kv, n)
    assert chunks[0][0] == 0 and chunks[-1][1] == h
    assert all(a1 == b0 for (_, a1), (b0, _) in pairwise(chunks))
    assert all(h0 % group == 0 and h1 % group == 0 and h1 > h0 for h0, h1 in chunks)
    calls = min(h_kv, -(-n // blocked.BLOCK_SIZE))  # a long block: as many calls as fit
    assert len(chunks) <= calls
    assert max(h1 - h0 for h0, h1 in chunks) == -(-h_kv // calls) * group  # even split of the groups
    if n <= blocked.BLOCK_SIZE:
        assert chunks == [(0, h)]


def _long_block_case(bias_kind, h, h_kv, s, batch_bias=False):
    """q [2, h, s, 8], k/v [2, h_kv, s, 8] in float64 (requiring grad) and a bias: T5's per-distance
    table, or a tensor [1 | 2, 1 | h, s, s] sliced per block. Returns q, k, v, bias_fn, the full
    bias and the bias's parameters."""
    b, d = 2, 8
    q = torch.randn(b, h, s, d, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, h_kv, s, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    pos = torch.arange(s)
    if bias_kind == "distance":
        scheme = posenc.build("t5", num_heads=h).double()
        return (
            q,
            k,
            v,
            scheme_bias_fn(scheme, pos, pos),
            scheme.score_bias(pos, pos),
            list(scheme.parameters()),
        )
    shape = (b if batch_bias else 1, 1 if bias_kind == "shared" else h, s, s)
    table = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    return q, k, v, (lambda q0, q1, k1: table[:, :, q0:q1, :k1]), table, [table]


@pytest.mark.parametrize("block", [10, 23, 40])
@pytest.mark.parametrize("bias_kind", ["distance", "shared", "per_head", "per_row_and_head"])
def test_long_blocks_split_heads_without_autograd(bias_kind, block, monkeypatch):
    """Without autograd, blocks longer than BLOCK_SIZE (shrunk to 4) run their heads in chunks of
    whole groups (6 query heads on 3 key/value heads: 3 SDPA calls per block of 10, and for one
    block of 23 or 40 = the whole input): the full-table path's numbers, for a per-distance table, a bias
    shared by the heads, one per head and one per batch row and head."""
    monkeypatch.setattr(blocked, "BLOCK_SIZE", 4)
    h, h_kv, s = 6, 3, 23
    kind = "per_head" if bias_kind == "per_row_and_head" else bias_kind
    q, k, v, fn, bias, _ = _long_block_case(kind, h, h_kv, s, batch_bias=bias_kind == "per_row_and_head")
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape[1])  # query heads of the call
        return sdpa(*args, **kwargs)

    with torch.no_grad():
        monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
        out = causal_attention_with_bias(q, k, v, fn, block_size=block)
        monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
        ref = full_path(q, k, v, bias)
    lengths = [min(block, s - q0) for q0 in range(0, s, block)]
    # blocks over 4 queries: 3 calls of one group (2 heads); a block of 3 (the last of 10s): one of 6
    assert calls == [c for n in lengths for c in ([2, 2, 2] if n > 4 else [6])]
    assert 2 in calls
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bias_kind", ["distance", "per_head"])
def test_long_blocks_keep_their_heads_together_under_autograd(bias_kind, monkeypatch):
    """With autograd, a long block is one call over all heads (everything is kept for the backward
    anyway): outputs and gradients of q, k, v and the bias equal the full-table path's."""
    monkeypatch.setattr(blocked, "BLOCK_SIZE", 4)
    q, k, v, fn, bias, params = _long_block_case(bias_kind, 6, 3, 23)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(a[0].shape[1]) or sdpa(*a, **kw)
    )
    out = causal_attention_with_bias(q, k, v, fn, block_size=10)
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    assert calls == [6, 6, 6]  # one call over all 6 heads per block
    ref = full_path(q, k, v, bias)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v, *params], grad)
    want = torch.autograd.grad(ref, [q, k, v, *params], grad)
    for g1, g2 in zip(got, want, strict=True):
        torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-9)


@settings(deadline=None, max_examples=20)
@given(
    b=st.integers(1, 2),
    kv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2]),
    s_q=st.integers(1, 20),
    prefix=st.integers(0, 9),
    block=st.integers(1, 8),
    per_row=st.booleans(),
)
def test_kv_prefix_gqa_and_per_row_positions(b, kv, group, s_q, prefix, block, per_row):
    """Queries after a cached prefix, grouped-query heads, positions [b, s] with a per-row offset."""
    h, d, s_k = kv * group, 4, s_q + prefix
    q = torch.randn(b, h, s_q, d, dtype=torch.float64)
    k, v = torch.randn(b, kv, s_k, d, dtype=torch.float64), torch.randn(b, kv, s_k, d, dtype=torch.float64)
    kp = torch.arange(s_k) + (torch.arange(b)[:, None] * 3 if per_row else 0)  # [s_k] or [b, s_k]
    qp = kp[..., prefix:]
    scheme = posenc.build("alibi", num_heads=h)
    out = causal_attention_with_bias(q, k, v, scheme_bias_fn(scheme, qp, kp), block_size=block)
    bias = scheme.score_bias(qp, kp).double()
    torch.testing.assert_close(out, reference64(q, k, v, bias), rtol=1e-9, atol=1e-9)


def test_content_dependent_bias_gets_its_query_block():
    """Shaw's bias reads q: each block must see its own queries (before rotation)."""
    b, h, s, d = 1, 2, 13, 8
    scheme = posenc.build("shaw", head_dim=d, num_heads=h, max_relative_position=4)
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    pos = torch.arange(s)
    out = causal_attention_with_bias(q, k, v, scheme_bias_fn(scheme, pos, pos, q), block_size=4)
    torch.testing.assert_close(out, full_path(q, k, v, scheme.score_bias(pos, pos, q)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("scheme_name", ["t5", "alibi"])
def test_gradients_match_the_full_path(scheme_name):
    """T5's bias carries gradients; ALiBi's is written into scratch buffers that SDPA's backward
    must not see overwritten by the next block (it once raised "modified by an inplace operation")."""
    b, h, s, d = 1, 2, 20, 8
    scheme = posenc.build(scheme_name, num_heads=h)
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    pos = torch.arange(s)
    g = torch.randn(b, h, s, d)
    grads_blocked = torch.autograd.grad(
        causal_attention_with_bias(q, k, v, scheme_bias_fn(scheme, pos, pos), block_size=6),
        (q, k, v, *scheme.parameters()),
        g,
    )
    grads_full = torch.autograd.grad(
        full_path(q, k, v, scheme.score_bias(pos, pos)), (q, k, v, *scheme.parameters()), g
    )
    assert len(grads_blocked) == 3 + len(list(scheme.parameters()))
    for a, b_ in zip(grads_blocked, grads_full):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)


def test_a_bias_the_scheme_keeps_is_not_written_into():
    """A bias_fn may hand back a view of a table it keeps: the causal -inf must go into a copy."""
    h, s, d = 2, 12, 4
    table = torch.randn(1, h, 64, 64)
    kept = table.clone()
    q, k, v = (torch.randn(1, h, s, d) for _ in range(3))
    out = causal_attention_with_bias(q, k, v, lambda q0, q1, k1: table[:, :, q0:q1, :k1], block_size=5)
    assert torch.equal(table, kept)
    torch.testing.assert_close(out, full_path(q, k, v, table[:, :, :s, :s]), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"q": torch.randn(2, 3, 8)}, r"q must be a float tensor \[b, h, s, d_h\]"),
        ({"k": torch.randn(1, 2, 3, 8), "v": torch.randn(1, 2, 3, 8)}, "causal attention needs s_k >= s_q"),
        ({"v": torch.randn(1, 2, 4, 8)}, "k and v must agree"),
        ({"q": torch.randn(1, 3, 5, 8)}, "h_kv must divide h"),
        ({"block_size": 0}, r"block_size must be None \(automatic\) or an int >= 1"),
        ({"block_size": 2.0}, r"block_size must be None \(automatic\) or an int >= 1, got 2.0"),
        ({"q": torch.randn(1, 2, 0, 8)}, r"at least one query \(s_q >= 1\), got s_q=0"),
        ({"bias_fn": lambda a, z, e: torch.zeros(1, 2, 1, 1)}, r"bias_fn\(0, 5, 5\) returned shape"),
    ],
)
def test_errors(kwargs, match):
    args = {
        "q": torch.randn(1, 2, 5, 8),
        "k": torch.randn(1, 2, 5, 8),
        "v": torch.randn(1, 2, 5, 8),
        "bias_fn": lambda a, z, e: torch.zeros(1, 2, z - a, e),
        "block_size": 8,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        causal_attention_with_bias(
            args["q"], args["k"], args["v"], args["bias_fn"], block_size=args["block_size"]
        )


@settings(deadline=None, max_examples=30)
@given(
    name=st.sampled_from(["alibi", "t5"]),
    per_row=st.booleans(),
    causal=st.booleans(),
    h=st.integers(1, 12),
    big=st.booleans(),
    past=st.integers(0, 5),
    q0=st.integers(0, 6),
    n=st.integers(1, 5),
)
def test_block_builder_gives_score_bias_values_and_masks_the_future(
    name, per_row, causal, h, big, past, q0, n
):
    """Each block's bias equals score_bias bit for bit on the keys a query may see, and -inf on its
    future keys where the builder says it masks them (the per-distance table, whose block views
    hold the queries in reverse order: positions in unit steps, past beyond float32's exact
    integers, after a cache of ``past`` keys); per-row positions take score_bias itself."""
    s = 12
    kw = {} if name == "alibi" else {"causal": causal}
    scheme = posenc.build(name, num_heads=h, **kw)
    k_pos = (2**30 if big else 0) + torch.arange(past + s)
    k_pos = k_pos + (torch.arange(2)[:, None] * 7 if per_row else 0)  # [s_k] or [2, s_k]
    q_pos = k_pos[..., past:]
    build = scheme_bias_fn(scheme, q_pos, k_pos)
    assert build.masks_future == (not per_row)
    q1 = min(q0 + n, s)
    k1 = q1 + past
    with torch.no_grad():
        want = scheme.score_bias(q_pos[..., q0:q1], k_pos[..., :k1])
        got = build(q0, q1, k1)
    if not per_row:
        future = torch.arange(k1)[None, :] > torch.arange(q0, q1)[:, None] + past  # [n, k1]
        want = want.masked_fill(future, float("-inf"))
        assert build.reversed_rows
        got = got.flip(-2)  # the block's queries come in reverse order
    assert torch.equal(got, want)


def test_t5_block_bias_is_differentiable_like_the_full_table():
    """With a trainable T5 table the per-distance blocks give the full-table path's gradients."""
    torch.manual_seed(0)
    scheme = posenc.build("t5", num_heads=2, causal=True)
    q, k, v = (torch.randn(1, 2, 40, 4, requires_grad=True) for _ in range(3))
    pos = torch.arange(40)
    out = causal_attention_with_bias(q, k, v, scheme_bias_fn(scheme, pos, pos), block_size=16)
    grads = torch.autograd.grad(out.square().sum(), (q, scheme.relative_attention_bias.weight))
    mask = scheme.score_bias(pos, pos).masked_fill(
        torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf")
    )
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = torch.autograd.grad(ref.square().sum(), (q, scheme.relative_attention_bias.weight))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_reuse_keeps_a_content_free_bias_per_block_for_later_calls():
    """With reuse=True (the layers of one forward sharing a bias) score_bias runs once per block,
    however many attention calls follow; without, once per block per call (the per-block path: a
    subclass that defines its own score_bias no longer speaks through distance_bias)."""
    h, s, d = 2, 30, 4
    calls = []

    class Counted(posenc.T5RelativeBias):
        def score_bias(self, q_positions, k_positions, q=None):
            calls.append(1)
            return super().score_bias(q_positions, k_positions, q)

    scheme = Counted(h)
    assert not scheme_bias_fn(scheme, torch.arange(s), torch.arange(s)).masks_future
    q, k, v = (torch.randn(1, h, s, d) for _ in range(3))
    pos = torch.arange(s)
    for reuse, expected in ((True, 3), (False, 6)):
        calls.clear()
        fn = scheme_bias_fn(scheme, pos, pos, reuse=reuse)
        first = causal_attention_with_bias(q, k, v, fn, block_size=10)
        second = causal_attention_with_bias(q, k, v, fn, block_size=10)
        assert len(calls) == expected
        torch.testing.assert_close(first, second, rtol=0, atol=0)
        with torch.no_grad():
            want = full_path(q, k, v, scheme.score_bias(pos, pos))
        torch.testing.assert_close(first, want, rtol=2e-6, atol=2e-6)


def test_distance_table_is_read_from_the_schemes_declaration():
    """A scheme whose distance_bias answers gets the per-distance views (KERPLE as well as ALiBi and
    T5); one whose distance_bias answers None (FIRE) gets score_bias per block."""
    pos = torch.arange(20)
    for name in ("alibi", "t5", "kerple_log", "kerple_power"):
        assert isinstance(scheme_bias_fn(posenc.build(name, num_heads=2), pos, pos), blocked.DistanceBlocks)
    assert isinstance(scheme_bias_fn(posenc.build("fire", num_heads=2), pos, pos), blocked.SchemeBlocks)


def test_a_subclass_overriding_score_bias_keeps_its_own_bias():
    """distance_bias speaks for score_bias only when one class defines both: a subclass that changes
    score_bias alone gets its own numbers through the per-block path."""

    class Doubled(posenc.ALiBi):
        def score_bias(self, q_positions, k_positions, q=None):
            return 2 * super().score_bias(q_positions, k_positions, q)

    pos = torch.arange(12)
    fn = scheme_bias_fn(Doubled(2), pos, pos)
    assert not fn.masks_future
    assert torch.equal(fn(0, 4, 4), 2 * posenc.ALiBi(2).score_bias(pos[:4], pos[:4]))


def test_automatic_long_blocks_with_a_table_bias(monkeypatch):
    """A bias that does not mask the future (a plain table) under the automatic long schedule,
    remainder block first: the causal triangle is sized for the longest block."""
    monkeypatch.setattr(blocked, "BLOCK_SIZE", 4)
    monkeypatch.setattr(blocked, "LONG_QUERIES", 20)
    monkeypatch.setattr(blocked, "LONG_BLOCK_SIZE", 7)
    q, k, v, fn, bias, _ = _long_block_case("per_head", 6, 3, 45)
    with torch.no_grad():
        out = causal_attention_with_bias(q, k, v, fn)
        torch.testing.assert_close(out, full_path(q, k, v, bias), rtol=1e-10, atol=1e-10)


def test_the_long_schedule_starts_at_4096_queries():
    assert blocked._block_bounds(4095, None)[1] == blocked.BLOCK_SIZE
    assert blocked._block_bounds(4096, None)[1] == 4096 % blocked.LONG_BLOCK_SIZE


def test_biases_declare_what_they_return_by_a_typed_protocol():
    """scheme_bias_fn's results are BlockBias objects with every declaration; a plain function is
    read as PerBlockBias with its defaults (fresh, read-only, query order, no causal mask)."""
    h, s, d = 2, 600, 8
    torch.manual_seed(0)
    q, k, v = torch.randn(1, h, s, d), torch.randn(1, h, s, d), torch.randn(1, h, s, d)
    pos = torch.arange(s)
    for name, kw in (("alibi", {}), ("shaw", {"head_dim": d})):
        fn = scheme_bias_fn(posenc.build(name, num_heads=h, **kw), pos, pos)
        assert isinstance(fn, blocked.BlockBias)
    alibi = posenc.build("alibi", num_heads=h)

    def plain(q0, q1, k1):
        return alibi.score_bias(pos[q0:q1], pos[:k1])

    assert not isinstance(plain, blocked.BlockBias)
    want = causal_attention_with_bias(q, k, v, PerBlockBias(plain))
    torch.testing.assert_close(causal_attention_with_bias(q, k, v, plain), want, rtol=0, atol=0)
    torch.testing.assert_close(causal_attention_with_bias(q, k, v, scheme_bias_fn(alibi, pos, pos)), want)
