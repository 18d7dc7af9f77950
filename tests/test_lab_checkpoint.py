"""Tests of posenc.lab.checkpoint: the training checkpoint round trip (weights, ties, AdamW state,
RNG, history, configs), the atomic write, clear errors for missing, foreign, truncated or
incomplete files, and load_trained_model from a checkpoint or a model file."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from _lab_toys import states_equal, tiny_config, tiny_data
from posenc.lab import (
    TrainConfig,
    batch_at,
    load_checkpoint,
    make_optimizer,
    save_checkpoint,
    seed_everything,
    train,
)
from posenc.model import ModelConfig, TransformerLM, save_model


def test_checkpoint_round_trip(tmp_path):
    data = tiny_data()
    cfg = TrainConfig(steps=3, batch_size=4, seq_len=16, warmup_steps=1)
    seed_everything(0)
    model = TransformerLM(tiny_config())
    assert model.lm_head.weight is model.decoder.embed.token.weight  # tied: stored once
    train(model, data, cfg, progress=False)
    opt = make_optimizer(model, cfg)
    model(batch_at(data, 0, 2, 16)[0]).logits.sum().backward()
    opt.step()  # some optimizer state to save
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, model, opt, 3, train_config=cfg, losses=[1.0, 2.0, 3.0], elapsed_s=1.5)
    after_save = torch.rand(3)

    seed_everything(99)
    fresh = TransformerLM(tiny_config())
    fresh_opt = make_optimizer(fresh, cfg)
    state = load_checkpoint(path, fresh, fresh_opt)
    assert state.step == 3 and state.losses == [1.0, 2.0, 3.0] and state.elapsed_s == 1.5
    assert state.train_config == cfg.to_dict() and state.model_config == model.config.to_dict()
    assert states_equal(model, fresh)
    assert fresh.lm_head.weight is fresh.decoder.embed.token.weight  # still tied
    a, b = opt.state_dict(), fresh_opt.state_dict()
    for index, values in a["state"].items():
        for key, value in values.items():
            assert torch.equal(value, b["state"][index][key])
    assert torch.equal(torch.rand(3), after_save)  # the RNG continues where the saved run was
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    import safetensors.torch

    cfg = TrainConfig(steps=2)
    model = TransformerLM(tiny_config())
    opt = make_optimizer(model, cfg)
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, model, opt, 1, train_config=cfg)
    before = path.read_bytes()

    def crash(tensors, filename, metadata=None):  # a write that dies half-way
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, opt, 2, train_config=cfg)
    assert path.read_bytes() == before  # the previous checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_load_checkpoint_errors(tmp_path):
    model = TransformerLM(tiny_config())
    with pytest.raises(ValueError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.safetensors", model)
    save_model(model, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="is not a posenc training checkpoint"):
        load_checkpoint(tmp_path / "model.safetensors", model)
    cfg = TrainConfig(steps=1)
    save_checkpoint(tmp_path / "c.safetensors", model, make_optimizer(model, cfg), 1, train_config=cfg)
    other = TransformerLM(tiny_config(position="learned"))
    with pytest.raises(ValueError, match="does not match this model"):
        load_checkpoint(tmp_path / "c.safetensors", other)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "not a readable safetensors file"),
        (b"\x00" * 7, "not a readable safetensors file"),
        ("truncate", "not a readable"),
        ("no-rng", r"lacks \['rng'\]"),
    ],
)
def test_bad_checkpoints_are_clear_errors(tmp_path, content, match):
    data, ckpt = tiny_data(), tmp_path / "c.safetensors"
    cfg = TrainConfig(steps=2, batch_size=4, seq_len=16)
    if isinstance(content, bytes):
        ckpt.write_bytes(content)
    else:
        train(TransformerLM(tiny_config()), data, cfg, checkpoint=ckpt, progress=False)
        if content == "truncate":
            ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
        else:
            tensors = safetensors.torch.load_file(str(ckpt))
            with safetensors.safe_open(str(ckpt), framework="pt") as fh:
                meta = {k: v for k, v in fh.metadata().items() if k != "rng"}
            safetensors.torch.save_file(tensors, str(ckpt), metadata=meta)
    with pytest.raises(ValueError, match=match):
        train(TransformerLM(tiny_config()), data, cfg, checkpoint=ckpt, resume=True, progress=False)


def test_load_trained_model_from_checkpoint_and_model_file(tmp_path):
    from posenc.lab import load_trained_model

    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2, position="alibi"))
    config = TrainConfig(steps=1)
    save_checkpoint(tmp_path / "ck.safetensors", model, make_optimizer(model, config), 1, train_config=config)
    save_model(model, tmp_path / "model.safetensors")
    ids = torch.randint(0, 32, (1, 8))
    for name in ("ck.safetensors", "model.safetensors"):
        loaded = load_trained_model(tmp_path / name)
        assert not loaded.training
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no checkpoint at"):
        load_trained_model(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_trained_model(tmp_path / "junk.safetensors")


def _crafted(tmp_path, meta_change=None, tensor_change=None) -> Path:
    """A real checkpoint, rewritten with ``meta_change(meta)`` / ``tensor_change(tensors)`` applied."""
    cfg = TrainConfig(steps=2)
    model = TransformerLM(tiny_config())
    opt = make_optimizer(model, cfg)
    model(batch_at(tiny_data(), 0, 2, 16)[0]).logits.sum().backward()
    opt.step()
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, model, opt, 1, train_config=cfg, losses=[1.0])
    tensors = safetensors.torch.load_file(str(path))
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    if meta_change is not None:
        meta_change(meta)
    if tensor_change is not None:
        tensor_change(tensors)
    safetensors.torch.save_file(tensors, str(path), metadata=meta)
    return path


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("meta_change", "tensor_change", "match"),
    [
        (lambda m: m.update(aliases="[]"), None, "field 'aliases' is not a JSON object of parameter names"),
        (lambda m: m.update(rng="{}"), None, "field 'rng' is not the NumPy and Python random states"),
        (lambda m: m.update(rng=_DEEP), None, "field 'rng' nests lists/objects more than 32 deep"),
        (lambda m: m.update(model_config=_DEEP), None, "field 'model_config' nests"),
        (lambda m: m.update(optimizer_groups='{"a": 1}'), None, "field 'optimizer_groups' is not a list"),
        (lambda m: m.update(optimizer_scalars='{"x": 1}'), None, "field 'optimizer_scalars' is not"),
        (lambda m: m.update(train_config="7"), None, "field 'train_config' is not a JSON object"),
        (lambda m: m.update(step="-3"), None, "field 'step' is not an integer >= 0"),
        (lambda m: m.update(step="9" * 400), None, "field 'step' is not an integer >= 0"),
        (lambda m: m.update(elapsed_s="nan"), None, "field 'elapsed_s' is not a number of seconds"),
        (lambda m: m.update(train_config="{"), None, "field 'train_config' is not valid JSON"),
        (None, lambda t: t.pop("history.loss"), "'history.loss' must be a 1-D torch.float64, got missing"),
        (None, lambda t: t.update({"rng.torch": t["rng.torch"][:9]}), "'rng.torch' must be a 1-D torch.uint"),
        (None, lambda t: t.update({"rng.numpy": t["rng.numpy"].float()}), "tensor 'rng.numpy' must be a 1-D"),
        (None, lambda t: t.update({"optimizer.x.y": torch.zeros(1)}), "holds a tensor 'optimizer.x.y'"),
    ],
)  # fmt: skip
def test_a_crafted_checkpoint_is_a_one_line_error_naming_the_file_and_field(
    tmp_path, meta_change, tensor_change, match
):
    """Each used to end in AttributeError, KeyError, RecursionError or RuntimeError on --resume."""
    path = _crafted(tmp_path, meta_change, tensor_change)
    model = TransformerLM(tiny_config())
    with pytest.raises(ValueError, match=match) as err:
        load_checkpoint(path, model, make_optimizer(model, TrainConfig(steps=2)))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_checkpoint_naming_a_class_outside_the_model_classes_is_refused(tmp_path):
    from posenc.lab import load_trained_model

    path = _crafted(tmp_path, lambda m: m.update(model_class="load_model"))
    with pytest.raises(ValueError, match="does not record a posenc model class"):
        load_trained_model(path)
