"""Tests of posenc.rotary.hf: hf_rope_config / rope_from_hf against Hugging Face transformers
(``ROPE_INIT_FUNCTIONS``, the GPT-NeoX / Llama ``apply_rotary_pos_emb``, GPT-J's ``rotate_every_two``
form, Phi-3 longrope, DeepSeek yarn), and permute_qk_weights against HF's
convert_llama_weights_to_hf permute. Tests that compare with HF skip when transformers is missing.
"""

from __future__ import annotations

import pytest
import torch

import posenc
from _rotary_refs import F64, angle_tol, scaling_for
from posenc.rotary import ROPE_SCALINGS

#: HF computes inv_freq in float32 (a pow, then up to ~4 more roundings for llama3/yarn blends);
#: posenc in float64, rounded once. They agree to a few float32 ulps.
HF_FREQ_RTOL = 4 * 2.0**-23


def hf_config(rule: str, head_dim: int, base: float, factor: float, partial: float):
    from transformers import GPTNeoXConfig

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
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.gpt_neox import modeling_gpt_neox as hf_neox

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
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

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
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as hf_llama

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
        oq = posenc.apply_rotary(q, c[:, None], s[:, None], compute_dtype="input")  # HF's roundings
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
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as hf_llama

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
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers import GPTJConfig
    from transformers.models.gptj import modeling_gptj as hf_gptj

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


def test_rope_from_hf_dicts_and_objects():
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers import LlamaConfig, Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

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


def test_every_hf_rope_type_is_known():
    """Fails when the installed transformers has a rope type posenc does not know: add the rule to
    ROPE_SCALINGS (with its float64 reference and an HF parity test) before claiming every rope type."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    missing = sorted(set(ROPE_INIT_FUNCTIONS) - set(ROPE_SCALINGS))
    assert not missing, f"transformers {transformers.__version__} has rope types posenc lacks: {missing}"


def test_proportional_equals_gemma4_rotary():
    """Gemma 4's full-attention layers (rope_type "proportional", a quarter of the pairs turning over
    the whole head): rope_from_hf rotates as Gemma4TextRotaryEmbedding + apply_rotary_pos_emb, bit for
    bit through posenc's ops with HF's inv_freq, and within float32 angle rounding with posenc's own;
    the pairs that do not turn pass unchanged."""
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4 import modeling_gemma4 as hf_gemma4

    cfg = Gemma4TextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        num_hidden_layers=2,
        intermediate_size=32,
        vocab_size=32,
        vocab_size_per_layer_input=32,
        hidden_size_per_layer_input=8,
    )
    full = cfg.rope_parameters["full_attention"]
    assert full["rope_type"] == "proportional"
    ours = posenc.rope_from_hf({"head_dim": 64, "rope_parameters": full})
    assert (ours.rotary_dim, ours.scaling_rule) == (64, "proportional")
    hf = hf_gemma4.Gemma4TextRotaryEmbedding(cfg)
    torch.testing.assert_close(
        ours.frequencies()[0].float(), hf.full_attention_inv_freq, rtol=HF_FREQ_RTOL, atol=0
    )
    torch.manual_seed(0)
    s = 3000
    pos = torch.arange(s)[None]  # [1, s]
    q = torch.randn(1, 2, s, 64)
    cos, sin = hf(q, pos, "full_attention")
    hq = hf_gemma4.apply_rotary_pos_emb(q, cos, sin)
    c, sn = posenc.rope_cos_sin(pos, hf.full_attention_inv_freq)
    assert torch.equal(posenc.apply_rotary(q, c[:, None], sn[:, None]), hq)  # HF's frequencies: HF's bits
    oq, _ = ours.rotate(q, q, pos, pos)
    torch.testing.assert_close(oq, hq, rtol=0, atol=angle_tol(s) * 2 * q.abs().max().item())
    turning = int(0.25 * 64 // 2)  # 8 of 32 pairs turn: dims 0..7 and 32..39
    still = torch.cat((torch.arange(turning, 32), torch.arange(32 + turning, 64)))
    assert torch.equal(oq[..., still], q[..., still])


def test_proportional_from_a_config_with_factor_and_by_name():
    """A proportional config with a factor (HF divides every frequency by it), through rope_from_hf,
    equals HF's ROPE_INIT_FUNCTIONS, and posenc.build("rope", scaling=...) is the same module."""
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 4.0, "rope_theta": 1e6}
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, head_dim=128, rope_parameters=params)
    hf_inv, hf_scale = ROPE_INIT_FUNCTIONS["proportional"](cfg, None)
    ours = posenc.rope_from_hf(cfg)
    inv, scale = ours.frequencies()
    torch.testing.assert_close(inv.float(), hf_inv, rtol=HF_FREQ_RTOL, atol=0)
    assert scale == hf_scale == 1.0
    assert int((inv > 0).sum()) == 32  # 0.5 * 128 // 2 pairs turn
    by_name = posenc.build(
        "rope",
        head_dim=128,
        base=1e6,
        scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 4.0},
    )
    assert torch.equal(by_name.frequencies()[0], inv)
    # no fraction in the config: HF's default 1.0 (every pair turns, each frequency / factor)
    no_fraction = {"rope_type": "proportional", "factor": 2.0}
    whole = posenc.rope_from_hf({"head_dim": 64, "rope_parameters": no_fraction})
    assert whole.scaling_params["partial_rotary_factor"] == 1.0 and bool((whole.frequencies()[0] > 0).all())
