"""Tests of posenc.model.pretrained: save_pretrained / from_pretrained on the model classes (the
save_model folder, with tokenizer.json beside it when a tokenizer is given)."""

from __future__ import annotations

import json

import pytest
import torch

import posenc
from posenc.model import Decoder, EncoderDecoder, ModelConfig, TransformerLM, load_model


def _config(**kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 40, "d_model": 16, "num_layers": 2, "num_heads": 2, **kw})


@pytest.mark.parametrize(
    "make",
    [
        lambda: TransformerLM(_config(position="t5")),
        lambda: EncoderDecoder(_config(tie="three_way")),
        lambda: Decoder(_config(position="alibi"), cross_attention=False),
    ],
)
def test_round_trip_is_bit_exact_and_keeps_ties(make, tmp_path):
    torch.manual_seed(0)
    model = make().eval()
    folder = model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    saved = json.loads((folder / "config.json").read_text())
    assert saved["posenc_model"] == type(model).__name__ and saved["config"] == model.config.to_dict()
    loaded = type(model).from_pretrained(folder)
    assert not loaded.training and loaded.config == model.config
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    if isinstance(model, EncoderDecoder):
        assert loaded.lm_head.weight is loaded.encoder.embed.token.weight
    if isinstance(model, Decoder):
        assert loaded.cross_attention is False
    assert type(load_model(folder)) is type(model)  # the same folder as save_model's


def test_dtype_is_kept_or_chosen(tmp_path):
    lm = TransformerLM(_config(), dtype=torch.bfloat16).eval()
    lm.save_pretrained(tmp_path)
    loaded = TransformerLM.from_pretrained(tmp_path)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    wide = posenc.load_model(tmp_path, dtype=torch.float32)
    assert {p.dtype for p in wide.parameters()} == {torch.float32}
    assert wide.lm_head.weight is wide.decoder.embed.token.weight


def test_tokenizer_is_saved_next_to_the_model(tmp_path):
    text = pytest.importorskip("posenc.text")
    pytest.importorskip("tokenizers")
    tok = text.build_tokenizer("wordpiece", ["the cat sat on the mat"] * 20, vocab_size=40)
    lm = TransformerLM(_config(vocab_size=tok.vocab_size))
    lm.save_pretrained(tmp_path, tokenizer=tok)
    assert (tmp_path / "tokenizer.json").is_file()
    assert text.load_tokenizer(tmp_path).encode("the cat").ids == tok.encode("the cat").ids


def test_errors_name_the_folder_and_the_fix(tmp_path):
    lm = TransformerLM(_config())
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; give a folder path"):
        lm.save_pretrained(tmp_path / "file")
    with pytest.raises(ValueError, match=r"needs config\.json and model\.safetensors"):
        TransformerLM.from_pretrained(tmp_path)
    lm.save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match="holds a TransformerLM, not a EncoderDecoder"):
        EncoderDecoder.from_pretrained(tmp_path / "lm")
    with pytest.raises(TypeError, match="save_model takes one of"):
        posenc.model.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")
    with pytest.raises(TypeError, match=r"tokenizer must be a posenc\.text\.Tokenizer"):
        lm.save_pretrained(tmp_path / "y", tokenizer="bert")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_save_pretrained_never_writes_through_a_symlink(tmp_path):
    from posenc.text import build_tokenizer

    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    folder = TransformerLM(_config()).save_pretrained(tmp_path / "m")
    for name in ("tokenizer.json", "model.safetensors"):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(outside)
    tok = build_tokenizer("byte")
    TransformerLM(_config()).save_pretrained(folder, tokenizer=tok)
    assert outside.read_text() == "not yours"
    assert not any(p.is_symlink() for p in folder.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
