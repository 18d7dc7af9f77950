"""Tests of posenc.model.layers: a scheme per layer (patterns, sharing, validation) and Llama 4's
positions (RoPE in three layers of four, none with a query temperature in the fourth) equal to
Hugging Face's ``Llama4TextAttention`` on a tiny random config (no downloads); the model invariants
with a pattern."""

from __future__ import annotations

import pytest
import torch

import posenc
from _scheme_invariants import check_all, check_compiled, tiny_lm
from posenc.model import ModelConfig, TransformerLM
from posenc.model.attention import MultiHeadAttention
from posenc.model.layers import layer_scheme_names, llama4_layers, parse_layer_pattern
from posenc.model.plan import plan_attention


def llama4(floor_scale: int = 4):
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    from transformers import Llama4TextConfig
    from transformers.models.llama4 import modeling_llama4 as hf

    cfg = Llama4TextConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=4,
        intermediate_size=32,
        intermediate_size_mlp=32,
        vocab_size=32,
        use_qk_norm=False,
        attn_temperature_tuning=True,
        floor_scale=floor_scale,
        attn_scale=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    cfg._attn_implementation = "eager"
    return cfg, hf


def test_llama4_text_attention_per_layer():
    """Each layer of a tiny Llama 4 (layers 0-2 RoPE, layer 3 no positions with the temperature at
    floor_scale 4, so positions 3.. are scaled): posenc's attention with the same weights and the
    scheme llama4_layers gives that layer equals HF's Llama4TextAttention."""
    cfg, hf = llama4()
    fields = llama4_layers(cfg)
    assert fields["layer_positions"] == ["rope", "rope", "rope", "nope_temperature"]
    ours_cfg = ModelConfig(
        vocab_size=32, d_model=64, num_heads=4, num_kv_heads=2, num_layers=4, position="nope", **fields
    )
    model = TransformerLM(ours_cfg).eval()
    rotary = hf.Llama4TextRotaryEmbedding(cfg)
    torch.manual_seed(0)
    b, s = 2, 13
    x = torch.randn(b, s, 64)
    pos = torch.arange(s)[None].expand(b, s)
    mask = torch.full((s, s), float("-inf")).triu(1)[None, None].expand(b, 1, s, s)
    for layer in range(4):
        theirs = hf.Llama4TextAttention(cfg, layer).eval()
        ours = MultiHeadAttention(ours_cfg).eval()
        ours.load_state_dict(theirs.state_dict())
        with torch.no_grad():
            want, _ = theirs(x, rotary(x, pos), mask)
            got = ours(x, plan_attention(b, s, x.device, causal=True), model.decoder.scheme(layer))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"layer {layer}")
    # the temperature changed layer 3 (a scheme that ignored it would differ from HF)
    plain = MultiHeadAttention(ours_cfg).eval()
    plain.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        assert not torch.allclose(plain(x, plan_attention(b, s, x.device, causal=True), None), want)


def perturb(scheme) -> None:
    pass  # rope and the temperature have no parameters


def test_pattern_model_invariants_compile_and_float64():
    fields = {
        "layer_positions": "rope,nope_temperature",
        "layer_position_options": {"nope_temperature": {"floor_scale": 2.0}},
    }
    check_all("nope", perturb, **fields)
    check_compiled(tiny_lm("nope", perturb, **fields))
    check_compiled(tiny_lm("alibi", perturb, layer_positions=["alibi", "nope"]))


def test_patterns_sharing_and_saving(tmp_path):
    assert parse_layer_pattern("rope*3, nope_temperature") == ["rope"] * 3 + ["nope_temperature"]
    assert parse_layer_pattern("rope*2+alibi") == ["rope", "rope", "alibi"]
    cfg = ModelConfig(
        vocab_size=11, d_model=32, num_heads=4, num_layers=5, position="t5", layer_positions=["t5", "rope"]
    )
    assert layer_scheme_names(cfg) == ["t5", "rope", "t5", "rope", "t5"]
    model = TransformerLM(cfg)
    assert len(model.decoder.schemes) == 2 and model.decoder.scheme(0) is model.decoder.scheme(4)
    apart = TransformerLM(ModelConfig(**{**cfg.to_dict(), "share_position": False}))
    assert len(apart.decoder.schemes) == 5
    model.save_pretrained(tmp_path / "m")
    loaded = TransformerLM.from_pretrained(tmp_path / "m")
    ids = torch.randint(0, 11, (1, 6))
    assert loaded.config.layer_positions == ["t5", "rope"]
    assert torch.equal(loaded.eval()(ids).logits, model.eval()(ids).logits)


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"layer_positions": ["rope", "sinusoidal"]}, ValueError, "adds to the input embeddings"),
        ({"layer_positions": ["rope_2d"]}, ValueError, "encodes grids"),
        ({"layer_positions": ["ropee"]}, ValueError, "did you mean 'rope'"),
        ({"layer_positions": "rope*x"}, ValueError, "whole repeat count"),
        ({"layer_positions": "rope*0"}, ValueError, "repeat count of 'rope'"),
        ({"layer_positions": "rope*99999"}, ValueError, "more than 4096 layers"),
        ({"layer_positions": "rope,,nope"}, ValueError, "empty entry"),
        ({"layer_positions": []}, TypeError, "non-empty list"),
        (
            {"layer_positions": ["rope"], "layer_position_options": {"alibi": {}}},
            ValueError,
            "not in layer_positions",
        ),
        (
            {"layer_positions": ["rope"], "layer_position_options": {"rope": {"bass": 1}}},
            ValueError,
            "keys \\['bass'\\]",
        ),
        ({"layer_position_options": {"rope": {}}}, ValueError, "set both or neither"),
        ({"layer_positions": ["rope"], "layer_position_options": {"rope": 3}}, TypeError, "dict"),
    ],
)
def test_bad_patterns_raise_clearly(fields, error, match):
    with pytest.raises(error, match=match):
        ModelConfig(vocab_size=11, d_model=32, num_heads=4, position="nope", **fields)


def test_pattern_forms_are_checked_per_stack():
    cfg = ModelConfig(vocab_size=11, d_model=32, num_heads=4, position="nope", layer_positions=["cope"])
    with pytest.raises(ValueError, match="'cope' has no bidirectional form"):
        posenc.Encoder(cfg)
    assert TransformerLM(cfg)(torch.zeros(1, 3, dtype=torch.long)).logits.shape == (1, 3, 11)
