"""Tests of posenc.model.norms: RMSNorm against its formula and Hugging Face's LlamaRMSNorm (float32
to rounding, bf16 bit for bit), and make_norm's choice by the config."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posenc.model import ModelConfig
from posenc.model.norms import RMSNorm, make_norm


def test_rmsnorm_is_its_formula_in_float64():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    norm = RMSNorm(8, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    want = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_equals_llama_rmsnorm(dtype):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    torch.manual_seed(0)
    ref = llama.LlamaRMSNorm(16, eps=1e-6).to(dtype)
    ours = RMSNorm(16, eps=1e-6).to(dtype)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ours.weight.copy_(ref.weight)
    x = (torch.randn(3, 7, 16) * 3).to(dtype)
    assert torch.equal(ours(x), ref(x))  # the same operations in the same order: the same bits


def test_rmsnorm_errors():
    with pytest.raises(ValueError, match="last dim must be 8"):
        RMSNorm(8)(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        RMSNorm(8, eps=0.0)
    with pytest.raises(TypeError, match="dim must be an int"):
        RMSNorm(8.0)


def test_make_norm_follows_the_config():
    layer = make_norm(ModelConfig(vocab_size=5, d_model=8, num_heads=2))
    assert type(layer) is nn.LayerNorm and layer.eps == 1e-5
    rms = make_norm(ModelConfig(vocab_size=5, d_model=8, num_heads=2, norm_type="rmsnorm", norm_eps=1e-6), 4)
    assert isinstance(rms, RMSNorm) and rms.eps == 1e-6 and rms.weight.shape == (4,)
