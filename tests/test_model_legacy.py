"""Tests of posenc.model.legacy: what earlier versions of posenc wrote (one ``.safetensors`` model
file, a folder with ``posenc_defaults``, a single-file training checkpoint), built here in those
layouts (tests/_legacy_files.py), loads through posenc.model.load_model as the model it was, and a
file from before format version 2 keeps the defaults it was built with."""

from __future__ import annotations

import json

import pytest
import safetensors
import safetensors.torch
import torch

from _legacy_files import write_old_folder, write_single_file, write_single_file_checkpoint
from _model_helpers import V, config
from posenc.lab import TrainConfig, make_optimizer
from posenc.model import Decoder, EncoderDecoder, ModelConfig, TransformerLM, load_model
from posenc.model.legacy import OLD_DEFAULTS, saved_version, upgrade_config


def _t5(max_len: int = 64) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(
        ModelConfig(vocab_size=V, d_model=16, num_heads=2, position="t5", max_len=max_len)
    ).eval()


def _same(a, b) -> None:
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TransformerLM(config("alibi")),
        lambda: EncoderDecoder(config("learned", tie="three_way")),
        lambda: Decoder(config("rope"), cross_attention=False),
    ],
)
def test_a_single_file_model_loads_as_it_was_saved(tmp_path, make):
    torch.manual_seed(0)
    model = make().eval()
    loaded = load_model(write_single_file(model, tmp_path / "m.safetensors"))
    assert type(loaded) is type(model) and loaded.config == model.config and not loaded.training
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    if isinstance(model, Decoder):
        assert loaded.cross_attention is False
    if isinstance(model, EncoderDecoder):
        assert loaded.lm_head.weight is loaded.encoder.embed.token.weight  # ties survive


def test_files_from_before_format_2_keep_the_old_defaults(tmp_path):
    """T5's max_distance now follows max_len (32 at max_len=64); a model saved before was built
    with 128 and loads with 128 (in its config too), in each old layout."""
    model = _t5()
    assert model.decoder.scheme(0).max_distance == 32 and model.config.position_options == {}
    old_file = load_model(write_single_file(model, tmp_path / "v1.safetensors", defaults=None))
    old_folder = load_model(write_old_folder(model, tmp_path / "v1", defaults=None))
    for old in (old_file, old_folder):
        assert old.decoder.scheme(0).max_distance == 128
        assert old.config.position_options == {"max_distance": 128}
    for current in (
        load_model(write_single_file(model, tmp_path / "v2.safetensors")),
        load_model(write_old_folder(model, tmp_path / "v2")),
    ):
        assert current.decoder.scheme(0).max_distance == 32
        _same(current, model)


def test_the_old_defaults_table_upgrades_only_what_was_not_set():
    assert OLD_DEFAULTS == {"t5": {"max_distance": 128}}
    cfg = {"position": "t5", "position_options": {"num_buckets": 8}}
    assert upgrade_config(cfg, 1)["position_options"] == {"max_distance": 128, "num_buckets": 8}
    assert upgrade_config({"position": "t5", "position_options": {"max_distance": 16}}, 1)[
        "position_options"
    ] == {"max_distance": 16}
    assert upgrade_config(cfg, 2) == cfg  # current files are read as written
    assert upgrade_config({"position": "alibi", "position_options": {}}, 1)["position_options"] == {}
    assert upgrade_config([1, 2], 1) == [1, 2]  # not a config: ModelConfig.from_dict names the problem
    assert (saved_version(None), saved_version(None, "2"), saved_version(2), saved_version("2")) == (
        1,
        2,
        2,
        2,
    )
    with pytest.raises(ValueError, match="'posenc_format' must be a whole number >= 1, got 'x'"):
        saved_version("x")


def test_scheme_options_of_their_old_form_are_read_in_the_new_one(tmp_path):
    """T5's ``bidirectional`` is the model's ``causal`` now, ALiBi's no-op ``causal`` is gone: a model
    saved with them loads, with the same logits as one built in today's form."""
    cfg = {"position": "t5", "position_options": {"bidirectional": False, "num_buckets": 8}}
    assert upgrade_config(cfg, 2)["position_options"] == {"causal": True, "num_buckets": 8}
    assert (
        upgrade_config({"position": "alibi", "position_options": {"causal": True}}, 2)["position_options"]
        == {}
    )
    torch.manual_seed(0)
    model = TransformerLM(config("alibi")).eval()
    folder = write_old_folder(model, tmp_path / "old")
    saved = json.loads((folder / "config.json").read_text())
    saved["config"]["position_options"] = {"causal": True}  # as an earlier version wrote it
    (folder / "config.json").write_text(json.dumps(saved))
    weights = folder / "model.safetensors"
    with safetensors.safe_open(str(weights), "pt") as f:
        meta = {**f.metadata(), "posenc_config": json.dumps(saved["config"])}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    safetensors.torch.save_file(tensors, str(weights), metadata=meta)
    ids = torch.randint(0, V, (2, 9))
    torch.testing.assert_close(load_model(folder)(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_old_options_of_a_per_layer_pattern_are_upgraded_and_bad_ones_named():
    """The schemes of ``layer_position_options`` get the same upgrade as the model's own; an old
    option with a non-bool value, or beside its new form, is an error naming the field."""
    cfg = {
        "position": "rope",
        "layer_positions": ["rope", "alibi", "t5"],
        "layer_position_options": {"alibi": {"causal": True}, "t5": {"bidirectional": True}},
    }
    got = upgrade_config(cfg, 1)["layer_position_options"]
    assert got == {"alibi": {}, "t5": {"max_distance": 128, "causal": False}}
    bad = {"position": "t5", "position_options": {"bidirectional": "no"}}
    with pytest.raises(
        ValueError, match=r"position_options\['bidirectional'\] must be true or false, got 'no'"
    ):
        upgrade_config(bad, 2)
    both = {"position": "t5", "position_options": {"bidirectional": False, "causal": False}}
    with pytest.raises(ValueError, match=r"gives both 'bidirectional' .* keep 'causal' alone"):
        upgrade_config(both, 2)


def test_a_single_file_checkpoint_loads_as_its_model(tmp_path):
    model = _t5()
    opt = make_optimizer(model, TrainConfig(steps=2))
    path = write_single_file_checkpoint(
        model,
        opt,
        tmp_path / "ck.safetensors",
        step=1,
        train_config=TrainConfig(steps=2).to_dict(),
        losses=[1.0],
    )
    loaded = load_model(path)
    assert type(loaded) is TransformerLM and loaded.config == model.config
    assert loaded.lm_head.weight is loaded.decoder.embed.token.weight  # stored once, tied again
    _same(loaded, model)


def test_old_files_that_are_broken_are_errors_naming_the_file(tmp_path):
    import safetensors.torch

    other = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(other))
    with pytest.raises(ValueError, match="has no posenc metadata: it is not a model saved by posenc"):
        load_model(other)
    (tmp_path / "empty.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.safetensors' is not a readable safetensors file"):
        load_model(tmp_path / "empty.safetensors")
    path = write_single_file(_t5(), tmp_path / "m.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header reads, the weights are cut
    with pytest.raises(ValueError, match=f"'{path}' is not a readable safetensors file"):
        load_model(path)
    opt = make_optimizer(_t5(), TrainConfig(steps=2))
    ck = write_single_file_checkpoint(
        _t5(), opt, tmp_path / "ck.safetensors", step=1, train_config={}, losses=[]
    )
    tensors = safetensors.torch.load_file(str(ck))
    with safetensors.safe_open(str(ck), framework="pt") as f:
        meta = f.metadata()
    wrong = {**json.loads(meta["model_config"]), "d_model": "16"}
    safetensors.torch.save_file(tensors, str(ck), metadata={**meta, "model_class": "load_model"})
    with pytest.raises(ValueError, match="does not record a posenc model class"):
        load_model(ck)
    safetensors.torch.save_file(tensors, str(ck), metadata={**meta, "model_config": json.dumps(wrong)})
    with pytest.raises(ValueError, match=r"field 'model_config': d_model must be an int, got str"):
        load_model(ck)
