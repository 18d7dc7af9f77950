"""Tests of posenc.lab.tasks: the ranking of schemes past the trained length, and whether each
learned the task at it."""

from __future__ import annotations

import pytest

from posenc.lab.stats import T_975
from posenc.lab.tasks import LEARNED_AT, format_ranking, task_ranking


def _run(name: str, seed: int, accuracies: dict[int, float | None]) -> dict:
    points = [{"length": n, "accuracy": a, "token_accuracy": a} for n, a in accuracies.items()]
    return {"name": name, "seed": seed, "eval": points}


RUNS = [
    _run("alibi", 0, {4: 1.0, 8: 0.99, 12: 0.0, 16: 0.0}),
    _run("alibi", 1, {4: 1.0, 8: 0.97, 12: 0.2, 16: 0.0}),
    _run("nope", 0, {4: 1.0, 8: 0.90, 12: 0.5, 16: 0.1}),
    _run("nope", 1, {4: 1.0, 8: 0.98, 12: 0.7, 16: 0.3}),
    _run("learned", 0, {4: 1.0, 8: 1.0, 12: None, 16: None}),
    _run("learned", 1, {4: 1.0, 8: 1.0, 12: None, 16: None}),
]


def test_ranking_orders_by_exact_match_past_L_across_seeds():
    ranking = task_ranking(RUNS, train_len=8)
    assert [r["name"] for r in ranking] == ["nope", "alibi", "learned"]
    nope = ranking[0]
    per_seed = [(0.5 + 0.1) / 2, (0.7 + 0.3) / 2]  # mean over lengths 12 and 16, per seed
    assert nope["beyond_L"]["mean"] == pytest.approx(sum(per_seed) / 2)
    half = T_975[0] * abs(per_seed[1] - per_seed[0]) / 2  # t interval: sd / sqrt(2) = |diff| / 2
    assert nope["beyond_L"]["high"] - nope["beyond_L"]["mean"] == pytest.approx(half)
    assert nope["at_L"]["mean"] == pytest.approx(0.94) and nope["at_L"]["n"] == 2
    assert nope["learned"] is False  # 0.94 < 0.95 in distribution
    assert ranking[1]["learned"] is True and ranking[1]["seeds"] == [0, 1]
    assert ranking[2]["beyond_L"] is None and ranking[2]["learned"] is True  # learned positions: n/a past L
    assert ranking[0]["lengths"] == [12, 16]
    assert LEARNED_AT == 0.95


def test_ranking_text_and_markdown():
    ranking = task_ranking(RUNS, train_len=8)
    lines = format_ranking(ranking, 8)
    assert lines[0].startswith("ranking by mean exact match past L=8 (lengths 12,16)")
    assert lines[2].split()[:2] == ["nope", "0.940"] and lines[2].split()[-1] == "no"
    assert lines[4].split() == ["learned", "1.000", "±0.000", "n/a", "n/a", "yes"]
    md = format_ranking(ranking, 8, markdown=True)
    assert md[2] == "| scheme | exact match at L | exact match past L | tokens right past L | learned |"
    assert md[4].startswith("| nope | 0.940 ±") and md[4].endswith("| no |")


def test_ties_in_exact_match_are_broken_by_the_tokens_right():
    runs = [_run("rope", 0, {8: 1.0, 12: 0.0}), _run("t5", 0, {8: 1.0, 12: 0.0})]
    runs[1]["eval"][1]["token_accuracy"] = 0.4  # t5 gets more answer tokens right past L
    runs[0]["eval"][1]["token_accuracy"] = 0.1
    ranking = task_ranking(runs, train_len=8)
    assert [r["name"] for r in ranking] == ["t5", "rope"]
    assert ranking[0]["beyond_L_tokens"] == {
        "mean": 0.4,
        "low": None,
        "high": None,
        "n": 1,
        "over": "seeds",
        "p_value": None,
    }
    old = [
        {**r, "eval": [{"length": p["length"], "accuracy": p["accuracy"]} for p in r["eval"]]} for r in runs
    ]
    assert task_ranking(old, train_len=8)[0]["beyond_L_tokens"] is None  # results of older versions


def test_ranking_per_length_orders_the_runs_with_their_intervals():
    """Just past L the schemes separate; the order is per length, best first, intervals kept."""
    from posenc.lab.stats import wilson_interval
    from posenc.lab.tasks import format_ranking_by_length, ranking_by_length

    def row(name, n, k):
        return {"name": name, "length": n, "accuracy": wilson_interval(k, 200).to_dict()}

    summary = [
        row("nope", 8, 200),
        row("rope", 8, 200),
        row("alibi", 8, 199),
        row("nope", 9, 200),
        row("alibi", 9, 169),
        row("rope", 9, 11),
        row("nope", 10, 193),
        row("alibi", 10, 0),
        row("rope", 10, 0),
        {"name": "learned", "length": 9, "accuracy": None},
    ]
    by_length = ranking_by_length(summary, 8)
    assert [r["length"] for r in by_length] == [9, 10]
    assert [e["name"] for e in by_length[0]["order"]] == ["nope", "alibi", "rope"]
    assert by_length[0]["order"][1]["accuracy"]["mean"] == 169 / 200
    lines = format_ranking_by_length(by_length)
    assert lines[0].endswith("NoPE > T5 > ALiBi ~ RoPE > absolute")
    assert lines[1].startswith("9: nope 1.000 [0.981, 1.000] > alibi 0.845 [")


def _per_question(name: str, seed: int, correct: dict[int, list[int]]) -> dict:
    points = [{"length": n, "accuracy": sum(c) / len(c), "example_correct": c} for n, c in correct.items()]
    return {"name": name, "seed": seed, "eval": points}


def test_task_comparisons_pair_questions_and_seeds_and_give_verdicts():
    """B - A exact match per question past L: a scheme right on every question where the other is
    wrong on most is "better" (and the other "worse"), an identical one "no difference shown";
    lengths at or below L are not compared; Holm counts every comparison."""
    from posenc.lab.tasks import task_comparisons

    good = [1] * 40
    poor = [1 if i % 10 == 0 else 0 for i in range(40)]  # 4 of 40
    runs = []
    for seed in (0, 1, 2):
        runs += [
            _per_question("nope", seed, {8: good, 9: good, 10: poor}),
            _per_question("rope", seed, {8: good, 9: poor, 10: poor}),
            _per_question("alibi", seed, {8: good, 9: good, 10: poor}),
        ]
    cmp = task_comparisons(runs, train_len=8)
    assert cmp["higher_is_better"] is True and cmp["family"] == 6  # 3 pairs x lengths 9, 10
    rows = {(r["a"], r["b"], r["length"]): r for r in cmp["rows"]}
    assert set(rows) == {
        (a, b, n) for a, b in [("nope", "rope"), ("nope", "alibi"), ("rope", "alibi")] for n in (9, 10)
    }
    worse = rows["nope", "rope", 9]
    assert worse["diff"]["mean"] == pytest.approx(-0.9) and worse["verdict"] == "worse"
    assert worse["diff"]["over"] == "seeds and questions" and worse["seeds"] == [0, 1, 2]
    assert rows["rope", "alibi", 9]["verdict"] == "better"
    assert rows["nope", "alibi", 9]["verdict"] == "no difference shown"
    assert rows["nope", "alibi", 9]["diff"]["p_value"] == 1.0
    assert all(r["p_holm"] >= r["diff"]["p_value"] for r in cmp["rows"])


def test_task_comparisons_need_per_question_records():
    """Results of earlier versions (no per-question records) give no comparisons, not made-up ones;
    a run with another number of questions is not paired."""
    from posenc.lab.tasks import task_comparisons

    assert task_comparisons(RUNS, train_len=8) is None
    runs = [_per_question("a", 0, {9: [1, 0, 1]}), _per_question("b", 0, {9: [1, 1]})]
    assert task_comparisons(runs, train_len=8) is None


def test_task_comparisons_include_settings_and_variants():
    """Randomized positions and their re-sampled evaluation are runs of their own, compared with
    the plain run (Ruoss et al.'s claim is one of these pairs); fine-tuned runs are left out."""
    from posenc.lab.tasks import task_comparisons

    names = ["rope", "rope[random_positions=64]", "rope[random_positions=64]+resampled"]
    runs = [_per_question(n, s, {9: [1, 0] * 10}) for s in (0, 1) for n in names]
    runs.append({**_per_question("rope+ft16", 0, {9: [1] * 20}), "finetune": {"len": 16}})
    rows = task_comparisons(runs, train_len=8)["rows"]
    assert {(r["a"], r["b"]) for r in rows} == {(a, b) for i, a in enumerate(names) for b in names[i + 1 :]}


def test_task_comparisons_are_printed_with_the_study():
    """The study's tables print the comparisons with the accuracy direction (> 0: B is better)."""
    from posenc.lab.compare import format_scheme_comparisons
    from posenc.lab.tasks import task_comparisons

    runs = [_per_question(n, s, {9: c}) for s in (0, 1) for n, c in (("a", [0] * 30), ("b", [1] * 30))]
    lines = format_scheme_comparisons(task_comparisons(runs, train_len=8))
    assert "exact match on the same questions and seeds (> 0: B is better)" in lines[0]
    assert any(line.startswith("b - a") and line.rstrip().endswith("b better") for line in lines)
