"""Per-call time of posenc's eager RoPE, dropout and input-layer entry points at tiny and decode sizes,
where the cost of a call (validation, the operator dispatch) outweighs the arithmetic.

    python benchmarks/op_call_overhead.py            # JSON: entry point -> microseconds per call

Each entry point is timed in 300 windows of a few calls each, 1 thread, and the fastest window is
kept: on a shared machine a window that no other process interrupted is the call's own cost (longer
windows mostly measure the other processes). To compare two versions, run the script alternately
with each version's sources first on ``PYTHONPATH`` (e.g. a ``git archive`` of the older revision),
a few rounds, and compare the minima.

Shapes: ``tiny`` ``q, k [1, 1, 1, 8]``; ``decode`` ``[8, 32, 1, 128]`` (one decoding step of 8
sequences, 32 heads of 128); tables for one position; the module at position 32767.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch

import posenc


def per_call_us(fn: Callable[[], object], calls: int = 10, windows: int = 300) -> float:
    """The fastest window's time per call of ``fn``, in microseconds (after 50 warm-up calls)."""
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def rope_calls(name: str, shape: tuple[int, ...]) -> dict[str, float]:
    """The RoPE entry points on ``q, k`` of ``shape`` ``[b, h, 1, d_h]``."""
    q, k = torch.randn(*shape), torch.randn(*shape)
    angles = torch.rand(shape[-2], shape[-1] // 2)  # [1, d_h / 2]
    cos, sin = angles.cos(), angles.sin()
    rope = posenc.RotaryEmbedding(shape[-1])
    pos = torch.tensor([32767])
    qg = q.clone().requires_grad_()
    return {
        f"{name} apply_rotary": per_call_us(lambda: posenc.apply_rotary(q, cos, sin)),
        f"{name} apply_rotary_qk": per_call_us(lambda: posenc.apply_rotary_qk(q, k, cos, sin)),
        f"{name} in place": per_call_us(lambda: posenc.apply_rotary(q, cos, sin, out=q)),
        f"{name} module.rotate(q,k,pos)": per_call_us(lambda: rope.rotate(q, k, pos)),
        f"{name} apply_rotary fwd+bwd": per_call_us(
            lambda: posenc.apply_rotary(qg, cos, sin).sum().backward(), calls=5
        ),
    }


def main() -> dict[str, float]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    res = {**rope_calls("tiny", (1, 1, 1, 8)), **rope_calls("decode", (8, 32, 1, 128))}
    layer = posenc.InputEmbedding(100, 64, "sinusoidal", dropout=0.1).train()
    ids = torch.randint(0, 100, (1, 1))
    res["input layer [1,1]x64 train fwd"] = per_call_us(lambda: layer(ids))
    drop = posenc.embedding.Dropout(0.1).train()
    x = torch.randn(64)
    res["Dropout [64]"] = per_call_us(lambda: drop(x))
    return res


if __name__ == "__main__":
    print(json.dumps(main()))
