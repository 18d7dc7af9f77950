"""Tests of posenc.rotary: RoPE, its scalings, xPos, axial 2D RoPE, HF interop, layout conversion.

References used here:
* float64 formulas written plainly from the papers (RoFormer's block-diagonal rotation matrix,
  Chen et al.'s interpolation, the NTK base change, YaRN's official ramp, Llama 3.1's rule, LongRoPE,
  xPos's zeta), in this file;
* Hugging Face transformers 5.23 (``ROPE_INIT_FUNCTIONS``, Llama/GPT-NeoX ``apply_rotary_pos_emb``,
  GPT-J's ``rotate_every_two`` form) and Meta's complex-number form (written here, ``torch.polar``).
Tolerances for float32 comparisons come from float32 angle rounding: an angle ``m * w`` carries
an error of at most a few units of ``m * 2^-24``, see :func:`angle_tol`.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.rotary import ROPE_SCALINGS, Rope2D, RotaryEmbedding, XPos

transformers = pytest.importorskip("transformers")
from transformers import GPTJConfig, GPTNeoXConfig, LlamaConfig, Phi3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox as hf_neox  # noqa: E402
from transformers.models.gptj import modeling_gptj as hf_gptj  # noqa: E402
from transformers.models.llama import modeling_llama as hf_llama  # noqa: E402

transformers.logging.set_verbosity_error()
F64 = torch.float64


# ----------------------------------------------------------------------------------------------
# float64 references, written from the papers
# ----------------------------------------------------------------------------------------------
def ref_pairs(r: int, layout: str) -> list[tuple[int, int]]:
    """The dims rotated together: (2i, 2i+1) in RoFormer/GPT-J, (i, i + r/2) in GPT-NeoX/HF Llama."""
    return [(2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + r // 2) for i in range(r // 2)]


def ref_rotate(x: torch.Tensor, angles: torch.Tensor, layout: str, scale: torch.Tensor | float = 1.0):
    """RoFormer eq. (13)-(15): y = R_Theta,m x with R block-diagonal 2x2 rotations, built explicitly.

    x: [..., s, d_h] float64; angles: [..., s, r/2] (broadcastable); scale multiplies each pair.
    """
    r = 2 * angles.shape[-1]
    x = x.to(F64)
    shape = torch.broadcast_shapes(x.shape[:-1], angles.shape[:-1])
    R = torch.zeros(*shape, r, r, dtype=F64)
    c, s = angles.cos() * scale, angles.sin() * scale
    c, s = c.expand(*shape, r // 2), s.expand(*shape, r // 2)
    for i, (a, b) in enumerate(ref_pairs(r, layout)):
        R[..., a, a], R[..., a, b] = c[..., i], -s[..., i]
        R[..., b, a], R[..., b, b] = s[..., i], c[..., i]
    rot = (R @ x[..., :r, None].expand(*shape, r, 1))[..., 0]
    return torch.cat((rot, x.expand(*shape, x.shape[-1])[..., r:]), dim=-1)


def ref_inv_freq(r: int, base: float, rule: str = "default", p: dict | None = None, seq_len=None):
    """Each scaling rule's frequencies in float64, from its paper / reference code."""
    p = p or {}
    i = torch.arange(r // 2, dtype=F64)
    theta = base ** (-2 * i / r)  # RoFormer: theta_i = base^(-2(i-1)/d), i from 1
    if rule == "default":
        return theta, 1.0
    if rule == "linear":  # Chen et al. 2023: f(x, m) = f(x, m / s)
        return theta / p["factor"], 1.0
    if rule == "ntk":  # bloc97: base' = base * s^(d/(d-2))
        return (base * p["factor"] ** (r / (r - 2))) ** (-2 * i / r), 1.0
    if rule == "dynamic":  # emozilla / HF: s' = (s L / L0) - (s - 1), L = max(L, L0)
        f, l0 = p["factor"], p["original_max_position_embeddings"]
        length = max(seq_len or l0, l0)
        return (base * (f * length / l0 - (f - 1)) ** (r / (r - 2))) ** (-2 * i / r), 1.0
    if rule == "yarn":  # YaRN reference code: linear ramp over dim index between the beta_fast/slow dims
        f, l0 = p["factor"], p["original_max_position_embeddings"]
        bf, bs = p.get("beta_fast", 32), p.get("beta_slow", 1)
        lo = math.floor(r * math.log(l0 / (bf * 2 * math.pi)) / (2 * math.log(base)))
        hi = math.ceil(r * math.log(l0 / (bs * 2 * math.pi)) / (2 * math.log(base)))
        lo, hi = max(lo, 0), min(hi, r - 1)
        gamma = ((i - lo) / (hi - lo if hi != lo else 0.001)).clamp(0, 1)  # 0: keep, 1: interpolate
        inv = theta * (1 - gamma) + theta / f * gamma

        def m(s, k=1.0):
            return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1  # sqrt(1/t) = 0.1 ln s + 1

        if p.get("mscale") and p.get("mscale_all_dim"):
            return inv, m(f, p["mscale"]) / m(f, p["mscale_all_dim"])
        return inv, m(f)
    if rule == "llama3":
        f, l0 = p["factor"], p["original_max_position_embeddings"]
        lo, hi = p["low_freq_factor"], p["high_freq_factor"]
        out = []
        for t in theta.tolist():
            wl = 2 * math.pi / t
            if wl < l0 / hi:
                out.append(t)
            elif wl > l0 / lo:
                out.append(t / f)
            else:
                sm = (l0 / wl - lo) / (hi - lo)
                out.append((1 - sm) * t / f + sm * t)
        return torch.tensor(out, dtype=F64), 1.0
    if rule == "longrope":  # Ding et al. 2024: theta_i / lambda_i, lambda from the short or long list
        l0 = p["original_max_position_embeddings"]
        lam = p["long_factor"] if seq_len and seq_len > l0 else p["short_factor"]
        f = p.get("factor") or p["max_position_embeddings"] / l0
        return theta / torch.tensor(lam, dtype=F64), math.sqrt(1 + math.log(f) / math.log(l0))
    raise AssertionError(rule)


#: HF computes inv_freq in float32 (a pow, then up to ~4 more roundings for llama3/yarn blends);
#: posenc in float64, rounded once. They agree to a few float32 ulps.
HF_FREQ_RTOL = 4 * 2.0**-23


def angle_tol(max_pos: int, ulps: float = 4.0) -> float:
    """Worst float32 error of an angle m * w with |w| <= 1 and 0 <= m <= max_pos, in radians:
    rounding of w (|w| 2^-24 relative, times m) and of the product (half an ulp of m w)."""
    return ulps * max(max_pos, 1) * 2.0**-24


def scaling_for(rule: str, r: int, factor: float = 4.0, l0: int = 1024) -> dict | None:
    """A valid scaling dict for each rule (longrope factors are a deterministic ramp)."""
    return {
        "default": None,
        "linear": {"rope_type": "linear", "factor": factor},
        "ntk": {"rope_type": "ntk", "factor": factor},
        "dynamic": {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": l0},
        "yarn": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": l0},
        "llama3": {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": l0,
        },
        "longrope": {
            "rope_type": "longrope",
            "original_max_position_embeddings": l0,
            "factor": factor,
            "short_factor": [1.0 + 0.02 * j for j in range(r // 2)],
            "long_factor": [1.0 + factor * j / (r // 2) for j in range(r // 2)],
        },
    }[rule]


# ----------------------------------------------------------------------------------------------
# apply_rotary
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# Frequencies: float64 references and HF parity for every rule
# ----------------------------------------------------------------------------------------------
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


def hf_config(rule: str, head_dim: int, base: float, factor: float, partial: float):
    r = int(head_dim * partial)
    p = scaling_for(rule, r, factor=factor, l0=1024)
    params = {"rope_type": "default"} if p is None else {k: v for k, v in p.items() if k != "rope_type"}
    params = {
        "rope_type": rule if rule != "default" else "default",
        **params,
        "rope_theta": base,
        "partial_rotary_factor": partial,
    }
    if rule == "dynamic":
        params.pop(
            "original_max_position_embeddings"
        )  # HF's dynamic rule measures against max_position_embeddings
    return GPTNeoXConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        max_position_embeddings=1024 * factor if rule != "dynamic" else 1024,
        rope_parameters=params,
    )


HF_RULES = [r for r in ROPE_SCALINGS if r != "ntk"]  # HF has no static NTK rule (its "dynamic" is NTK grown)


@pytest.mark.parametrize("rule", HF_RULES)
@pytest.mark.parametrize("partial", [1.0, 0.5, 0.25])
def test_hf_parity_frequencies_and_rotation(rule, partial):
    """Same inv_freq, attention scale and rotated q/k as HF (GPT-NeoX classes: partial rotary)."""
    torch.manual_seed(0)
    for head_dim in (64, 128):
        for base in (10000.0, 1e6):
            for factor in (2, 8):
                cfg = hf_config(rule, head_dim, base, factor, partial)
                ours = posenc.rope_from_hf(cfg)
                hf = hf_neox.GPTNeoXRotaryEmbedding(cfg)
                # frequencies at the trained length and beyond it (dynamic / longrope change there)
                for seq_len in (None, 1024 * factor + 100):
                    inv, scale = ours.frequencies(seq_len)
                    if seq_len is None:
                        hf_inv, hf_scale = hf.inv_freq, hf.attention_scaling
                    elif rule == "default" or rule not in ("dynamic", "longrope"):
                        continue
                    else:
                        hf_inv, hf_scale = ROPE_INIT_FUNCTIONS[rule](cfg, None, seq_len=seq_len)
                    torch.testing.assert_close(inv.float(), hf_inv, rtol=HF_FREQ_RTOL, atol=0)
                    assert scale == pytest.approx(hf_scale, rel=1e-12)
                # rotated q/k over a long range of positions (past the trained length)
                s = 1024 * factor + 200
                pos = torch.randint(0, s, (1, 64))  # [1, 64] positions up to past the trained length
                pos[0, 0] = s - 1  # the length-dependent rules see the long length
                q, k = torch.randn(1, 2, pos.shape[1], head_dim), torch.randn(1, 2, pos.shape[1], head_dim)
                cos, sin = hf(q, pos)
                hq, hk = hf_neox.apply_rotary_pos_emb(q, k, cos, sin)
                oq, ok = ours.rotate(q, k, pos, pos)
                tol = angle_tol(s) * q.abs().max().item() * 2 * max(1.0, ours.frequencies()[1])
                torch.testing.assert_close(oq, hq, rtol=0, atol=tol)
                torch.testing.assert_close(ok, hk, rtol=0, atol=tol)
                r = ours.rotary_dim
                assert torch.equal(oq[..., r:], q[..., r:])


@pytest.mark.parametrize("rule", ["dynamic", "longrope"])
def test_hf_parity_at_the_switch_point(rule):
    """Length-dependent rules change at the original length: compare one before, exactly at, and
    one past it with HF (a `>` turned into `>=` must fail here)."""
    cfg = hf_config(rule, 64, 10000.0, 4, 1.0)
    ours = posenc.rope_from_hf(cfg)
    original = ours.scaling_params.get("original_max_position_embeddings") or cfg.max_position_embeddings
    changed = []
    for seq_len in (original - 1, original, original + 1):
        inv, scale = ours.frequencies(seq_len)
        hf_inv, hf_scale = ROPE_INIT_FUNCTIONS[rule](cfg, None, seq_len=seq_len)
        torch.testing.assert_close(inv.float(), hf_inv, rtol=HF_FREQ_RTOL, atol=0)
        assert scale == pytest.approx(hf_scale, rel=1e-12)
        changed.append(inv)
    assert torch.equal(changed[0], changed[1]) and not torch.equal(changed[1], changed[2])


def test_hf_parity_llama_bitwise_default_and_bf16():
    """Llama's own classes; with identical inv_freq posenc's ops are HF's, so outputs are bit-equal."""
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, rope_theta=10000.0)
    hf = hf_llama.LlamaRotaryEmbedding(cfg)
    ours = posenc.rope_from_hf(cfg)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(2, 4, 300, 64).to(dtype)
        pos = torch.arange(300)[None].expand(2, -1)
        cos, sin = hf(q, pos)
        hq, _ = hf_llama.apply_rotary_pos_emb(q, q, cos, sin)
        # feed HF's inv_freq through posenc's pipeline: the remaining ops must be identical
        c, s = posenc.rope_cos_sin(pos, hf.inv_freq, dtype=dtype)
        oq = posenc.apply_rotary(q, c[:, None], s[:, None])
        assert torch.equal(oq, hq)
        oq2, _ = ours.rotate(q, q, pos, pos)  # posenc's own (float64-derived) inv_freq: within angle rounding
        torch.testing.assert_close(
            oq2.float(),
            hq.float(),
            rtol=0,
            atol=angle_tol(300) * 8 + (0 if dtype == torch.float32 else 2**-7 * 8),
        )


def test_hf_parity_dynamic_module_after_growth():
    """HF's LlamaRotaryEmbedding recomputes its base when positions pass max_position_embeddings."""
    cfg = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
    )
    ours = posenc.rope_from_hf(cfg)
    assert ours.needs_unrotated_cache is True
    torch.manual_seed(0)
    for s in (300, 2000):
        hf = hf_llama.LlamaRotaryEmbedding(cfg)
        q = torch.randn(1, 2, s, 64)
        pos = torch.arange(s)[None]
        hq, _ = hf_llama.apply_rotary_pos_emb(q, q, *hf(q, pos))
        oq, _ = ours.rotate(q, q, pos, pos)
        torch.testing.assert_close(oq, hq, rtol=0, atol=angle_tol(s) * 2 * q.abs().max().item())


def test_gptj_interleaved_parity():
    """GPT-J: interleaved pairs, rotary_dim=16 of head_dim 32, HF's rotate_every_two form."""
    cfg = GPTJConfig(n_embd=64, n_head=2, rotary_dim=16, n_positions=512)
    ours = posenc.rope_from_hf(cfg)
    assert (ours.layout, ours.rotary_dim, ours.head_dim) == ("interleaved", 16, 32)
    torch.manual_seed(0)
    q = torch.randn(1, 2, 100, 32)  # [b, h, s, d_h]
    table = hf_gptj.create_sinusoidal_positions(512, 16)  # [n, r] = [sin | cos]
    sin, cos = table[:100, :8][None], table[:100, 8:][None]  # [1, s, r/2]
    q_bshd = q.transpose(1, 2)  # GPT-J works on [b, s, h, d_h]
    hq_rot = hf_gptj.apply_rotary_pos_emb(q_bshd[..., :16], sin, cos)
    hq = torch.cat((hq_rot, q_bshd[..., 16:]), dim=-1).transpose(1, 2)
    oq, _ = ours.rotate(q, q)
    torch.testing.assert_close(oq, hq, rtol=0, atol=angle_tol(100) * 8)


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


def test_permute_qk_weights_converts_layouts_exactly():
    torch.manual_seed(0)
    h, d_h, d_in, s = 3, 16, 24, 20
    w_meta = torch.randn(h * d_h, d_in, dtype=F64)
    # HF convert_llama_weights_to_hf.py's permute, written out here
    hf_perm = w_meta.view(h, d_h // 2, 2, d_in).transpose(1, 2).reshape(h * d_h, d_in)
    w_hf = posenc.permute_qk_weights(w_meta, h, to="half")
    assert torch.equal(w_hf, hf_perm)
    assert torch.equal(posenc.permute_qk_weights(w_hf, h, to="interleaved"), w_meta)
    x = torch.randn(s, d_in, dtype=F64)

    def heads(y):
        return y.view(1, s, h, d_h).transpose(1, 2)  # [1, s, h * d_h] -> [1, h, s, d_h]

    inter = posenc.build("rope", head_dim=d_h, layout="interleaved")
    half = posenc.build("rope", head_dim=d_h, layout="half")
    q_i, k_i = inter.rotate(heads(x @ w_meta.T), heads(x @ w_meta.T))
    q_h, k_h = half.rotate(heads(x @ w_hf.T), heads(x @ w_hf.T))
    flat_i = q_i.transpose(1, 2).reshape(s, h * d_h)
    expect = posenc.permute_qk_weights(flat_i.T, h, to="half").T  # the same permutation on the outputs
    torch.testing.assert_close(q_h.transpose(1, 2).reshape(s, h * d_h), expect, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        q_h @ k_h.transpose(-1, -2), q_i @ k_i.transpose(-1, -2), rtol=1e-12, atol=1e-12
    )
    # partial rotary: only the first r rows of each head move; bias vectors too
    b = torch.arange(h * d_h, dtype=F64)
    pb = posenc.permute_qk_weights(b, h, to="half", rotary_dim=8).view(h, d_h)
    assert pb[0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7, *range(8, 16)]
    with pytest.raises(ValueError, match="not a multiple of num_heads=5"):
        posenc.permute_qk_weights(w_meta, 5)
    with pytest.raises(ValueError, match="unknown to 'meta'"):
        posenc.permute_qk_weights(w_meta, h, to="meta")


# ----------------------------------------------------------------------------------------------
# The rope scheme: properties
# ----------------------------------------------------------------------------------------------
vec_dims = st.sampled_from([8, 16, 32])


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


@settings(deadline=None, max_examples=20)
@given(d=vec_dims, layout=st.sampled_from(["half", "interleaved"]), seed=st.integers(0, 2**16))
def test_property_position_zero_is_identity(d, layout, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 3, d, generator=g)
    rope = posenc.build("rope", head_dim=d, layout=layout)
    oq, ok = rope.rotate(q, q, torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    assert torch.equal(oq, q) and torch.equal(ok, q)


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


@pytest.mark.parametrize("rule", ["default", "yarn", "dynamic", "longrope", "xpos"])
def test_incremental_decoding_equals_full(rule):
    """Rotating token by token with offset positions == rotating the whole sequence; for length-dependent
    rules the model keeps raw keys and rotates the whole cache at each step (needs_unrotated_cache)."""
    torch.manual_seed(0)
    d, s = 16, 40
    if rule == "xpos":
        rope = posenc.build("xpos", head_dim=d)
    else:
        rope = posenc.build("rope", head_dim=d, scaling=scaling_for(rule, d, factor=4.0, l0=16))
    q, k = torch.randn(2, 2, s, d), torch.randn(2, 1, s, d)  # GQA: 2 query heads, 1 key head
    fq, fk = rope.rotate(q, k)
    logits_full = fq @ fk.transpose(-1, -2)
    cache = []
    for t in range(s):
        pos = torch.tensor([t])
        if rope.needs_unrotated_cache:
            qt, kt = rope.rotate(q[:, :, t : t + 1], k[:, :, : t + 1], pos, torch.arange(t + 1))
        else:
            qt, kn = rope.rotate(q[:, :, t : t + 1], k[:, :, t : t + 1], pos, pos)
            cache.append(kn)
            kt = torch.cat(cache, dim=2)
        step = qt @ kt.transpose(-1, -2)  # [b, h, 1, t+1]
        if rule in ("dynamic", "longrope"):  # the base follows the current length t + 1, as in HF
            rq, rk = rope.rotate(q[:, :, : t + 1], k[:, :, : t + 1])
            torch.testing.assert_close(step[..., 0, :], (rq @ rk.transpose(-1, -2))[..., t, :])
        else:
            torch.testing.assert_close(step[..., 0, :], logits_full[..., t, : t + 1])


def test_per_token_positions_packing_and_left_padding():
    """Positions [b, s] (left padding from a mask) == rotating each row with its own positions."""
    torch.manual_seed(0)
    rope = posenc.build("rope", head_dim=16, scaling=scaling_for("yarn", 16))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = posenc.positions_from_mask(mask)
    q = torch.randn(2, 3, 5, 16)
    oq, ok = rope.rotate(q, q, pos, pos)
    for row in range(2):
        rq, rk = rope.rotate(q[row : row + 1], q[row : row + 1], pos[row], pos[row])
        torch.testing.assert_close(oq[row : row + 1], rq, rtol=0, atol=0)
        torch.testing.assert_close(ok[row : row + 1], rk, rtol=0, atol=0)
    explicit, _ = rope.rotate(q, q, torch.arange(5), torch.arange(5))
    assert torch.equal(explicit, rope.rotate(q, q)[0])  # explicit arange == default, bit for bit


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


# ----------------------------------------------------------------------------------------------
# Precision, compile, meta device
# ----------------------------------------------------------------------------------------------
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


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    rope = posenc.build("rope", head_dim=16, partial_rotary_factor=0.5, scaling=scaling_for("yarn", 8))
    dyn = posenc.build("rope", head_dim=16, scaling=scaling_for("dynamic", 16, l0=8))
    xpos = posenc.build("xpos", head_dim=16, layout="interleaved")

    def f(q, k, pq, pk):
        return (*rope.rotate(q, k, pq, pk), *dyn.rotate(q, k, pq, pk), *xpos.rotate(q, k))

    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 12, 16), torch.randn(2, 1, 12, 16)
    pq = torch.arange(12)[None].expand(2, -1) + torch.tensor([[0], [5]])
    compiled = torch.compile(f, fullgraph=True)
    for a, b in zip(compiled(q, k, pq, pq), f(q, k, pq, pq)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_meta_device_build_and_materialize():
    with torch.device("meta"):
        m = posenc.build("rope", head_dim=32, scaling=scaling_for("longrope", 32))
        x = posenc.build("xpos", head_dim=32)
        a = posenc.build("rope_2d", head_dim=32, grid=(2, 3))
    assert not list(m.buffers()) and not list(m.parameters())  # nothing to materialize: config only
    m.to_empty(device="cpu")
    q = torch.randn(1, 1, 6, 32)
    ref = posenc.build("rope", head_dim=32, scaling=scaling_for("longrope", 32))
    assert torch.equal(m.rotate(q, q)[0], ref.rotate(q, q)[0])
    for mod in (x, a):
        mq, _ = mod.rotate(q.to("meta"), q.to("meta"))
        assert mq.shape == q.shape and mq.device.type == "meta"


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
        rope.rotate(q, q, None, torch.arange(3.0))
    with pytest.raises(ValueError, match=r"q_positions must have shape \[s\] or \[b, s\] with s = 3"):
        rope.rotate(q, q, torch.arange(4))
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        posenc.rope_cos_sin(torch.arange(3.0), torch.ones(4))


def test_registry_and_flags():
    assert {"rope", "xpos", "rope_2d"} <= set(posenc.schemes())
    assert isinstance(posenc.build("rope", head_dim=8), RotaryEmbedding)
    assert posenc.build("rope", head_dim=8).needs_unrotated_cache is False
    assert posenc.build("rope", head_dim=8, scaling=scaling_for("dynamic", 8)).needs_unrotated_cache is True
    assert posenc.build("rope", head_dim=8, scaling=scaling_for("longrope", 8)).needs_unrotated_cache is True
    ctx = posenc.build_with_context("rope", {"head_dim": 16, "d_model": 64, "num_heads": 4})
    assert ctx.head_dim == 16 and posenc.describe("rope")["hooks"] == ["rotate"]


# ----------------------------------------------------------------------------------------------
# HF config interop
# ----------------------------------------------------------------------------------------------
def test_rope_from_hf_dicts_and_objects():
    old = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
        "rope_theta": 1e4,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    assert posenc.hf_rope_config(old) == {
        "head_dim": 128,
        "base": 1e4,
        "layout": "half",
        "scaling": {"rope_type": "linear", "factor": 2.0},
    }
    llama31 = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    m = posenc.rope_from_hf(llama31)
    cfg = LlamaConfig(**llama31)
    hf_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, None)
    torch.testing.assert_close(m.frequencies()[0].float(), hf_inv, rtol=HF_FREQ_RTOL, atol=0)
    assert posenc.hf_rope_config(cfg) == posenc.hf_rope_config(llama31)  # object == its dict
    # Phi-3 style longrope: the top-level original_max_position_embeddings wins, factor from lengths
    phi = Phi3Config(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "longrope",
            "short_factor": [1.0] * 32,
            "long_factor": [2.0] * 32,
            "rope_theta": 10000.0,
        },
    )
    pm = posenc.rope_from_hf(phi)
    hf_inv, hf_scale = ROPE_INIT_FUNCTIONS["longrope"](phi, None, seq_len=5000)
    inv, scale = pm.frequencies(5000)
    torch.testing.assert_close(inv.float(), hf_inv, rtol=HF_FREQ_RTOL, atol=0)
    assert scale == pytest.approx(hf_scale, rel=1e-12)
    # DeepSeek-style yarn with mscale / mscale_all_dim
    ds = {
        "qk_rope_head_dim": 64,
        "head_dim": 64,
        "max_position_embeddings": 163840,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    }
    dsm = posenc.rope_from_hf({**ds, "qk_rope_head_dim": 32, "rope_interleave": True})
    assert dsm.frequencies()[1] == 1.0  # mscale == mscale_all_dim: DeepSeek moves it into the softmax scale
    assert (dsm.head_dim, dsm.layout) == (32, "interleaved")
    with pytest.raises(ValueError, match="unsupported HF rope_type 'mrope'; posenc supports: default"):
        posenc.rope_from_hf({"head_dim": 64, "rope_parameters": {"rope_type": "mrope"}})
    with pytest.raises(ValueError, match="config needs head_dim, or hidden_size and num_attention_heads"):
        posenc.rope_from_hf({"rope_theta": 1e4})


# ----------------------------------------------------------------------------------------------
# xPos
# ----------------------------------------------------------------------------------------------
def ref_xpos(x, pos, d, sign, layout, base=10000.0, gamma=512.0):
    """Sun et al. 2022: RoPE times zeta_i^(sign * n / gamma), zeta_i = (2i/d + 0.4) / 1.4."""
    i = torch.arange(d // 2, dtype=F64)
    zeta = (2 * i / d + 0.4) / 1.4
    angles = pos.to(F64)[:, None] * base ** (-2 * i / d)
    return ref_rotate(x, angles, layout, scale=zeta ** (sign * pos.to(F64)[:, None] / gamma))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_xpos_matches_paper_reference(layout):
    torch.manual_seed(0)
    xpos = posenc.build("xpos", head_dim=16, layout=layout)
    q, k = torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16)
    pos = torch.arange(1000, 1030)
    oq, ok = xpos.rotate(q, k, pos, pos)
    for x, out, sign in ((q, oq, 1.0), (k, ok, -1.0)):
        ref = ref_xpos(x, pos, 16, sign, layout)
        big = (3.5 ** (1030 / 512)) if sign < 0 else 1.0  # largest xPos scale here: zeta_0^(-m/gamma)
        # float32 angle error, plus float32 rounding of the exponential scale
        torch.testing.assert_close(
            out.double(), ref, rtol=1e-5, atol=angle_tol(1030) * x.abs().max().item() * big
        )


@settings(deadline=None, max_examples=30)
@given(m=st.integers(0, 3000), n=st.integers(0, 3000), t=st.integers(0, 3000), seed=st.integers(0, 2**16))
def test_property_xpos_logit_depends_only_on_distance(m, n, t, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    xpos = posenc.build("xpos", head_dim=16)

    def logit(a, b):
        rq, rk = xpos.rotate(q, k, torch.tensor([a]), torch.tensor([b]))
        return (rq * rk).sum()

    torch.testing.assert_close(logit(m, n), logit(m + t, n + t), rtol=1e-3, atol=1e-4)


def test_xpos_logits_match_rotary_embedding_torch():
    """rotary-embedding-torch re-centres positions on seq_len // 2 each call; logits are the same."""
    ret = pytest.importorskip("rotary_embedding_torch")
    torch.manual_seed(0)
    peer = ret.RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=512)
    ours = posenc.build("xpos", head_dim=16, layout="interleaved")
    q, k = torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)
    pq, pk = peer.rotate_queries_and_keys(q, k)
    oq, ok = ours.rotate(q, k)
    torch.testing.assert_close(oq @ ok.mT, pq @ pk.mT, rtol=1e-4, atol=1e-4)


def test_xpos_refuses_positions_that_overflow():
    xpos = posenc.build("xpos", head_dim=16)
    limit = xpos.max_position(torch.float16)
    q = torch.randn(1, 1, 1, 16, dtype=torch.float16)
    xpos.rotate(q, q, torch.tensor([limit]), torch.tensor([limit]))
    with pytest.raises(
        ValueError, match=r"k_positions reach 5000 but xPos scales .* torch.float16 past \|m\| = 3966"
    ):
        xpos.rotate(q, q, torch.tensor([10]), torch.tensor([5000]))
    # |ln zeta_0| = ln(1.4 / 0.4); fp16 underflows below 2^-14, float32 overflows above ~2^128
    assert limit == int(512 * 14 * math.log(2) / math.log(3.5)) == 3966
    f32 = torch.finfo(torch.float32)
    assert xpos.max_position(torch.float32) == int(
        512 * min(math.log(f32.max), -math.log(f32.tiny)) / math.log(3.5)
    )


# ----------------------------------------------------------------------------------------------
# Axial 2D RoPE
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_2d_matches_axial_reference(layout):
    torch.manual_seed(0)
    d, rows, cols = 16, 3, 4
    m = posenc.build("rope_2d", head_dim=d, grid=(rows, cols), layout=layout)
    q = torch.randn(2, 2, rows * cols, d)
    oq, _ = m.rotate(q, q)
    # Heo et al. 2024 (axial): pairs 0..r/4-1 turn with the row, r/4..r/2-1 with the column
    coords = torch.tensor([(y, x) for y in range(rows) for x in range(cols)])
    inv = 10000.0 ** (-torch.arange(0, d // 2, 2, dtype=F64) / (d // 2))
    angles = torch.cat((coords[:, :1] * inv, coords[:, 1:] * inv), dim=-1)
    torch.testing.assert_close(oq.double(), ref_rotate(q, angles, layout), rtol=1e-5, atol=1e-5)
    explicit, _ = m.rotate(q, q, coords, coords[None].expand(2, -1, -1))
    torch.testing.assert_close(explicit, oq, rtol=0, atol=0)


@settings(deadline=None, max_examples=30)
@given(
    a=st.tuples(st.integers(0, 500), st.integers(0, 500)),
    b=st.tuples(st.integers(0, 500), st.integers(0, 500)),
    t=st.tuples(st.integers(-200, 200), st.integers(-200, 200)),
    seed=st.integers(0, 2**16),
)
def test_property_rope_2d_relative_per_axis(a, b, t, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 16, dtype=F64, generator=g), torch.randn(1, 1, 1, 16, dtype=F64, generator=g)
    m = posenc.build("rope_2d", head_dim=16)

    def logit(p, r):
        rq, rk = m.rotate(q, k, torch.tensor([p]), torch.tensor([r]))
        return (rq * rk).sum()

    shifted = logit((a[0] + t[0], a[1] + t[1]), (b[0] + t[0], b[1] + t[1]))
    torch.testing.assert_close(logit(a, b), shifted, rtol=1e-4, atol=1e-4)


def test_rope_2d_errors():
    with pytest.raises(ValueError, match="rotary_dim must be a multiple of 4, got 6"):
        posenc.build("rope_2d", head_dim=6)
    m = posenc.build("rope_2d", head_dim=8)
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"q_positions is None .* build rope_2d with grid=\(rows, cols\)"):
        m.rotate(q, q)
    with pytest.raises(ValueError, match=r"k_positions must have shape \[s, 2\] or \[b, s, 2\] with s = 4"):
        m.rotate(q, q, torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"grid must be a \(rows, cols\) pair"):
        posenc.build("rope_2d", head_dim=8, grid=4)


def test_classes_are_exported():
    assert posenc.RotaryEmbedding is RotaryEmbedding and posenc.XPos is XPos and posenc.Rope2D is Rope2D


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


# ----------------------------------------------------------------------------------------------
# qk_layout: [b, h, s, d_h] and [b, s, h, d_h] give the same rotation
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: RotaryEmbedding(64), lambda: XPos(64), lambda: RotaryEmbedding(
    64, layout="interleaved", partial_rotary_factor=0.5,
    scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32})])  # fmt: skip
@pytest.mark.parametrize("per_row", [False, True])
def test_bshd_equals_bhsd_transposed(make, per_row):
    rope = make()
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 100, 64), torch.randn(2, 2, 100, 64)  # GQA: h_kv = 2
    pos = torch.randint(0, 90, (2, 100)) if per_row else torch.arange(7, 107)
    ref_q, ref_k = rope.rotate(q, k, pos, pos)
    for qs, ks in ((q.transpose(1, 2), k.transpose(1, 2)),  # views
                   (q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous())):  # fmt: skip
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
