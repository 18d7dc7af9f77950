"""Tests of posenc.model.io: the weights file (written atomically, never through a link; weights
that are NaN, integers or booleans, or whose shapes do not match the config, refused by name) and
JSON read with a depth limit."""

from __future__ import annotations

import pytest
import torch

from _model_helpers import config
from posenc.model import TransformerLM, load_model, save_model


def _rewrite_weights(folder, change) -> None:
    """The folder's weights file written again with ``change(tensors)`` applied (metadata kept)."""
    import safetensors
    import safetensors.torch

    path = folder / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    change(tensors)
    safetensors.torch.save_file(tensors, str(path), metadata=meta)


_TOKENS = "decoder.embed.token.weight"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t: t.update({_TOKENS: t[_TOKENS] * float("nan")}), r"token\.weight holds NaN values"),
        (
            lambda t: t.update({_TOKENS: t[_TOKENS].long()}),
            r"token\.weight is torch\.int64, not a floating-point tensor",
        ),
        (lambda t: t.update({_TOKENS: t[_TOKENS] > 0}), r"is torch\.bool, not a floating-point tensor"),
        (
            lambda t: t.update({_TOKENS: t[_TOKENS][:, :8].contiguous()}),
            r"has shape \(37, 8\), the model's \(37, 32\): the file's config does not describe its weights",
        ),
        (
            lambda t: t.update({"extra": torch.zeros(1)}),
            r"the file has weights this model does not: \['extra'\]",
        ),
        (lambda t: t.pop(_TOKENS), "the file lacks the weights"),
    ],
)
def test_weights_that_do_not_fit_the_model_are_refused_naming_the_file(tmp_path, change, match):
    folder = save_model(TransformerLM(config(position="rope")), tmp_path / "m")
    _rewrite_weights(folder, change)
    with pytest.raises(ValueError, match=match) as err:
        load_model(folder)
    assert "model.safetensors" in str(err.value)


def test_a_failed_write_leaves_the_weights_as_they_were(tmp_path, monkeypatch):
    import safetensors.torch

    folder = save_model(TransformerLM(config(position="rope")), tmp_path / "m")
    before = (folder / "model.safetensors").read_bytes()

    def dies(model, filename, metadata=None):  # a write that dies half-way
        with open(filename, "wb") as fh:
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_model", dies)
    with pytest.raises(OSError, match="disk full"):
        save_model(TransformerLM(config(position="rope")), folder)
    assert (folder / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]  # no temporary


def test_json_that_is_huge_not_utf8_or_too_deep_is_an_error_naming_where():
    from posenc.model.io import parse_json

    with pytest.raises(ValueError, match=r"'the field' is not valid JSON \(Exceeds the limit"):
        parse_json('{"d_model": ' + "9" * 5000 + "}", "'the field'")
    with pytest.raises(ValueError, match=r"'f' is not valid JSON \(.*utf-8"):
        parse_json(b'{"a": "\xff\xfe"}', "'f'")
    with pytest.raises(ValueError, match="'g' nests lists/objects more than 32 deep"):
        parse_json("[" * 100_000 + "]" * 100_000, "'g'")
    assert parse_json("[" * 32 + "]" * 32, "'h'") is not None
