"""Tests of posenc.model.saving: save_model / load_model round trips (every model class, ties kept,
bit-identical outputs), and the choice between the single-file and the folder form."""

from __future__ import annotations

import pytest
import torch

from _model_helpers import config, ids_
from _model_toys import register_toys
from posenc.model import Decoder, EncoderDecoder, ModelConfig, TransformerLM, load_model, save_model


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TransformerLM(config("toy_content", share_position=False)),
        lambda: TransformerLM(config("scaled_sinusoidal", tie="none", memory_len=0)),
        lambda: EncoderDecoder(config("learned", tie="three_way")),
        lambda: Decoder(config("toy_alibi")),
    ],
)
def test_save_load_round_trip_gives_identical_outputs(tmp_path, make):
    torch.manual_seed(0)
    model = make().eval()
    path = tmp_path / "model.safetensors"
    save_model(model, path)
    loaded = load_model(path)
    assert type(loaded) is type(model) and loaded.config == model.config
    src, tgt = ids_(2, 6), ids_(2, 4, seed=2)
    with torch.no_grad():
        if isinstance(model, EncoderDecoder):
            a, b = model(src, tgt), loaded(src, tgt)
            assert loaded.lm_head.weight is loaded.encoder.embed.token.weight  # ties survive
        elif isinstance(model, Decoder):
            ctx = torch.randn(2, 3, 32)
            a, b = model(tgt, ctx)[0], loaded(tgt, ctx)[0]
        else:
            a, b = model(src).logits, loaded(src).logits
    assert torch.equal(a, b)
    for (name, p), (_, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(p, q), name


def test_save_model_into_a_folder_and_load_model_from_it(tmp_path):
    lm = TransformerLM(ModelConfig(vocab_size=40, d_model=16, num_layers=2, num_heads=2)).eval()
    save_model(lm, tmp_path)  # an existing folder: the folder form, not "Is a directory"
    save_model(lm, str(tmp_path / "new") + "/")  # a trailing separator: a new folder
    save_model(lm, tmp_path / "one.safetensors")  # the single-file form is kept
    ids = torch.randint(0, 40, (1, 6))
    for path in (tmp_path, tmp_path / "new", tmp_path / "one.safetensors"):
        assert torch.equal(load_model(path)(ids).logits, lm(ids).logits)
