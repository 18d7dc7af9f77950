"""Tests of posenc.lab.pretrained_eval: a model the lab did not train (a posenc save or its Hugging
Face export) scored as it is and under its scheme's variants, with paired deltas against L and
against the model as it is, intervals over documents, and the probe."""

from __future__ import annotations

import pytest

from _pretrained_toys import untrained_model, write_code_corpus
from posenc.lab.evalset import sample_eval_set
from posenc.lab.evaluate import evaluate_lm
from posenc.lab.pretrained_eval import evaluate_pretrained, format_pretrained, prepare_pretrained
from posenc.lab.pretrained_load import load_pretrained
from posenc.model import TransformerLM
from posenc.model.hf import save_transformers
from posenc.text import load_corpus


@pytest.fixture
def corpus(tmp_path):
    return write_code_corpus(tmp_path)


_model = untrained_model


KW = dict(corpus=None, val_fraction=0.34, eval_windows=8)


def test_an_exported_model_is_scored_as_is_and_with_each_variant(tmp_path, corpus):
    model = _model()
    save_transformers(model, tmp_path / "hf")
    kw = {**KW, "corpus": corpus, "eval_lens": (32,)}
    results = evaluate_pretrained(str(tmp_path / "hf"), variants=("linear", "yarn"), probe_trials=0, **kw)
    assert results["train_len"] == 16  # from the config: max_position_embeddings
    assert results["unit"] == "byte"
    assert [r["name"] for r in results["runs"]] == ["as is", "+linear", "+yarn"]
    for run in results["runs"]:
        at_l, at_2l = run["eval"]
        assert at_l["length"] == 16 and at_l["delta"] is None
        delta = at_2l["delta"]  # resampled by document: n counts the documents the windows fall in
        assert delta["n"] == results["eval"]["n_documents"] and delta["over"] == "documents"
        assert delta["n"] >= 2 and delta["low"] <= delta["mean"] <= delta["high"]
        score = at_2l["score"]
        assert score["mean"] == pytest.approx(at_2l["bpb_window"]) and score["low"] <= score["high"]
    # factor 1 at E = L: every variant is the model itself; at 2L the scaling changes the scores
    as_is, linear, _ = results["runs"]
    assert linear["eval"][0]["window_bits"] == pytest.approx(as_is["eval"][0]["window_bits"], abs=1e-5)
    assert linear["eval"][1]["bpb_window"] != pytest.approx(as_is["eval"][1]["bpb_window"], abs=1e-3)
    # against "as is": the paired difference of the same windows
    vs = linear["eval"][1]["vs_as_is"]
    assert vs["mean"] == pytest.approx(linear["eval"][1]["bpb_window"] - as_is["eval"][1]["bpb_window"])
    assert "vs_as_is" not in as_is["eval"][1]
    # the export reloaded scores what the posenc model itself scores on the same windows
    text = load_corpus(corpus, seed=0, val_fraction=0.34)
    evalset = sample_eval_set(
        text.val_bytes,
        8,
        32,
        0,
        doc_names=[d.name for d in text.val],
        doc_starts=text.val_starts,
        train_tokens=text.train_bytes,
        score_len=8,
    )
    direct = evaluate_lm(model, evalset, 32, 16, 8)
    assert as_is["eval"][1]["bpb_window"] == pytest.approx(direct.bpb_window, abs=1e-5)
    table = format_pretrained(results)
    assert "+yarn" in table and "±" in table and "vs as is" in table and "bits/byte" in table


def test_default_lengths_and_the_probe(tmp_path, corpus):
    model = _model(max_len=None)
    with pytest.raises(ValueError, match="no trained length"):
        prepare_pretrained(model, **{**KW, "corpus": corpus})
    model = _model()
    results = evaluate_pretrained(
        model, **{**KW, "corpus": corpus}, variants=(), probe_trials=4, multiples=(1, 4)
    )
    assert results["eval_lens"] == [16, 64]
    points = results["runs"][0]["eval"]
    assert points[0]["probe"] is None  # the probe runs at the longest length only
    probe = points[1]["probe"]
    assert [row["distance"] for row in probe] == [32]  # 16 + 32 + 16 bytes fit in 64
    assert probe[0]["gain"]["n"] == 4
    assert "effective-context probe at E=64" in format_pretrained(results)


def test_learned_positions_stop_at_their_table(tmp_path, corpus):
    model = _model("learned")
    model.save_pretrained(tmp_path / "posenc")
    assert isinstance(load_pretrained(tmp_path / "posenc"), TransformerLM)
    results = evaluate_pretrained(tmp_path / "posenc", **{**KW, "corpus": corpus}, probe_trials=0)
    assert results["eval_lens"] == [16]  # the default multiples stop at the table
    assert [r["name"] for r in results["runs"]] == ["as is"]  # learned positions declare no variants
    with pytest.raises(ValueError, match=r"--eval-lens \[32\] are longer than the model's positions allow"):
        evaluate_pretrained(tmp_path / "posenc", **{**KW, "corpus": corpus}, eval_lens=(32,))


# ----------------------------------------------------------------------------------------------
# Hostile arguments: refused, naming the flag, before the corpus is read or anything is scored
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def no_text(monkeypatch):
    """Fails a test that reaches the corpus: every check below must run before it is read."""

    def read_text(*args, **kwargs):
        raise AssertionError("the corpus was read before the arguments were checked")

    monkeypatch.setattr("posenc.lab.pretrained_eval.read_text", read_text)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"score_len": 0}, "--score-len must be >= 1, got 0"),  # not read as 'the default'
        ({"score_len": -3}, "--score-len must be >= 1"),
        ({"eval_lens": (0,)}, "--eval-lens entry must be >= 1"),
        ({"eval_lens": (-16,)}, "--eval-lens entry must be >= 1"),
        ({"train_len": 0}, "--train-len must be >= 1"),
        ({"eval_windows": 0}, "--eval-windows must be >= 1"),
        ({"split_seed": -1}, "--split-seed must be >= 0"),
        ({"variants": ("yarnn",)}, r"did you mean 'yarn'\?"),
        # one window of 10^9 positions: refused by the memory estimate, not allocated
        ({"eval_lens": (10**9,)}, r"evaluation at length 1000000000 \(one window\) would not fit"),
        ({"train_len": 10**8, "variants": ()}, "would not fit in memory"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(no_text, options, match):
    with pytest.raises(ValueError, match=match):
        prepare_pretrained(_model(), **{**KW, **options})


def test_a_train_len_past_a_learned_table_is_refused(no_text):
    # the model cannot have been trained at a length its positions do not reach
    with pytest.raises(ValueError, match=r"--train-len 32 is longer than the model's positions allow \(16"):
        prepare_pretrained(_model("learned"), **{**KW, "train_len": 32})


def test_a_vocabulary_smaller_than_the_probes_ids_has_no_probe(tmp_path, corpus):
    # the probe's random strings are ids 0-255: fed to a 37-id model they were out of its vocabulary
    from posenc.text import train_wordpiece

    tok = train_wordpiece(
        load_corpus(corpus, seed=0, val_fraction=0.34).texts, vocab_size=60, min_frequency=1
    )
    assert tok.vocab_size < 256
    _model(vocab_size=tok.vocab_size).save_pretrained(tmp_path / "wp", tokenizer=tok)
    options = {**KW, "corpus": corpus, "eval_windows": 2}
    results = evaluate_pretrained(tmp_path / "wp", **options, eval_lens=(64,), variants=())
    assert results["unit"] == "token"
    assert all(p["probe"] is None for p in results["runs"][0]["eval"])
    assert results["runs"][0]["eval"][1]["bpb_window"] > 0
