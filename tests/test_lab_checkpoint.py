"""Tests of posenc.lab.checkpoint: a checkpoint is the model's folder with the trainer state
beside it; the round trip (weights, ties, AdamW state, RNG, history, configs); the atomic swap (a
write that dies keeps the previous checkpoint; a swap cut between its renames is completed); clear
errors for missing, foreign, truncated or incomplete checkpoints; a single-file checkpoint of an
earlier version converted when a run resumes it; load_trained_model / load_model on a checkpoint."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from _lab_toys import states_equal, tiny_config, tiny_data
from _legacy_files import write_single_file_checkpoint
from posenc.lab import (
    TrainConfig,
    batch_at,
    load_checkpoint,
    make_optimizer,
    save_checkpoint,
    seed_everything,
    train,
)
from posenc.lab.checkpoint import checkpoint_exists, read_checkpoint_meta
from posenc.model import ModelConfig, TransformerLM, load_model, save_model


def _stepped(cfg: TrainConfig) -> tuple[TransformerLM, torch.optim.Optimizer]:
    """A tiny model and an AdamW that has taken one step (some optimizer state to save)."""
    model = TransformerLM(tiny_config())
    opt = make_optimizer(model, cfg)
    model(batch_at(tiny_data(), 0, 2, 16)[0]).logits.sum().backward()
    opt.step()
    return model, opt


def _opt_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(
        torch.equal(value, sb["state"][index][key])
        if isinstance(value, torch.Tensor)
        else value == sb["state"][index][key]
        for index, values in sa["state"].items()
        for key, value in values.items()
    )


def test_checkpoint_round_trip(tmp_path):
    data = tiny_data()
    cfg = TrainConfig(steps=3, batch_size=4, seq_len=16, warmup_steps=1)
    seed_everything(0)
    model = TransformerLM(tiny_config())
    assert model.lm_head.weight is model.decoder.embed.token.weight  # tied: stored once
    train(model, data, cfg, progress=False)
    opt = make_optimizer(model, cfg)
    model(batch_at(data, 0, 2, 16)[0]).logits.sum().backward()
    opt.step()
    path = tmp_path / "c"
    save_checkpoint(path, model, opt, 3, train_config=cfg, losses=[1.0, 2.0, 3.0], elapsed_s=1.5)
    after_save = torch.rand(3)
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "trainer.safetensors",
    ]

    seed_everything(99)
    fresh = TransformerLM(tiny_config())
    fresh_opt = make_optimizer(fresh, cfg)
    state = load_checkpoint(path, fresh, fresh_opt)
    assert state.step == 3 and state.losses == [1.0, 2.0, 3.0] and state.elapsed_s == 1.5
    assert state.train_config == cfg.to_dict() and state.model_config == model.config.to_dict()
    assert states_equal(model, fresh)
    assert fresh.lm_head.weight is fresh.decoder.embed.token.weight  # still tied
    assert _opt_equal(opt, fresh_opt)
    assert torch.equal(torch.rand(3), after_save)  # the RNG continues where the saved run was
    assert not list(tmp_path.glob(".*"))  # no temporary folder left behind


def test_a_checkpoint_folder_is_a_model_folder(tmp_path):
    """load_model (and everything that takes a model path: load_trained_model, the loader of
    ``posenc extrapolate --model``) reads a checkpoint as its model."""
    from posenc.lab import load_trained_model
    from posenc.lab.pretrained_load import load_pretrained

    cfg = TrainConfig(steps=2)
    model, opt = _stepped(cfg)
    save_checkpoint(tmp_path / "c", model, opt, 1, train_config=cfg)
    ids = torch.randint(0, 32, (1, 8))
    for load in (load_model, load_trained_model, load_pretrained):
        loaded = load(tmp_path / "c")
        assert not loaded.training and loaded.config == model.config
        assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    cfg = TrainConfig(steps=2)
    model, opt = _stepped(cfg)
    path = tmp_path / "c"
    save_checkpoint(path, model, opt, 1, train_config=cfg)
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    def crash(tensors, filename, metadata=None):  # a write that dies half-way
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, opt, 2, train_config=cfg)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # the previous checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_a_swap_cut_between_its_renames_is_completed(tmp_path):
    """Killed after the previous checkpoint was renamed aside and before the new one was renamed
    in: the run finds its checkpoint again instead of starting over."""
    cfg = TrainConfig(steps=2)
    model, opt = _stepped(cfg)
    path = tmp_path / "c"
    save_checkpoint(path, model, opt, 1, train_config=cfg)
    os.replace(path, tmp_path / ".c.old12345")  # what the killed write left
    assert checkpoint_exists(path)
    assert read_checkpoint_meta(path)["step"] == "1" and not (tmp_path / ".c.old12345").exists()
    assert not checkpoint_exists(tmp_path / "other")


def test_a_swap_cut_after_the_new_folder_was_complete_keeps_the_newer_checkpoint(tmp_path):
    cfg = TrainConfig(steps=3)
    model, opt = _stepped(cfg)
    path = tmp_path / "c"
    save_checkpoint(path, model, opt, 1, train_config=cfg)
    save_checkpoint(tmp_path / "d", model, opt, 2, train_config=cfg)
    os.replace(path, tmp_path / ".c.old777")  # step 1 renamed aside
    os.replace(tmp_path / "d", tmp_path / ".c.tmp777")  # step 2 was complete, not yet renamed in
    (tmp_path / ".c.tmp888").mkdir()  # an unfinished write of another process: never taken
    assert checkpoint_exists(path) and read_checkpoint_meta(path)["step"] == "2"
    save_checkpoint(path, model, opt, 3, train_config=cfg)  # the leftovers go with the next write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_a_model_a_checkpoint_cannot_hold_is_refused_before_training(tmp_path):
    class Unregistered(TransformerLM):
        """A model class load_model could not rebuild."""

    model = Unregistered(tiny_config())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TypeError, match=r"a checkpoint holds one of posenc's models .*got Unregistered"):
        train(model, tiny_data(), TrainConfig(steps=2, batch_size=4, seq_len=16), checkpoint=tmp_path / "c")
    assert (
        all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and not (tmp_path / "c").exists()
    )


def test_a_checkpoint_never_replaces_what_is_not_a_checkpoint(tmp_path):
    cfg = TrainConfig(steps=2)
    model, opt = _stepped(cfg)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("x")
    save_model(model, tmp_path / "model")  # a model without trainer state is not a checkpoint either
    for path in (theirs, tmp_path / "file", tmp_path / "model"):
        with pytest.raises(
            ValueError, match="exists and is not a posenc checkpoint; a checkpoint never replaces it"
        ):
            save_checkpoint(path, model, opt, 1, train_config=cfg)
    assert (theirs / "notes.txt").read_text() == "mine" and (tmp_path / "file").read_text() == "x"
    with pytest.raises(
        ValueError, match=r"a checkpoint is a folder, but .*c\.safetensors' names a \.safetensors file"
    ):
        save_checkpoint(tmp_path / "c.safetensors", model, opt, 1, train_config=cfg)


def test_load_checkpoint_errors(tmp_path):
    model = TransformerLM(tiny_config())
    with pytest.raises(ValueError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing", model)
    save_model(model, tmp_path / "model")
    with pytest.raises(
        ValueError, match=r"is not a posenc training checkpoint: it has no trainer\.safetensors"
    ):
        load_checkpoint(tmp_path / "model", model)
    cfg = TrainConfig(steps=1)
    save_checkpoint(tmp_path / "c", model, make_optimizer(model, cfg), 1, train_config=cfg)
    other = TransformerLM(tiny_config(position="learned"))
    with pytest.raises(ValueError, match="does not match this model"):
        load_checkpoint(tmp_path / "c", other)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "not a readable safetensors file"),
        (b"\x00" * 7, "not a readable safetensors file"),
        ("truncate", "not a readable"),
        ("truncate-weights", "model.safetensors' is not a readable safetensors file"),
        ("no-rng", r"lacks \['rng'\]"),
    ],
)
def test_bad_checkpoints_are_clear_errors(tmp_path, content, match):
    data, ckpt = tiny_data(), tmp_path / "c"
    cfg = TrainConfig(steps=2, batch_size=4, seq_len=16)
    train(TransformerLM(tiny_config()), data, cfg, checkpoint=ckpt, progress=False)
    trainer = ckpt / "trainer.safetensors"
    if isinstance(content, bytes):
        trainer.write_bytes(content)
    elif content == "truncate":
        trainer.write_bytes(trainer.read_bytes()[: trainer.stat().st_size // 2])
    elif content == "truncate-weights":
        weights = ckpt / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        tensors = safetensors.torch.load_file(str(trainer))
        with safetensors.safe_open(str(trainer), framework="pt") as fh:
            meta = {k: v for k, v in fh.metadata().items() if k != "rng"}
        safetensors.torch.save_file(tensors, str(trainer), metadata=meta)
    with pytest.raises(ValueError, match=match):
        train(TransformerLM(tiny_config()), data, cfg, checkpoint=ckpt, resume=True, progress=False)


def test_a_single_file_checkpoint_is_converted_when_a_run_resumes_it(tmp_path):
    """A run an earlier version checkpointed at step 2 as ``c.safetensors`` resumes from it (given
    the folder path ``c``) and ends where an uninterrupted run does."""
    data = tiny_data()
    cfg = TrainConfig(steps=4, batch_size=4, seq_len=16, warmup_steps=1)
    seed_everything(0)
    full = TransformerLM(tiny_config())
    full_result = train(full, data, cfg, progress=False)

    seed_everything(0)
    half = TransformerLM(tiny_config())
    opt = make_optimizer(half, cfg)
    train(half, data, cfg, progress=False, stop_at=2, checkpoint=tmp_path / "scratch")
    state = load_checkpoint(tmp_path / "scratch", half, opt)  # the weights, AdamW moments and RNG at step 2
    old = write_single_file_checkpoint(
        half, opt, tmp_path / "c.safetensors", step=2, train_config=cfg.to_dict(), losses=state.losses
    )
    with pytest.raises(
        ValueError, match=r"single-file checkpoint of an earlier posenc; resume it by giving the folder"
    ):
        read_checkpoint_meta(old)

    resumed = TransformerLM(tiny_config())
    result = train(resumed, data, cfg, progress=False, checkpoint=tmp_path / "c", resume=True)
    assert result.start_step == 2 and result.completed
    assert states_equal(full, resumed) and result.losses == full_result.losses
    assert (tmp_path / "c" / "trainer.safetensors").is_file() and old.is_file()  # the old file is kept


def test_load_trained_model_reads_folders_and_old_files(tmp_path):
    from posenc.lab import load_trained_model

    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2, position="alibi"))
    config = TrainConfig(steps=1)
    opt = make_optimizer(model, config)
    save_checkpoint(tmp_path / "ck", model, opt, 1, train_config=config)
    save_model(model, tmp_path / "model")
    write_single_file_checkpoint(model, opt, tmp_path / "old.safetensors", step=1, train_config={}, losses=[])
    ids = torch.randint(0, 32, (1, 8))
    for name in ("ck", "model", "old.safetensors"):
        loaded = load_trained_model(tmp_path / name)
        assert not loaded.training
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no saved model at"):
        load_trained_model(tmp_path / "missing")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_trained_model(tmp_path / "junk.safetensors")


def _crafted(tmp_path, meta_change=None, tensor_change=None) -> Path:
    """A real checkpoint, its trainer state rewritten with ``meta_change(meta)`` /
    ``tensor_change(tensors)`` applied."""
    cfg = TrainConfig(steps=2)
    model, opt = _stepped(cfg)
    path = tmp_path / "c"
    save_checkpoint(path, model, opt, 1, train_config=cfg, losses=[1.0])
    trainer = path / "trainer.safetensors"
    tensors = safetensors.torch.load_file(str(trainer))
    with safetensors.safe_open(str(trainer), framework="pt") as f:
        meta = f.metadata()
    if meta_change is not None:
        meta_change(meta)
    if tensor_change is not None:
        tensor_change(tensors)
    safetensors.torch.save_file(tensors, str(trainer), metadata=meta)
    return path


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("meta_change", "tensor_change", "match"),
    [
        (lambda m: m.update(rng="{}"), None, "field 'rng' is not the NumPy and Python random states"),
        (lambda m: m.update(rng=_DEEP), None, "field 'rng' nests lists/objects more than 32 deep"),
        (lambda m: m.update(optimizer_groups='{"a": 1}'), None, "field 'optimizer_groups' is not a list"),
        (lambda m: m.update(optimizer_scalars='{"x": 1}'), None, "field 'optimizer_scalars' is not"),
        (lambda m: m.update(train_config="7"), None, "field 'train_config' is not a JSON object"),
        (lambda m: m.update(step="-3"), None, "field 'step' is not an integer >= 0"),
        (lambda m: m.update(step="9" * 400), None, "field 'step' is not an integer >= 0"),
        (lambda m: m.update(elapsed_s="nan"), None, "field 'elapsed_s' is not a number of seconds"),
        (lambda m: m.update(train_config="{"), None, "field 'train_config' is not valid JSON"),
        (lambda m: m.update(posenc_trainer="x"), None, "is not a posenc trainer state"),
        (None, lambda t: t.pop("history.loss"), "'history.loss' must be a 1-D torch.float64, got missing"),
        (None, lambda t: t.update({"rng.torch": t["rng.torch"][:9]}), "'rng.torch' must be a 1-D torch.uint"),
        (None, lambda t: t.update({"rng.numpy": t["rng.numpy"].float()}), "tensor 'rng.numpy' must be a 1-D"),
        (None, lambda t: t.update({"optimizer.x.y": torch.zeros(1)}), "holds a tensor 'optimizer.x.y'"),
    ],
)
def test_a_crafted_checkpoint_is_a_one_line_error_naming_the_file_and_field(
    tmp_path, meta_change, tensor_change, match
):
    path = _crafted(tmp_path, meta_change, tensor_change)
    model = TransformerLM(tiny_config())
    with pytest.raises(ValueError, match=match) as err:
        load_checkpoint(path, model, make_optimizer(model, TrainConfig(steps=2)))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_checkpoint_whose_config_json_is_broken_is_refused(tmp_path):
    path = _crafted(tmp_path)
    saved = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**saved, "posenc_model": "load_model"}))
    with pytest.raises(ValueError, match="names an unknown model class 'load_model'"):
        read_checkpoint_meta(path)
    (path / "config.json").write_text(
        json.dumps({**saved, "config": {**saved["config"], "position": "nope"}})
    )
    model = TransformerLM(tiny_config())
    with pytest.raises(ValueError, match="does not describe the weights"):
        load_checkpoint(path, model)


def test_posenc_extrapolate_takes_a_checkpoint_folder_as_its_model(tmp_path, capsys):
    from _pretrained_toys import untrained_model, write_code_corpus
    from posenc.cli import main

    model = untrained_model(position="alibi")
    cfg = TrainConfig(steps=1)
    save_checkpoint(tmp_path / "ck", model, make_optimizer(model, cfg), 1, train_config=cfg)
    corpus = write_code_corpus(tmp_path)
    argv = ["extrapolate", "--model", str(tmp_path / "ck"), "--corpus", corpus, "--val-fraction", "0.34"]
    argv += ["--eval-windows", "4", "--train-len", "16", "--eval-lens", "32", "--out", str(tmp_path / "o")]
    assert main(argv) == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "o" / "results.json").read_text())
    assert record["model"] == str(tmp_path / "ck") and record["runs"][0]["name"] == "as is"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_on_linux_a_checkpoint_is_replaced_in_one_step(tmp_path, monkeypatch):
    """The previous checkpoint is exchanged with the new folder, never renamed aside: a reader
    (a worker restarted on another machine) never finds the path missing."""
    cfg = TrainConfig(steps=3)
    model, opt = _stepped(cfg)
    path = tmp_path / "c"
    save_checkpoint(path, model, opt, 1, train_config=cfg)
    renames = []
    real = os.replace
    monkeypatch.setattr(
        os, "replace", lambda a, b: renames.append((Path(a).name, Path(b).name)) or real(a, b)
    )
    save_checkpoint(path, model, opt, 2, train_config=cfg)
    assert ("c", f".c.old{os.getpid()}") not in renames
    assert read_checkpoint_meta(path)["step"] == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["c"]
