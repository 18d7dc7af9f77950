"""Tests of posenc.model.io: the single-file form (safetensors weights + the config as JSON
metadata): files that are not posenc's, empty, missing or whose weights do not match their config
are refused by name; a file from before a default changed loads with the old default."""

from __future__ import annotations

import pytest
import torch

from _model_helpers import V, config
from posenc.model import ModelConfig, TransformerLM, load_model, save_model


def test_load_rejects_files_without_posenc_metadata(tmp_path):
    import safetensors.torch

    path = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="has no posenc metadata"):
        load_model(path)
    with pytest.raises(TypeError, match=r"save_model takes one of .*TransformerLM.*, got Linear"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_model(tmp_path / "empty.safetensors")
    with pytest.raises(ValueError, match="no model file at"):
        load_model(tmp_path / "missing.safetensors")
    # weights whose shapes do not match the config stored beside them (a hand-edited file)
    import json

    import safetensors.torch

    save_model(TransformerLM(config("alibi")), tmp_path / "lm.safetensors")
    tensors = safetensors.torch.load_file(str(tmp_path / "lm.safetensors"))
    with safetensors.safe_open(str(tmp_path / "lm.safetensors"), framework="pt") as f:
        meta = f.metadata()
    cfg = json.loads(meta["posenc_config"])
    meta["posenc_config"] = json.dumps({**cfg, "d_ff": 2 * cfg["d_model"]})
    safetensors.torch.save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match=r"has shape .* the file's config does not describe its weights"):
        load_model(tmp_path / "bad.safetensors")


def test_files_saved_before_a_default_changed_load_as_they_were_trained(tmp_path):
    """T5's max_distance now follows max_len; a file from before (no defaults-version mark) keeps
    the 128 it was built and trained with, instead of silently changing its buckets."""
    import json

    import safetensors.torch

    model = TransformerLM(ModelConfig(vocab_size=V, d_model=16, num_heads=2, position="t5", max_len=64))
    assert model.decoder.scheme(0).max_distance == 32
    path = tmp_path / "lm.safetensors"
    save_model(model, path)
    assert load_model(path).decoder.scheme(0).max_distance == 32  # a current file: as saved
    tensors = safetensors.torch.load_file(str(path))
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = {k: v for k, v in f.metadata().items() if k != "posenc_defaults"}
    safetensors.torch.save_file(tensors, str(tmp_path / "old.safetensors"), metadata=meta)
    old = load_model(tmp_path / "old.safetensors")
    assert old.decoder.scheme(0).max_distance == 128
    assert old.config.position_options == {"max_distance": 128}
    assert json.loads(meta["posenc_config"])["position_options"] == {}
