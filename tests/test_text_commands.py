"""posenc.text.commands: `posenc encode` (the pipeline itself: test_text_pipeline)."""

from posenc.cli import main


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


def test_encode_refuses_a_text_too_long_to_show_before_building_anything(capsys, monkeypatch):
    """A 40 KB text with alibi built a 13 GB [s, s] bias table."""
    import posenc.text.pipeline as pipeline
    from posenc.text.commands import MAX_ENCODE_TOKENS

    def built(*args, **kwargs):
        raise AssertionError("the pipeline ran")

    monkeypatch.setattr(pipeline, "encode_text", built)
    text = "ab " * (MAX_ENCODE_TOKENS + 1)
    assert main(["encode", text, "--tokenizer", "byte", "--scheme", "alibi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"TEXT has {3 * (MAX_ENCODE_TOKENS + 1):,} tokens" in err
