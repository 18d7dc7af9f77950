"""Tests of posenc.analysis.section_cache: a scheme's section is stored once and read back by the
next build with the same inputs (not drawn again), drawn anew when an input changes or the stored
file is damaged, and a cache that cannot be written is skipped."""

from __future__ import annotations

from posenc.analysis import report as report_module
from posenc.analysis.report import REPORT_CONTEXT, _parts
from posenc.analysis.section_cache import load_section, section_key

SMALL = {**REPORT_CONTEXT, "d_model": 16, "head_dim": 8, "num_heads": 2, "max_len": 32}
NAMES = ["nope", "alibi"]


def test_a_second_build_reads_the_sections_back(tmp_path, monkeypatch):
    first = _parts(NAMES, SMALL, 40, 1, None, tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 2

    def never(*args, **kwargs):
        raise AssertionError("a stored section was drawn again")

    monkeypatch.setattr(report_module, "_scheme_part", never)
    again = _parts(NAMES, SMALL, 40, 1, None, tmp_path)
    for a, b in zip(first, again):
        assert a["section"] == b["section"] and a["profile"] == b["profile"] and a["group"] == b["group"]
        assert [(r.property, r.status, r.value) for r in a["results"] or []] == [
            (r.property, r.status, r.value) for r in b["results"] or []
        ]


def test_a_changed_input_or_a_damaged_file_is_drawn_anew(tmp_path):
    key = section_key("nope", SMALL, 40, None)
    assert len({key, section_key("nope", {**SMALL, "max_len": 64}, 40, None)}) == 2
    assert section_key("nope", SMALL, 41, None) != key
    assert section_key("nope", SMALL, 40, {"config": {}}) != key
    assert section_key("alibi", SMALL, 40, None) != key
    _parts(["nope"], SMALL, 40, 1, None, tmp_path)
    stored = tmp_path / f"{key}.json"
    assert load_section(tmp_path, key) is not None
    for damage in (
        "{not json",
        '{"section": 1}',
        "[]",
        '{"section": "x", "results": [{"bad": 1}], '
        '"profile": null, "group": "none", "trainable": false, "sequence": true, "along": null}',
    ):
        stored.write_text(damage, encoding="utf-8")
        assert load_section(tmp_path, key) is None
    stored.write_bytes(b"\xff\xfe")
    assert load_section(tmp_path, key) is None
    (part,) = _parts(["nope"], SMALL, 40, 1, None, tmp_path)  # drawn again and stored again
    assert "nope" in part["section"] and load_section(tmp_path, key) is not None


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be", encoding="utf-8")
    (part,) = _parts(["nope"], SMALL, 40, 1, None, blocked / "sections")
    assert part["group"] == "none"
