"""posenc.analysis.embeddings: `posenc plot embeddings --checkpoint`."""

import pytest

from posenc.analysis.embeddings import byte_label
from posenc.cli import main
from posenc.model import ModelConfig, TransformerLM, save_model


def test_plot_embeddings_of_a_byte_level_model(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    model = TransformerLM(
        ModelConfig(vocab_size=256, d_model=16, num_layers=1, num_heads=2, position="alibi")
    )
    save_model(model, tmp_path / "lm")
    out = tmp_path / "emb.png"
    code = main(
        [
            "plot",
            "embeddings",
            "--checkpoint",
            str(tmp_path / "lm"),
            "-o",
            str(out),
            "--top-k",
            "64",
        ]
    )
    assert code == 0 and out.stat().st_size > 1000
    assert "64 of 256 tokens" in capsys.readouterr().out
    # labels from a tokenizer given by kind (resolve_tokenizer returns the tokenizer and its description)
    out2 = tmp_path / "emb_byte.png"
    argv = [
        "plot",
        "embeddings",
        "--checkpoint",
        str(tmp_path / "lm"),
        "-o",
        str(out2),
        "--top-k",
        "32",
        "--tokenizer",
        "byte",
    ]
    assert main(argv) == 0 and out2.stat().st_size > 1000
    assert "32 of 256 tokens" in capsys.readouterr().out


def test_plot_embeddings_errors(tmp_path, capsys):
    assert main(["plot", "embeddings", "-o", str(tmp_path / "x.png")]) == 2
    assert "needs --checkpoint PATH" in capsys.readouterr().err
    model = TransformerLM(ModelConfig(vocab_size=50, d_model=16, num_layers=1, num_heads=2, position="nope"))
    save_model(model, tmp_path / "lm")
    assert main(["plot", "embeddings", "--checkpoint", str(tmp_path / "lm"), "-o", "x.png"]) == 2
    assert "pass --tokenizer PATH" in capsys.readouterr().err
    assert main(["plot", "sinusoidal", "-o", str(tmp_path / "x.png")]) == 2
    assert "--kind is required" in capsys.readouterr().err


def testbyte_labels_are_readable():
    assert byte_label(ord("a")) == "a"
    assert byte_label(ord(" ")) == "␣"
    assert byte_label(10) == "\\n"
    assert byte_label(0xE2) == "\\xe2"
    assert len({byte_label(i) for i in range(256)}) == 256
