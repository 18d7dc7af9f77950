"""Tests of posenc.lab.config: StudyConfig validation and defaults, the model a study builds."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.base import PositionalScheme
from posenc.bias import t5_relative_bucket
from posenc.lab.config import PRESETS, StudyConfig, TrainConfig, study_model_config
from posenc.model import TransformerLM
from posenc.registry import SCHEMES, register


class _Bidirectional(PositionalScheme):
    name = "test_bidirectional_only"
    causal_ok = False


@pytest.fixture
def bidirectional_scheme():
    register(_Bidirectional)
    yield _Bidirectional.name
    SCHEMES.pop(_Bidirectional.name)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"schemes": ()}, ValueError, "schemes is empty"),
        ({"schemes": ("alibi", "alibi")}, ValueError, "schemes has duplicates"),
        ({"schemes": ("nonsense",)}, ValueError, "unknown scheme 'nonsense'; valid schemes: nope"),
        ({"eval_lens": (256, 128)}, ValueError, "eval_lens must be increasing"),
        ({"eval_lens": ()}, ValueError, "eval_lens is empty"),
        ({"seeds": (1, 1)}, ValueError, "seeds must be increasing without repeats"),
        ({"seeds": (-1,)}, ValueError, "seeds entry must be >= 0"),
        ({"split_seed": -2}, ValueError, "split_seed must be >= 0"),
        ({"eval_windows": 0}, ValueError, "eval_windows must be >= 1"),
        ({"score_len": 200}, ValueError, "score_len=200 must be <= the shortest eval length 128"),
        ({"variants": ("yarnn",)}, ValueError, "unknown variants entry 'yarnn'; valid values: .*'yarn'"),
        ({"mode": "scan"}, ValueError, "unknown mode 'scan'; valid values: 'lm', 'copy'"),
        ({"curriculum_steps": 10}, ValueError, "curriculum_steps=10 needs a synthetic task"),
        ({"mode": "copy", "curriculum_steps": -1}, ValueError, "curriculum_steps must be >= 0"),
        (
            {"mode": "copy", "steps": 100, "curriculum_steps": 200},
            ValueError,
            "curriculum_steps=200 must be <= steps=100",
        ),
        ({"num_heads": 3}, ValueError, "num_heads=3 does not divide d_model=128"),
        ({"seed": 3}, ValueError, "StudyConfig sets train.seed itself: set the seeds with seeds"),
        ({"max_len": 64}, ValueError, "StudyConfig sets model.max_len itself"),
        ({"stride": 4}, TypeError, r"StudyConfig has no field\(s\) \[.stride.\]"),
        ({"train_len": 0}, ValueError, "train_len must be >= 1"),
        ({"steps": 1.5}, TypeError, "steps must be an int"),
        ({"position_lr_scale": 0.0}, ValueError, "position_lr_scale must be a finite number > 0"),
        (
            {"position_options": {"t5": {"max_distance": 64}}},
            ValueError,
            "unknown position_options scheme 't5'; valid values: 'alibi'",
        ),
        (
            {"schemes": ("t5",), "position_options": {"t5": {"max_dist": 64}}},
            ValueError,
            "unknown position_options key of 't5' 'max_dist'; valid values: .*'max_distance'",
        ),
        ({"position_options": [1]}, TypeError, "position_options must be a dict"),
        (
            {"vary": {"nrom": ["pre"]}},
            ValueError,
            "vary field 'nrom' is not a model setting; did you mean 'norm'",
        ),
        ({"randomized_positions": 64}, ValueError, "randomized_positions=64 must be >= train_len=128"),
        (
            {"mode": "copy", "train_len": 8, "randomized_positions": 12},
            ValueError,
            "randomized_positions=12 must be >= 18, the input length of a 8-digit copy example",
        ),
        ({"finetune_len": 256}, ValueError, "finetune_len and finetune_steps go together"),
        (
            {"finetune_len": 128, "finetune_steps": 5},
            ValueError,
            "finetune_len=128 must be longer than train_len",
        ),
        (
            {"finetune_len": 256, "finetune_steps": 5},
            ValueError,
            r"none of \['alibi'\] has any; add e.g. rope",
        ),
        ({"diagnostic_windows": 300}, ValueError, "diagnostic_windows=300 must be <= eval_windows=256"),
        ({"diagnostic_windows": -1}, ValueError, "diagnostic_windows must be >= 0"),
    ],
)
def test_study_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        StudyConfig(**{"schemes": ("alibi",), **kwargs})


def test_study_refuses_a_non_causal_scheme(bidirectional_scheme):
    with pytest.raises(ValueError, match="has no causal form, so it cannot run in a decoder-only LM"):
        StudyConfig(schemes=(bidirectional_scheme,))


def test_train_length_is_always_evaluated_and_score_len_defaults_to_half():
    config = StudyConfig(("alibi",), train_len=128, eval_lens=(256, 512))
    assert config.eval_lens == (128, 256, 512)  # the paired deltas' reference
    assert config.targets_per_window == 64
    assert StudyConfig(("alibi",), train_len=128, eval_lens=(32, 256)).targets_per_window == 16
    assert StudyConfig(("alibi",), mode="copy", train_len=8, eval_lens=(4, 12)).eval_lens == (4, 12)


def test_round_trip_and_train_configs_per_seed():
    config = StudyConfig(("alibi", "t5"), seeds=(0, 3), split_seed=5, eval_lens=(128, 256))
    assert StudyConfig.from_dict(config.to_dict()) == config
    assert config.train_config(seed=3).seed == 3 and config.train_config().seed == 0
    assert config.train_config().position_lr_scale == TrainConfig.position_lr_scale
    with pytest.raises(ValueError, match="unknown StudyConfig field"):
        StudyConfig.from_dict({**config.to_dict(), "stride": 4})
    assert PRESETS["default"]["seeds"] == (0, 1, 2)  # the documented study has intervals over seeds
    grid = StudyConfig(
        ("rope",),
        vary={"norm": ("pre", "post"), "embed_scale": (None, 2.0)},
        randomized_positions=512,
        finetune_len=256,
        finetune_steps=7,
        diagnostic_windows=4,
    )
    assert StudyConfig.from_dict(json.loads(json.dumps(grid.to_dict()))) == grid  # through JSON


def test_position_options_reach_the_model():
    config = StudyConfig(
        schemes=("t5", "alibi"), train_len=64, eval_lens=(64,), position_options={"t5": {"max_distance": 128}}
    )
    assert TransformerLM(config.model_config("t5")).decoder.scheme(0).max_distance == 128
    assert StudyConfig.from_dict(config.to_dict()) == config


def test_t5_in_a_study_trains_every_bucket():
    """T5's buckets are sized from the training length: every bucket that any distance reaches
    occurs within L tokens, so none keeps its initial value and inverts the distance preference
    past L (with T5's max_distance=128 at L=64, buckets 27-31 occur only past L)."""
    for train_len in (32, 64, 128, 512):
        config = StudyConfig(schemes=("t5",), train_len=train_len, eval_lens=(train_len,))
        scheme = TransformerLM(study_model_config(config, "t5")).decoder.scheme(0)
        assert scheme.causal is True and scheme.max_distance == min(128, max(17, train_len // 2))

        def buckets(n, scheme=scheme):  # the buckets of key-query distances 0 .. n - 1
            rel = -torch.arange(n)
            kw = {"num_buckets": scheme.num_buckets, "max_distance": scheme.max_distance}
            return set(t5_relative_bucket(rel, causal=True, **kw).tolist())

        assert buckets(train_len) == buckets(64 * train_len)


@pytest.mark.parametrize("m", [2**20 + 1, 100_000_000, 2**60, 2**100])
def test_randomized_positions_are_capped_before_any_allocation(m):
    """--randomized-positions 100000000 allocated 12.8 GB per step; 2^60 overflowed in torch."""
    from posenc.lab.config import StudyConfig, TrainConfig

    with pytest.raises(ValueError, match=f"randomized_positions={m} is larger than 1,048,576"):
        StudyConfig(randomized_positions=m)
    with pytest.raises(ValueError, match=f"random_positions={m} is larger than 1,048,576"):
        TrainConfig(random_positions=m)
    assert StudyConfig(randomized_positions=2**20).randomized_positions == 2**20


def test_randomized_positions_cap_is_one_line_in_the_cli(capsys):
    from posenc.cli import main

    assert main(["extrapolate", "--randomized-positions", "100000000", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "randomized_positions=100000000 is larger than" in err


#: ``StudyConfig.to_dict()`` of the configuration below before studies had parts (the flat form of
#: results.json's ``config`` then), written by posenc at b50c9c8.
FLAT_CONFIG = {
    "schemes": ["alibi", "rope"],
    "mode": "lm",
    "train_len": 64,
    "eval_lens": [64, 128],
    "steps": 300,
    "batch_size": 32,
    "lr": 0.003,
    "min_lr": 0.0003,
    "warmup_steps": 20,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "position_lr_scale": 1.0,
    "seeds": [0, 1],
    "split_seed": 0,
    "corpus": "stdlib",
    "max_chars": 3000000,
    "val_fraction": 0.1,
    "d_model": 64,
    "num_layers": 2,
    "num_heads": 4,
    "dropout": 0.1,
    "eval_windows": 256,
    "score_len": None,
    "variants": ["linear", "ntk", "yarn"],
    "position_options": {},
    "eval_examples": 200,
    "curriculum_steps": 0,
    "eval_batch_tokens": 16384,
    "checkpoint_every": 50,
    "vary": {"norm": ["pre", "post"]},
    "randomized_positions": 0,
    "finetune_len": 0,
    "finetune_steps": 0,
    "diagnostic_windows": 0,
}


def test_a_study_is_composed_of_its_parts_and_reads_the_flat_form():
    from posenc.lab.config import CorpusConfig
    from posenc.model import ModelConfig

    composed = StudyConfig(
        schemes=("alibi", "rope"),
        train_len=64,
        eval_lens=(64, 128),
        seeds=(0, 1),
        vary={"norm": ("pre", "post")},
        data=CorpusConfig(max_chars=3_000_000),
        train=TrainConfig(
            steps=300, batch_size=32, warmup_steps=20, position_lr_scale=1.0, checkpoint_every=50
        ),
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=4, dropout=0.1),
    )
    by_name = StudyConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in FLAT_CONFIG.items()})
    assert by_name == composed == StudyConfig.from_dict(FLAT_CONFIG)
    d = composed.to_dict()
    assert (d["steps"], d["d_model"], d["max_chars"], d["norm"], d["betas"]) == (
        300,
        64,
        3_000_000,
        "pre",
        [0.9, 0.95],
    )
    assert "seed" not in d and "position" not in d and "train" not in d  # set per cell; fields by name
    assert StudyConfig.from_dict(json.loads(json.dumps(d))) == composed
    # a cell trains with the study's training, its own seed and length; the model gets its scheme
    tc = composed.train_config(seed=1)
    assert (tc.seed, tc.seq_len, tc.steps, tc.checkpoint_every) == (1, 64, 300, 50)
    mc = composed.model_config("rope")
    assert (mc.position, mc.max_len, mc.d_model, mc.dropout) == ("rope", 64, 64, 0.1)


def test_a_scheme_entry_may_be_a_per_layer_pattern_with_a_readable_name():
    from posenc.lab.grid import run_name, scheme_entry

    config = StudyConfig(
        schemes=("rope", "rope*3,nope_temperature"),
        train_len=16,
        eval_lens=(16, 32),
        d_model=16,
        num_layers=4,
        num_heads=2,
        position_options={"rope": {"base": 5e5}},
    )
    assert config.schemes == ("rope", "rope*3+nope_temperature")  # one spelling: '+' between entries
    mc = config.model_config("rope*3+nope_temperature")
    assert mc.position == "nope" and mc.layer_positions == ["rope", "rope", "rope", "nope_temperature"]
    assert mc.layer_position_options == {"rope": {"base": 5e5}}  # a scheme's options reach its layers
    assert config.model_config("rope").position_options == {"base": 5e5}
    assert run_name("rope*3+nope_temperature", ()) == "rope-x3+nope_temperature"
    assert run_name("rope*3+nope_temperature", (("norm", "post"),)) == "rope-x3+nope_temperature[norm=post]"
    assert scheme_entry("alibi").label == "alibi"
    assert StudyConfig.from_dict(config.to_dict()) == config
    for bad, error, match in [
        ("rope*x", ValueError, "needs a whole repeat count"),
        ("rope+sinusoidal", ValueError, "'sinusoidal' adds to the input embeddings"),
        ("rope+ropee", ValueError, "unknown scheme 'ropee'; valid schemes: nope"),
        ("rope*0", ValueError, "must be >= 1"),
    ]:
        with pytest.raises(error, match=match):
            StudyConfig(schemes=("alibi", bad))


def test_a_run_is_a_run_not_a_study():
    from posenc.lab.config import RunConfig

    run = RunConfig(scheme="learned", steps=5, seq_len=32, d_model=32, corpus="stdlib", random_positions=64)
    assert (run.model.position, run.model.max_len, run.model.vocab_size) == ("learned", 64, 256)
    assert (run.train.steps, run.train.checkpoint_every, run.data.corpus) == (5, 100, "stdlib")
    assert RunConfig.from_dict(json.loads(json.dumps(run.to_dict()))) == run
    assert not hasattr(run, "schemes") and not hasattr(run, "eval_lens")
    with pytest.raises(ValueError, match=r"RunConfig sets model\.position itself"):
        RunConfig(position="alibi")
    pattern = RunConfig(scheme="alibi*2+nope")
    assert pattern.model.layer_positions == ["alibi", "alibi", "nope"] and pattern.label == "alibi-x2+nope"


def test_every_field_of_a_run_or_study_has_one_owner():
    """Fields are given by name (flags, JSON, keyword arguments): no name is declared by two parts."""
    from posenc.lab.config import RunConfig, field_owners

    owners = field_owners(StudyConfig)
    assert (owners["schemes"], owners["corpus"], owners["steps"], owners["norm"]) == (
        "own",
        "data",
        "train",
        "model",
    )
    assert field_owners(RunConfig)["scheme"] == "own"
