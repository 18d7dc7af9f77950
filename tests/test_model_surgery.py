"""Tests of posenc.model.surgery: a converted Llama given a RoPE scaling computes what transformers'
own rope type computes on the same weights, and the result saves in both formats."""

from __future__ import annotations

import pytest
import torch

from _hf_families import V, hf_model
from posenc.model import ModelConfig, TransformerLM, from_pretrained
from posenc.model.hf import from_transformers, save_transformers
from posenc.model.surgery import with_position

transformers = pytest.importorskip("transformers")

ATOL = 1e-5  # float32 rounding through two layers (see test_model_hf)

SCALINGS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("rule", list(SCALINGS))
def test_rope_scaling_surgery_equals_transformers_rope_type(rule, tmp_path):
    hf = hf_model("llama")  # default RoPE, trained length 2048 in its config; we say 16
    scaling = SCALINGS[rule]
    model = with_position(from_transformers(hf), {"scaling": scaling}, max_len=64)
    assert model.config.position_options["scaling"] == scaling and model.config.max_len == 64
    # transformers' own implementation: the same weights under a config with that rope type
    params = {"rope_theta": 10000.0, **{k: v for k, v in scaling.items()}}
    max_pos = 16 if rule == "dynamic" else 64  # its dynamic rule grows past max_position_embeddings
    config = hf.config.to_dict() | {"rope_parameters": params, "max_position_embeddings": max_pos}
    ref = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**config)).eval()
    ref.load_state_dict(hf.state_dict())
    ids = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits
        torch.testing.assert_close(model(ids).logits, want, atol=ATOL, rtol=0)
        assert not torch.allclose(from_transformers(hf)(ids).logits, want, atol=1e-3)  # the surgery mattered
        model.save_pretrained(tmp_path / "posenc")
        torch.testing.assert_close(from_pretrained(tmp_path / "posenc")(ids).logits, want, atol=ATOL, rtol=0)
        save_transformers(model, tmp_path / "hf")
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(reloaded(ids).logits, want, atol=ATOL, rtol=0)


def test_surgery_keeps_the_original_and_its_mode():
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=V, d_model=32, num_heads=4, num_layers=1)).train()
    before = model.config.position_options
    new = with_position(model, {"base": 500.0})
    assert model.config.position_options is before and before == {}
    assert new.training and new.decoder.scheme(0).base == 500.0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), new.parameters()))
    alibi = with_position(model, position="alibi")
    assert alibi.config.position == "alibi" and alibi.config.position_options == {}


def test_surgery_errors():
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=V, d_model=32, num_heads=4, num_layers=1))
    with pytest.raises(ValueError, match="changes the trained positional parameters"):
        with_position(model, position="learned", max_len=16)
    learned = TransformerLM(
        ModelConfig(vocab_size=V, d_model=32, num_heads=4, num_layers=1, position="learned", max_len=16)
    )
    with pytest.raises(ValueError, match="keep the sizes of trained tables"):
        with_position(learned, max_len=32)
    with pytest.raises(ValueError, match="unknown position_options"):
        with_position(model, {"scalin": None})
    with pytest.raises(TypeError, match="position_options must be a dict"):
        with_position(model, "yarn")
    with pytest.raises(TypeError, match="TransformerLM"):
        with_position(torch.nn.Linear(2, 2))
