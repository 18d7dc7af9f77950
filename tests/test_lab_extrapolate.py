"""Tests of posenc.lab.extrapolate: evaluation against a float64 reference, the study end to end,
synthetic tasks, RoPE scalings at evaluation time, configuration errors.

Models are tiny (d=16, 1 layer, a few steps); the full default study is run by hand (docs/lab.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from posenc.base import PositionalScheme
from posenc.cli import main
from posenc.lab import extrapolate as ex
from posenc.lab.extrapolate import (
    EvalPoint,
    StudyConfig,
    eval_slice,
    evaluate_lm,
    evaluate_task,
    format_table,
    study_model_config,
    task_batch_fn,
)
from posenc.model import ModelConfig, TransformerLM
from posenc.registry import SCHEMES, register
from posenc.text.tasks import EOS, SEP, TASK_VOCAB


def tiny_lm(position: str = "alibi", max_len: int = 8, vocab_size: int = 256) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(ModelConfig(vocab_size=vocab_size, d_model=16, num_layers=1, num_heads=2,
                                     position=position, max_len=max_len)).eval()


def reference_bits(model: nn.Module, tokens: torch.Tensor, length: int, train_len: int, stride=None):
    """Bits per token written plainly: each window run alone, log-softmax in float64, one target at a time."""
    n = tokens.shape[0] - 1
    starts = list(range(0, n, length)) if stride is None else list(range(0, n - length + 1, stride))
    all_bits, beyond_bits = [], []
    with torch.no_grad():
        for w, start in enumerate(starts):
            window = tokens[start : start + length + 1].long()
            logp = torch.log_softmax(model(window[None, :-1])[0].double(), dim=-1)  # [E, V]
            first = 0 if stride is None or w == 0 else length - stride
            for i in range(first, length):
                bits = -logp[i, window[i + 1]].item() / math.log(2)
                all_bits.append(bits)
                if i >= train_len:
                    beyond_bits.append(bits)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return mean(all_bits), mean(beyond_bits), len(all_bits), len(beyond_bits)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    source = (Path(__file__).resolve().parents[1] / "src" / "posenc" / "lab" / "train.py").read_text()
    for i in range(12):
        (folder / f"doc{i:02d}.txt").write_text(source[i * 2000 : i * 2000 + 8000])
    return folder


# ---------------------------------------------------------------------------------------------- evaluation
@pytest.mark.parametrize("length", [8, 16, 32])
def test_evaluate_lm_matches_float64_reference(length):
    model = tiny_lm()
    tokens = torch.randint(0, 256, (64 + 1,), generator=torch.Generator().manual_seed(2)).to(torch.uint8)
    point = evaluate_lm(model, tokens, length, train_len=8, batch_tokens=24)  # several batches
    ref_all, ref_beyond, n_all, n_beyond = reference_bits(model, tokens, length, 8)
    assert point.n_scored == n_all == 64  # every length scores the same 64 targets
    assert point.bpb_all == pytest.approx(ref_all, rel=1e-5)
    if length == 8:
        assert point.bpb_beyond is None and point.n_beyond == 0
    else:
        assert point.n_beyond == n_beyond == 64 // length * (length - 8)
        assert point.bpb_beyond == pytest.approx(ref_beyond, rel=1e-5)


def test_evaluate_lm_sliding_window_matches_reference():
    model = tiny_lm()
    tokens = torch.randint(0, 256, (64 + 1,), generator=torch.Generator().manual_seed(3)).to(torch.uint8)
    point = evaluate_lm(model, tokens, 16, train_len=8, stride=4)
    ref_all, ref_beyond, n_all, n_beyond = reference_bits(model, tokens, 16, 8, stride=4)
    assert point.n_scored == n_all == 64 and point.n_beyond == n_beyond
    assert point.bpb_all == pytest.approx(ref_all, rel=1e-5)
    assert point.bpb_beyond == pytest.approx(ref_beyond, rel=1e-5)
    same = evaluate_lm(model, tokens, 16, train_len=8, stride=16)  # stride E == non-overlapping windows
    assert same.bpb_all == pytest.approx(evaluate_lm(model, tokens, 16, train_len=8).bpb_all, rel=1e-6)


def test_evaluation_errors():
    model = tiny_lm()
    tokens = torch.zeros(65, dtype=torch.uint8)
    with pytest.raises(ValueError, match="must be a multiple of the length 24"):
        evaluate_lm(model, tokens, 24, train_len=8)
    with pytest.raises(ValueError, match=r"stride=5 does not tile 64 tokens with windows of 16"):
        evaluate_lm(model, tokens, 16, train_len=8, stride=5)
    with pytest.raises(ValueError, match=r"the validation data has 65 tokens, fewer than eval_offset"):
        eval_slice(tokens, 64, offset=1)
    assert eval_slice(torch.arange(100), 10, 5).tolist() == list(range(5, 16))


def test_eval_batch_shrinks_when_memory_is_short(monkeypatch):
    config = tiny_lm().config
    assert ex._eval_batch(config, 64, 16, 4096, torch.device("cpu")) == 16
    monkeypatch.setattr(ex, "available_memory", lambda device: 4 * 2**20)  # 4 MiB free
    assert ex._eval_batch(config, 64, 16, 4096, torch.device("cpu")) < 16


# ---------------------------------------------------------------------------------------------- study
def test_tiny_study_end_to_end(tmp_path, corpus_dir, capsys):
    out = tmp_path / "study"
    code = main(["extrapolate", "--schemes", "learned,alibi", "--train-len", "8", "--eval-lens", "8,16,32",
                 "--steps", "6", "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2",
                 "--corpus", str(corpus_dir), "--eval-tokens", "256", "--seed", "3", "--threads", "1",
                 "--no-progress", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "bits/byte, positions >= L=8 only" in printed and "n/a" in printed
    results = json.loads((out / "results.json").read_text())
    assert (out / "extrapolation.png").stat().st_size > 0 and (out / "extrapolation.svg").stat().st_size > 0
    assert (out / "checkpoints" / "alibi.safetensors").exists()

    cfg = results["config"]
    assert cfg["schemes"] == ["learned", "alibi"] and cfg["eval_lens"] == [8, 16, 32]
    assert cfg["train_len"] == 8
    assert cfg["seed"] == 3 and cfg["steps"] == 6 and cfg["mode"] == "lm"
    env = results["environment"]
    assert {"python", "torch", "posenc", "threads", "device"} <= env.keys()
    assert len(results["corpus"]["sha256"]) == 64 and results["corpus"]["python_version"] == env["python"]
    assert results["wall_s"] > 0 and results["eval"]["tokens"] == 256
    assert results["train_config"]["steps"] == 6 and results["train_config"]["seq_len"] == 8
    runs = {r["name"]: r for r in results["runs"]}
    assert set(runs) == {"learned", "alibi"}
    for run in runs.values():
        assert run["params"] > 0 and math.isfinite(run["train"]["final_loss_nats"])
        assert [p["length"] for p in run["eval"]] == [8, 16, 32]
    learned = {p["length"]: p for p in runs["learned"]["eval"]}
    assert math.isfinite(learned[8]["bpb_all"]) and learned[8]["bpb_beyond"] is None
    for e in (16, 32):  # learned positions cannot run past L: n/a, not a crash
        assert learned[e]["bpb_all"] is None and learned[e]["bpb_beyond"] is None
        assert learned[e]["note"].startswith("n/a")
    for p in runs["alibi"]["eval"]:
        assert math.isfinite(p["bpb_all"]) and 0 < p["bpb_all"] < 16 and p["n_scored"] == 256
        assert (p["bpb_beyond"] is None) == (p["length"] <= 8)
        if p["bpb_beyond"] is not None:
            assert math.isfinite(p["bpb_beyond"]) and p["n_beyond"] == 256 // p["length"] * (p["length"] - 8)

    # --resume finds every scheme finished and only re-evaluates: the same numbers
    again = ex.run_study(StudyConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}),
                         out=out, resume=True, log=None, progress=False)
    def numbers(res):
        return [[{k: v for k, v in p.items() if k != "wall_s"} for p in r["eval"]] for r in res["runs"]]

    assert numbers(again) == numbers(results)
    assert all(r["train"]["resumed_from"] == 6 for r in again["runs"])


def test_same_batches_for_every_scheme(corpus_dir, monkeypatch):
    seen: dict[str, list] = {}
    real_train = ex.train

    def spy(model, data, config, **kw):
        seen[model.config.position] = [data, config, [p.detach().clone() for p in model.parameters()]]
        return real_train(model, data, config, **kw)

    monkeypatch.setattr(ex, "train", spy)
    config = StudyConfig(schemes=("nope", "sinusoidal"), train_len=8, eval_lens=(8,), steps=2, batch_size=2,
                         d_model=16, num_layers=1, num_heads=2, corpus=str(corpus_dir), eval_tokens=64)
    results = ex.run_study(config, log=None, progress=False)
    # same data and TrainConfig (batches are a pure function of data, seed and step: test_lab_train)
    (data_a, cfg_a, init_a), (data_b, cfg_b, init_b) = seen["nope"], seen["sinusoidal"]
    assert torch.equal(data_a, data_b) and cfg_a == cfg_b
    assert all(torch.equal(x, y) for x, y in zip(init_a, init_b))  # neither scheme has parameters
    assert results["model_configs"]["nope"]["position"] == "nope"


def test_format_table_marks_missing_values():
    results = {
        "config": {"mode": "lm", "train_len": 8, "eval_lens": [8, 16]},
        "runs": [
            {"name": "learned", "eval": [EvalPoint(8, 2.5).__dict__, EvalPoint(16, note="n/a").__dict__]},
            {"name": "alibi", "eval": [EvalPoint(8, 2.4).__dict__, EvalPoint(16, 2.3, 2.2).__dict__]},
        ],
    }
    table = format_table(results)
    lines = table.splitlines()
    assert lines[0] == "bits/byte, all positions"
    assert lines[2].split() == ["learned", "2.500", "n/a"] and lines[3].split() == ["alibi", "2.400", "2.300"]
    assert lines[7].split() == ["learned", "-", "n/a"] and lines[8].split() == ["alibi", "-", "2.200"]


def test_t5_gets_unidirectional_buckets_in_the_study():
    config = StudyConfig(schemes=("t5",), eval_lens=(128,))
    lm = TransformerLM(study_model_config(config, "t5"))
    assert lm.decoder.scheme(0).bidirectional is False
    assert TransformerLM(study_model_config(config, "alibi")).decoder.scheme(0).causal is True


# ---------------------------------------------------------------------------------------------- RoPE scalings
def test_rope_scaling_rows_at_evaluation():
    rotary = pytest.importorskip("posenc.rotary")
    if "rope" not in SCHEMES:
        pytest.skip("rope is not registered")
    opts = ex.scaled_rope_options("yarn", 4.0, 128)["scaling"]
    assert opts == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    assert ex.scaled_rope_options("linear", 2.0, 128) == {"scaling": {"rope_type": "linear", "factor": 2.0}}
    assert "linear" in rotary.ROPE_SCALINGS
    model = tiny_lm("rope")
    tokens = torch.randint(0, 256, (33,), generator=torch.Generator().manual_seed(4)).to(torch.uint8)
    ids = tokens[None, :16].long()
    mc = model.config
    with torch.no_grad():
        plain = model(ids)
        for factor in (1.0, 2.0):
            options = {**mc.position_options, **ex.scaled_rope_options("linear", factor, 8)}
            scaled = TransformerLM(ModelConfig(**{**mc.to_dict(), "position_options": options})).eval()
            scaled.load_state_dict(model.state_dict())  # same weights, other frequencies
            if factor == 1.0:  # linear interpolation with factor 1 is plain RoPE
                torch.testing.assert_close(scaled(ids), plain, rtol=0, atol=0)
            else:
                assert not torch.allclose(scaled(ids), plain, rtol=0, atol=1e-7)
    # the study adds rope+<rule> rows evaluated at every length (factor max(1, E / L))
    config = StudyConfig(schemes=("rope",), train_len=8, eval_lens=(8, 16), rope_scalings=("linear", "yarn"))
    rows = ex._scaled_rope_runs(config, model, mc, tokens, torch.device("cpu"), lambda _m: None)
    assert [r.name for r in rows] == ["rope+linear", "rope+yarn"]
    assert [p.note for p in rows[1].eval] == ["factor 1", "factor 2"]
    linear_at_l = rows[0].eval[0].bpb_all
    assert linear_at_l == pytest.approx(evaluate_lm(model, tokens, 8, train_len=8).bpb_all, rel=1e-6)


# ---------------------------------------------------------------------------------------------- tasks
class CopyOracle(nn.Module):
    """Predicts the copy task perfectly from the question it is given (one-hot logits)."""

    def __init__(self, wrong_at: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.wrong_at = wrong_at

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [b, 2n + 2] = BOS q SEP a
        s = ids.shape[1]
        n = (s - 2) // 2
        nxt = torch.zeros_like(ids)
        # position t predicts token t + 1: SEP (token n + 1), the answer (tokens n + 2 .. 2n + 1), EOS
        nxt[:, n] = SEP
        nxt[:, n + 1 : 2 * n + 1] = ids[:, 1 : n + 1]
        nxt[:, 2 * n + 1] = EOS
        if self.wrong_at is not None:
            nxt[:, n + 1 + self.wrong_at] = (nxt[:, n + 1 + self.wrong_at] + 1) % len(TASK_VOCAB)
        return nn.functional.one_hot(nxt, len(TASK_VOCAB)).float() + 0 * self.weight


def test_evaluate_task_aligns_predictions_with_answers():
    assert evaluate_task(CopyOracle(), "copy", 6, 20, seed=0).accuracy == 1.0
    assert evaluate_task(CopyOracle(wrong_at=3), "copy", 6, 20, seed=0).accuracy == 0.0


def test_task_batches_score_answers_only():
    batch = task_batch_fn("reverse", 8, 5, seed=0)
    ids, targets = batch(3, 0, 1)
    again = batch(3, 0, 1)
    assert torch.equal(ids, again[0]) and torch.equal(targets, again[1])  # pure in the step
    assert ids.shape == targets.shape and ids.shape[0] == 8
    for row_ids, row_targets in zip(ids, targets):
        sep = int((row_ids == SEP).nonzero()[0])
        question = row_ids[1:sep].tolist()  # BOS q1..qn SEP ...
        assert 1 <= len(question) <= 5
        scored = row_targets[row_targets != -100].tolist()
        assert scored == [*question[::-1], EOS]  # exactly the answer and EOS count
    top, bottom = batch(3, 0, 2), batch(3, 1, 2)
    assert torch.equal(torch.cat((top[0], bottom[0])), ids)  # ranks partition the global batch


def test_tiny_task_study(tmp_path, capsys):
    code = main(["extrapolate", "--task", "copy", "--schemes", "learned,nope", "--train-len", "4",
                 "--eval-lens", "2,4,8", "--steps", "4", "--batch-size", "8", "--d-model", "16",
                 "--layers", "1", "--heads", "2", "--threads", "1", "--no-progress", "--out", str(tmp_path)])
    assert code == 0
    assert "exact-match accuracy, task 'copy'" in capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    runs = {r["name"]: {p["length"]: p for p in r["eval"]} for r in results["runs"]}
    assert all(0.0 <= runs["nope"][n]["accuracy"] <= 1.0 for n in (2, 4, 8))
    assert runs["learned"][8]["accuracy"] is None and runs["learned"][8]["note"].startswith("n/a")
    assert runs["learned"][4]["accuracy"] is not None


# ---------------------------------------------------------------------------------------------- config errors
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
        ({"mode": "sort"}, ValueError, "unknown mode 'sort'; valid values: 'lm', 'copy'"),
        ({"mode": "copy", "stride": 4}, ValueError, "stride applies to mode='lm' only"),
        ({"num_heads": 3}, ValueError, "num_heads=3 must divide d_model=128"),
        ({"train_len": 0}, ValueError, "train_len must be >= 1"),
        ({"steps": 1.5}, TypeError, "steps must be an int"),
    ],
)
def test_study_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        StudyConfig(**{"schemes": ("alibi",), **kwargs})


def test_study_refuses_a_non_causal_scheme(bidirectional_scheme):
    with pytest.raises(ValueError, match="has no causal form, so it cannot run in a decoder-only LM"):
        StudyConfig(schemes=(bidirectional_scheme,))


def test_eval_tokens_rounded_to_every_length():
    # lcm(128, 192) = 384; 1000 tokens round up to 3 x 384
    assert StudyConfig(("alibi",), eval_lens=(128, 192), eval_tokens=1000).n_eval_tokens() == 1152
    assert StudyConfig(("alibi",)).n_eval_tokens() == 16 * 2048


def test_cli_list_flag_errors(capsys):
    assert main(["extrapolate", "--eval-lens", "128,abc"]) == 2
    assert "--eval-lens '128,abc' is not a comma list of ints" in capsys.readouterr().err
    assert main(["extrapolate", "--schemes", ","]) == 2
    assert "--schemes ',' is empty" in capsys.readouterr().err


def test_cli_resume_needs_out(capsys):
    assert main(["extrapolate", "--schemes", "alibi", "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_cuda_without_a_gpu(capsys, tmp_path):
    assert main(["extrapolate", "--schemes", "alibi", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "--device cuda but torch sees no CUDA device" in capsys.readouterr().err
