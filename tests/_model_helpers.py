"""Shared pieces of the posenc.model tests: small model configs, seeded token ids, a call counter.

Models are tiny (d=32) and float32; ``ALL`` is every registered scheme plus the causal toy schemes of
``_model_toys`` (a test using toys registers them with ``register_toys``).
"""

from __future__ import annotations

import pytest
import torch

import posenc
from _model_toys import CAUSAL_TOYS
from posenc.model import ModelConfig, TransformerLM
from posenc.registry import scheme_class

V = 37


ALL = [*posenc.schemes(), *CAUSAL_TOYS]


def config(position="toy_rotate", **kw) -> ModelConfig:
    base = dict(
        vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, position=position, max_len=64
    )
    base.update(kw)
    return ModelConfig(**base)


def lm_or_skip(position: str, seed: int = 0, **kw) -> TransformerLM:
    """A small eval-mode LM for ``position``, or skip schemes a causal sequence model cannot take."""
    if not scheme_class(position).causal_ok:
        pytest.skip(f"{position} has no causal form")
    torch.manual_seed(seed)
    try:
        model = TransformerLM(config(position, **kw))
    except ValueError as err:
        if "grids" in str(err):
            pytest.skip(f"{position} encodes grids, not sequences")
        raise
    return model.eval()


def count_calls(monkeypatch, owner, name: str, calls: list | None = None) -> list:
    """Wrap ``owner.name`` (for the test's duration) so that each call appends to ``calls``."""
    calls = [] if calls is None else calls
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def ids_(b: int, s: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))


def mha_config(**kw) -> ModelConfig:
    """One attention layer's config: d=32, 4 query heads over 2 key/value heads, no scheme."""
    base = dict(vocab_size=11, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, position="nope")
    base.update(kw)
    return ModelConfig(**base)
