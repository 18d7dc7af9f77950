"""Tests of posenc.model.mlp: the plain and gated MLPs against Hugging Face's own layers (LlamaMLP's
SwiGLU, GemmaMLP's tanh GeGLU, GPT-NeoX's GELU MLP) with the same weights."""

from __future__ import annotations

import pytest
import torch

from posenc.model import ModelConfig
from posenc.model.config import ACTIVATION_NAMES
from posenc.model.mlp import ACTIVATIONS, MLP

transformers = pytest.importorskip("transformers")


def _config(**kw) -> ModelConfig:
    return ModelConfig(vocab_size=5, d_model=16, num_heads=2, d_ff=24, **kw)


def _copy(dst: torch.nn.Linear, src: torch.nn.Linear) -> None:
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if src.bias is not None:
            dst.bias.copy_(src.bias)


def test_every_activation_name_has_a_function():
    assert set(ACTIVATIONS) == set(ACTIVATION_NAMES)


@pytest.mark.parametrize("mlp_bias", [False, True])
def test_swiglu_equals_llama_mlp(mlp_bias):
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    hf_config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=24, num_attention_heads=2, mlp_bias=mlp_bias
    )
    ref = LlamaMLP(hf_config)
    ours = MLP(_config(activation="silu", gated_mlp=True, mlp_bias=mlp_bias))
    for a, b in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
        _copy(getattr(ours, a), getattr(ref, b))
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)


def test_geglu_equals_gemma_mlp():
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    torch.manual_seed(0)
    ref = GemmaMLP(
        transformers.GemmaConfig(
            hidden_size=16, intermediate_size=24, num_attention_heads=2, hidden_act="gelu_pytorch_tanh"
        )
    )
    ours = MLP(_config(activation="gelu_tanh", gated_mlp=True))
    for a, b in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
        _copy(getattr(ours, a), getattr(ref, b))
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)


def test_plain_gelu_mlp_equals_gpt_neox_mlp():
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXMLP

    torch.manual_seed(0)
    ref = GPTNeoXMLP(
        transformers.GPTNeoXConfig(
            hidden_size=16, intermediate_size=24, num_attention_heads=2, hidden_act="gelu"
        )
    )
    ours = MLP(_config(bias=True))
    assert ours.gate is None
    _copy(ours.up, ref.dense_h_to_4h)
    _copy(ours.down, ref.dense_4h_to_h)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)


def test_biases_follow_mlp_bias_then_bias():
    assert MLP(_config(bias=True)).up.bias is not None
    assert MLP(_config(bias=True, mlp_bias=False)).up.bias is None
    assert MLP(_config(mlp_bias=True, gated_mlp=True)).gate.bias is not None
