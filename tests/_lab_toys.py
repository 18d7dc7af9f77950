"""Small models and corpora shared by the lab's tests (d=16, 1 layer: seconds, not minutes)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from posenc.model import ModelConfig, TransformerLM


def tiny_lm(position: str = "alibi", max_len: int = 8, vocab_size: int = 256) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(
        ModelConfig(
            vocab_size=vocab_size, d_model=16, num_layers=1, num_heads=2, position=position, max_len=max_len
        )
    ).eval()


def lab_text() -> str:
    """posenc's own training loop, as text: a corpus that is the same across Python versions."""
    return (Path(__file__).resolve().parents[1] / "src" / "posenc" / "lab" / "train.py").read_text()


def write_corpus(folder: Path, n_docs: int = 12, size: int = 8000) -> Path:
    """``n_docs`` text files cut from posenc's own source (stable across Python versions)."""
    source = lab_text()
    source = source * (1 + n_docs * size // len(source))
    for i in range(n_docs):
        (folder / f"doc{i:02d}.txt").write_text(source[i * 2000 : i * 2000 + size])
    return folder


def tiny_study(corpus: Path, **overrides):
    """A StudyConfig that trains in a second: d=16, 1 layer, L=8, a few steps."""
    from posenc.lab.config import StudyConfig

    fields = dict(
        schemes=("alibi",),
        train_len=8,
        eval_lens=(8, 16, 32),
        steps=4,
        batch_size=4,
        d_model=16,
        num_layers=1,
        num_heads=2,
        corpus=str(corpus),
        eval_windows=6,
        warmup_steps=1,
        checkpoint_every=0,
    )
    fields.update(overrides)
    return StudyConfig(**fields)


def torchrun_command(args: list[str], nproc: int = 2) -> tuple[list[str], dict[str, str]]:
    """``torchrun --standalone --nproc-per-node N -m posenc ARGS`` and an environment that finds posenc."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "posenc",
        *args,
    ]
    return cmd, env


def tiny_config(position: str = "alibi", dropout: float = 0.0, **kw) -> ModelConfig:
    """A training-sized LM config: vocabulary 64 (bytes of tiny_data), d=16, 1 layer, max_len 16."""
    return ModelConfig(
        vocab_size=64,
        d_model=16,
        num_layers=1,
        num_heads=2,
        position=position,
        max_len=16,
        dropout=dropout,
        **kw,
    )


def tiny_data(n: int = 4000) -> torch.Tensor:
    """``n`` seeded random tokens below 64, as a uint8 stream."""
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(1)).to(torch.uint8)


def states_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """The two modules hold the same state dict keys, each tensor bit-equal."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def text_corpus_in(folder: Path) -> Path:
    """12 overlapping text files of up to 6000 characters (a corpus for ``posenc train``)."""
    source = lab_text()
    for i in range(12):
        (folder / f"doc{i}.txt").write_text(source[i * 900 : i * 900 + 6000])
    return folder


def train_cli_args(corpus: Path, out: Path, steps: int, **extra) -> list[str]:
    """``posenc train`` arguments for a tiny alibi run (d=16, 1 layer) on ``corpus``; ``extra``
    adds ``--key value`` flags."""
    args = [
        "train",
        "--scheme",
        "alibi",
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--train-len",
        "16",
        "--batch-size",
        "4",
        "--d-model",
        "16",
        "--layers",
        "1",
        "--heads",
        "2",
        "--threads",
        "1",
        "--no-progress",
    ]
    for key, value in extra.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


#: the flags of a study that trains and evaluates in seconds (d=16, 1 layer, L=8, 6 steps)
TINY = [
    "--train-len",
    "8",
    "--eval-lens",
    "8,16,32",
    "--steps",
    "6",
    "--batch-size",
    "4",
    "--d-model",
    "16",
    "--layers",
    "1",
    "--heads",
    "2",
    "--eval-windows",
    "6",
    "--threads",
    "1",
    "--workers",
    "1",
    "--no-progress",
]
