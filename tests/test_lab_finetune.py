"""Tests of posenc.lab.finetune: which cells a study fine-tunes (asked of the scheme, never by
name), that a fine-tuning run starts from the trained checkpoint's weights, AdamW moments and RNG,
its recipe and cost, the paired comparison with the same weights before fine-tuning, resume, and
the errors."""

from __future__ import annotations

import pytest
import safetensors
import torch

from _lab_toys import states_equal, tiny_study, write_corpus
from posenc.lab.cells import Cell, study_cells
from posenc.lab.checkpoint import load_trained_model
from posenc.lab.data import study_data
from posenc.lab.extrapolate import run_study
from posenc.lab.finetune import FinetuneCell, finetune_cells, finetune_config
from posenc.lab.tables import format_table
from posenc.model import TransformerLM


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _config(corpus, **kw):
    fields = dict(
        schemes=("alibi", "rope"), seeds=(0, 1), variants=("linear",), finetune_len=16, finetune_steps=2
    )
    return tiny_study(corpus, **{**fields, **kw})


def test_cells_per_variant_the_scheme_declares_with_controls_for_every_scheme(corpus_dir):
    """Every scheme gets the same fine-tuning budget (learned positions cannot reach 16: only its
    control), and every trained cell a control continued at L=8."""
    config = _config(corpus_dir, schemes=("alibi", "rope", "learned"), variants=("linear", "yarn"))
    cells = finetune_cells(config, study_cells(config))
    names = [c.name for c in cells]
    assert names[:4] == ["alibi+ft16-seed0", "alibi+cont8-seed0", "alibi+ft16-seed1", "alibi+cont8-seed1"]
    assert names[4:8] == [
        "rope+ft16-seed0",
        "rope+linear+ft16-seed0",
        "rope+yarn+ft16-seed0",
        "rope+cont8-seed0",
    ]
    assert names[-2:] == ["learned+cont8-seed0", "learned+cont8-seed1"] and len(names) == 14
    assert [c.before for c in cells[4:8]] == ["rope", "rope+linear", "rope+yarn", "rope"]
    control = cells[7]
    assert control.control and control.length == 8
    # the same tokens per step: the control trains B windows of L, fine-tuning B L / E_ft of E_ft
    tc_ft, tc_control = finetune_config(config, 0), finetune_config(config, 0, 8)
    assert tc_ft.batch_size * tc_ft.seq_len == tc_control.batch_size * tc_control.seq_len == 4 * 8
    assert tc_control.steps == tc_ft.steps == 2
    assert finetune_cells(_config(corpus_dir, finetune_len=0, finetune_steps=0), study_cells(config)) == []


def test_recipe_keeps_the_tokens_per_step():
    from posenc.lab.config import StudyConfig

    config = StudyConfig(
        ("rope",),
        train_len=64,
        eval_lens=(64, 256),
        batch_size=32,
        min_lr=2e-4,
        finetune_len=256,
        finetune_steps=50,
    )
    tc = finetune_config(config, seed=3)
    assert (tc.steps, tc.seq_len, tc.batch_size, tc.seed) == (50, 256, 8, 3)
    assert tc.lr == tc.min_lr == 2e-4 and tc.warmup_steps == 0 and tc.random_positions == 0


def test_finetuning_starts_from_the_trained_checkpoint(corpus_dir, tmp_path):
    """The fine-tuning checkpoint at step 0 holds the trained weights and AdamW moments."""
    import posenc.lab.finetune as ft_module

    config = _config(corpus_dir, seeds=(0,))
    run_study(tiny_study(corpus_dir, schemes=("rope",), variants=()), out=tmp_path, log=None)
    base = tmp_path / "checkpoints" / "rope-seed0"
    started = tmp_path / "started"
    ft = FinetuneCell(Cell("rope", 0), "linear", 16)
    data = study_data(config)
    model = TransformerLM(ft_module._model_config(config, ft, data))
    assert model.config.position_options["scaling"] == {"rope_type": "linear", "factor": 2.0}
    ft_module._start_from_base(base, started, model, finetune_config(config, 0), data.data_id)
    assert states_equal(load_trained_model(started), load_trained_model(base))
    trainer = "trainer.safetensors"
    with (
        safetensors.safe_open(str(base / trainer), "pt") as a,
        safetensors.safe_open(str(started / trainer), "pt") as b,
    ):
        moments = [k for k in a.keys() if k.startswith("optimizer.")]  # noqa: SIM118
        assert moments and all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in moments)
        assert torch.equal(a.get_tensor("rng.torch"), b.get_tensor("rng.torch"))


def test_a_study_fine_tunes_compares_and_resumes(corpus_dir, tmp_path):
    config = _config(corpus_dir)
    study = run_study(config, out=tmp_path, log=None)
    results = study.to_dict()
    names = {r["name"] for r in results["summary"]}
    assert {"rope+ft16", "rope+linear+ft16", "alibi+ft16", "alibi+cont8", "rope+cont8"} <= names
    entries = {e["run"]: e for e in results["finetune"]}
    linear = entries["rope+linear+ft16"]
    assert linear["before"] == "rope+linear" and (
        linear["steps"],
        linear["length"],
        linear["batch_size"],
    ) == (2, 16, 2)
    assert linear["tokens"] == 2 * 2 * 16 and linear["train_tokens"] == 4 * 4 * 8
    assert [r["length"] for r in linear["rows"]] == [8, 16, 32] and linear["rows"][0][
        "over"
    ] == "seeds and documents"
    assert results["model_configs"]["rope+linear+ft16"]["position_options"]["scaling"]["factor"] == 2.0
    cells = [c for c in results["cells"] if "finetune" in c]
    assert len(cells) == 10 and all(c["train"]["steps"] == 2 for c in cells)
    # against the control: the same weights continued at L for the same steps and tokens
    assert linear["against_control"] == "rope+cont8" and [r["length"] for r in linear["rows_vs_control"]] == [
        8,
        16,
        32,
    ]
    runs = {(r["name"], r["seed"]): r for r in results["runs"]}
    a, c = runs["rope+linear+ft16", 0]["eval"][0], runs["rope+cont8", 0]["eval"][0]
    d0 = sum(x - y for x, y in zip(a["window_bits"], c["window_bits"])) / len(a["window_bits"])
    a1, c1 = runs["rope+linear+ft16", 1]["eval"][0], runs["rope+cont8", 1]["eval"][0]
    d1 = sum(x - y for x, y in zip(a1["window_bits"], c1["window_bits"])) / len(a1["window_bits"])
    assert linear["rows_vs_control"][0]["diff"]["mean"] == pytest.approx((d0 + d1) / 2, abs=1e-9)
    assert entries["alibi+ft16"]["against_control"] == "alibi+cont8" and entries["alibi+cont8"]["control"]
    assert "rope+ft16" not in results["training"]  # training curves: the trained runs only
    text = format_table(study)
    assert "fine-tuned minus not fine-tuned" in text and "rope+linear+ft16 - rope+linear" in text
    assert "fine-tuned minus the control" in text and "rope+linear+ft16 - rope+cont8" in text
    again = run_study(config, out=tmp_path, resume=True, log=None).to_dict()
    assert all(c.get("reused") for c in again["cells"])
    assert again["finetune"] == results["finetune"]


def test_finetuning_needs_an_output_folder(corpus_dir):
    with pytest.raises(
        ValueError, match="fine-tuning starts from each trained model's checkpoint: give an output"
    ):
        run_study(_config(corpus_dir), log=None)


@pytest.mark.slow
def test_the_whole_grid_gives_the_same_numbers_in_local_processes(corpus_dir, tmp_path):
    """Settings, randomized positions, fine-tuning cells and diagnostics: two worker processes give
    exactly the numbers of one process."""
    config = _config(
        corpus_dir,
        schemes=("rope",),
        seeds=(0,),
        variants=("yarn",),
        vary={"norm": ("post",)},
        randomized_positions=16,
        diagnostic_windows=1,
    )
    here = run_study(config, out=tmp_path / "a", log=None, threads=1).to_dict()
    there = run_study(config, out=tmp_path / "b", log=None, threads=1, workers=2).to_dict()
    numbers = [
        {(r["name"], r["seed"]): [p["window_bits"] for p in r["eval"]] for r in s["runs"]}
        for s in (here, there)
    ]
    assert len(numbers[0]) == 10 and numbers[0] == numbers[1]
    assert here["finetune"] == there["finetune"]
