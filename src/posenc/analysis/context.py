"""The sizes analysis builds schemes with by default (no torch here: ``posenc report --help`` reads them)."""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_CONTEXT"]

#: What a model offers a scheme when analysis builds it by name (a small Transformer's sizes).
DEFAULT_CONTEXT: dict[str, Any] = {
    "d_model": 128,
    "num_heads": 8,
    "head_dim": 64,
    "max_len": 512,
    "causal": False,
}
