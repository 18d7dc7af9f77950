"""Tests of posenc.lab.pretrained_load: a model the lab did not train, loaded with its checks, and
the corpus read as its tokenizer's ids (bits per token) or as bytes (a byte-level model only)."""

from __future__ import annotations

import json

import pytest
import torch

from _pretrained_toys import untrained_model, write_code_corpus
from posenc.lab.evalset import sample_eval_set
from posenc.lab.evaluate import evaluate_lm
from posenc.lab.pretrained_eval import evaluate_pretrained, format_pretrained
from posenc.lab.pretrained_load import checked_model, load_pretrained, read_text
from posenc.text import load_corpus, load_tokenizer, train_bpe


@pytest.fixture
def corpus(tmp_path):
    return write_code_corpus(tmp_path)


_model = untrained_model


KW = dict(corpus=None, val_fraction=0.34, eval_windows=8)


def test_a_tokenizer_beside_the_model_gives_bits_per_token(tmp_path, corpus):
    texts = load_corpus(corpus, seed=0, val_fraction=0.34).texts
    tok = train_bpe(texts, vocab_size=300, min_frequency=1)
    model = _model(vocab_size=tok.vocab_size)
    model.save_pretrained(tmp_path / "m", tokenizer=tok)
    results = evaluate_pretrained(
        tmp_path / "m", **{**KW, "corpus": corpus}, eval_lens=(32,), variants=("yarn",), probe_trials=0
    )
    assert results["unit"] == "token" and "bits/token" in format_pretrained(results)
    # the windows are the tokenizer's ids of the validation documents, and are scored as such
    text = read_text(corpus, load_tokenizer(tmp_path / "m"), val_fraction=0.34)
    val = load_corpus(corpus, seed=0, val_fraction=0.34).val
    assert (
        text.val[: text.val_starts[1]].tolist()[: len(tok.encode(val[0].text, False))]
        == tok.encode(val[0].text, False).ids
    )
    assert text.val.numel() < sum(len(d.text.encode()) for d in val)  # merges: fewer tokens than bytes
    evalset = sample_eval_set(
        text.val,
        8,
        32,
        0,
        doc_names=list(text.val_names),
        doc_starts=list(text.val_starts),
        train_tokens=text.train,
        score_len=8,
    )
    direct = evaluate_lm(model, evalset, 32, 16, 8)
    assert results["runs"][0]["eval"][1]["bpb_window"] == pytest.approx(direct.bpb_window, abs=1e-5)
    # a tokenizer with more ids than the model: another model's
    _model(vocab_size=260).save_pretrained(tmp_path / "small", tokenizer=tok)
    with pytest.raises(ValueError, match="another model's tokenizer"):
        evaluate_pretrained(tmp_path / "small", **{**KW, "corpus": corpus})


def test_errors(tmp_path, corpus):
    for vocab in (50, 1000):  # no tokenizer: only a byte-level vocabulary reads bytes
        with pytest.raises(ValueError, match="byte-level model"):
            evaluate_pretrained(_model(vocab_size=vocab), train_len=16, corpus=corpus)
    with pytest.raises(ValueError, match=r"variants \['magic'\] are not offered"):
        evaluate_pretrained(_model(), variants=("magic",), **{**KW, "corpus": corpus})
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_pretrained(tmp_path / "bad")


# ----------------------------------------------------------------------------------------------
# Hostile model folders: each refused in one ValueError naming the file, before any scoring
# ----------------------------------------------------------------------------------------------
def _hf_folder(tmp_path, name="hf"):
    from posenc.model.hf import save_transformers

    save_transformers(_model(), tmp_path / name)
    return tmp_path / name


def _edit_config(folder, **fields):

    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "case, match",
    [
        ("not json", "is not valid JSON"),
        ("nested", "nests lists/objects more than 32 deep"),
        ("huge width", r"needs a .* table of about"),
        ("wrong type", "field 'num_hidden_layers' must be an int"),
        ("missing field", "lacks the field 'hidden_size'"),
        ("truncated weights", "is not a readable safetensors file"),
        ("random weights", "is not a readable safetensors file"),
        ("wrong shapes", "has shape"),
    ],
)
def test_the_model_files_checks_run_on_this_path(tmp_path, case, match):
    # the checks of posenc.model's readers are the ones --model goes through
    folder = _hf_folder(tmp_path)
    weights = folder / "model.safetensors"
    if case == "not json":
        (folder / "config.json").write_text("{not json")
    elif case == "nested":
        (folder / "config.json").write_text("[" * 10_000 + "]" * 10_000)
    elif case == "huge width":
        _edit_config(folder, hidden_size=10**12)
    elif case == "wrong type":
        _edit_config(folder, num_hidden_layers="2")
    elif case == "missing field":
        import json

        config = json.loads((folder / "config.json").read_text())
        del config["hidden_size"]
        (folder / "config.json").write_text(json.dumps(config))
    elif case == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:3000])
    elif case == "random weights":
        weights.write_bytes(torch.randint(0, 256, (50_000,), dtype=torch.uint8).numpy().tobytes())
    elif case == "wrong shapes":
        _edit_config(folder, intermediate_size=64)
    with pytest.raises(ValueError, match=match):
        checked_model(str(folder), "cpu")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_weight(tmp_path, value):
    from safetensors.torch import load_file, save_file

    folder = _hf_folder(tmp_path)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if "layers.0.attention.dense.weight" in k)
    weights[name][0, 0] = value
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"hf'.*'decoder\.blocks\.0\.attn\.o_proj\.weight' holds NaN"):
        checked_model(str(folder), "cpu")
    broken = _model()
    with torch.no_grad():
        broken.decoder.embed.token.weight[3, 0] = value  # a row the text may never reach: still refused
    with pytest.raises(ValueError, match="holds NaN or infinite values"):
        checked_model(broken, "cpu")


@pytest.mark.parametrize("kind", ["folder", "device link", "broken link"])
@pytest.mark.parametrize("name", ["tokenizer.json", "config.json"])
def test_a_model_file_that_is_not_a_regular_file_is_refused(tmp_path, corpus, kind, name):
    # a tokenizer.json that cannot be read is not the same as none: reading bytes instead would
    # score a subword model on ids it never saw, in the wrong unit
    texts = load_corpus(corpus, seed=0, val_fraction=0.34).texts
    tok = train_bpe(texts, vocab_size=300, min_frequency=1)
    _model(vocab_size=tok.vocab_size).save_pretrained(tmp_path / "m", tokenizer=tok)
    target = tmp_path / "m" / name
    target.unlink()
    if kind == "folder":
        target.mkdir()
    else:
        target.symlink_to("/dev/zero" if kind == "device link" else tmp_path / "gone.json")
    with pytest.raises(ValueError, match=rf"{name}' is not a regular file"):
        checked_model(str(tmp_path / "m"), "cpu")


def test_a_model_file_linked_to_a_regular_file_is_read(tmp_path):
    # Hugging Face's cache links every file of a checkpoint into a blob store
    folder = _hf_folder(tmp_path)
    for name in ("config.json", "model.safetensors"):
        (tmp_path / f"blob-{name}").write_bytes((folder / name).read_bytes())
        (folder / name).unlink()
        (folder / name).symlink_to(tmp_path / f"blob-{name}")
    model, tokenizer = checked_model(str(folder), "cpu")
    assert tokenizer is None and model.config.vocab_size == 256


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: t["model"]["vocab"].update({next(iter(t["model"]["vocab"])): 10**9}), "holds the id"),
        (
            lambda t: t.update(
                padding={
                    "strategy": {"Fixed": 10**8},
                    "direction": "Right",
                    "pad_to_multiple_of": None,
                    "pad_id": 0,
                    "pad_type_id": 0,
                    "pad_token": "[PAD]",
                }
            ),
            "'padding' asks for length",
        ),
        (lambda t: t.update(x=json.loads("[" * 40 + "]" * 40)), "nests"),
        (None, "is not valid JSON"),
    ],
)
def test_a_hostile_tokenizer_is_refused_by_the_checked_loader(tmp_path, corpus, edit, match):

    texts = load_corpus(corpus, seed=0, val_fraction=0.34).texts
    tok = train_bpe(texts, vocab_size=300, min_frequency=1)
    _model(vocab_size=tok.vocab_size).save_pretrained(tmp_path / "m", tokenizer=tok)
    path = tmp_path / "m" / "tokenizer.json"
    if edit is None:
        path.write_text("{nope")
    else:
        spec = json.loads(path.read_text())
        edit(spec)
        path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=match):
        checked_model(str(tmp_path / "m"), "cpu")
