"""Tests of posenc.lab.pretrained: a model the lab did not train (a posenc save or its Hugging Face
export) scored as it is and under its scheme's variants, with paired deltas and intervals."""

from __future__ import annotations

import pytest
import torch

from posenc.lab.evalset import sample_eval_set
from posenc.lab.evaluate import evaluate_lm
from posenc.lab.pretrained import evaluate_pretrained, format_pretrained, load_pretrained
from posenc.model import ModelConfig, TransformerLM
from posenc.model.hf import save_transformers
from posenc.text import load_corpus

TEXT = "def f(x):\n    return x * 2 + 1\n" * 40


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(6):
        (folder / f"m{i}.py").write_text(TEXT.replace("2", str(i)))
    return str(folder)


def _model(position="rope", **kw) -> TransformerLM:
    torch.manual_seed(0)
    # a large init makes attention, and so positions, matter in an untrained model
    config = ModelConfig(
        vocab_size=256,
        d_model=32,
        num_layers=2,
        num_heads=4,
        position=position,
        max_len=16,
        init_std=0.5,
        **kw,
    )
    return TransformerLM(config).eval()


def test_an_exported_model_is_scored_as_is_and_with_each_variant(tmp_path, corpus):
    model = _model()
    save_transformers(model, tmp_path / "hf")
    kw = dict(train_len=16, eval_lens=(32,), corpus=corpus, val_fraction=0.34, eval_windows=8)
    results = evaluate_pretrained(str(tmp_path / "hf"), variants=("linear", "yarn"), **kw)
    assert [r["name"] for r in results["runs"]] == ["as is", "+linear", "+yarn"]
    for run in results["runs"]:
        at_l, at_2l = run["eval"]
        assert at_l["length"] == 16 and at_l["delta"] is None
        delta = at_2l["delta"]  # resampled by document: n counts the documents the windows fall in
        assert delta["n"] == results["eval"]["n_documents"] and delta["over"] == "documents"
        assert delta["n"] >= 2 and delta["low"] <= delta["mean"] <= delta["high"]
    # factor 1 at E = L: every variant is the model itself; at 2L the scaling changes the scores
    as_is, linear, _ = results["runs"]
    assert linear["eval"][0]["window_bits"] == pytest.approx(as_is["eval"][0]["window_bits"], abs=1e-5)
    assert linear["eval"][1]["bpb_window"] != pytest.approx(as_is["eval"][1]["bpb_window"], abs=1e-3)
    # the export reloaded scores what the posenc model itself scores on the same windows
    text = load_corpus(corpus, seed=0, val_fraction=0.34)
    evalset = sample_eval_set(
        text.val_bytes, 8, 32, 0, doc_names=[d.name for d in text.val], doc_starts=text.val_starts
    )
    direct = evaluate_lm(model, evalset, 32, 16, 8)
    assert as_is["eval"][1]["bpb_window"] == pytest.approx(direct.bpb_window, abs=1e-5)
    table = format_pretrained(results)
    assert "+yarn" in table and "±" in table


def test_learned_positions_are_na_past_their_table(tmp_path, corpus):
    model = _model("learned")
    model.save_pretrained(tmp_path / "posenc")
    assert isinstance(load_pretrained(tmp_path / "posenc"), TransformerLM)
    results = evaluate_pretrained(
        tmp_path / "posenc", train_len=16, eval_lens=(32,), corpus=corpus, val_fraction=0.34, eval_windows=8
    )
    assert [r["name"] for r in results["runs"]] == ["as is"]  # learned positions declare no variants
    assert results["runs"][0]["eval"][1]["note"].startswith("n/a")
    assert "n/a" in format_pretrained(results)


def test_errors(tmp_path, corpus):
    with pytest.raises(ValueError, match="byte-level model"):
        evaluate_pretrained(
            TransformerLM(ModelConfig(vocab_size=50, d_model=32, num_heads=4)),
            train_len=8,
            eval_lens=(8,),
            corpus=corpus,
        )
    with pytest.raises(ValueError, match=r"variants \['magic'\] are not offered"):
        evaluate_pretrained(
            _model(),
            train_len=16,
            eval_lens=(16,),
            variants=("magic",),
            corpus=corpus,
            val_fraction=0.34,
            eval_windows=4,
        )
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_pretrained(tmp_path / "bad")


def test_the_command_prints_the_tables_or_one_line(tmp_path, corpus, capsys):
    from posenc.lab.pretrained import main

    _model().save_pretrained(tmp_path / "m")
    args = [
        "--model",
        str(tmp_path / "m"),
        "--train-len",
        "16",
        "--eval-lens",
        "16,32",
        "--corpus",
        corpus,
        "--eval-windows",
        "4",
        "--variants",
        "yarn",
    ]
    assert main(args) == 0
    assert "+yarn" in capsys.readouterr().out
    assert main(["--model", str(tmp_path / "nothing"), "--train-len", "16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
