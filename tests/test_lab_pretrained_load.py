"""Tests of posenc.lab.pretrained_load: a model the lab did not train, loaded with its checks, and
the corpus read as its tokenizer's ids (bits per token) or as bytes (a byte-level model only)."""

from __future__ import annotations

import pytest
import torch

from posenc.lab.evalset import sample_eval_set
from posenc.lab.evaluate import evaluate_lm
from posenc.lab.pretrained_eval import evaluate_pretrained, format_pretrained
from posenc.lab.pretrained_load import load_pretrained, read_text
from posenc.model import ModelConfig, TransformerLM
from posenc.text import load_corpus, load_tokenizer, train_bpe

TEXT = "def f(x):\n    return x * 2 + 1\n" * 40


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(6):
        (folder / f"m{i}.py").write_text(TEXT.replace("2", str(i)))
    return str(folder)


def _model(position="rope", vocab_size=256, max_len=16, **kw) -> TransformerLM:
    torch.manual_seed(0)
    # a large init makes attention, and so positions, matter in an untrained model
    config = ModelConfig(
        vocab_size=vocab_size,
        d_model=32,
        num_layers=2,
        num_heads=4,
        position=position,
        max_len=max_len,
        init_std=0.5,
        **kw,
    )
    return TransformerLM(config).eval()


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
