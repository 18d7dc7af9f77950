"""Tests of posenc.rotary.apply: apply_rotary against RoFormer's rotation matrix, both pair layouts
("half", "interleaved", and Meta's complex-number form), partial rotary, the rotation's invariants
(norm kept, logits depend on distance only), and the qk_layout axis orders ("bhsd", "bshd")."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _rotary_refs import F64, ref_rotate, scaling_for, vec_dims
from posenc.rotary import ROPE_SCALINGS, Rope2D, RotaryEmbedding, XPos


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("r", [16, 8])
def test_apply_rotary_matches_rotation_matrix(layout, r):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 16, dtype=F64)
    angles = torch.randn(7, r // 2, dtype=F64) * 10
    out = posenc.apply_rotary(x, angles.cos(), angles.sin(), layout=layout)
    torch.testing.assert_close(out, ref_rotate(x, angles, layout), rtol=1e-12, atol=1e-12)
    assert torch.equal(out[..., r:], x[..., r:])  # partial rotary: pass-through bit-identical


def test_apply_rotary_per_token_tables_broadcast_over_heads():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 8, dtype=F64)
    angles = torch.randn(2, 1, 5, 4, dtype=F64)  # [b, 1, s, r/2]
    out = posenc.apply_rotary(x, angles.cos(), angles.sin())
    torch.testing.assert_close(out, ref_rotate(x, angles, "half"), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rotary_gradcheck(layout):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, 6, dtype=F64, requires_grad=True)
    a = torch.randn(3, 2, dtype=F64)
    cos, sin = a.cos().requires_grad_(), a.sin().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, c, s: posenc.apply_rotary(x, c, s, layout=layout), (x, cos, sin)
    )


def test_apply_rotary_errors():
    x, c = torch.randn(1, 1, 4, 8), torch.randn(4, 4)
    with pytest.raises(ValueError, match="unknown layout 'neox'; valid values: 'half', 'interleaved'"):
        posenc.apply_rotary(x, c, c, layout="neox")
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        posenc.apply_rotary(x.long(), c, c)
    with pytest.raises(TypeError, match="sin must be a floating-point tensor"):
        posenc.apply_rotary(x, c, c.long())
    with pytest.raises(ValueError, match="cos and sin must have the same shape"):
        posenc.apply_rotary(x, c, c[:, :2])
    with pytest.raises(ValueError, match=r"cos/sin cover r = 16 dims .* x has d_h = 8"):
        posenc.apply_rotary(x, torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="rotary_dim=4 does not match cos/sin, which are half width"):
        posenc.apply_rotary(x, c, c, rotary_dim=4)
    with pytest.raises(ValueError, match=r"do not broadcast to x\[..., :r/2\]"):
        posenc.apply_rotary(x, torch.randn(3, 1, 4, 4), torch.randn(3, 1, 4, 4))


def test_interleaved_equals_meta_complex_form():
    """Meta's llama reference: view pairs as complex numbers, multiply by polar(1, m theta)."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 50, 64)
    rope = posenc.build("rope", head_dim=64, base=500000.0, layout="interleaved")
    inv, _ = rope.frequencies()
    angles = torch.outer(torch.arange(50).float(), inv.float())  # [s, d_h/2]
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # [s, d_h/2] complex
    q_c = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2))  # [b, h, s, d_h/2]
    meta = torch.view_as_real(q_c * freqs_cis).flatten(-2)
    oq, _ = rope.rotate(q, q)
    torch.testing.assert_close(oq, meta, rtol=1e-6, atol=1e-6)


@settings(deadline=None, max_examples=40)
@given(
    d=vec_dims,
    m=st.integers(0, 10**5),
    layout=st.sampled_from(["half", "interleaved"]),
    rule=st.sampled_from(list(ROPE_SCALINGS)),
    seed=st.integers(0, 2**16),
)
def test_property_norm_preserved(d, m, layout, rule, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 1, 1, d, dtype=F64, generator=g)
    inv, scale = posenc.rope_frequencies(d, scaling=scaling_for(rule, d), seq_len=m + 1, dtype=F64)
    cos, sin = posenc.rope_cos_sin(torch.tensor([m]), inv, attention_scale=scale, dtype=F64)
    y = posenc.apply_rotary(x, cos, sin, layout=layout)
    torch.testing.assert_close(y.norm(), x.norm() * scale, rtol=1e-12, atol=0)


@settings(deadline=None, max_examples=40)
@given(
    d=vec_dims,
    m=st.integers(0, 5000),
    n=st.integers(0, 5000),
    t=st.integers(-5000, 5000),
    layout=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 2**16),
)
def test_property_logit_depends_only_on_distance(d, m, n, t, layout, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, d, dtype=F64, generator=g), torch.randn(1, 1, 1, d, dtype=F64, generator=g)
    inv, _ = posenc.rope_frequencies(d, dtype=F64)

    def logit(a, b):
        ca, sa = posenc.rope_cos_sin(torch.tensor([a]), inv, dtype=F64)
        cb, sb = posenc.rope_cos_sin(torch.tensor([b]), inv, dtype=F64)
        return (
            posenc.apply_rotary(q, ca, sa, layout=layout) * posenc.apply_rotary(k, cb, sb, layout=layout)
        ).sum()

    torch.testing.assert_close(logit(m, n), logit(m + t, n + t), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "make",
    [
        lambda: RotaryEmbedding(64),
        lambda: XPos(64),
        lambda: RotaryEmbedding(
            64,
            layout="interleaved",
            partial_rotary_factor=0.5,
            scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32},
        ),
    ],
)
@pytest.mark.parametrize("per_row", [False, True])
def test_bshd_equals_bhsd_transposed(make, per_row):
    rope = make()
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 100, 64), torch.randn(2, 2, 100, 64)  # GQA: h_kv = 2
    pos = torch.randint(0, 90, (2, 100)) if per_row else torch.arange(7, 107)
    ref_q, ref_k = rope.rotate(q, k, pos, pos)
    for qs, ks in (
        (q.transpose(1, 2), k.transpose(1, 2)),  # views
        (q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()),
    ):
        got_q, got_k = rope.rotate(qs, ks, pos, pos, qk_layout="bshd")
        assert got_q.shape == (2, 100, 4, 64) and got_k.shape == (2, 100, 2, 64)
        torch.testing.assert_close(got_q.transpose(1, 2), ref_q, rtol=0, atol=0)
        torch.testing.assert_close(got_k.transpose(1, 2), ref_k, rtol=0, atol=0)


def test_bshd_as_module_default_and_call():
    torch.manual_seed(0)
    q = torch.randn(1, 100, 4, 64)  # [b, s, h, d_h]
    rope = posenc.build("rope", head_dim=64, qk_layout="bshd")
    ref, _ = posenc.build("rope", head_dim=64)(q.transpose(1, 2), q.transpose(1, 2))
    got, _ = rope(q, q)
    torch.testing.assert_close(got.transpose(1, 2), ref, rtol=0, atol=0)
    assert "qk_layout='bshd'" in repr(rope)


def test_apply_rotary_bshd_tables():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16)
    x = torch.randn(3, 10, 2, 16)  # [b, s, h, d_h]
    pos = torch.randint(0, 50, (3, 10))
    cos, sin = rope.cos_sin(pos, qk_layout="bshd")
    assert cos.shape == (3, 10, 1, 8)
    ref_cos, ref_sin = rope.cos_sin(pos)  # [b, 1, s, r/2]
    ref = posenc.apply_rotary(x.transpose(1, 2), ref_cos, ref_sin)
    got = posenc.apply_rotary(x, cos, sin, qk_layout="bshd")
    torch.testing.assert_close(got.transpose(1, 2), ref, rtol=0, atol=0)
    shared = posenc.apply_rotary(x, *rope.cos_sin(torch.arange(10)), qk_layout="bshd")  # [s, r/2]
    torch.testing.assert_close(shared, rope.rotate(x, x, qk_layout="bshd")[0], rtol=0, atol=0)


def test_positions_that_cannot_match_the_sequence_axis_raise_naming_the_layout():
    rope = RotaryEmbedding(64)
    q = torch.randn(1, 100, 4, 64)  # [b, s, h, d_h] passed without saying so
    with pytest.raises(ValueError, match=r"q_positions must have shape .* s = 4.*pass qk_layout='bshd'"):
        rope.rotate(q, q, torch.arange(100), torch.arange(100))
    cos, sin = rope.cos_sin(torch.arange(100))
    with pytest.raises(ValueError, match=r"cos/sin \(100, 32\) hold 100 positions .*qk_layout='bshd'"):
        posenc.apply_rotary(q, cos, sin)
    with pytest.raises(ValueError, match=r"s = 100 along its sequence axis \(dim 1: qk_layout='bshd'"):
        posenc.apply_rotary(q, *rope.cos_sin(torch.arange(4)), qk_layout="bshd")
    with pytest.raises(ValueError, match=r"unknown qk_layout 'bsdh'.*did you mean 'bshd'"):
        rope.rotate(q, q, qk_layout="bsdh")
    with pytest.raises(ValueError, match="unknown qk_layout"):
        RotaryEmbedding(64, qk_layout="sbhd")


def test_rope_2d_bshd():
    torch.manual_seed(0)
    rope = Rope2D(16, grid=(3, 4))
    q = torch.randn(2, 2, 12, 16)
    ref, _ = rope.rotate(q, q)
    got, _ = rope.rotate(q.transpose(1, 2), q.transpose(1, 2), qk_layout="bshd")
    torch.testing.assert_close(got.transpose(1, 2), ref, rtol=0, atol=0)


@pytest.mark.parametrize("qk_layout", ["bhsd", "bshd"])
def test_apply_rotary_qk_equals_two_calls(qk_layout):
    """apply_rotary_qk(q, k, ...) is apply_rotary on each, bit for bit, with shared or own tables."""
    q = torch.randn(2, 4, 6, 16) if qk_layout == "bhsd" else torch.randn(2, 6, 4, 16)
    k = torch.randn(2, 2, 6, 16) if qk_layout == "bhsd" else torch.randn(2, 6, 2, 16)
    inv, _ = posenc.rope_frequencies(16, rotary_dim=12)
    cos, sin = posenc.rope_cos_sin(torch.arange(6), inv)
    kc, ks = posenc.rope_cos_sin(torch.arange(10, 16), inv)
    for k_tab in ((None, None), (kc, ks)):
        got = posenc.apply_rotary_qk(q, k, cos, sin, *k_tab, layout="interleaved", qk_layout=qk_layout)
        kw = {"layout": "interleaved", "qk_layout": qk_layout}
        want_k = posenc.apply_rotary(k, *(k_tab if k_tab[0] is not None else (cos, sin)), **kw)
        assert torch.equal(got[0], posenc.apply_rotary(q, cos, sin, **kw)) and torch.equal(got[1], want_k)


def test_apply_rotary_qk_errors():
    q = torch.randn(1, 1, 4, 8)
    cos, sin = posenc.rope_cos_sin(torch.arange(4), posenc.rope_frequencies(8)[0])
    with pytest.raises(ValueError, match="pass both k_cos and k_sin"):
        posenc.apply_rotary_qk(q, q, cos, sin, k_cos=cos)
    with pytest.raises(ValueError, match="keys' r = 4"):
        posenc.apply_rotary_qk(q, q, cos, sin, cos[:, :2], sin[:, :2])


# ---------------------------------------------------------------------------------------------
# compute_dtype=torch.float32: float32 tables and arithmetic, one rounding (torchtune's arithmetic)
# ---------------------------------------------------------------------------------------------
def _rounded_once(x, cos, sin, layout, r):
    """The float32 expression, independent of posenc's dispatch: ROTARY_LAYOUTS on x.float() and
    float32 tables, cast back once; pass-through dims copied."""
    from posenc.rotary import ROTARY_LAYOUTS

    y = ROTARY_LAYOUTS[layout](x.float(), cos.float(), sin.float(), r).to(x.dtype)
    return torch.cat((y, x[..., r:]), dim=-1) if r < x.shape[-1] else y


EXACT = {"rtol": 0, "atol": 0, "equal_nan": True}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    "pairs, extra, per_token", [(67, 3, False), (16, 0, True), (40, 0, False), (5, 1, True)]
)
def test_compute_dtype_float32_gives_the_float32_expression_bit_for_bit(
    dtype, layout, pairs, extra, per_token
):
    """The CPU kernel (bf16; fp16 takes the PyTorch path) equals the float32 expression, out of
    place, in place and with out=, for tables given in float64, float32 or x's dtype."""
    gen = torch.Generator().manual_seed(pairs)
    x = torch.randn(2, 5, 9, 2 * pairs + extra, generator=gen).to(dtype)
    angles = (
        torch.rand((2, 1, 9, pairs) if per_token else (9, pairs), generator=gen, dtype=torch.float64) * 60
    )
    want_by_table = {}
    for table_dtype in (torch.float64, torch.float32, dtype):
        cos, sin = angles.cos().to(table_dtype), angles.sin().to(table_dtype)
        want = _rounded_once(x, cos, sin, layout, 2 * pairs)
        got = posenc.apply_rotary(x, cos, sin, layout=layout, compute_dtype=torch.float32)
        torch.testing.assert_close(got, want, **EXACT)
        y = x.clone()
        posenc.apply_rotary(y, cos, sin, layout=layout, compute_dtype="float32", out=y)
        torch.testing.assert_close(y, want, **EXACT)
        want_by_table[table_dtype] = want
    exact = posenc.apply_rotary(x, angles.cos().to(dtype), angles.sin().to(dtype), layout=layout)
    assert not torch.equal(want_by_table[torch.float32], exact)  # a different rounding than HF's


def test_compute_dtype_float32_keeps_nan_inf_and_huge_values_as_the_expression():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 8, 70, generator=gen).bfloat16()
    x[0, 0, 1, ::5] = float("nan")
    x[0, 1, 2, ::7] = float("inf")
    x[1, 2, 3] = torch.randint(-(2**15), 2**15, (70,), generator=gen, dtype=torch.int16).view(torch.bfloat16)
    angles = torch.rand(8, 35, generator=gen, dtype=torch.float64) * 40
    cos, sin = angles.cos().float(), angles.sin().float()
    cos[4] = torch.randint(-(2**31), 2**31 - 1, (35,), generator=gen, dtype=torch.int32).view(torch.float32)
    sin[5, :3] = float("nan")
    for layout in ("half", "interleaved"):
        got = posenc.apply_rotary(x, cos, sin, layout=layout, compute_dtype=torch.float32)
        torch.testing.assert_close(got, _rounded_once(x, cos, sin, layout, 70), **EXACT)


def test_compute_dtype_float32_is_closer_to_the_exact_rotation():
    """Against a float64 rotation with exact angles: rounded once, 99.9% of bf16 outputs are the
    correctly rounded value (99.998% measured) and the mean error is under 0.7x that of PyTorch's bf16
    arithmetic, HF's bits (0.60x measured: 62% of those are correctly rounded)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 64, 128, generator=gen).bfloat16()
    angles = torch.arange(64, dtype=torch.float64)[:, None] * torch.rand(
        64, generator=gen, dtype=torch.float64
    )
    exact = ref_rotate(x.double(), angles, "half")
    once = posenc.apply_rotary(x, angles.cos(), angles.sin(), compute_dtype=torch.float32)
    bf16 = posenc.apply_rotary(x, angles.cos().bfloat16(), angles.sin().bfloat16(), compute_dtype="input")
    assert (once == exact.bfloat16()).double().mean() > 0.999
    assert (once.double() - exact).abs().mean() < 0.7 * (bf16.double() - exact).abs().mean()


def test_compute_dtype_leaves_float32_and_float64_unchanged():
    x = torch.randn(2, 3, 5, 8)
    angles = torch.rand(5, 4, dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        xd, c, s = x.to(dtype), angles.cos().to(dtype), angles.sin().to(dtype)
        assert torch.equal(
            posenc.apply_rotary(xd, c, s, compute_dtype=torch.float32), posenc.apply_rotary(xd, c, s)
        )


def test_compute_dtype_float32_gradients_follow_the_expression():
    gen = torch.Generator().manual_seed(1)
    angles = torch.rand(6, 10, generator=gen, dtype=torch.float64) * 9
    cos, sin = angles.cos().float(), angles.sin().float()
    g = torch.randn(2, 3, 6, 20, generator=gen).bfloat16()
    x = torch.randn(2, 3, 6, 20, generator=gen).bfloat16().requires_grad_()
    for layout in ("half", "interleaved"):
        (got,) = torch.autograd.grad(
            posenc.apply_rotary(x, cos, sin, layout=layout, compute_dtype=torch.float32), x, g
        )
        (want,) = torch.autograd.grad(_rounded_once(x, cos, sin, layout, 20), x, g)
        assert torch.equal(got, want)  # the kernel's backward: the float32 rotation by -angle, rounded once


def test_compute_dtype_float32_in_apply_rotary_qk_and_compiled():
    gen = torch.Generator().manual_seed(2)
    q, k = (
        torch.randn(2, 4, 7, 16, generator=gen).bfloat16(),
        torch.randn(2, 2, 7, 16, generator=gen).bfloat16(),
    )
    angles = torch.rand(7, 8, generator=gen, dtype=torch.float64) * 20
    cos, sin = angles.cos().float(), angles.sin().float()
    rq, rk = posenc.apply_rotary_qk(q, k, cos, sin, compute_dtype=torch.float32)
    assert torch.equal(rq, _rounded_once(q, cos, sin, "half", 16))
    assert torch.equal(rk, _rounded_once(k, cos, sin, "half", 16))

    @torch.compile(fullgraph=True, backend="eager")
    def compiled(q, k):
        return posenc.apply_rotary_qk(q, k, cos, sin, compute_dtype=torch.float32)

    cq, ck = compiled(q, k)
    assert torch.equal(cq, rq) and torch.equal(ck, rk)


@pytest.mark.parametrize(
    "value, err",
    [(32, TypeError), (torch.float16, ValueError), (torch.float64, ValueError), ("bf16", ValueError)],
)
def test_compute_dtype_errors_name_the_argument(value, err):
    x, c = torch.randn(1, 2, 4), torch.randn(2, 2)
    with pytest.raises(err, match="compute_dtype"):
        posenc.apply_rotary(x, c, c, compute_dtype=value)
    with pytest.raises(err, match="compute_dtype"):
        posenc.RotaryEmbedding(4, compute_dtype=value)


def test_compute_dtype_float32_on_two_threads():
    """A tensor past the kernel's one-thread grain (32768 elements) splits over the threads with
    the same bits."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 8, 64, 128, generator=gen).bfloat16()  # 131072 elements
    angles = torch.rand(64, 64, generator=gen, dtype=torch.float64) * 30
    cos, sin = angles.cos().float(), angles.sin().float()
    want = _rounded_once(x, cos, sin, "half", 128)
    for threads in (1, 2):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            assert torch.equal(posenc.apply_rotary(x, cos, sin, compute_dtype=torch.float32), want)
        finally:
            torch.set_num_threads(before)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_bf16_default_is_within_one_rounding_of_the_float64_rotation(layout):
    """The default for a bf16 x (float32 tables and arithmetic, one rounding): every element is within
    half a bf16 ulp of the float64 rotation by the same float32 tables, plus the float32 arithmetic's
    own error (two float32 roundings of the products' size, which matters only where the two products
    nearly cancel), and nearly all of them are that rotation correctly rounded. The per-operation
    form (compute_dtype="input", Hugging Face's bits) is off by up to several bf16 ulps of the inputs."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 4, 128, 64, generator=gen) * 4).bfloat16()
    angles = torch.arange(128, dtype=F64)[:, None] * torch.rand(32, generator=gen, dtype=F64) * 3
    cos, sin = angles.cos().float(), angles.sin().float()  # the tables the rotation reads
    got = posenc.apply_rotary(x, cos, sin, layout=layout)
    assert got.dtype == torch.bfloat16
    exact = ref_rotate(x.double(), torch.atan2(sin.double(), cos.double()), layout)  # float64
    size = ref_rotate(x.double().abs(), torch.zeros_like(angles), layout)  # |x| per element
    ulp = torch.where(exact == 0, 0.0, 2.0 ** (torch.floor(torch.log2(exact.abs())) - 7))  # bf16 ulp
    bound = 0.5 * ulp + 2 * 2.0**-24 * 2 * size  # one bf16 rounding + float32 error of two products
    err = (got.double() - exact).abs()
    assert (err <= bound).all(), float((err - bound).max())
    assert (got == exact.bfloat16()).double().mean() > 0.999
    per_op = posenc.apply_rotary(x, cos.bfloat16(), sin.bfloat16(), layout=layout, compute_dtype="input")
    assert ((per_op.double() - exact).abs() > bound).any()  # what the default avoids
