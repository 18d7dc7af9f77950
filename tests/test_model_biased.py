"""Tests of posenc.model.biased: the model's check for attention that applies its bias itself
holds inside a compiled graph."""

from __future__ import annotations

import pytest
import torch

from posenc.model import ModelConfig, TransformerLM
from posenc.model.biased import BiasedAttention
from posenc.model.blocked import BlockedAttention
from posenc.model.flex import FlexBiasedAttention


def test_both_paths_are_biased_attention():
    assert issubclass(BlockedAttention, BiasedAttention) and issubclass(FlexBiasedAttention, BiasedAttention)
    with pytest.raises(TypeError):
        BiasedAttention()  # the interface alone cannot attend


@pytest.mark.parametrize("position", ["transformer_xl", "alibi", "fire"])
def test_a_model_with_a_score_bias_compiles_in_one_graph(position):
    """``isinstance(bias, BiasedAttention)`` runs in the traced forward pass: TorchDynamo answers it
    for a class (a protocol with data members raised inside the graph); the numbers are eager's."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=13, d_model=16, num_layers=1, num_heads=2, position=position, max_len=32)
    model = TransformerLM(config).eval()
    ids = torch.randint(0, 13, (2, 11))
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True, backend="eager")(ids).logits
        want = model(ids).logits
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
