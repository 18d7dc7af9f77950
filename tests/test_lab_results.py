"""Tests of posenc.lab.results: results.json written from typed records with a schema version, read
back into the same types, and older files migrated or refused in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from _lab_toys import tiny_study, write_corpus
from posenc.cli import main
from posenc.lab.config import StudyConfig
from posenc.lab.extrapolate import run_study
from posenc.lab.results import (
    SCHEMA_VERSION,
    CellRecord,
    RunRecord,
    StudyResults,
    TrainingRecord,
    read_results,
)
from posenc.lab.tables import format_table


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A finished tiny study (two schemes, one seed) and its folder."""
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"))
    out = tmp_path_factory.mktemp("study") / "run"
    results = run_study(tiny_study(corpus, schemes=("alibi", "rope"), variants=("yarn",)), out=out, log=None)
    return results, out


#: The configuration fields results.json held before the schema was versioned (schema 1).
SCHEMA_1_FIELDS = [
    "schemes",
    "mode",
    "train_len",
    "eval_lens",
    "steps",
    "batch_size",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "position_lr_scale",
    "seeds",
    "split_seed",
    "corpus",
    "max_chars",
    "val_fraction",
    "d_model",
    "num_layers",
    "num_heads",
    "dropout",
    "eval_windows",
    "score_len",
    "variants",
    "position_options",
    "eval_examples",
    "curriculum_steps",
    "eval_batch_tokens",
    "checkpoint_every",
    "vary",
    "randomized_positions",
    "finetune_len",
    "finetune_steps",
    "diagnostic_windows",
]


def _flat(config: dict) -> dict:
    """The configuration as results.json held it in schema 1: the fields posenc wrote then."""
    return {k: v for k, v in config.items() if k in SCHEMA_1_FIELDS}


def test_results_json_carries_the_schema_version_and_round_trips_through_its_types(study):
    results, out = study
    assert isinstance(results, StudyResults) and results.schema_version == SCHEMA_VERSION == 2
    saved = json.loads((out / "results.json").read_text())
    assert next(iter(saved)) == "schema_version" and saved["schema_version"] == 2
    assert saved == results.to_dict()
    back = read_results(out, "--from")
    assert back == results  # the same typed records: config, cells, runs, summaries
    assert isinstance(back.config, StudyConfig) and isinstance(back.runs[0], RunRecord)
    assert isinstance(back.cells[0], CellRecord) and isinstance(back.cells[0].train, TrainingRecord)
    assert [r.name for r in back.runs] == ["alibi", "rope", "rope+yarn"]
    assert back.to_dict() == saved
    assert format_table(back) == format_table(results)
    cell = CellRecord.from_dict(json.loads((out / "cells" / "rope-seed0.json").read_text()))
    assert cell.key is not None and [r.name for r in cell.runs] == ["rope", "rope+yarn"]
    assert CellRecord.from_dict(json.loads(json.dumps(cell.to_dict()))) == cell


def test_a_results_json_without_a_schema_version_is_migrated(study, tmp_path, capsys):
    results, _ = study
    old = results.to_dict()
    del old["schema_version"]
    old["config"] = _flat(old["config"])
    (tmp_path / "results.json").write_text(json.dumps(old))
    migrated = read_results(tmp_path, "--from")
    assert migrated.config == results.config and migrated.schema_version == SCHEMA_VERSION
    assert migrated.runs == results.runs and migrated.summary == results.summary
    assert main(["extrapolate", "--from", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("paired delta vs L=8")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"schema_version": 3}, "has schema_version 3; this posenc reads up to 2: upgrade posenc"),
        ({"schema_version": "2"}, "has schema_version '2', not a version number"),
        ({"surprise": 1}, r"unknown field\(s\) \['surprise'\] for a StudyResults"),
        ({"config": {"schemes": ["alibi"], "stride": 4}}, r"field 'config': unknown StudyConfig field\(s\)"),
        ({"config": {"schemes": ["ropee"]}}, "field 'config': unknown scheme 'ropee'"),
        ({"runs": [{"name": "alibi"}]}, r"run 0 lacks field\(s\) \['variant', 'eval'\] of a RunRecord"),
        ({"runs": [{"name": "a", "variant": None, "eval": 3}]}, "run 0 field 'eval' is not a list"),
        ({"cells": [{"cell": "x"}]}, r"cell 0 lacks field\(s\)"),
        ({"cells": {}}, "field 'cells' is not a list"),
    ],
)
def test_a_bad_results_json_is_one_line_naming_the_file(study, tmp_path, change, match, capsys):
    results, _ = study
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**results.to_dict(), **change}))
    with pytest.raises(ValueError, match=match) as err:
        read_results(tmp_path, "--from")
    assert str(path) in str(err.value) and "--from" in str(err.value)
    assert main(["extrapolate", "--from", str(tmp_path)]) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and str(path) in line and "Traceback" not in line


def test_a_cell_file_that_is_not_a_cell_record_is_refused_with_the_fix(study, tmp_path):
    from posenc.lab.cells import finished_cell

    _, out = study
    data = json.loads((out / "cells" / "alibi-seed0.json").read_text())
    bad = tmp_path / "alibi-seed0.json"
    bad.write_text(json.dumps({**data, "train": {"steps": "many"}}))
    with pytest.raises(ValueError, match=r"lacks field\(s\) .* delete it and resume to run the cell again"):
        finished_cell(bad, data["key"])
    assert finished_cell(bad, {"other": "key"}) is None  # run with other settings: run again
    good = finished_cell(out / "cells" / "alibi-seed0.json", data["key"])
    assert good.reused and dataclasses.replace(good, reused=None).to_dict() == data
