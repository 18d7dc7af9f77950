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


def write_corpus(folder: Path, n_docs: int = 12, size: int = 8000) -> Path:
    """``n_docs`` text files cut from posenc's own source (stable across Python versions)."""
    source = (Path(__file__).resolve().parents[1] / "src" / "posenc" / "lab" / "train.py").read_text()
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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "posenc", *args]  # fmt: skip
    return cmd, env
