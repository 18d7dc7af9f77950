"""Tests of posenc.bias: ALiBi and T5 relative bias.

References: float64 formulas written here from the papers (Press et al. 2022; Raffel et al. 2020),
the official ALiBi slope recursion re-written from the repository's description, and HF
transformers' Bloom (``build_alibi_tensor``) and T5 (``T5Attention``) as test-only parities.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.bias import (
    ALiBi,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    relative_positions,
    t5_relative_bucket,
)

FAST = settings(deadline=None, max_examples=40)


# ---------------------------------------------------------------------------------------------- slopes
def _official_slopes(n: int) -> list[float]:
    """The official recursion (ofirpress/attention_with_linear_biases, get_slopes), in float64.

    Power of two n: start = 2^(-2^-(log2(n) - 3)) = 2^(-8/n), slopes start * ratio^k with ratio = start.
    Otherwise: the closest power of two's slopes, then every other slope of twice that power.
    """

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _official_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64, 128])
def test_slopes_closed_form_powers_of_two(n):
    expected = torch.tensor([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)], dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(n, dtype=torch.float64), expected, rtol=1e-15, atol=0)
    # The paper's example: 8 heads -> 1/2, 1/4, ..., 1/256.
    if n == 8:
        assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]


def test_slopes_official_recursion_every_head_count():
    for n in range(1, 129):
        expected = torch.tensor(_official_slopes(n), dtype=torch.float64)
        torch.testing.assert_close(alibi_slopes(n, dtype=torch.float64), expected, rtol=1e-14, atol=0)
        got = alibi_slopes(n)
        assert got.dtype == torch.float32 and got.shape == (n,)
        assert bool(((got > 0) & (got < 1)).all())


def test_slopes_match_hf_bloom():
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    mask = torch.ones(1, 4, dtype=torch.long)
    for n in range(1, 129):
        alibi = bloom.build_alibi_tensor(mask, n, torch.float32)  # [b*h, 1, s] = slope_h * j
        torch.testing.assert_close(alibi[:, 0, 1], alibi_slopes(n))  # float32 tolerance (rtol 1.3e-6)


# ---------------------------------------------------------------------------------------------- ALiBi bias
def _alibi_reference(slopes, qp, kp, causal):
    """Plain loops from the paper: bias[b, h, i, j] = -m_h (i - j) for a key at or before the query,
    -m_h |i - j| after it (both forms; the causal one never favours a future key), float64."""
    qp = qp if qp.dim() == 2 else qp[None]
    kp = kp if kp.dim() == 2 else kp[None]
    b = max(qp.shape[0], kp.shape[0])
    out = torch.zeros(b, len(slopes), qp.shape[1], kp.shape[1], dtype=torch.float64)
    for bb in range(b):
        for h, m in enumerate(slopes.tolist()):
            for i in range(qp.shape[1]):
                for j in range(kp.shape[1]):
                    pi, pj = int(qp[bb % qp.shape[0], i]), int(kp[bb % kp.shape[0], j])
                    out[bb, h, i, j] = -m * ((pi - pj) if causal and pj <= pi else abs(pi - pj))
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_matches_reference_arbitrary_batched_positions(causal):
    """One bias serves both references: the paper's causal form on the keys a mask keeps, and the
    symmetric -m |i - j| of encoders."""
    g = torch.Generator().manual_seed(0)
    qp = torch.randint(-50, 1000, (2, 5), generator=g)  # non-contiguous, per-row positions
    kp = torch.randint(-50, 1000, (2, 7), generator=g)
    scheme = posenc.build("alibi", num_heads=6)
    got = scheme.score_bias(qp, kp)
    assert got.shape == (2, 6, 5, 7) and got.dtype == torch.float32
    ref = _alibi_reference(alibi_slopes(6, dtype=torch.float64), qp, kp, causal)
    torch.testing.assert_close(got.double(), ref, rtol=1.3e-6, atol=0)
    # 1-D positions give a broadcastable [1, h, s_q, s_k].
    assert scheme.score_bias(torch.arange(3), torch.arange(4)).shape == (1, 6, 3, 4)
    # Mixed: [s_q] queries against [b, s_k] keys.
    torch.testing.assert_close(scheme.score_bias(qp[0], kp), scheme.score_bias(qp[0].expand(2, 5), kp))


def test_alibi_causal_equals_bloom_up_to_row_constant():
    """Bloom adds m_h * j (softmax is shift invariant per row); the paper's form is m_h * (j - i),
    which posenc's bias is on every key Bloom's causal mask keeps (j <= i)."""
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    s, h = 9, 12
    hf = bloom.build_alibi_tensor(torch.ones(1, s, dtype=torch.long), h, torch.float32)  # [h, 1, s]
    ours = ALiBi(h).score_bias(torch.arange(s), torch.arange(s))[0]  # [h, s, s]
    row_const = alibi_slopes(h)[:, None, None] * torch.arange(s)[None, :, None]  # m_h * i
    kept = torch.ones(s, s, dtype=torch.bool).tril()  # [s, s]: j <= i
    torch.testing.assert_close((ours + row_const)[:, kept], hf.expand(h, s, s)[:, kept])


@pytest.mark.parametrize(
    "build",
    [
        lambda: ALiBi(8),
        lambda: ALiBi(5),
        lambda: T5RelativeBias(4, causal=True),
        lambda: posenc.build("alibi", num_heads=8),
    ],
)
def test_no_bias_favours_a_future_key(build):
    """A causal bias is never larger for a key after the query than for the query itself, so an
    encoder built from the plain ALiBi line without a causal mask does not favour far-future tokens
    (ALiBi's causal default used to give +0.5, +1.0, ... to them; T5's causal buckets clip them to
    distance 0)."""
    scheme = build()
    pos = torch.arange(12)
    with torch.no_grad():
        bias = scheme.score_bias(pos, pos)[0]  # [h, s, s]
    present = bias.diagonal(dim1=-2, dim2=-1)[..., None]  # [h, s, 1]
    future = torch.ones(12, 12, dtype=torch.bool).triu(1)  # [s, s]: j > i
    assert bool((bias <= present)[:, future].all()), bias[0, 0]
    assert bool((bias[:, future] <= 0).all() if isinstance(scheme, ALiBi) else True)


def test_causal_alibi_leaves_a_masked_model_unchanged_bit_for_bit():
    """The paper's form -m (i - j) and posenc's -m |i - j| differ only on future keys, which a causal
    model masks: its logits are the same bits (blocked path, full table path and a KV cache)."""
    from posenc.model import ModelConfig, TransformerLM

    torch.manual_seed(0)
    lm = TransformerLM(
        ModelConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=4, position="alibi")
    ).eval()
    ids = torch.randint(0, 40, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the full-table path
    with torch.no_grad():
        ours = lm(ids).logits, lm(ids, attention_mask=mask).logits
        scheme = lm.decoder.scheme(0)
        paper = type(scheme)

        class PaperALiBi(paper):  # -m (i - j) everywhere: positive on future keys
            def score_bias(self, q_positions, k_positions, q=None):
                rel = relative_positions(q_positions, k_positions)
                return rel[:, None].float() * self.slopes(rel.device)[None, :, None, None]

            def distance_bias(self, distance):
                return distance[None].float() * self.slopes(distance.device)[:, None]

        scheme.__class__ = PaperALiBi
        theirs = lm(ids).logits, lm(ids, attention_mask=mask).logits
        scheme.__class__ = paper
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


@FAST
@given(
    h=st.integers(1, 20),
    pos=st.lists(st.integers(-10_000, 10_000), min_size=1, max_size=12),
    shift=st.integers(-100_000, 100_000),
)
def test_alibi_properties(h, pos, shift):
    p = torch.tensor(pos)
    sym = ALiBi(h).score_bias(p, p)[0]  # [h, s, s]: -m |i - j| (the paper's -m (i - j) for j <= i)
    assert torch.equal(sym, sym.transpose(-1, -2))  # one form, symmetric
    assert bool((sym <= 0).all())
    # Translation invariance: only differences matter (exact: integer differences).
    assert torch.equal(ALiBi(h).score_bias(p, p), ALiBi(h).score_bias(p + shift, p + shift))


@FAST
@given(h=st.integers(1, 16), i=st.integers(0, 500), n=st.integers(2, 40))
def test_alibi_linear_decay_with_slope(h, i, n):
    """Moving the key one step further back changes the bias by exactly -m_h."""
    kp = torch.arange(i - n + 1, i + 1)  # keys i-n+1 .. i, all <= i
    bias = ALiBi(h).score_bias(torch.tensor([i]), kp)[0, :, 0].double()  # [h, n]
    steps = bias[:, :-1] - bias[:, 1:]  # bias(j) - bias(j + 1)
    torch.testing.assert_close(
        steps, -alibi_slopes(h, dtype=torch.float64)[:, None].expand_as(steps), rtol=1e-5, atol=1e-6
    )


def test_alibi_has_no_state():
    scheme = ALiBi(8)
    assert dict(scheme.state_dict()) == {} and list(scheme.buffers()) == []
    scheme.score_bias(torch.arange(64), torch.arange(64))
    assert list(scheme.buffers()) == []  # nothing cached by a call
    scheme.to(torch.bfloat16)
    assert scheme.score_bias(torch.arange(3), torch.arange(3)).dtype == torch.float32


def test_alibi_pure_function_float64():
    out = alibi_bias(alibi_slopes(4, dtype=torch.float64), torch.arange(3), torch.arange(3))
    assert out.dtype == torch.float64
    with pytest.raises(TypeError, match="slopes must be a float tensor"):
        alibi_bias(torch.arange(4), torch.arange(3), torch.arange(3))


# ---------------------------------------------------------------------------------------------- T5 buckets
BUCKET_SETTINGS = [(32, 128), (16, 64), (64, 256), (8, 20), (6, 7), (4, 2**20)]


@pytest.mark.parametrize(("num_buckets", "max_distance"), BUCKET_SETTINGS)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_match_hf(num_buckets, max_distance, bidirectional):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    g = torch.Generator().manual_seed(num_buckets + max_distance)
    rel = (
        torch.cat(
            [
                torch.arange(-3 * max_distance, 3 * max_distance + 1),  # every distance around the buckets
                torch.randint(-(10**6), 10**6, (2000,), generator=g),  # random, both directions
            ]
        )
        if max_distance < 1000
        else torch.randint(-(10**7), 10**7, (700,), generator=g)
    )
    expected = t5.T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    got = t5_relative_bucket(
        rel, causal=not bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert got.dtype == torch.long and torch.equal(got, expected.long())
    assert int(got.min()) >= 0 and int(got.max()) < num_buckets


@FAST
@given(
    a=st.integers(0, 5000),
    b=st.integers(0, 5000),
    setting=st.sampled_from(BUCKET_SETTINGS),
    causal=st.booleans(),
)
def test_t5_buckets_monotone_in_distance(a, b, setting, causal):
    near, far = sorted((a, b))
    num_buckets, max_distance = setting
    kw = {"causal": causal, "num_buckets": num_buckets, "max_distance": max_distance}
    bucket = lambda r: int(t5_relative_bucket(torch.tensor(r), **kw))  # noqa: E731
    assert bucket(-near) <= bucket(-far)  # keys before the query
    if not causal:
        assert bucket(near) <= bucket(far) or near == 0  # keys after (0 lives in the lower half)
        if near > 0:
            assert bucket(near) >= num_buckets // 2  # after-query keys use the upper half
    else:
        assert bucket(far) == 0  # causal: keys after the query all count as distance 0
    if far >= max_distance:
        assert bucket(-far) == (num_buckets if causal else num_buckets // 2) - 1


# ---------------------------------------------------------------------------------------------- T5 bias
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_matches_hf_compute_bias(bidirectional):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    from transformers import T5Config

    cfg = T5Config(
        d_model=16,
        d_kv=4,
        num_heads=4,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=40,
        is_decoder=not bidirectional,
    )
    hf = t5.T5Attention(cfg, has_relative_attention_bias=True)
    ours = posenc.build("t5", num_heads=4, num_buckets=16, max_distance=40, causal=not bidirectional)
    with torch.no_grad():
        ours.relative_attention_bias.weight.copy_(hf.relative_attention_bias.weight)
    torch.testing.assert_close(
        ours.score_bias(torch.arange(50), torch.arange(60)), hf.compute_bias(50, 60), rtol=0, atol=0
    )
    # Decoding with a cache: HF offsets the queries by past_seen_tokens.
    torch.testing.assert_close(
        ours.score_bias(torch.arange(45, 47), torch.arange(47)),
        hf.compute_bias(2, 47, past_seen_tokens=45),
        rtol=0,
        atol=0,
    )


def test_t5_bias_reference_and_batched_positions():
    scheme = T5RelativeBias(3, num_buckets=8, max_distance=16)
    qp = torch.tensor([[0, 5, 9], [100, 101, 102]])
    kp = torch.tensor([[3, 40], [90, 103]])
    got = scheme.score_bias(qp, kp)
    assert got.shape == (2, 3, 3, 2) and got.dtype == torch.float32
    w = scheme.relative_attention_bias.weight
    for b in range(2):
        for i in range(3):
            for j in range(2):
                bucket = t5_relative_bucket(kp[b, j] - qp[b, i], num_buckets=8, max_distance=16)
                torch.testing.assert_close(got[b, :, i, j], w[bucket], rtol=0, atol=0)


@FAST
@given(
    pos=st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=10),
    shift=st.integers(-(10**6), 10**6),
    causal=st.booleans(),
)
def test_t5_translation_invariance(pos, shift, causal):
    torch.manual_seed(0)
    scheme = T5RelativeBias(2, causal=causal)
    p = torch.tensor(pos)
    assert torch.equal(scheme.score_bias(p, p), scheme.score_bias(p + shift, p + shift))


def test_t5_gradients_and_dtypes():
    scheme = T5RelativeBias(4, num_buckets=8, max_distance=16)
    scheme.score_bias(torch.arange(20), torch.arange(20)).pow(2).sum().backward()
    grad = scheme.relative_attention_bias.weight.grad
    # 20 positions reach every bucket of (8, 16) but one: in T5's bidirectional scheme the upper half's
    # distance-0 bucket (num_buckets / 2) is never used, since relative position 0 is in the lower half.
    used = torch.ones(8, dtype=torch.bool)
    used[4] = False
    assert grad is not None and bool((grad[used] != 0).all()) and bool((grad[4] == 0).all())
    scheme.to(torch.bfloat16)
    assert scheme.score_bias(torch.arange(3), torch.arange(3)).dtype == torch.float32


def test_t5_default_max_distance_follows_the_trained_length():
    assert T5RelativeBias(4).max_distance == 128  # T5's value when no length is known
    assert T5RelativeBias(4, max_len=2048).max_distance == 128
    assert T5RelativeBias(4, max_len=128).max_distance == 64  # half the trained length
    assert T5RelativeBias(4, max_len=128, causal=True).max_distance == 64
    assert T5RelativeBias(4, max_len=8).max_distance == 9  # above the 8 exact buckets
    assert T5RelativeBias(4, max_len=8, causal=True).max_distance == 17  # 16 exact buckets
    assert T5RelativeBias(4, max_distance=100, max_len=64).max_distance == 100  # the user's choice wins
    assert T5RelativeBias(4, max_len=64).max_len is None  # still no limit on the input length
    model_t5 = posenc.build("t5", num_heads=2, max_len=96)  # the key a model offers
    assert model_t5.max_distance == 48


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("build", "exc", "match"),
    [
        (lambda: ALiBi(0), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: ALiBi(2.0), TypeError, "num_heads must be an int"),
        (lambda: alibi_slopes(-3), ValueError, "num_heads must be >= 1, got -3"),
        (lambda: T5RelativeBias(0), ValueError, "num_heads must be >= 1"),
        (lambda: T5RelativeBias(4, num_buckets=31), ValueError, "num_buckets must be even.*use 32"),
        (lambda: T5RelativeBias(4, num_buckets=2), ValueError, "num_buckets must be >= 4, got 2"),
        (
            lambda: T5RelativeBias(4, num_buckets=1, causal=True),
            ValueError,
            "num_buckets must be >= 2",
        ),
        (lambda: T5RelativeBias(4, max_distance=8), ValueError, "max_distance must be >= 9.*8 exact buckets"),
        (lambda: T5RelativeBias(4, causal=1), TypeError, "causal must be a bool"),
        (
            lambda: T5RelativeBias(4, 32, 128, False),
            TypeError,
            "positional argument",
        ),  # causal is keyword-only
        (lambda: T5RelativeBias(4, init_std=0), ValueError, "init_std must be a finite number > 0"),
        (lambda: T5RelativeBias(4, max_len=0), ValueError, "max_len must be >= 1"),
        (lambda: T5RelativeBias(4, num_buckets=31, max_len=64), ValueError, "num_buckets must be even"),
        (lambda: t5_relative_bucket(torch.tensor([1.0])), TypeError, "relative_position must be an integer"),
        (lambda: t5_relative_bucket([1, 2]), TypeError, "relative_position must be an integer tensor"),
        (lambda: posenc.build("alibi"), ValueError, "needs num_heads"),
        (lambda: posenc.build("t5", num_heads=2, buckets=3), ValueError, "unknown config key"),
    ],
)
def test_construction_errors(build, exc, match):
    with pytest.raises(exc, match=match):
        build()


@pytest.mark.parametrize("scheme", [ALiBi(2), T5RelativeBias(2)], ids=["alibi", "t5"])
def test_position_errors(scheme):
    with pytest.raises(TypeError, match=r"q_positions must be an integer tensor, got dtype torch\.float32"):
        scheme.score_bias(torch.arange(3.0), torch.arange(3))
    with pytest.raises(TypeError, match="k_positions must be an integer tensor"):
        scheme.score_bias(torch.arange(3), [0, 1, 2])
    with pytest.raises(ValueError, match=r"k_positions must have shape \[s\] or \[b, s\]"):
        scheme.score_bias(torch.arange(3), torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="batch sizes 2 and 3"):
        scheme.score_bias(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long))


def test_relative_positions_sign():
    rel = relative_positions(torch.tensor([5]), torch.tensor([2, 5, 9]))
    assert rel.tolist() == [[[-3, 0, 4]]]  # memory (key) minus query


# ---------------------------------------------------------------------------------------------- compile/meta
def test_registry_and_meta_device():
    assert {"alibi", "t5"} <= set(posenc.schemes())
    assert posenc.describe("t5")["hooks"] == ["score_bias"]
    with torch.device("meta"):
        alibi, t5 = posenc.build("alibi", num_heads=4), posenc.build("t5", num_heads=4)
        p = torch.arange(5)
        assert alibi.score_bias(p, p).shape == (1, 4, 5, 5)
        assert t5.score_bias(p, p).is_meta
    assert t5.relative_attention_bias.weight.is_meta


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    alibi, t5 = ALiBi(4), T5RelativeBias(4, num_buckets=8, max_distance=16)

    def f(qp, kp):
        return alibi.score_bias(qp, kp) + t5.score_bias(qp, kp)

    qp, kp = torch.tensor([[3, 9, 10]]), torch.tensor([[0, 1, 2, 3, 9, 30]])
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(qp, kp), f(qp, kp))


@pytest.mark.parametrize("name", ["alibi", "t5"])
@pytest.mark.parametrize("causal", [True, False])
def test_distance_bias_is_score_bias_per_distance(name, causal):
    """distance_bias(d)[:, t] equals score_bias at every pair whose k_pos - q_pos is d[t], bit for
    bit; schemes whose bias is not a function of the distance alone answer None."""
    scheme = posenc.build(name, num_heads=5, **({} if name == "alibi" else {"causal": causal}))
    q_pos, k_pos = torch.arange(3, 40), torch.arange(0, 50)
    full = scheme.score_bias(q_pos, k_pos)[0]  # [h, s_q, s_k]
    dist = k_pos[None, :] - q_pos[:, None]  # [s_q, s_k]
    table = scheme.distance_bias(torch.arange(-39, 47))  # [h, 86]
    assert torch.equal(table[:, dist + 39], full)
    for other in (posenc.SinusoidalPE(40), posenc.RotaryEmbedding(8), posenc.build("nope")):
        assert other.distance_bias(torch.arange(3)) is None


def test_old_form_arguments_get_the_fix():
    """posenc has one ``causal`` argument: T5's ``bidirectional`` (its negation) and ALiBi's
    ``causal`` (which changed no value) are refused by the classes with the fix, and by build as
    unknown keys listing the valid ones (``causal`` among T5's)."""
    rel = torch.arange(-3, 4)
    fix_t5 = r"no longer takes bidirectional=: pass causal=not bidirectional"
    with pytest.raises(TypeError, match=fix_t5):
        T5RelativeBias(4, bidirectional=False)
    with pytest.raises(TypeError, match=fix_t5):
        t5_relative_bucket(rel, bidirectional=True)
    with pytest.raises(TypeError, match="positional argument"):  # an old positional flag flips nothing
        t5_relative_bucket(rel, True, 32, 128)
    with pytest.raises(
        ValueError, match=r"unknown config key\(s\) \['bidirectional'\] .*valid keys: .*causal"
    ):
        posenc.build("t5", num_heads=2, bidirectional=True)
    with pytest.raises(TypeError, match=r"ALiBi no longer takes causal=: drop it"):
        ALiBi(4, causal=True)
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['causal'\] for scheme 'alibi'"):
        posenc.build("alibi", num_heads=2, causal=False)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'buckets'"):
        T5RelativeBias(4, buckets=8)
    assert "causal" not in posenc.describe("alibi")["optional"]
    assert (
        posenc.describe("t5")["optional"]["causal"] is False
        and "bidirectional" not in posenc.describe("t5")["optional"]
    )
    # the T5 forms, at distances below the exact buckets (< 4 per direction with 16 buckets): an
    # encoder puts keys after the query in the upper half (8 + d), a decoder clips them to 0
    kw = {"num_buckets": 16, "max_distance": 32}
    assert t5_relative_bucket(rel, **kw).tolist() == [3, 2, 1, 0, 9, 10, 11]
    assert t5_relative_bucket(rel, causal=True, **kw).tolist() == [3, 2, 1, 0, 0, 0, 0]
