"""The small corpus and untrained models shared by the tests of ``posenc extrapolate --model``."""

from __future__ import annotations

from pathlib import Path

import torch

from posenc.model import ModelConfig, TransformerLM

TEXT = "def f(x):\n    return x * 2 + 1\n" * 40


def write_code_corpus(tmp_path: Path) -> str:
    """Six small Python files (each ``TEXT`` with its own digit) in ``tmp_path/corpus``."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(6):
        (folder / f"m{i}.py").write_text(TEXT.replace("2", str(i)))
    return str(folder)


def untrained_model(position="rope", vocab_size=256, max_len=16, **kw) -> TransformerLM:
    """A d=32, 2-layer model in eval mode; its large init makes attention, and so positions, matter
    in an untrained model."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=vocab_size,
        d_model=32,
        num_layers=2,
        num_heads=4,
        position=position,
        max_len=max_len,
        init_std=0.5,
        **kw,
    )
    return TransformerLM(config).eval()
