"""Tests of posenc.rotary.scalings: every rule of ROPE_SCALINGS against its float64 paper reference
(rope_frequencies), linear scaling as position interpolation, dynamic below the trained length,
the attention scale, rope_cos_sin's float32 angles under bf16, scaling/rotary_dim validation, and
document_lengths (length-dependent rules see each packed document and row alone)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _rotary_refs import F64, angle_tol, ref_inv_freq, scaling_for, vec_dims
from posenc.rotary import ROPE_SCALINGS


@pytest.mark.parametrize("rule", list(ROPE_SCALINGS))
@pytest.mark.parametrize("r", [128, 64, 32])
def test_frequencies_match_float64_reference(rule, r):
    for base in (10000.0, 500000.0):
        p = scaling_for(rule, r)
        for seq_len in (None, 512, 8192):
            inv, scale = posenc.rope_frequencies(r, base=base, scaling=p, seq_len=seq_len, dtype=F64)
            ref, ref_scale = ref_inv_freq(r, base, rule, p, seq_len)
            torch.testing.assert_close(inv, ref, rtol=1e-12, atol=0)
            assert scale == pytest.approx(ref_scale, rel=1e-12)


@settings(deadline=None, max_examples=40)
@given(d=vec_dims, m=st.integers(0, 4000), s=st.integers(1, 16))
def test_property_linear_scaling_is_position_interpolation(d, m, s):
    """linear scaling by s at position m * s == default at position m (Chen et al. 2023)."""
    lin, _ = posenc.rope_frequencies(d, scaling={"rope_type": "linear", "factor": float(s)}, dtype=F64)
    dft, _ = posenc.rope_frequencies(d, dtype=F64)
    a = posenc.rope_cos_sin(torch.tensor([m * s]), lin, dtype=F64)
    b = posenc.rope_cos_sin(torch.tensor([m]), dft, dtype=F64)
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@settings(deadline=None, max_examples=30)
@given(d=vec_dims, top=st.integers(1, 1024), seed=st.integers(0, 2**16))
def test_property_dynamic_equals_default_below_trained_length(d, top, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 4, d, generator=g)
    pos = torch.randint(0, top, (4,), generator=g)
    dyn = posenc.build("rope", head_dim=d, scaling=scaling_for("dynamic", d, l0=1024))
    dft = posenc.build("rope", head_dim=d)
    assert all(torch.equal(a, b) for a, b in zip(dyn.rotate(q, q, pos, pos), dft.rotate(q, q, pos, pos)))


def test_attention_scale_scales_logits_by_its_square():
    rope = posenc.build("rope", head_dim=32, scaling=scaling_for("yarn", 32, factor=16.0))
    plain = posenc.build(
        "rope", head_dim=32, scaling={**scaling_for("yarn", 32, factor=16.0), "attention_factor": 1.0}
    )
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 8, 32), torch.randn(1, 1, 8, 32)
    a = rope.frequencies()[1]
    assert a == pytest.approx(0.1 * math.log(16.0) + 1)
    lq, lk = rope.rotate(q, k)
    pq, pk = plain.rotate(q, k)
    torch.testing.assert_close(lq @ lk.mT, a**2 * (pq @ pk.mT))


def test_bf16_module_keeps_65536_positions_distinct():
    n, d = 65536, 64
    rope = posenc.build("rope", head_dim=d).to(torch.bfloat16)
    pos = torch.arange(n)
    cos, sin = rope.cos_sin(pos, dtype=torch.bfloat16)
    rows = torch.cat((cos, sin), dim=-1).view(torch.int16)  # exact bit patterns of each row
    assert torch.unique(rows, dim=0).shape[0] == n
    # float64 reference; error <= half a bf16 ulp (2^-9 below 1) + the float32 angle error (m * 2^-23)
    angles = pos.to(F64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=F64) / d)
    bound = 2.0**-9 + angle_tol(n, ulps=2.0)
    assert (cos.double() - angles.cos()).abs().max().item() <= bound
    assert (sin.double() - angles.sin()).abs().max().item() <= bound
    # the rotated vectors of a bf16 model stay distinct too
    q = torch.randn(1, 1, 1, d).to(torch.bfloat16).expand(1, 1, n, d)
    out, _ = rope.rotate(q, q[:, :, :1])
    assert torch.unique(out[0, 0].view(torch.int16), dim=0).shape[0] == n
    # the naive way (positions held in bf16, as peers did) collapses: measured 1281 distinct rows of 65536
    naive = pos.to(torch.bfloat16)[:, None] * rope.frequencies()[0].to(torch.bfloat16)
    collapsed = torch.unique(torch.cat((naive.cos(), naive.sin()), -1).view(torch.int16), dim=0).shape[0]
    assert collapsed < 1300


def test_rope_config_errors():
    with pytest.raises(ValueError, match="unknown RoPE scaling rule 'su'; valid rules: default, linear, ntk"):
        posenc.rope_frequencies(64, scaling={"rope_type": "su"})
    with pytest.raises(
        ValueError, match=r"RoPE scaling 'yarn' needs key\(s\) \['original_max_position_embed"
    ):
        posenc.build("rope", head_dim=64, scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) \['alpha'\] for RoPE scaling 'linear'; valid keys: factor"
    ):
        posenc.build("rope", head_dim=64, scaling={"rope_type": "linear", "factor": 2.0, "alpha": 1})
    with pytest.raises(ValueError, match="scaling dict needs a 'rope_type' key"):
        posenc.build("rope", head_dim=64, scaling={"factor": 2.0})
    with pytest.raises(TypeError, match="scaling must be None, a rule name or a dict"):
        posenc.build("rope", head_dim=64, scaling=2.0)
    with pytest.raises(ValueError, match=r"scaling\['factor'\] must be a finite number > 0, got -1"):
        posenc.build("rope", head_dim=64, scaling={"rope_type": "linear", "factor": -1})
    with pytest.raises(ValueError, match=r"scaling\['short_factor'\] must be a list of r/2 = 32 numbers"):
        posenc.build("rope", head_dim=64, scaling={**scaling_for("longrope", 64), "short_factor": [1.0]})
    with pytest.raises(ValueError, match="needs 'factor' or 'max_position_embeddings'"):
        posenc.build(
            "rope", head_dim=8, scaling={k: v for k, v in scaling_for("longrope", 8).items() if k != "factor"}
        )
    with pytest.raises(ValueError, match=r"scaling\['high_freq_factor'\] \(1.0\) must be >"):
        posenc.build("rope", head_dim=64, scaling={**scaling_for("llama3", 64), "high_freq_factor": 1.0})
    with pytest.raises(ValueError, match="head_dim must be even"):
        posenc.build("rope", head_dim=63)
    with pytest.raises(
        ValueError, match=r"rotary_dim must be even .* \(= int\(head_dim 64 \* partial_rotary"
    ):
        posenc.build("rope", head_dim=64, partial_rotary_factor=13 / 64)
    with pytest.raises(ValueError, match=r"give rotary_dim .* or partial_rotary_factor .*, not both"):
        posenc.build("rope", head_dim=64, rotary_dim=32, partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match=r"partial_rotary_factor must be in \(0, 1\], got 1.5"):
        posenc.build("rope", head_dim=64, partial_rotary_factor=1.5)
    with pytest.raises(ValueError, match="rotary_dim must be <= head_dim"):
        posenc.build("rope", head_dim=64, rotary_dim=128)
    with pytest.raises(ValueError, match="unknown layout 'neox'"):
        posenc.build("rope", head_dim=64, layout="neox")
    rope = posenc.build("rope", head_dim=8)
    q = torch.randn(1, 1, 3, 8)
    with pytest.raises(ValueError, match=r"q must have shape \[b, h, s, 8\], got \(1, 3, 8\)"):
        rope.rotate(q[0], q)
    with pytest.raises(TypeError, match="k_positions must be an integer tensor"):
        rope.rotate(q, q, torch.arange(3), torch.arange(3.0))
    with pytest.raises(ValueError, match=r"q_positions must have shape \[s\] or \[b, s\] with s = 3"):
        rope.rotate(q, q, torch.arange(4))
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        posenc.rope_cos_sin(torch.arange(3.0), torch.ones(4))


def test_document_lengths():
    from posenc.rotary import document_lengths

    assert document_lengths(torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3])).tolist() == [3, 3, 3, 2, 2, 4, 4, 4, 4]
    assert document_lengths(torch.tensor([7, 8, 9])).tolist() == [10, 10, 10]  # an offset range: one
    assert document_lengths(torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])).tolist() == [[3], [5]]


@pytest.mark.parametrize("rule", ["dynamic", "longrope"])
def test_length_dependent_rules_treat_each_document_and_row_alone(rule):
    """A packed short document must not take the long one's base, nor a left-padded short row the
    long row's: packed == separate and left-padded == alone (it was 0.33 off for dynamic)."""
    rope = posenc.build(
        "rope", head_dim=16, scaling={**scaling_for(rule, 16), "original_max_position_embeddings": 8}
    )
    g = torch.Generator().manual_seed(0)
    a, b = 5, 20  # a document within the original length, one past it
    q, k = torch.randn(2, 1, 2, a + b, 16, generator=g)
    pos = torch.cat((torch.arange(a), torch.arange(b)))  # [a + b]: two packed documents
    packed = rope.rotate(q, k, pos, pos)[0]
    separate = torch.cat(
        (rope.rotate(q[..., :a, :], k[..., :a, :])[0], rope.rotate(q[..., a:, :], k[..., a:, :])[0]), -2
    )
    torch.testing.assert_close(packed, separate, rtol=0, atol=1e-6)
    mask = torch.tensor([[False] * 3 + [True] * 5, [True] * 8])
    positions = posenc.positions_from_mask(mask)  # [2, 8]: row 0 padded on the left
    q, k = torch.randn(2, 2, 2, 8, 16, generator=g)
    rq, rk = rope.rotate(q, k, positions, positions)
    aq, ak = rope.rotate(q[:1, :, 3:], k[:1, :, 3:])  # the short row alone
    torch.testing.assert_close(rq[:1, :, 3:], aq, rtol=0, atol=1e-6)
    torch.testing.assert_close(rk[:1, :, 3:], ak, rtol=0, atol=1e-6)


def test_yarn_mscale_and_mscale_all_dim_give_deepseeks_attention_factor():
    """DeepSeek-V2/V3's YaRN: attention factor mscale(s, mscale) / mscale(s, mscale_all_dim) with
    mscale(s, m) = 0.1 m ln s + 1: factor 40, mscale 1.0, mscale_all_dim 0.707 gives 1.0857 (the tests
    before used mscale = mscale_all_dim = 1, where ignoring mscale went unseen); the same as HF's."""
    scaling = {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    rope = posenc.build("rope", head_dim=64, scaling=scaling)
    want = (0.1 * 1.0 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1)
    assert rope.frequencies()[1] == pytest.approx(want, rel=1e-12) and round(want, 4) == 1.0857
    plain = posenc.build("rope", head_dim=64, scaling={**scaling, "mscale": None, "mscale_all_dim": None})
    assert plain.frequencies()[1] == pytest.approx(0.1 * math.log(40) + 1, rel=1e-12)  # 1.3689: YaRN's own
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {k: v for k, v in scaling.items()} | {"rope_theta": 10000.0}
    cfg = transformers.LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
        max_position_embeddings=4096 * 40,
        rope_parameters=params,
    )
    hf_inv, hf_scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, None)
    assert rope.frequencies()[1] == pytest.approx(hf_scale, rel=1e-12)
    torch.testing.assert_close(rope.frequencies()[0].float(), hf_inv, rtol=4 * 2.0**-23, atol=0)


def test_proportional_validates_its_fraction():
    """The fraction of turning pairs is required (without it the rule is `linear`) and in (0, 1]."""
    needs = r"RoPE scaling 'proportional' needs key\(s\) \['partial_rotary_factor'\]"
    with pytest.raises(ValueError, match=needs):
        posenc.rope_frequencies(64, scaling={"rope_type": "proportional"})
    with pytest.raises(ValueError, match=r"partial_rotary_factor'\] must be in \(0, 1\]"):
        posenc.rope_frequencies(64, scaling={"rope_type": "proportional", "partial_rotary_factor": 1.5})
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        posenc.rope_frequencies(64, scaling={"rope_type": "proportional", "partial_rotary_factor": 0})
    assert "proportional" not in posenc.RotaryEmbedding.eval_variants  # needs a fraction, not just a factor


def test_llama3_is_an_evaluation_variant_with_llama_3_1_settings():
    """``llama3`` is offered for evaluation at factor E / L: Llama 3.1's low/high frequency factors
    (1 and 4) with the trained length as the original one, equal to HF's llama3 rule for that
    config; ``longrope`` (searched per-pair factors) is not offered."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_cls = posenc.RotaryEmbedding
    assert "llama3" in rope_cls.eval_variants and "longrope" not in rope_cls.eval_variants
    options = rope_cls.variant_options("llama3", 4.0, 512)
    assert options["scaling"]["original_max_position_embeddings"] == 512
    rope = posenc.build("rope", head_dim=64, **options)
    params = {**options["scaling"], "rope_theta": 10000.0}
    cfg = transformers.LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        rope_parameters=params,
    )
    hf_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, None)
    torch.testing.assert_close(rope.frequencies()[0].float(), hf_inv, rtol=4 * 2.0**-23, atol=0)
