"""`posenc plot embeddings --checkpoint` (text/commands.py); `posenc encode`: test_text_pipeline."""

import pytest

from posenc.cli import main
from posenc.model import ModelConfig, TransformerLM, save_model
from posenc.text.commands import _byte_label


def test_plot_embeddings_of_a_byte_level_model(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    model = TransformerLM(
        ModelConfig(vocab_size=256, d_model=16, num_layers=1, num_heads=2, position="alibi")
    )
    save_model(model, tmp_path / "lm.safetensors")
    out = tmp_path / "emb.png"
    code = main(
        [
            "plot",
            "embeddings",
            "--checkpoint",
            str(tmp_path / "lm.safetensors"),
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
        str(tmp_path / "lm.safetensors"),
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
    save_model(model, tmp_path / "lm.safetensors")
    assert main(["plot", "embeddings", "--checkpoint", str(tmp_path / "lm.safetensors"), "-o", "x.png"]) == 2
    assert "pass --tokenizer PATH" in capsys.readouterr().err
    assert main(["plot", "sinusoidal", "-o", str(tmp_path / "x.png")]) == 2
    assert "--kind is required" in capsys.readouterr().err


def test_byte_labels_are_readable():
    assert _byte_label(ord("a")) == "a"
    assert _byte_label(ord(" ")) == "␣"
    assert _byte_label(10) == "\\n"
    assert _byte_label(0xE2) == "\\xe2"
    assert len({_byte_label(i) for i in range(256)}) == 256


def test_encode_caps_rows_and_shows_all_on_request(capsys):
    text = " ".join(f"w{i}" for i in range(40))
    assert main(["encode", text, "--tokenizer", "byte", "--rows", "5"]) == 0
    out = capsys.readouterr().out
    s = len(text.encode())
    assert f"    ... {s - 5:,} more rows (posenc encode --all shows every row)" in out
    assert f"({s - 20:,} more)" in out.splitlines()[1]  # the token list: 4 x rows entries, then a count
    assert main(["encode", text, "--tokenizer", "byte", "--all"]) == 0
    full = capsys.readouterr().out
    assert "more rows" not in full and len(full.splitlines()) > len(out.splitlines()) + 5 * (s - 5)


def test_encode_shows_what_attention_schemes_do(capsys):
    import re

    assert main(["encode", "the cat the cat", "--tokenizer", "byte", "--scheme", "rope"]) == 0
    out = capsys.readouterr().out
    step6 = out.split("\n6. ")[1].split("\n7. ")[0]
    assert (
        step6.startswith("inside attention: rope turns q and k")
        and "|R_p x| / |x| is 1.0000 .. 1.0000" in step6
    )
    assert "+0.000, +0.000, +0.000, +0.000, +0.000, +0.000" not in step6
    assert main(["encode", "the cat", "--tokenizer", "byte", "--scheme", "alibi"]) == 0
    step6 = capsys.readouterr().out.split("\n6. ")[1].split("\n7. ")[0]
    assert "alibi adds a bias to the attention logits" in step6
    first = re.findall(r"[-+]\d\.\d+", step6.splitlines()[2])  # the second query: keys 0, 1, ...
    assert float(first[0]) < 0 and float(first[1]) == 0.0  # distance 1 penalised, distance 0 not
