"""Tests of posenc.text.pipeline and the `posenc encode` command (posenc.text.commands)."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.cli import main
from posenc.text.pipeline import encode_text, format_pipeline, plot_pipeline, run_pipeline
from posenc.text.tokenizer import byte_tokenizer, train_wordpiece

TEXT = "The cat sat on the mat."
CORPUS = [
    "The cat sat on the mat.",
    "A dog sat on the log. The cat saw the dog.",
    "On the mat the cat sat, and the dog sat on the log.",
] * 4
SEED_002 = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]


@pytest.fixture(scope="module")
def tok():
    return train_wordpiece(CORPUS, vocab_size=200)


@pytest.fixture(scope="module")
def result(tok):
    return encode_text(TEXT, tok, d_model=16, dropout=0.1, seed=0)


def _reference(weight: torch.Tensor, ids: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Vaswani et al. 2017 in float64, written plainly: LayerNorm(E[ids] sqrt(d) + PE)."""
    w = weight.double()
    d = w.shape[1]
    x = w[ids] * math.sqrt(d)
    pe = torch.zeros(len(ids), d, dtype=torch.float64)
    for p in range(len(ids)):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            pe[p, 2 * i], pe[p, 2 * i + 1] = math.sin(angle), math.cos(angle)
    h = x + pe
    mu = h.mean(-1, keepdim=True)
    var = h.var(-1, unbiased=False, keepdim=True)
    return (h - mu) / torch.sqrt(var + eps)


def test_seed_002_sentence_shapes(result):
    assert result.tokens == SEED_002
    s = len(SEED_002)
    assert result["ids"].tensor.shape == (s,)
    assert result["one_hot"].tensor.shape == (s, result.module.token.vocab_size)
    for name in ("lookup", "scaled", "positional", "sum", "layer_norm", "dropout_train", "dropout_eval"):
        assert result[name].tensor.shape == (s, 16), name


def test_matches_input_embedding(result):
    ids = result.ids
    torch.manual_seed(0)  # the same seed builds the same weights
    emb = posenc.InputEmbedding(
        result.module.token.vocab_size, 16, "sinusoidal", layer_norm=True, dropout=0.1
    )
    assert torch.equal(emb.token.weight, result.module.token.weight)
    # InputEmbedding runs the layer in one pass on CPU (kernels.input_cpu), whose LayerNorm sums in
    # float64: the pipeline's step-by-step values up to float32 rounding, and the same dropout mask
    emb.eval()
    torch.testing.assert_close(emb(ids[None])[0], result.output, rtol=1e-6, atol=1e-6)
    assert torch.equal(result["layer_norm"].tensor, result.output)
    emb.train()
    torch.manual_seed(0)  # the pipeline seeds the dropout mask with the same seed
    got, want = emb(ids[None])[0], result["dropout_train"].tensor
    assert torch.equal(got == 0, want == 0)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_against_float64_reference(result):
    ref = _reference(result.module.token.weight, result.ids)
    torch.testing.assert_close(result.output.double(), ref, atol=1e-5, rtol=1e-5)
    x = result.module.token.weight.double()[result.ids] * 4.0  # sqrt(16)
    torch.testing.assert_close(result["scaled"].tensor.double(), x, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(result["sum"].tensor, result["scaled"].tensor + result["positional"].tensor)


def test_one_hot_equivalence(result):
    st = result["one_hot"].stats
    assert st["equal"] and st["max_abs_diff"] == 0.0  # one nonzero product per output: exact
    one_hot = result["one_hot"].tensor.double()
    assert torch.all(one_hot.sum(-1) == 1)
    w = result.module.token.weight.double()
    assert torch.equal(one_hot @ w, w[result.ids])


def test_layer_norm_and_dropout_stats(result):
    ln = result["layer_norm"].stats
    assert max(abs(m) for m in ln["mean_per_token"]) < 1e-6
    # LayerNorm divides by sqrt(var + eps): the output variance is var / (var + eps), just under 1
    assert all(0.999 < v <= 1.0 for v in ln["var_per_token"])
    dt = result["dropout_train"]
    zeroed = (dt.tensor == 0) & (result["layer_norm"].tensor != 0)
    assert dt.stats["zeroed_fraction"] == int(zeroed.sum()) / zeroed.numel()
    kept = ~zeroed
    torch.testing.assert_close(dt.tensor[kept], result["layer_norm"].tensor[kept] / 0.9)
    assert torch.equal(result["dropout_eval"].tensor, result["layer_norm"].tensor)


def test_scheme_without_embed_hook_and_learned():
    r = run_pipeline(torch.tensor([1, 2, 3]), 10, scheme="nope", d_model=8, dropout=0.0)
    assert torch.all(r["positional"].tensor == 0) and "acts inside attention" in r["positional"].stats["note"]
    r = run_pipeline(torch.tensor([1, 2, 3]), 10, scheme="learned", d_model=8)  # max_len defaults to s
    assert r.module.position.max_len == 3


def test_format_and_plot(result, tmp_path):
    text = format_pipeline(result)
    assert "1. tokens (9): [CLS] the cat sat on the mat . [SEP]" in text
    assert "bit-identical" in text and "'the' at positions 1 and 5: the same row of E" in text
    path = plot_pipeline(result, tmp_path / "steps.png")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
    # one rule for every posenc figure: missing folders are made; a name without suffix gets .png
    made = plot_pipeline(result, tmp_path / "missing" / "x")
    assert made == tmp_path / "missing" / "x.png" and made.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"--plot '.*f/x.png' lies under the file"):
        plot_pipeline(result, tmp_path / "f" / "x.png")
    with pytest.raises(ValueError, match=r"must end in .png, .svg, .pdf"):
        plot_pipeline(result, tmp_path / "x.jpg")


def test_pipeline_errors(tok):
    with pytest.raises(ValueError, match="text is empty"):
        encode_text("   ", tok)
    with pytest.raises(TypeError, match="text must be a str"):
        encode_text(None, tok)
    with pytest.raises(ValueError, match=r"text is not valid UTF-8 \(character 3"):
        encode_text("abc\udcff", tok)  # how Python passes non-UTF-8 command-line bytes
    with pytest.raises(ValueError, match=r"ids must have shape \[s\], got \(1, 3\)"):
        run_pipeline(torch.tensor([[1, 2, 3]]), 10)
    with pytest.raises(ValueError, match="ids is empty"):
        run_pipeline(torch.tensor([], dtype=torch.long), 10)
    with pytest.raises(ValueError, match="tokens has 2 entries but ids has 3"):
        run_pipeline(torch.tensor([1, 2, 3]), 10, tokens=["a", "b"])
    with pytest.raises(ValueError, match=r"token id 12 at index \(1,\) is outside the vocabulary \[0, 10\)"):
        run_pipeline(torch.tensor([1, 12, 3]), 10)
    with pytest.raises(ValueError, match="unknown scheme 'rotary'"):
        run_pipeline(torch.tensor([1]), 10, scheme="rotary")


# ----------------------------------------------------------------------------------- the command
def test_cli_encode_numbers_match_input_embedding(tok, tmp_path, capsys):
    path = tok.save(tmp_path / "tokenizer.json")
    png = tmp_path / "steps.png"
    rc = main(
        [
            "encode",
            TEXT,
            "--tokenizer",
            str(path),
            "--d-model",
            "16",
            "--seed",
            "3",
            "--columns",
            "16",
            "--digits",
            "4",
            "--plot",
            str(png),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and png.exists()
    assert "tokens (9): [CLS] the cat sat on the mat . [SEP]" in out
    ids = torch.tensor(tok.encode(TEXT).ids)
    assert f"ids [s=9]: {ids.tolist()}" in out
    torch.manual_seed(3)
    emb = posenc.InputEmbedding(tok.vocab_size, 16, "sinusoidal", dropout=0.1).eval()
    with torch.no_grad():
        expected_sum = emb.position.embed(emb.token(ids[None]))[0]  # step 7 as the library computes it
    for token, row in zip(SEED_002, expected_sum.tolist()):
        assert "[" + ", ".join(f"{v:+.4f}" for v in row) + "]" in out, token
    assert "8. LayerNorm over d=16" in out and "9. dropout p=0.1" in out


def test_cli_encode_default_wordpiece_and_byte(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty tokenizer cache
    assert main(["encode", TEXT]) == 0  # trains a WordPiece on the stdlib's docstrings
    out = capsys.readouterr().out
    assert "wordpiece trained in" in out and "[CLS] the" in out and "[SEP]" in out
    assert main(["encode", TEXT]) == 0  # the second run reads the first one's tokenizer
    again = capsys.readouterr().out
    assert "read from the cache" in again and again.split("ids")[1] == out.split("ids")[1]
    assert main(["encode", "héllo", "--tokenizer", "byte"]) == 0
    out = capsys.readouterr().out
    assert f"ids [s=6]: {list('héllo'.encode())}" in out


def test_cli_encode_errors(tmp_path, capsys):
    assert main(["encode", ""]) == 2
    assert "TEXT is empty" in capsys.readouterr().err
    assert main(["encode", "hi", "--tokenizer", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert "is neither a kind (wordpiece, bpe, byte) nor an existing tokenizer.json" in err
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert main(["encode", "hi", "--tokenizer", str(bad)]) == 2
    assert f"tokenizer file {str(bad)!r} is not valid JSON" in capsys.readouterr().err
    assert main(["encode", "hi", "--tokenizer", "byte", "--dropout", "1.5"]) == 2
    assert "dropout must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_byte_pipeline_runs():
    r = encode_text("ab", byte_tokenizer(), d_model=4)
    assert r.tokens == ["a", "b"] and r.ids.tolist() == [97, 98]


def test_plot_of_a_scheme_acting_in_attention_says_so(tok, tmp_path, monkeypatch):
    """The positional panel of rope holds a note, not an empty heatmap; the layout is constrained
    (the figure title no longer overlaps the panel titles)."""
    import matplotlib.figure

    seen = {}
    real = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        seen["fig"] = fig
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    plot_pipeline(encode_text("the cat sat", tok, scheme="rope", d_model=8), tmp_path / "rope.png")
    fig = seen["fig"]
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("positional part"))
    assert not panel.images and "acts inside attention" in panel.texts[0].get_text()
    assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"


def test_a_query_transform_is_shown_on_the_queries_alone():
    """nope_temperature transforms the queries (its ``queries`` hook), not a rotation of q and k."""
    opts = {"floor_scale": 1.0}  # the factor log1p(p + 1) * 0.1 + 1 moves from position 0
    r = run_pipeline(torch.tensor([1, 2, 3]), 10, scheme="nope_temperature", d_model=8, scheme_options=opts)
    step = r["attention"]
    assert "transforms the queries alone" in step.stats["note"] and "norm_ratio_min" not in step.stats
    x = r["scaled"].tensor  # [s, d]: the scaled embeddings taken as one head's queries
    factor = torch.log1p(torch.arange(3.0) + 1) * 0.1 + 1
    torch.testing.assert_close(step.tensor, x * factor[:, None])
    assert "inside attention: nope_temperature transforms the queries alone" in format_pipeline(r)
