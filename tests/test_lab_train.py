"""Tests of posenc.lab.train: schedule, batches, the optimizer's groups, resume from a checkpoint
(bit-identical, after a SIGKILL too), DDP with two gloo processes, the memory check before starting.

Models are tiny (d=16, 1 layer) so the whole file runs in well under a minute; the three
subprocess tests (kill-and-resume, torchrun with 2 gloo processes) dominate its time.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _lab_toys import states_equal, text_corpus_in, tiny_config, tiny_data, torchrun_command, train_cli_args
from posenc.base import PositionalScheme
from posenc.cli import main
from posenc.lab import (
    InsufficientMemoryError,
    TrainConfig,
    batch_at,
    lr_at,
    make_optimizer,
    position_parameters,
    seed_everything,
    train,
)
from posenc.model import ModelConfig, TransformerLM, load_model

SRC = str(Path(__file__).resolve().parents[1] / "src")


# ---------------------------------------------------------------------------------------------- schedule
def test_lr_schedule_reference():
    # Written plainly: linear warmup to the peak, then half a cosine from lr to min_lr.
    c = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, c) == pytest.approx(1e-4)
    assert lr_at(9, c) == pytest.approx(1e-3)
    assert lr_at(10, c) == pytest.approx(1e-3)
    assert lr_at(55, c) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(99, c) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 89 / 90)))


@settings(deadline=None, max_examples=30)
@given(steps=st.integers(2, 500), warm=st.integers(0, 50))
def test_lr_schedule_properties(steps, warm):
    c = TrainConfig(steps=steps, warmup_steps=min(warm, steps), lr=2e-3, min_lr=2e-4)
    lrs = [lr_at(s, c) for s in range(steps)]
    before, after = lrs[: c.warmup_steps], lrs[c.warmup_steps :]
    assert all(0 < x <= c.lr * (1 + 1e-12) for x in before)
    assert all(c.min_lr * (1 - 1e-12) <= x <= c.lr * (1 + 1e-12) for x in after)
    assert all(a >= b - 1e-15 for a, b in itertools.pairwise(after))  # non-increasing after warmup
    assert all(a < b for a, b in itertools.pairwise(before))  # increasing during warmup


# ---------------------------------------------------------------------------------------------- batches
def test_batch_at_is_pure_and_shifted():
    data = tiny_data()
    ids, targets = batch_at(data, 3, 8, 16, seed=5)
    ids2, targets2 = batch_at(data, 3, 8, 16, seed=5)
    assert ids.shape == targets.shape == (8, 16) and ids.dtype == torch.long
    assert torch.equal(ids, ids2) and torch.equal(targets, targets2)
    assert torch.equal(ids[:, 1:], targets[:, :-1])  # targets are the next tokens
    assert not torch.equal(ids, batch_at(data, 4, 8, 16, seed=5)[0])  # another step, another batch
    assert not torch.equal(ids, batch_at(data, 3, 8, 16, seed=6)[0])  # another seed, another batch
    # every window is a real slice of the data
    for row_ids, row_t in zip(ids, targets):
        window = torch.cat((row_ids, row_t[-1:]))
        starts = [i for i in range(len(data) - 16) if torch.equal(data[i : i + 17].long(), window)]
        assert starts


@settings(deadline=None, max_examples=25)
@given(step=st.integers(0, 10_000), world=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**31))
def test_batch_at_ranks_partition_the_global_batch(step, world, seed):
    data = tiny_data(500)
    full = batch_at(data, step, 8, 12, seed)
    parts = [batch_at(data, step, 8, 12, seed, rank=r, world_size=world) for r in range(world)]
    assert torch.equal(torch.cat([p[0] for p in parts]), full[0])
    assert torch.equal(torch.cat([p[1] for p in parts]), full[1])


def test_batch_at_errors():
    with pytest.raises(ValueError, match="too few for windows"):
        batch_at(tiny_data(10), 0, 2, 16)
    with pytest.raises(ValueError, match="divisible by world_size=3"):
        batch_at(tiny_data(), 0, 8, 16, world_size=3)
    with pytest.raises(ValueError, match="1-D integer token tensor"):
        batch_at(torch.rand(100), 0, 2, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"steps": 0}, ValueError, "steps must be >= 1"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int"),
        ({"lr": -1.0}, ValueError, "lr must be a finite number > 0"),
        ({"lr": 1e-4, "min_lr": 1e-3}, ValueError, "min_lr=0.001 must be <= lr"),
        ({"weight_decay": 1.5}, ValueError, "weight_decay must be a number in"),
        ({"betas": (0.9,)}, ValueError, "betas must be two numbers"),
        ({"grad_clip": -1}, ValueError, "grad_clip must be a number >= 0"),
        ({"autocast": "fp8"}, ValueError, "unknown autocast 'fp8'; valid values: 'auto', 'bf16', 'off'"),
    ],
)
def test_train_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        TrainConfig(**kwargs)


def test_train_config_round_trip():
    c = TrainConfig(steps=7, betas=(0.8, 0.9))
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match=r"unknown TrainConfig field\(s\) \['nope'\]"):
        TrainConfig.from_dict({"nope": 1})


def test_optimizer_groups_decay_matrices_only():
    model = TransformerLM(tiny_config())  # ALiBi: no positional parameters, so no third group
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n_unique = len({id(p) for p in model.parameters()})
    assert len(decay["params"]) + len(no_decay["params"]) == n_unique  # tied weights once


@pytest.mark.parametrize("position", ["t5", "learned", "shaw", "transformer_xl"])
def test_positional_parameters_get_their_own_learning_rate(position):
    model = TransformerLM(
        ModelConfig(vocab_size=64, d_model=16, num_layers=2, num_heads=2, position=position, max_len=16)
    )
    schemes = [m for m in model.modules() if isinstance(m, PositionalScheme)]
    scheme_params = {id(p) for m in schemes for p in m.parameters()}
    assert scheme_params and {id(p) for p in position_parameters(model)} == scheme_params
    config = TrainConfig(
        steps=3, warmup_steps=1, lr=1e-3, min_lr=1e-3, batch_size=2, seq_len=16, position_lr_scale=10.0
    )
    opt = make_optimizer(model, config)
    *_, positional = opt.param_groups
    assert {id(p) for p in positional["params"]} == scheme_params
    assert positional["weight_decay"] == 0.0 and positional["lr_scale"] == 10.0
    others = {id(p) for g in opt.param_groups[:-1] for p in g["params"]}
    assert not others & scheme_params
    assert len(others | scheme_params) == len({id(p) for p in model.parameters()})


def test_t5_table_moves_past_what_one_learning_rate_allows():
    """Adam moves an entry by about lr per step, so without its own learning rate T5's table can
    travel at most steps * lr; the positional group lets it reach the +-2.5 T5 needs."""
    data = torch.arange(4096) % 7  # periodic: position and content both predictive
    moved = {}
    for scale in (1.0, 10.0):
        seed_everything(0)
        model = TransformerLM(
            ModelConfig(vocab_size=8, d_model=16, num_layers=1, num_heads=2, position="t5", max_len=32)
        )
        table = model.decoder.scheme(0).relative_attention_bias.weight
        before = table.detach().clone()
        config = TrainConfig(
            steps=20,
            warmup_steps=1,
            lr=1e-2,
            min_lr=1e-2,
            batch_size=4,
            seq_len=32,
            position_lr_scale=scale,
            grad_clip=0.0,
        )
        train(model, data, config, progress=False)
        moved[scale] = float((table.detach() - before).abs().max())
    budget = 20 * 1e-2  # steps * lr: the most plain Adam can move one entry (bias-corrected steps <= ~lr)
    assert moved[1.0] <= budget * 1.05
    assert moved[10.0] > 2 * budget


# ---------------------------------------------------------------------------------------------- training
def test_training_lowers_the_loss_on_learnable_data():
    # A repeating pattern is learnable: the loss must fall well below the uniform log(64).
    data = torch.arange(4000).remainder(7).to(torch.uint8)
    seed_everything(0)
    model = TransformerLM(tiny_config())
    result = train(
        model,
        data,
        TrainConfig(steps=60, batch_size=8, seq_len=16, warmup_steps=5, lr=1e-2, min_lr=1e-3, log_every=5),
        progress=False,
    )
    assert result.completed and len(result.losses) == 60
    assert result.losses[0] > 3.0 and sum(result.losses[-5:]) / 5 < 0.5
    assert result.tokens_per_s > 0


def test_same_seed_same_run():
    data = tiny_data()
    cfg = TrainConfig(steps=5, batch_size=4, seq_len=16, warmup_steps=1)
    runs = []
    for _ in range(2):
        seed_everything(3)
        model = TransformerLM(tiny_config(dropout=0.1))
        runs.append((model, train(model, data, cfg, progress=False)))
    assert states_equal(runs[0][0], runs[1][0]) and runs[0][1].losses == runs[1][1].losses


def test_resume_refuses_a_changed_config(tmp_path):
    data, ckpt = tiny_data(), tmp_path / "c"
    model = TransformerLM(tiny_config())
    cfg = TrainConfig(steps=4, batch_size=4, seq_len=16)
    train(model, data, cfg, checkpoint=ckpt, progress=False, stop_at=2)
    with pytest.raises(ValueError, match=r"the config changed \(lr: checkpoint 0.003 vs now 0.001\)"):
        train(
            model,
            data,
            TrainConfig(steps=4, batch_size=4, seq_len=16, lr=1e-3),
            checkpoint=ckpt,
            resume=True,
            progress=False,
        )


def test_resume_refuses_another_split_of_the_same_corpus(tmp_path):
    """A data id is the corpus sha256 and the split: two splits of one corpus share the first 64+
    characters, so a check of a prefix would let a resume train on the other split's bytes."""
    data, ckpt = tiny_data(), tmp_path / "c"
    cfg = TrainConfig(steps=4, batch_size=4, seq_len=16)
    sha = "9f" * 32
    train(
        TransformerLM(tiny_config()),
        data,
        cfg,
        checkpoint=ckpt,
        progress=False,
        stop_at=2,
        data_id=f"{sha}:split0",
    )
    with pytest.raises(ValueError, match="trained on other data"):
        train(
            TransformerLM(tiny_config()),
            data,
            cfg,
            checkpoint=ckpt,
            resume=True,
            progress=False,
            data_id=f"{sha}:split1",
        )
    result = train(
        TransformerLM(tiny_config()),
        data,
        cfg,
        checkpoint=ckpt,
        resume=True,
        progress=False,
        data_id=f"{sha}:split0",
    )
    assert result.completed  # the same split resumes


def test_resume_refuses_another_model_before_loading_it(tmp_path):
    """Schemes without positional parameters share every shape: only the config tells them apart."""
    data, ckpt = tiny_data(), tmp_path / "c"
    cfg = TrainConfig(steps=4, batch_size=4, seq_len=16)
    train(TransformerLM(tiny_config()), data, cfg, checkpoint=ckpt, progress=False, stop_at=2)
    other = TransformerLM(ModelConfig(**{**tiny_config().to_dict(), "position": "nope", "dropout": 0.2}))
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(
        ValueError,
        match=r"model dropout: checkpoint 0.0 vs now 0.2; model position: "
        r"checkpoint 'alibi' vs now 'nope'",
    ):
        train(other, data, cfg, checkpoint=ckpt, resume=True, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters()))  # nothing was loaded


def test_a_new_run_never_overwrites_a_checkpoint(tmp_path):
    data, ckpt = tiny_data(), tmp_path / "c"
    cfg = TrainConfig(steps=2, batch_size=4, seq_len=16)
    train(TransformerLM(tiny_config()), data, cfg, checkpoint=ckpt, progress=False)
    saved = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    with pytest.raises(ValueError, match=r"a checkpoint already exists at .*resume it"):
        train(TransformerLM(tiny_config()), data, cfg, checkpoint=ckpt, progress=False)
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == saved


def test_checkpoint_every_needs_a_path():
    with pytest.raises(ValueError, match="checkpoint_every=5 needs a checkpoint path"):
        train(
            TransformerLM(tiny_config()),
            tiny_data(),
            TrainConfig(steps=2, checkpoint_every=5),
            progress=False,
        )


def test_stop_and_resume_in_fresh_objects_is_bit_identical(tmp_path):
    # Dropout on: the RNG state must be restored too.
    data = tiny_data()
    cfg = TrainConfig(steps=12, batch_size=4, seq_len=16, warmup_steps=3, checkpoint_every=4, log_every=3)

    def run(ckpt, stop_at=None, resume=False):
        seed_everything(0)
        model = TransformerLM(tiny_config(dropout=0.2))
        return model, train(model, data, cfg, checkpoint=ckpt, resume=resume, stop_at=stop_at, progress=False)

    full, full_result = run(tmp_path / "a")
    _, first = run(tmp_path / "b", stop_at=6)  # "preempted" after step 6 (checkpoint written)
    assert not first.completed and first.end_step == 6
    resumed, second = run(tmp_path / "b", resume=True)
    assert second.start_step == 6 and second.completed
    assert states_equal(full, resumed)
    assert second.losses == full_result.losses  # the history spans both halves


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory) -> Path:
    return text_corpus_in(tmp_path_factory.mktemp("corpus"))


def test_killed_run_resumes_to_identical_weights(tmp_path, text_corpus):
    """SIGKILL a real ``posenc train`` process after its first checkpoint, resume it in a fresh
    process, and compare with an uninterrupted run: bit-identical weights and loss history."""
    steps = 300
    killed_dir, full_dir = tmp_path / "killed", tmp_path / "full"
    env = {**os.environ, "PYTHONPATH": SRC}
    args = train_cli_args(text_corpus, killed_dir, steps, checkpoint_every=10)
    cmd = [sys.executable, "-m", "posenc", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ckpt = killed_dir / "checkpoint"
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"the run ended before being killed: {err.decode()[-500:]}"
    with safetensors.safe_open(str(ckpt / "trainer.safetensors"), framework="pt") as fh:
        killed_at = int(fh.metadata()["step"])
    assert 0 < killed_at < steps
    assert not (killed_dir / "model").exists()

    assert main([*args, "--resume"]) == 0
    assert main(train_cli_args(text_corpus, full_dir, steps)) == 0
    resumed, full = load_model(killed_dir / "model"), load_model(full_dir / "model")
    assert states_equal(resumed, full)
    record = json.loads((killed_dir / "train.json").read_text())
    assert record["start_step"] == killed_at and record["end_step"] == steps
    assert record["losses"] == json.loads((full_dir / "train.json").read_text())["losses"]


@pytest.mark.xdist_group("ports")
def test_two_gloo_processes_match_one(tmp_path, text_corpus):
    """``torchrun --nproc-per-node 2 posenc train`` (DDP, gloo) == 1 process, same global batch."""
    one, two = tmp_path / "one", tmp_path / "two"
    args = train_cli_args(text_corpus, two, 8, checkpoint_every=4)
    cmd, env = torchrun_command(args)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 process(es)" in done.stdout
    assert main(train_cli_args(text_corpus, one, 8, checkpoint_every=4)) == 0
    a = load_model(one / "model").state_dict()
    b = load_model(two / "model").state_dict()
    for key in a:  # float summation order differs (gradients averaged over ranks), nothing else
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    la = json.loads((one / "train.json").read_text())["losses"]
    lb = json.loads((two / "train.json").read_text())["losses"]
    assert json.loads((two / "train.json").read_text())["world_size"] == 2
    torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- memory


def test_train_refuses_a_run_that_does_not_fit_before_starting():
    model = TransformerLM(tiny_config(position="alibi"))
    cfg = TrainConfig(steps=1, batch_size=2**16, seq_len=2**14)  # ~10^14 bytes of attention
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InsufficientMemoryError, match=r"training train .* would not fit in memory"):
        train(model, tiny_data(), cfg, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert issubclass(InsufficientMemoryError, ValueError)  # the CLI reports it as a clear error


def test_stop_at_must_be_a_step():
    with pytest.raises(ValueError, match="stop_at must be >= 0"):
        train(TransformerLM(tiny_config()), tiny_data(), TrainConfig(steps=2), progress=False, stop_at=-1)


# ---------------------------------------------------------------------------------------------- positions
def test_random_positions_train_every_row_of_a_learned_table():
    """With ``random_positions=M`` the model sees positions from [0, M): a learned table of M rows
    trains all of them; with ordinary positions only the first seq_len rows move."""
    data = tiny_data()
    moved = {}
    for m in (0, 64):
        seed_everything(0)
        model = TransformerLM(dataclasses.replace(tiny_config("learned"), max_len=64))
        table = model.decoder.embed.position.weight
        before = table.detach().clone()
        cfg = TrainConfig(steps=8, batch_size=8, seq_len=8, warmup_steps=1, random_positions=m)
        train(model, data, cfg, progress=False)
        changed = (table.detach() - before).abs().amax(dim=1) > 0  # [64] rows that moved
        moved[m] = int(changed[8:].sum())
    assert moved[0] == 0 and moved[64] == 56


def test_random_positions_are_a_pure_function_of_seed_and_step(monkeypatch):
    lab_train = sys.modules["posenc.lab.train"]  # the module (posenc.lab.train is also the function)
    seen = []
    real = lab_train._train_step

    def spy(*args):
        seen.append(args[-1].clone())
        return real(*args)

    monkeypatch.setattr(lab_train, "_train_step", spy)
    cfg = TrainConfig(steps=3, batch_size=4, seq_len=8, warmup_steps=1, random_positions=40)
    for _ in range(2):
        seed_everything(0)
        train(TransformerLM(tiny_config("alibi")), tiny_data(), cfg, progress=False)
    first, second = seen[:3], seen[3:]
    assert all(torch.equal(a, b) for a, b in zip(first, second))  # the same draw in every run
    assert not torch.equal(first[0], first[1])  # a new draw every step
    assert all(p.shape == (4, 8) and int(p.max()) < 40 and bool((p.diff(dim=1) > 0).all()) for p in first)


def test_random_positions_must_cover_the_window():
    with pytest.raises(ValueError, match=r"random_positions=4 must be 0 \(off\) or >= seq_len=8"):
        TrainConfig(seq_len=8, random_positions=4)
