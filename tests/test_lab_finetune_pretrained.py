"""Tests of posenc.lab.finetune_pretrained: a loaded model fine-tuned at a longer length, plainly
and under its scheme's variants, next to the control continued at its trained length for the same
steps and tokens, with paired deltas against the control and against the model before."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from _pretrained_toys import untrained_model, write_code_corpus
from posenc.cli import main as cli_main
from posenc.lab.finetune_pretrained import FinetunePlan, check_peft, format_finetune
from posenc.lab.pretrained_eval import evaluate_setup, prepare_pretrained
from posenc.model import TransformerLM
from posenc.model.hf import save_transformers


@pytest.fixture
def corpus(tmp_path):
    return write_code_corpus(tmp_path)


_model = untrained_model


def _setup(model, corpus, **kw):
    return prepare_pretrained(
        model, corpus=corpus, val_fraction=0.34, eval_windows=8, eval_lens=(32,), probe_trials=0, **kw
    )


def test_finetuning_carries_the_control(corpus):
    model = _model()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    setup = _setup(model, corpus, variants=("yarn",))
    results = evaluate_setup(setup)
    plan = FinetunePlan.checked(setup, 32, 3, batch_size=4, lr=1e-3)
    ft = plan.run(setup, results, progress=False)
    names = [r["name"] for r in ft["runs"]]
    assert names == ["ft32", "+yarn+ft32", "cont16"] and ft["control"] == "cont16"
    control, plain = ft["runs"][2], ft["runs"][0]
    # the control: the same steps and tokens, at L
    assert control["train"]["length"] == 16 and control["train"]["batch_size"] == 4
    assert plain["train"]["length"] == 32 and plain["train"]["batch_size"] == 2
    assert control["train"]["tokens"] == plain["train"]["tokens"] == 3 * 4 * 16
    assert control["train"]["steps"] == plain["train"]["steps"] == 3
    # the loaded model itself is untouched: every run trained a copy
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    for run in ft["runs"]:
        before = next(r for r in results["runs"] if r["name"] == run["before"])
        for p, b in zip(run["eval"], before["eval"]):
            # the paired differences are of the same windows: fine-tuned minus control / before
            assert p["vs_before"]["mean"] == pytest.approx(p["bpb_window"] - b["bpb_window"])
            assert p["bpb_window"] != pytest.approx(b["bpb_window"], abs=1e-4)  # training moved it
            if run["control"]:
                assert p["vs_control"] is None
            else:
                c = control["eval"][run["eval"].index(p)]
                assert p["vs_control"]["mean"] == pytest.approx(p["bpb_window"] - c["bpb_window"])
                assert p["vs_control"]["over"] == "documents"
    # the cost at L: the fine-tuned model against the control at E = L, in the table
    results["finetune"] = ft
    table = "\n".join(format_finetune(results, "byte"))
    assert "paired delta vs the control cont16" in table and "at 16: its cost" in table
    assert format_finetune(results, "byte")[0].startswith("fine-tuned at 32 for 3 steps (192 tokens")


def test_plan_errors(tmp_path, corpus):
    setup = _setup(_model(), corpus)
    with pytest.raises(ValueError, match="--finetune-steps must be >= 1"):
        FinetunePlan.checked(setup, 32, 0)
    with pytest.raises(ValueError, match="too few for fine-tuning windows of 100000"):
        FinetunePlan.checked(setup, 100_000, 3)
    learned = prepare_pretrained(
        _model("learned"), corpus=corpus, val_fraction=0.34, eval_windows=8, probe_trials=0
    )
    with pytest.raises(ValueError, match="--finetune-len 32 is longer than the model's positions allow"):
        FinetunePlan.checked(learned, 32, 3)
    if importlib.util.find_spec("peft") is None:
        with pytest.raises(ValueError, match=r"not installed \(pip install peft\)"):
            check_peft()


@pytest.mark.skipif(importlib.util.find_spec("peft") is not None, reason="peft is installed")
def test_the_command_fine_tunes_or_says_why_not(tmp_path, corpus, capsys):
    save_transformers(_model(), tmp_path / "hf")
    argv = ["extrapolate", "--model", str(tmp_path / "hf"), "--corpus", corpus, "--val-fraction", "0.34"]
    argv += ["--eval-windows", "4", "--eval-lens", "32", "--variants", "none", "--no-progress"]
    assert cli_main([*argv, "--finetune-len", "32", "--finetune-steps", "2", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "control cont16" in out and "ft32" in out
    assert cli_main([*argv, "--finetune-len", "32", "--finetune-steps", "2", "--peft", "lora"]) == 2
    err = capsys.readouterr().err
    assert "pip install peft" in err and err.count("\n") == 1
    assert cli_main([*argv, "--peft", "lora"]) == 2
    assert "give them with --finetune-len" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft is not installed")
def test_lora_through_peft_trains_adapters_and_merges_them(corpus):
    model = _model()
    setup = _setup(model, corpus, variants=())
    plan = FinetunePlan.checked(setup, 32, 2, batch_size=4, lr=1e-3, peft="lora")
    ft = plan.run(setup, evaluate_setup(setup), progress=False)
    total = sum(p.numel() for p in model.parameters())
    for run in ft["runs"]:
        assert 0 < run["train"]["trainable"] < total / 2  # adapters only (rank 8 of width 32)
        assert run["eval"][1]["vs_before"]["mean"] != pytest.approx(0.0, abs=1e-6)  # merged: it moved


# ----------------------------------------------------------------------------------------------
# Hostile plans and numbers
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [8, 16])
def test_a_finetune_len_not_past_l_is_refused(corpus, length):
    # at or below L a variant's factor E_ft / L would be <= 1 (a compression no scaling means) and the
    # plain run would repeat the control
    setup = _setup(_model(), corpus, variants=("yarn",))
    with pytest.raises(
        ValueError, match=rf"--finetune-len {length} is not longer than the trained length L=16"
    ):
        FinetunePlan.checked(setup, length, 2)


def test_a_batch_past_memory_is_refused_before_the_evaluation(corpus):
    setup = _setup(_model(), corpus, variants=())
    with pytest.raises(
        ValueError, match=r"fine-tuning at 32 \(batch 500000000 x 32\) would not fit in memory"
    ):
        FinetunePlan.checked(setup, 32, 2, batch_size=10**9)


def test_a_bf16_model_is_fine_tuned_on_float32_weights(corpus):
    # bf16 spaces its values 2^-8 apart relative to their size: AdamW's steps of lr (3e-4) on weights
    # of ~0.5 round away, so the model is trained on float32 weights and stored back in bf16
    bf16 = _model().to(torch.bfloat16)
    same = TransformerLM(bf16.config).eval()
    same.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})  # the same weights
    drops = {}
    for name, model in (("bf16", bf16), ("float32", same)):
        setup = _setup(model, corpus, variants=())
        ft = FinetunePlan.checked(setup, 32, 6, batch_size=4).run(
            setup, evaluate_setup(setup), progress=False
        )
        train = ft["runs"][0]["train"]
        assert train["dtype"] == "float32"
        drops[name] = train["loss_first"] - train["loss_last"]
        assert next(model.parameters()).dtype == (torch.bfloat16 if name == "bf16" else torch.float32)
    assert drops["float32"] > 0.05
    assert drops["bf16"] == pytest.approx(drops["float32"], rel=0.2)
