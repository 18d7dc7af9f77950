"""Tests of posenc.lab.compare: two studies on the same bytes compared seed for seed (B - A with a
t interval over seeds), from the command line and compare_studies; studies that scored different
bytes are refused."""

from __future__ import annotations

import json
import statistics

import pytest

from _lab_toys import TINY, write_corpus
from posenc.cli import main


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_docs=40, size=3000)  # 4 validation documents


def test_compare_two_studies_on_the_same_bytes(tmp_path, corpus_dir, capsys):
    common = ["extrapolate", "--schemes", "t5", "--seeds", "0,1", "--corpus", str(corpus_dir), *TINY]
    assert main([*common, "--position-lr-scale", "1", "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["extrapolate", "--compare", str(tmp_path / "a"), str(tmp_path / "b" / "results.json")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("B - A, sliding-window bits/byte on the same bytes") and "over seeds" in printed
    a, b = (json.loads((tmp_path / x / "results.json").read_text()) for x in ("a", "b"))
    from posenc.lab.compare import compare_studies

    rows = {r["length"]: r for r in compare_studies(a, b)}
    for i, e in enumerate(a["config"]["eval_lens"]):
        per_seed = [
            statistics.mean(
                wb - wa for wa, wb in zip(ra["eval"][i]["window_bits"], rb["eval"][i]["window_bits"])
            )
            for ra, rb in zip(a["runs"], b["runs"])
        ]
        assert rows[e]["diff"]["mean"] == pytest.approx(statistics.mean(per_seed), abs=1e-6)
        assert rows[e]["seeds"] == [0, 1] and rows[e]["over"] == "seeds"
    # other evaluation windows: not the same bytes, refused
    assert main([*common, "--split-seed", "1", "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    assert main(["extrapolate", "--compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 2
    assert "the two studies scored different bytes" in capsys.readouterr().err
    assert main(["extrapolate", "--compare", str(tmp_path / "a"), str(tmp_path / "nothing")]) == 2
    assert "--compare: cannot read a study from" in capsys.readouterr().err


def test_paired_rows_pair_two_runs_seed_for_seed():
    from posenc.lab.compare import paired_rows
    from posenc.lab.stats import seed_interval

    def run(seed, bits):
        return {"seed": seed, "eval": [{"length": 8, "window_bits": bits}, {"length": 16, "window_bits": []}]}

    pairs = [(run(0, [1.0, 2.0]), run(0, [0.5, 1.5])), (run(1, [1.0, 1.0]), run(1, [0.8, 0.8]))]
    rows = paired_rows("b", pairs)
    assert len(rows) == 1 and rows[0]["length"] == 8 and rows[0]["seeds"] == [0, 1]  # 16: not measured
    assert (
        rows[0]["diff"] == pytest.approx(seed_interval([-0.5, -0.2]).to_dict()) and rows[0]["over"] == "seeds"
    )
    one = paired_rows("b", pairs[:1])[0]
    assert one["over"] == "windows" and one["diff"]["mean"] == pytest.approx(-0.5)


def test_read_results_names_the_flag(tmp_path):
    from posenc.lab.compare import read_results

    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ValueError, match=r"--from: .* is not a results\.json of posenc extrapolate"):
        read_results(str(tmp_path), "--from")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("[" * 100_000 + "]" * 100_000, "nests lists/objects more than 32 deep"),
        ('{"config": [], "runs": [], "eval": {}, "summary": []}', "field 'config' is not a dict"),
        ('{"config": {}, "runs": {}, "eval": {}, "summary": []}', "field 'runs' is not a list"),
        (b'{"config": "\xff"}', "is not valid JSON"),
    ],
)
def test_a_crafted_results_json_is_one_line_naming_the_file(tmp_path, content, match):
    from posenc.lab.compare import read_results

    path = tmp_path / "results.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=match) as err:
        read_results(str(tmp_path), "--from")
    assert str(path) in str(err.value) and "--from" in str(err.value)
