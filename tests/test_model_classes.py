"""Tests of posenc.model.classes: MODEL_CLASSES names the four model classes a saved file can hold,
and a class decorated with register_model is saved and loaded by its name (and refused once gone)."""

from __future__ import annotations

import pytest
import torch

import posenc.model
from posenc.model import Decoder, Encoder, EncoderDecoder, ModelConfig, TransformerLM, load_model, save_model
from posenc.model.classes import MODEL_CLASSES, register_model


def test_the_four_model_classes_are_registered_by_name():
    assert {
        "TransformerLM": TransformerLM,
        "EncoderDecoder": EncoderDecoder,
        "Encoder": Encoder,
        "Decoder": Decoder,
    } == MODEL_CLASSES
    assert posenc.model.MODEL_CLASSES is MODEL_CLASSES  # one registry, the one the loaders read


def test_a_decorated_class_is_loadable_by_name(tmp_path):
    class TinyLM(TransformerLM):
        """A model class only this test knows."""

    model = TinyLM(ModelConfig(vocab_size=11, d_model=16, num_layers=1, num_heads=2)).eval()
    path = tmp_path / "tiny"
    try:
        assert register_model(TinyLM) is TinyLM  # a class decorator: the class itself comes back
        assert MODEL_CLASSES["TinyLM"] is TinyLM
        save_model(model, path)
        loaded = load_model(path)
        assert type(loaded) is TinyLM and loaded.config == model.config
        ids = torch.randint(0, 11, (1, 5))
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    finally:
        MODEL_CLASSES.pop("TinyLM", None)
    with pytest.raises(TypeError, match=r"save_model takes one of .*TransformerLM.*, got TinyLM"):
        save_model(model, tmp_path / "again")
    with pytest.raises(ValueError, match=r"unknown model class 'TinyLM'; known: .*TransformerLM"):
        load_model(path)
