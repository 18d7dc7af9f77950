"""Tests of posenc.analysis.trained: which schemes the report trains, where it caches them, how a
study's checkpoints are read (clear errors for a wrong folder), that each trained scheme is paired
with its own model's initialisation (not another seed's), and that a second report reuses the
cached training."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from _lab_toys import tiny_study, write_corpus
from posenc.analysis import make_probe
from posenc.analysis.trained import default_cache_dir, learnable, read_study, train_for_report
from posenc.base import PositionalScheme
from posenc.model import ModelConfig, TransformerLM

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}


# ---------------------------------------------------------------------------------------------- learnable
class _Table(PositionalScheme):
    """A trainable table over 1-D positions; :class:`_Grid` is the same over 2-D coordinates."""

    name = "test_table"
    hooks = ("embed",)

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(4, 8))

    def embed(self, x, positions=None):
        return x


class _Grid(_Table):
    name = "test_grid"
    position_dims = 2


def test_learnable_keeps_trainable_1d_schemes():
    names = ["learned", "t5", "sinusoidal", "sinusoidal_2d", "rope", "alibi", "nope"]
    probes = [make_probe(n, SMALL) for n in names]
    assert learnable(probes) == ["learned", "t5"]
    # trainable but over 2-D coordinates: the lab trains token sequences only
    assert learnable([make_probe(_Table()), make_probe(_Grid())]) == ["test_table"]
    frozen = make_probe("learned", SMALL)
    frozen.scheme.requires_grad_(False)
    assert learnable([frozen]) == []


def test_default_cache_dir_honours_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "posenc" / "report"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert default_cache_dir() == Path.home() / ".cache" / "posenc" / "report"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "posenc" / "report"


# ---------------------------------------------------------------------------------------------- a study
@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trained") / "corpus"
    folder.mkdir()
    return write_corpus(folder)


@pytest.fixture(scope="module")
def study(corpus) -> Path:
    """One t5 model trained for one step at lr 1e-9: its weights are still its initialisation."""
    from posenc.lab.extrapolate import run_study

    out = corpus.parent / "study"
    config = tiny_study(corpus, schemes=("t5",), steps=1, lr=1e-9, min_lr=1e-9, eval_lens=(8,), variants=())
    run_study(config, out=out, log=None, workers=1)
    return out


def _params(scheme: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in scheme.parameters()])


def _first_scheme(model: torch.nn.Module) -> PositionalScheme:
    return next(m for m in model.modules() if isinstance(m, PositionalScheme))


def test_read_study_errors(study, corpus):
    with pytest.raises(ValueError, match=r"holds no results\.json"):
        read_study(corpus)
    with pytest.raises(ValueError, match=r"has no checkpoint for 'learned' \(learned-seed0\)"):
        read_study(study, ["learned"])


def test_read_study_pairs_the_trained_scheme_with_its_own_initialisation(study):
    results = json.loads((study / "results.json").read_text(encoding="utf-8"))
    (t5,) = read_study(study)
    assert t5.name == "t5" and t5.initial.name == t5.trained.name == "t5"
    assert (t5.steps, t5.train_len, t5.source) == (1, 8, str(study))
    assert t5.final_loss == results["cells"][0]["train"]["final_loss_nats"]
    assert t5.trained.trainable and t5.initial.trainable and t5.trained.causal
    trained, initial = _params(t5.trained.scheme), _params(t5.initial.scheme)
    # one step at lr 1e-9 (x position_lr_scale): the trained table is its initialisation
    assert float((trained - initial).abs().max()) <= 1e-6
    # the same model built here at the study's seed is that initialisation; another seed is not
    config = ModelConfig(**results["model_configs"]["t5"])
    built = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        built[seed] = _params(_first_scheme(TransformerLM(config)))
    assert torch.equal(built[0], initial)
    assert float((built[1] - trained).abs().max()) > 1e-3
    # asking for the scheme by name gives the same pair
    (again,) = read_study(study, ["t5"])
    assert torch.equal(_params(again.trained.scheme), trained)


def test_a_study_at_seed_3_is_paired_with_seed_3s_initialisation(corpus, tmp_path):
    """A study whose seed is not 0: the initial weights are those its own seed drew (a pairing with
    seed 0's initialisation passed every test while the only study had seed 0)."""
    from posenc.lab.extrapolate import run_study

    out = tmp_path / "seed3"
    config = tiny_study(
        corpus, schemes=("t5",), steps=1, lr=1e-9, min_lr=1e-9, eval_lens=(8,), variants=(), seeds=(3,)
    )
    run_study(config, out=out, log=None, workers=1)
    assert (out / "checkpoints" / "t5-seed3").is_dir()
    (t5,) = read_study(out)
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    model_config = ModelConfig(**results["model_configs"]["t5"])
    built = {}
    for seed in (0, 3):
        torch.manual_seed(seed)
        built[seed] = _params(_first_scheme(TransformerLM(model_config)))
    initial = _params(t5.initial.scheme)
    assert torch.equal(built[3], initial) and not torch.equal(built[0], initial)
    assert float((_params(t5.trained.scheme) - initial).abs().max()) <= 1e-6  # lr 1e-9: still its init


def test_read_study_skips_schemes_without_checkpoints_unless_asked(study, tmp_path):
    copy = tmp_path / "study"
    shutil.copytree(study, copy)
    results = json.loads((copy / "results.json").read_text(encoding="utf-8"))
    results["config"]["schemes"] = ["learned", "t5"]  # learned never trained: no checkpoint
    (copy / "results.json").write_text(json.dumps(results), encoding="utf-8")
    assert [t.name for t in read_study(copy)] == ["t5"]
    with pytest.raises(ValueError, match="has no checkpoint for 'learned'"):
        read_study(copy, ["learned", "t5"])


# ---------------------------------------------------------------------------------------------- the cache
def test_train_for_report_trains_once_then_reuses(corpus, tmp_path, monkeypatch):
    import posenc.lab.cells

    overrides = dict(
        steps=1,
        batch_size=4,
        d_model=16,
        num_layers=1,
        num_heads=2,
        train_len=8,
        eval_lens=(8,),
        corpus=str(corpus),
        eval_windows=2,
        warmup_steps=1,
    )
    cache = tmp_path / "cache"
    lines: list[str] = []
    (first,) = train_for_report(["t5"], cache, log=lines.append, workers=1, overrides=overrides)
    assert sum("1 steps in" in line for line in lines) == 1
    assert re.fullmatch(r"study-[0-9a-f]{12}", Path(first.source).name)
    assert Path(first.source).parent == cache and first.steps == 1 and first.train_len == 8

    def no_training(*args, **kwargs):
        raise AssertionError("the second report must not train")

    monkeypatch.setattr(posenc.lab.cells, "train", no_training)
    lines.clear()
    (second,) = train_for_report(["t5"], cache, log=lines.append, workers=1, overrides=overrides)
    assert sum("reused" in line for line in lines) == 1 and not any("steps in" in line for line in lines)
    assert second.source == first.source
    assert torch.equal(_params(second.trained.scheme), _params(first.trained.scheme))
    monkeypatch.undo()
    # anything that decides the weights gives another study folder
    (other,) = train_for_report(["t5"], cache, workers=1, overrides={**overrides, "steps": 2})
    assert other.steps == 2 and other.source != first.source
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        {Path(first.source).name, Path(other.source).name}
    )
    assert train_for_report([], cache) == []


_TRAIN_IN_A_PROCESS = """
import sys
sys.path.insert(0, {tests!r})
from posenc.analysis.trained import train_for_report
(t,) = train_for_report(["t5"], {cache!r}, log=print, workers=1, overrides={overrides!r})
print("trained", t.steps)
"""


@pytest.mark.slow  # two fresh Python processes importing torch and training: 45 s at load 11
def test_two_reports_sharing_a_cache_both_succeed(corpus, tmp_path):
    """The second waits for the first's training, then reuses it: both exit 0, one trains."""
    import subprocess
    import sys

    overrides = dict(
        steps=3,
        batch_size=4,
        d_model=16,
        num_layers=1,
        num_heads=2,
        train_len=8,
        eval_lens=(8,),
        corpus=str(corpus),
        eval_windows=2,
        warmup_steps=1,
    )
    code = _TRAIN_IN_A_PROCESS.format(
        tests=str(Path(__file__).parent), cache=str(tmp_path / "cache"), overrides=overrides
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert "trained 3" in out and "--out" not in out + err  # no flag the user did not pass
    logs = "".join(out for out, _ in outs)
    assert logs.count("3 steps in") == 1 and logs.count("reused") == 1


def test_the_cache_lock_never_follows_a_link(tmp_path):
    """A link planted at the report cache's lock name is refused in one line, and its target is left
    alone (the lock file is opened without following links)."""
    from posenc.analysis.trained import _cache_lock

    target = tmp_path / "someone-elses-file"
    target.write_text("theirs")
    lock = tmp_path / ".report-training.lock"
    lock.symlink_to(target)
    with pytest.raises(ValueError, match=r"report cache's lock .* cannot be opened"), _cache_lock(lock, None):
        pass
    assert target.read_text() == "theirs"
    plain = tmp_path / "plain.lock"
    with _cache_lock(plain, None):
        assert plain.is_file()
