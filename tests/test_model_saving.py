"""Tests of posenc.model.saving: the model folder (config.json + model.safetensors) round trips
for every model class (ties kept, bit-identical outputs); save_model never writes over what is not
a posenc model (a .safetensors name, a file, a folder of other files, a training checkpoint, a
place it cannot write); load_model refuses broken folders with one line naming the file."""

from __future__ import annotations

import json
import os

import pytest
import torch

from _model_helpers import V, config, ids_
from _model_toys import register_toys
from posenc.model import Decoder, EncoderDecoder, ModelConfig, TransformerLM, load_model, save_model


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


def _lm(**kw) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(
        ModelConfig(
            **{"vocab_size": 40, "d_model": 16, "num_layers": 1, "num_heads": 2, "position": "alibi", **kw}
        )
    ).eval()


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
    folder = save_model(model, tmp_path / "model")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    saved = json.loads((folder / "config.json").read_text())
    assert saved["posenc_format"] == 2 and saved["posenc_model"] == type(model).__name__
    loaded = load_model(folder)
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
    assert type(load_model(folder / "model.safetensors")) is type(model)  # its weights: the folder


def test_a_safetensors_name_is_refused_with_the_folder_to_give(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"save_model writes a folder .* names a \.safetensors file; give a "
        r"folder path, e\.g\. '.*/lm'",
    ):
        save_model(_lm(), tmp_path / "lm.safetensors")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_save_model_never_writes_over_what_is_not_a_posenc_model(tmp_path):
    lm = _lm()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    (theirs / "config.json").write_text('{"model_type": "llama"}')  # a Hugging Face folder, say
    with pytest.raises(
        ValueError, match=r"holds files that are not a posenc model \(config\.json, notes\.txt\)"
    ):
        save_model(lm, theirs)
    assert (theirs / "config.json").read_text() == '{"model_type": "llama"}'
    assert sorted(p.name for p in theirs.iterdir()) == ["config.json", "notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"save_model writes a folder, but .*file' is a file"):
        save_model(lm, tmp_path / "file")
    with pytest.raises(ValueError, match=r"'.*file' is a file, not a folder"):
        save_model(lm, tmp_path / "file" / "lm")
    assert (tmp_path / "file").read_text() == "x"
    with pytest.raises(TypeError, match=r"save_model takes one of .*TransformerLM.*, got Linear"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_posenc_folder_is_saved_again_keeping_other_files(tmp_path):
    folder = save_model(_lm(), tmp_path / "lm")
    (folder / "notes.txt").write_text("mine")
    other = _lm(position="rope")
    save_model(other, folder)  # a posenc model folder: its config.json and weights are replaced
    assert load_model(folder).config.position == "rope" and (folder / "notes.txt").read_text() == "mine"
    (folder / "trainer.safetensors").write_bytes(b"state")
    with pytest.raises(ValueError, match=r"holds a training checkpoint .*give another folder"):
        save_model(_lm(), folder)
    assert load_model(folder).config.position == "rope"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert save_model(_lm(), empty) == empty and load_model(empty).config.position == "alibi"


def test_a_read_only_folder_is_a_clear_error(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # root may write anyway: the folder answers as it does to other users
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(locked) else real(p, mode))
    try:
        with pytest.raises(ValueError, match=r"cannot save a model at .*locked.*is not writable"):
            save_model(_lm(), locked / "lm")
    finally:
        locked.chmod(0o700)
    assert list(locked.iterdir()) == []


def test_a_symlinked_config_json_is_not_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").symlink_to(outside)
    with pytest.raises(ValueError, match="holds files that are not a posenc model"):
        save_model(_lm(), folder)
    good = save_model(_lm(), tmp_path / "good")
    (good / "model.safetensors").unlink()
    (good / "model.safetensors").symlink_to(outside)
    save_model(_lm(), good)  # the link is replaced, not written through
    assert outside.read_text() == "not yours" and not (good / "model.safetensors").is_symlink()


def _tampered(tmp_path, change) -> str:
    """A rope model's folder, its config.json changed by ``change(saved)``."""
    folder = save_model(_lm(position="rope"), tmp_path / "m")
    saved = json.loads((folder / "config.json").read_text())
    change(saved)
    (folder / "config.json").write_text(json.dumps(saved))
    return str(folder)


@pytest.mark.parametrize("scheme", ["nope", "alibi"])
def test_a_config_json_that_does_not_describe_the_weights_is_refused(tmp_path, scheme):
    """RoPE weights under a config.json saying nope or alibi have the same shapes: the weights
    file's own record of its config is the check."""
    folder = _tampered(tmp_path, lambda s: s["config"].update(position=scheme))
    with pytest.raises(ValueError, match=f"does not describe the weights .*position: '{scheme}' vs 'rope'"):
        load_model(folder)


_DEEP = json.loads("[" * 40 + "]" * 40)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s["config"].update(d_model=10**12 + 1), "field 'config': num_heads=2 does not divide"),
        (lambda s: s["config"].update(d_model="16"), "field 'config': d_model must be an int, got str"),
        (lambda s: s.update(config=[1, 2]), "field 'config' must be a JSON object of ModelConfig fields"),
        (lambda s: s.update(posenc_model=["TransformerLM"]), "names an unknown model class"),
        (lambda s: s.pop("config"), "is not a posenc config.json: it needs 'posenc_model' and 'config'"),
        (lambda s: s.update(cross_attention="yes"), "'cross_attention' must be a bool, got 'yes'"),
        (lambda s: s.update(posenc_format="two"), "'posenc_format' must be a whole number >= 1, got 'two'"),
        (lambda s: s.update(posenc_format=3), "is format 3, written by a newer posenc .*upgrade posenc"),
        (lambda s: s["config"]["position_options"].update(x=_DEEP), "more than 32 deep"),
    ],
)
def test_a_config_json_with_wrong_types_is_a_one_line_error_naming_the_file_and_field(
    tmp_path, change, match
):
    folder = _tampered(tmp_path, change)
    with pytest.raises(ValueError, match=match) as err:
        load_model(folder)
    assert "config.json" in str(err.value) and "\n" not in str(err.value)


def test_broken_folders_are_errors_naming_the_file(tmp_path):
    folder = _tampered(tmp_path, lambda s: None)
    weights = tmp_path / "m" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated: the header reads, the weights are cut
    with pytest.raises(ValueError, match=f"'{weights}' is not a readable safetensors file"):
        load_model(folder)
    weights.unlink()
    with pytest.raises(
        ValueError, match=r"is not a saved posenc model folder: it needs config\.json and model"
    ):
        load_model(folder)
    (tmp_path / "m" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    weights.write_bytes(data)
    with pytest.raises(ValueError, match=r"config\.json' nests lists/objects more than 32 deep"):
        load_model(folder)
    with pytest.raises(ValueError, match=r"no saved model at .*missing"):
        load_model(tmp_path / "missing")


def test_a_save_cut_before_its_config_is_saved_over(tmp_path):
    """A save killed after the weights and before config.json leaves posenc's weights alone in the
    folder: saving again there completes it (other people's files still refuse)."""
    torch.manual_seed(0)
    model = TransformerLM(config("alibi")).eval()
    folder = tmp_path / "m"
    save_model(model, folder)
    (folder / "config.json").unlink()
    save_model(model, folder)
    ids = torch.randint(0, V, (1, 7))
    torch.testing.assert_close(load_model(folder)(ids).logits, model(ids).logits, rtol=0, atol=0)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="holds files that are not a posenc model"):
        save_model(model, other)
