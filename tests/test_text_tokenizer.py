"""Tests of posenc.text.tokenizer: WordPiece/BPE training, the byte tokenizer, save/load, errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.text.tokenizer import (
    BERT_SPECIAL_TOKENS,
    TOKENIZER_KINDS,
    Tokenizer,
    build_tokenizer,
    byte_symbols,
    byte_tokenizer,
    load_tokenizer,
    train_bpe,
    train_wordpiece,
)

# A tiny corpus holding seed 002's words (written for this test, nothing downloaded).
CORPUS = [
    "The cat sat on the mat.",
    "A dog sat on the log. The cat saw the dog.",
    "On the mat the cat sat, and the dog sat on the log.",
    "The mat is red; the log is brown. A cat and a dog.",
] * 4

SEED_002 = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]


@pytest.fixture(scope="module")
def wordpiece() -> Tokenizer:
    return train_wordpiece(CORPUS, vocab_size=200)


def test_wordpiece_reproduces_seed_002(wordpiece):
    # Seed 002 section 1.1: ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"] (it omits the
    # final "." which BERT's pre-tokenizer splits off as its own token).
    enc = wordpiece.encode("The cat sat on the mat.")
    assert enc.tokens == SEED_002
    assert enc.ids[0] == wordpiece.token_to_id("[CLS]") and enc.ids[-1] == wordpiece.token_to_id("[SEP]")
    assert [wordpiece.id_to_token(i) for i in enc.ids] == enc.tokens
    assert enc.ids[1] == enc.ids[5]  # "the" twice, one id
    assert wordpiece.encode_tensor("The cat sat on the mat.").tolist() == enc.ids


def test_wordpiece_specials_and_lowercase(wordpiece):
    assert wordpiece.special_tokens == list(BERT_SPECIAL_TOKENS)
    assert [wordpiece.token_to_id(t) for t in BERT_SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert wordpiece.pad_id == 0
    assert wordpiece.encode("THE CAT").tokens == wordpiece.encode("the cat").tokens
    # A word never seen is split into pieces or [UNK]; "zebra" letters z,e,b are not in the corpus.
    assert "[UNK]" in wordpiece.encode("zebra").tokens
    assert wordpiece.encode("the cat", add_special_tokens=False).tokens == ["the", "cat"]
    assert wordpiece.decode(wordpiece.encode("The cat sat.").ids) == "the cat sat."
    assert wordpiece.kind == "wordpiece" and wordpiece.vocab_size <= 200


def test_wordpiece_pair_template(wordpiece):
    enc = wordpiece.hf.encode("the cat", "the dog")
    assert enc.tokens == ["[CLS]", "the", "cat", "[SEP]", "the", "dog", "[SEP]"]
    assert enc.type_ids == [0, 0, 0, 0, 1, 1, 1]


def test_wordpiece_ids_depend_only_on_the_token_set():
    # HF's trainer numbers tokens in hash order (and may break count ties differently between
    # runs, see train_wordpiece's caveat); posenc renumbers them: specials, then code-point order.
    tok = train_wordpiece(CORPUS, vocab_size=150)
    vocab = tok.hf.get_vocab()
    order = sorted(vocab, key=vocab.get)
    assert order[:5] == list(BERT_SPECIAL_TOKENS) and order[5:] == sorted(order[5:])
    assert sorted(vocab.values()) == list(range(len(vocab)))


def test_bpe_training_is_deterministic():
    a = train_bpe(CORPUS, vocab_size=300)
    b = train_bpe(CORPUS, vocab_size=300)
    assert a.hf.get_vocab() == b.hf.get_vocab()


def test_bpe_round_trips_and_merges():
    tok = train_bpe(CORPUS, vocab_size=300)
    text = "The cat sat on the mat. Ünïcödé 😀 is never [UNK]"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text
    assert len(enc.ids) < len(text.encode())  # merges learnt: fewer tokens than bytes
    assert tok.kind == "bpe" and tok.token_to_id("<|endoftext|>") == 0


def test_byte_symbols_match_library():
    from tokenizers.pre_tokenizers import ByteLevel

    syms = byte_symbols()
    assert len(syms) == 256 and set(syms) == set(ByteLevel.alphabet())
    pre = ByteLevel(add_prefix_space=False, use_regex=False)
    # The library's own stand-in for every byte reachable from a str (all of ASCII and, through
    # two-byte characters, the continuation bytes 0x80..0xBF and the lead bytes 0xC2, 0xC3).
    for b in range(128):
        assert pre.pre_tokenize_str(chr(b))[0][0] == syms[b]
    for c in range(0x80, 0x100):
        raw = chr(c).encode()
        assert pre.pre_tokenize_str(chr(c))[0][0] == "".join(syms[x] for x in raw)


def test_byte_ids_are_byte_values():
    tok = byte_tokenizer()
    text = "héllo\x00\n😀"
    assert tok.encode(text).ids == list(text.encode("utf-8"))
    assert tok.vocab_size == 256 and tok.special_tokens == []
    with_specials = byte_tokenizer(["<|bos|>", "<|eos|>"])
    assert with_specials.vocab_size == 258
    assert with_specials.encode("<|bos|>a<|eos|>").ids == [256, 97, 257]


@settings(deadline=None, max_examples=50)
@given(st.text())
def test_byte_round_trips_any_text(text):
    tok = _BYTE
    enc = tok.encode(text)
    assert enc.ids == list(text.encode("utf-8"))
    assert tok.decode(enc.ids) == text


_BYTE = byte_tokenizer()


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "byte"])
def test_save_load_round_trip(tmp_path, kind):
    options = {} if kind == "byte" else {"vocab_size": 300}
    tok = build_tokenizer(kind, None if kind == "byte" else CORPUS, **options)
    path = tok.save(tmp_path)
    assert path.name == "tokenizer.json"
    json.loads(path.read_text())  # a real JSON file
    back = load_tokenizer(path)
    assert back.kind == kind and back.vocab_size == tok.vocab_size
    text = "The cat sat on the mat. Ünïcödé"
    assert back.encode(text) == tok.encode(text)
    assert load_tokenizer(tmp_path).kind == kind  # a directory holding tokenizer.json
    # the file is a standard tokenizer.json that Hugging Face reads too
    from tokenizers import Tokenizer as HF

    assert HF.from_file(str(path)).encode(text).ids == tok.encode(text).ids


def test_registry_and_errors(tmp_path):
    assert set(TOKENIZER_KINDS) == {"wordpiece", "bpe", "byte"}
    with pytest.raises(ValueError, match="unknown tokenizer kind 'sentencepiece'; valid kinds: wordpiece"):
        build_tokenizer("sentencepiece", CORPUS)
    with pytest.raises(ValueError, match="'wordpiece' is trained: pass texts"):
        build_tokenizer("wordpiece")
    with pytest.raises(ValueError, match="'byte' needs no training"):
        build_tokenizer("byte", CORPUS)
    with pytest.raises(ValueError, match="texts is empty"):
        train_wordpiece(["", "  "])
    with pytest.raises(TypeError, match="not a single str; wrap it in a list"):
        train_wordpiece("The cat sat on the mat.")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        train_bpe(["ok", 3])
    with pytest.raises(ValueError, match="vocab_size must be >= 257"):
        train_bpe(CORPUS, vocab_size=100)
    with pytest.raises(TypeError, match="special_tokens must be a sequence of str"):
        byte_tokenizer("<|bos|>")
    with pytest.raises(TypeError, match="text must be a str"):
        _BYTE.encode(b"bytes")


def test_load_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ValueError, match=r"tokenizer file '.*nope\.json' does not exist"):
        load_tokenizer(missing)
    corrupt = tmp_path / "bad.json"
    corrupt.write_text("{ this is not json")
    with pytest.raises(ValueError, match=r"tokenizer file '.*bad\.json' is not valid JSON"):
        load_tokenizer(corrupt)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(ValueError, match=r"wrong\.json' is not a valid tokenizer\.json"):
        load_tokenizer(wrong)
    with pytest.raises(ValueError, match=r"'.*empty_dir/tokenizer\.json' does not exist"):
        (tmp_path / "empty_dir").mkdir()
        load_tokenizer(tmp_path / "empty_dir")


def _hostile(tmp_path, wordpiece, change) -> str:
    """``wordpiece`` saved, its JSON changed by ``change(spec)``, written back; the file's path."""
    path = wordpiece.save(tmp_path / "tokenizer.json")
    spec = json.loads(path.read_text())
    change(spec)
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s["model"]["vocab"].update(zzz=10**9), r"'model.vocab' holds the id 1000000000; ids are"),
        (lambda s: s["model"]["vocab"].update(zzz=4 * 10**9), r"'model.vocab' holds the id 4000000000"),
        (lambda s: s["model"]["vocab"].update(zzz="7"), r"'model.vocab' holds the id '7'"),
        (lambda s: s["added_tokens"][0].update(id=-1), r"'added_tokens\[\].id' holds the id -1"),
        (lambda s: s.update(padding={"strategy": {"Fixed": 10**8}}), "'padding' asks for length 100000000"),
        (lambda s: s.update(truncation={"max_length": 2**62}), "'truncation' asks for length"),
        (lambda s: s.update(padding=[]), "'padding' must be an object or null, got list"),
        (lambda s: s.update(model=[1]), "'model' must be an object, got list"),
        (lambda s: s["model"].update(vocab=[["a", 1]]), "'model.vocab' must be an object of token -> id"),
        (lambda s: s.update(deep=json.loads("[" * 40 + "]" * 40)), "nests lists/objects more than 32"),
    ],
)
def test_a_hostile_tokenizer_file_is_refused_before_it_costs_anything(tmp_path, wordpiece, change, match):
    """An id of 10^9 made `tokenizers` fill a 4 GB table (4*10^9 aborted the process); fixed padding
    of 10^8 aborted in Rust after 6.7 GB: each is refused first, naming the file and the field."""
    path = _hostile(tmp_path, wordpiece, change)
    with pytest.raises(ValueError, match=f"tokenizer file '{path}'.*" + match):
        load_tokenizer(path)


def test_a_tokenizer_file_nested_past_the_recursion_limit_is_a_value_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"tokenizer\.json' nests lists/objects more than 32 deep"):
        load_tokenizer(path)


def test_a_tokenizer_whose_regex_cannot_run_raises_a_value_error(tmp_path, wordpiece):
    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    tok = load_tokenizer(_hostile(tmp_path, wordpiece, lambda s: s.update(pre_tokenizer=split)))
    with pytest.raises(ValueError, match=r"the tokenizer failed on this text .*retry-limit"):
        tok.encode("a" * 40_000 + "!")


def test_save_replaces_a_symlink_instead_of_writing_through_it(tmp_path, wordpiece):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tokenizer.json").symlink_to(outside)
    path = wordpiece.save(tmp_path / "m")
    assert outside.read_text() == "not yours" and not path.is_symlink()
    assert load_tokenizer(path).vocab_size == wordpiece.vocab_size
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["tokenizer.json"]  # no temporary left
