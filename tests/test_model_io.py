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


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t: t.update({"decoder.embed.token.weight": t["decoder.embed.token.weight"] * float("nan")}),
         r"decoder\.embed\.token\.weight holds NaN values"),
        (lambda t: t.update({"decoder.embed.token.weight": t["decoder.embed.token.weight"].long()}),
         r"decoder\.embed\.token\.weight is torch\.int64, not a floating-point tensor"),
        (lambda t: t.update({"decoder.embed.token.weight": t["decoder.embed.token.weight"] > 0}),
         r"is torch\.bool, not a floating-point tensor"),
    ],
)  # fmt: skip
def test_weights_that_are_nan_int_or_bool_are_refused(tmp_path, change, match):
    import safetensors
    import safetensors.torch

    path = tmp_path / "m.safetensors"
    save_model(TransformerLM(config(position="rope")), path)
    tensors = safetensors.torch.load_file(str(path))
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    change(tensors)
    safetensors.torch.save_file(tensors, str(path), metadata=meta)
    with pytest.raises(ValueError, match=match):
        load_model(path)


def test_cut_weights_and_huge_integers_are_errors_naming_the_file(tmp_path):
    from posenc.model.io import parse_json

    with pytest.raises(ValueError, match=r"'the field' is not valid JSON \(Exceeds the limit"):
        parse_json('{"d_model": ' + "9" * 5000 + "}", "'the field'")
    with pytest.raises(ValueError, match=r"'f' is not valid JSON \(.*utf-8"):
        parse_json(b'{"a": "\xff\xfe"}', "'f'")
    path = tmp_path / "m.safetensors"
    save_model(TransformerLM(config(position="rope")), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header reads, the data is cut
    with pytest.raises(ValueError, match=f"'{path}' is not a readable safetensors file"):
        load_model(path)
