"""Tests of posenc.lab.compare: two studies on the same bytes compared seed for seed (B - A with a
bootstrap over seeds and documents), from the command line and compare_studies; studies that scored
different bytes are refused; scheme-vs-scheme tests within a study, Holm-corrected, with verdicts."""

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
    assert printed.startswith("B - A, sliding-window bits/byte on the same bytes")
    assert "over seeds and documents" in printed
    a, b = (json.loads((tmp_path / x / "results.json").read_text()) for x in ("a", "b"))
    from posenc.lab.compare import compare_studies
    from posenc.lab.results import read_results

    rows = {r["length"]: r for r in compare_studies(*(read_results(tmp_path / x) for x in ("a", "b")))}
    for i, e in enumerate(a["config"]["eval_lens"]):
        per_seed = [
            statistics.mean(
                wb - wa for wa, wb in zip(ra["eval"][i]["window_bits"], rb["eval"][i]["window_bits"])
            )
            for ra, rb in zip(a["runs"], b["runs"])
        ]
        assert rows[e]["diff"]["mean"] == pytest.approx(statistics.mean(per_seed), abs=1e-6)
        assert rows[e]["seeds"] == [0, 1] and rows[e]["over"] == "seeds and documents"
        assert 0 < rows[e]["diff"]["p_value"] <= 1
    # other evaluation windows: not the same bytes, refused
    assert main([*common, "--split-seed", "1", "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    assert main(["extrapolate", "--compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 2
    assert "the two studies scored different bytes" in capsys.readouterr().err
    assert main(["extrapolate", "--compare", str(tmp_path / "a"), str(tmp_path / "nothing")]) == 2
    assert "--compare: cannot read a study from" in capsys.readouterr().err


def test_paired_rows_pair_two_runs_seed_for_seed():
    from posenc.lab.compare import paired_rows
    from posenc.lab.stats import paired_bootstrap

    def run(seed, bits):
        return {"seed": seed, "eval": [{"length": 8, "window_bits": bits}, {"length": 16, "window_bits": []}]}

    pairs = [(run(0, [1.0, 2.0]), run(0, [0.5, 1.5])), (run(1, [1.0, 1.0]), run(1, [0.8, 0.8]))]
    rows = paired_rows("b", pairs)
    assert len(rows) == 1 and rows[0]["length"] == 8 and rows[0]["seeds"] == [0, 1]  # 16: not measured
    expected = paired_bootstrap([[0.5 - 1.0, 1.5 - 2.0], [0.8 - 1.0, 0.8 - 1.0]], seed=8).to_dict()
    assert rows[0]["diff"] == expected and rows[0]["over"] == "seeds and windows"
    assert rows[0]["diff"]["mean"] == pytest.approx(-0.35)
    one = paired_rows("b", pairs[:1], clusters=[0, 1])[0]
    assert one["over"] == "documents" and one["diff"]["mean"] == pytest.approx(-0.5)


def test_read_results_names_the_flag(tmp_path):
    from posenc.lab.results import read_results

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
    from posenc.lab.results import read_results

    path = tmp_path / "results.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=match) as err:
        read_results(str(tmp_path), "--from")
    assert str(path) in str(err.value) and "--from" in str(err.value)


def _study(runs: dict[str, list[list[float]]], docs: list[int]) -> dict:
    """A results dict with one run per (name, seed): ``runs[name][seed]`` are its window bits at 8."""
    return {
        "eval": {"window_documents": docs},
        "runs": [
            {
                "name": name,
                "variant": None,
                "seed": seed,
                "setting": {},
                "eval": [{"length": 8, "window_bits": bits}],
            }
            for name, per_seed in runs.items()
            for seed, bits in enumerate(per_seed)
        ],
    }


def test_scheme_comparisons_are_paired_tests_with_holm_and_verdicts():
    """B clearly better than A (every window 0.3 lower), C equal to A up to noise: the verdict
    words follow the corrected p-values, and the family is every pair at every length."""
    import torch

    from posenc.lab.compare import format_scheme_comparisons, scheme_comparisons
    from posenc.lab.stats import holm

    g = torch.Generator().manual_seed(0)
    docs = [i // 4 for i in range(80)]  # 20 documents of 4 windows
    base = [(2 + torch.rand(80, generator=g, dtype=torch.float64)).tolist() for _ in range(3)]
    noise = [(0.01 * torch.randn(80, generator=g, dtype=torch.float64)).tolist() for _ in range(3)]
    study = _study(
        {
            "a": base,
            "b": [[x - 0.3 for x in s] for s in base],
            "c": [[x + e for x, e in zip(s, n)] for s, n in zip(base, noise)],
        },
        docs,
    )
    out = scheme_comparisons(study)
    rows = {(r["a"], r["b"]): r for r in out["rows"]}
    assert set(rows) == {("a", "b"), ("a", "c"), ("b", "c")} and out["family"] == 3
    assert rows["a", "b"]["diff"]["mean"] == pytest.approx(-0.3) and rows["a", "b"]["verdict"] == "better"
    assert rows["b", "c"]["verdict"] == "worse" and rows["a", "c"]["verdict"] == "no difference shown"
    assert rows["a", "b"]["diff"]["over"] == "seeds and documents" and rows["a", "b"]["seeds"] == [0, 1, 2]
    raw = [r["diff"]["p_value"] for r in out["rows"]]
    assert [r["p_holm"] for r in out["rows"]] == pytest.approx(holm(raw))
    assert "Holm-corrected over the 3 comparisons" in out["method"]
    table = "\n".join(format_scheme_comparisons(out, markdown=True))
    assert "| b - a | 8 | -0.300 |" in table and "b better" in table and "c no difference shown" in table


def test_verdict_needs_the_corrected_p_value():
    from posenc.lab.compare import verdict

    assert verdict({"mean": -0.1}, 0.01) == "better" and verdict({"mean": 0.1}, 0.01) == "worse"
    assert verdict({"mean": -0.1}, 0.05) == "no difference shown"  # at alpha: not below it
    assert verdict({"mean": -0.1}, None) == "no difference shown"


def test_a_zero_difference_is_never_a_verdict():
    from posenc.lab.compare import verdict

    for higher in (False, True):
        assert verdict({"mean": 0.0}, 1e-6, higher_is_better=higher) == "no difference shown"
    assert (
        verdict({"mean": -0.1}, 1e-6) == "better"
        and verdict({"mean": -0.1}, 1e-6, higher_is_better=True) == "worse"
    )
