"""Tests of posenc.lab.flags: command-line flags generated from the configuration dataclasses."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from posenc.cli import main
from posenc.lab import config as lab_config
from posenc.lab.commands import MODEL_SOURCE, extrapolate_args, run_config, study_config, train_args
from posenc.lab.flags import field_docs, field_specs, source_field_specs


def _parser(add) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser


def test_field_docs_read_the_args_table():
    doc = """Summary line.

    Args:
        steps: optimizer steps.
        lr, min_lr: the peak and final learning rates, see
            :func:`~posenc.lab.train.lr_at` and ``warmup``.
        ratio: 10% of it.

    Returns:
        not_a_field: ignored.
    """
    docs = field_docs(doc)
    assert docs["steps"] == "optimizer steps."
    assert docs["lr"] == docs["min_lr"] == "the peak and final learning rates, see lr_at and warmup."
    assert docs["ratio"] == "10%% of it."  # argparse formats help with %
    assert "not_a_field" not in docs


def test_model_fields_read_from_the_source_match_the_dataclass():
    """The model's flags come from its source without importing torch: the same fields, types and
    literal defaults as the class itself."""
    from posenc.model import ModelConfig

    read = {s.name: s for s in source_field_specs(MODEL_SOURCE, "ModelConfig")}
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    assert list(read) == list(fields)
    for name, f in fields.items():
        assert read[name].type == str(f.type), name
        if f.default is not dataclasses.MISSING:
            assert read[name].default == f.default, name
        assert read[name].doc, f"ModelConfig's docstring documents {name}"


@dataclasses.dataclass
class _TrainWithSmoothing(lab_config.TrainConfig):
    """A TrainConfig with one more field.

    Args:
        label_smoothing: the share of each target's probability spread over the vocabulary.
    """

    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


def test_a_new_train_config_field_is_a_flag_of_both_commands_with_no_other_edit(monkeypatch, capsys):
    """Adding a field to TrainConfig (here: a subclass put in its place) makes it a flag of
    ``posenc train`` and ``posenc extrapolate``, with its doc as help and its default stated once,
    and its value reaches the configuration."""
    monkeypatch.setattr(lab_config, "TrainConfig", _TrainWithSmoothing)
    for add in (train_args, extrapolate_args):
        text = " ".join(_parser(add).format_help().split())
        assert (
            "--label-smoothing LABEL_SMOOTHING the share of each target's probability spread over the "
            "vocabulary. (default 0.0)" in text
        )
    run = run_config(
        _parser(train_args).parse_args(["--out", "x", "--label-smoothing", "0.1", "--steps", "7"])
    )
    assert isinstance(run.train, _TrainWithSmoothing)
    assert (run.train.label_smoothing, run.train.steps) == (0.1, 7)
    study = study_config(
        _parser(extrapolate_args).parse_args(["--schemes", "alibi", "--label-smoothing", "0.2"])
    )
    assert study.train.label_smoothing == 0.2 and study.train_config(seed=1).label_smoothing == 0.2
    assert study.to_dict()["label_smoothing"] == 0.2
    assert main(["extrapolate", "--schemes", "alibi", "--label-smoothing", "1.5"]) == 2
    assert "label_smoothing must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_every_model_field_a_study_may_set_is_a_flag_that_reaches_the_cells_model():
    from posenc.lab.grid import model_fields

    parser = _parser(extrapolate_args)
    flags = {s for a in parser._actions for s in a.option_strings}
    assert {"--" + f.replace("_", "-") for f in model_fields()} <= flags
    args = ["--schemes", "rope", "--norm", "post", "--embed-norm", "true", "--d-ff", "none", "--layers", "2"]
    args += ["--embed-scale", "none", "--betas", "0.8,0.9", "--init-std", "0.01"]
    study = study_config(parser.parse_args(args))
    mc = study.model_config("rope")
    assert (mc.norm, mc.embed_norm, mc.d_ff, mc.num_layers, mc.embed_scale, mc.init_std) == (
        "post",
        True,
        None,
        2,
        None,
        0.01,
    )
    assert study.train.betas == (0.8, 0.9)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--embed-norm", "maybe"], "--embed-norm 'maybe' is not true or false"),
        (["--betas", "0.9,x"], "--betas '0.9,x' is not a comma list of floats"),
        (["--betas", "0.9"], "betas must be two numbers in [0, 1), got (0.9,)"),
        (["--d-ff", "wide"], "--d-ff 'wide' is not an integer (or none)"),
        (["--norm", "sideways"], "unknown norm 'sideways'"),
        (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
        (["--autocast", "fp8"], "argument --autocast: invalid choice: 'fp8'"),
        (["--lr", "0.01", "--min-lr", "0.1"], "min_lr=0.1 must be <= lr=0.01"),
    ],
)
def test_bad_generated_flag_values_are_one_line(argv, message, capsys):
    for command in (["extrapolate", "--schemes", "alibi"], ["train", "--out", "unused"]):
        assert main([*command, *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err


def test_a_lower_lr_lowers_the_default_min_lr():
    """--lr below the default min_lr (3e-4) without --min-lr: the cosine decays to --lr."""
    study = study_config(_parser(extrapolate_args).parse_args(["--schemes", "alibi", "--lr", "1e-4"]))
    assert (study.train.lr, study.train.min_lr) == (1e-4, 1e-4)


def test_field_specs_of_the_lab_configs_are_all_documented():
    for cls in (
        lab_config.TrainConfig,
        lab_config.CorpusConfig,
        lab_config.StudyConfig,
        lab_config.RunConfig,
    ):
        undocumented = [s.name for s in field_specs(cls, skip=lab_config.PARTS) if not s.doc]
        assert undocumented == [], (cls.__name__, undocumented)
