"""Same-process timings behind figures in docs/performance.md and benchmarks/RESULTS.md.

``posenc bench`` times each implementation between its peers; these loops instead alternate two or
three calls in one process, 11 rounds, medians printed (2 threads). Run from the repository root:

    python benchmarks/same_process.py rope fp32   # in place vs x.mul_(1), out= vs a copy, fresh outputs
    python benchmarks/same_process.py rope bf16     # ... and compute_dtype=torch.float32 (one rounding)
    POSENC_HUGEPAGES=1 python benchmarks/same_process.py fresh   # fresh outputs with the huge-page hint
    POSENC_HUGEPAGES=0 python benchmarks/same_process.py fresh   # ... and without it
    python benchmarks/same_process.py blocks        # biased attention: blocks of 256 vs 768 queries
    python benchmarks/same_process.py blocks train  # ... forward + backward at L = 4096
    python benchmarks/same_process.py decode        # one decode step: module, tables, function
    python benchmarks/same_process.py module bf16   # the module against the function, out of place
    python benchmarks/same_process.py module bf16 long  # ... on the long prefill [1, 32, 16384, 128]
    python benchmarks/same_process.py hot           # the kernel's own rate in L2, one thread
    python benchmarks/same_process.py tables        # laying out a sinusoidal table: strided out= vs a copy

Shapes as in RESULTS.md: q and k ``[4, 32, 2048, 128]``; the input layer ``[8, 2048]`` ids, d = 768.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import posenc
from posenc.kernels import rope_cpu
from posenc.model import blocked


def _medians(fns: dict, rounds: int = 11) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for _ in range(rounds):
            for name, fn in fns.items():
                fn()  # warm: the second call is timed
                t0 = time.perf_counter()
                out = fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
                del out
    return {name: statistics.median(v) for name, v in times.items()}


def rope(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(4, 32, 2048, 128, generator=gen).to(dtype) for _ in range(2))
    rot = posenc.build("rope", head_dim=128, compute_dtype="input")  # bf16: every operation rounded
    tables = rot.rotary_tables(q, k)
    cos, sin = tables.q_cos, tables.q_sin
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    wide = posenc.RotaryEmbedding(128, compute_dtype=torch.float32)  # bf16: float32 math, one rounding
    c32, s32 = wide.rotary_tables(q, k)[:2]

    def once_in_place():
        return rope_cpu.rotate(q, c32, s32, "half", out=q), rope_cpu.rotate(k, c32, s32, "half", out=k)

    once = {"in place, float32 math": once_in_place} if dtype == torch.bfloat16 else {}
    m = _medians(
        {
            **once,
            "floor x.mul_(1)": lambda: (q.mul_(1), k.mul_(1)),
            "in place half": lambda: (
                rope_cpu.rotate(q, cos, sin, "half", out=q),
                rope_cpu.rotate(k, cos, sin, "half", out=k),
            ),
            "in place interleaved": lambda: (
                rope_cpu.rotate(q, cos, sin, "interleaved", out=q),
                rope_cpu.rotate(k, cos, sin, "interleaved", out=k),
            ),
            "copy into buffer": lambda: (dq.copy_(q), dk.copy_(k)),
            "out= into buffer": lambda: (
                rope_cpu.rotate(q, cos, sin, "half", out=dq),
                rope_cpu.rotate(k, cos, sin, "half", out=dk),
            ),
            "function, fresh outputs": lambda: posenc.apply_rotary_qk(q, k, cos, sin, cos, sin),
            "module rotate": lambda: rot.rotate(q, k),
        }
    )
    for name, ms in m.items():
        print(f"{name:24s} {ms:7.2f} ms")
    floor, copy = m["floor x.mul_(1)"], m["copy into buffer"]
    print(
        f"in place: {floor / m['in place half']:.0%} / {floor / m['in place interleaved']:.0%} of the floor; "
        f"out= {copy / m['out= into buffer']:.0%}, module {copy / m['module rotate']:.0%} of the copy"
    )
    if once:
        print(f"float32 math: in place {floor / m['in place, float32 math']:.0%} of the floor")


def fresh() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 32, 2048, 128, generator=gen)
    ang = torch.arange(2048, dtype=torch.float64)[:, None] * torch.rand(
        64, dtype=torch.float64, generator=gen
    )
    cos, sin = ang.cos().float(), ang.sin().float()
    layer = posenc.InputEmbedding(32000, 768, "sinusoidal").eval()
    ids = torch.randint(0, 32000, (8, 2048), generator=gen)
    m = _medians(
        {
            "rope out of place": lambda: rope_cpu.rotate(q, cos, sin, "half"),
            "InputEmbedding eval": lambda: layer(ids),
            "token gather": lambda: layer.token(ids),
        },
        rounds=8,
    )
    for name, ms in m.items():
        print(f"{name:24s} {ms:7.2f} ms")


def decode() -> None:
    """One decode step, q and k ``[8, 32, 1, 128]`` at position 32767 (float32): where the module's
    time goes (microseconds per call, 2000 calls after 100 warm-up calls)."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(8, 32, 1, 128, generator=gen) for _ in range(2))
    pos = torch.tensor([32767])
    rope = posenc.RotaryEmbedding(128)
    tab = rope.rotary_tables(q, k, pos, pos)
    calls = {
        "module rotate": lambda: rope.rotate(q, k, pos, pos),
        "rotate(tables=...)": lambda: rope.rotate(q, k, pos, pos, tables=tab),
        "rotary_tables": lambda: rope.rotary_tables(q, k, pos, pos),
        "apply_rotary_qk": lambda: posenc.apply_rotary_qk(q, k, tab.q_cos, tab.q_sin, tab.k_cos, tab.k_sin),
    }
    for name, fn in calls.items():
        for _ in range(100):
            fn()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        print(f"{name:24s} {(time.perf_counter() - t0) / 2000 * 1e6:7.1f} us")


def module(dtype: torch.dtype, shape: tuple[int, ...] = (4, 32, 2048, 128)) -> None:
    """The module against the function, out of place, q and k ``shape``: ``rotate`` with its
    tables built in the call, from rows precomputed at build time, with tables passed in, the
    function on precomputed tables, and the tables alone, against a copy (glibc keeps freed memory,
    as ``posenc bench --allocator keep``); in bf16 also the module with
    ``compute_dtype=torch.float32``."""
    from posenc.benchmarks.harness import set_allocator

    set_allocator("keep")
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(*shape, generator=gen).to(dtype) for _ in range(2))
    rot = posenc.RotaryEmbedding(128, compute_dtype="input")  # bf16: every operation rounded
    tab = rot.rotary_tables(q, k)
    cos, sin = tab.q_cos, tab.q_sin
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    wide = posenc.RotaryEmbedding(128, compute_dtype=torch.float32)  # bf16: float32 math, one rounding
    once = {"module rotate, float32 math": lambda: wide.rotate(q, k)} if dtype == torch.bfloat16 else {}
    kept = posenc.RotaryEmbedding(128, precompute=shape[-2])  # rows of the default positions, made here
    m = _medians(
        {
            **once,
            "copy into buffers": lambda: (dq.copy_(q), dk.copy_(k)),
            "module rotate": lambda: rot.rotate(q, k),
            "module, precompute=s": lambda: kept.rotate(q, k),
            "rotate(tables=...)": lambda: rot.rotate(q, k, tables=tab),
            "apply_rotary_qk": lambda: posenc.apply_rotary_qk(q, k, cos, sin, cos, sin),
            "rotary_tables": lambda: rot.rotary_tables(q, k),
        }
    )
    for name, ms in m.items():
        print(f"{name:24s} {ms:7.2f} ms")
    print(f"module: {m['module rotate'] / m['apply_rotary_qk'] - 1:+.1%} of the function's time", end="")
    print(f", with precompute {m['module, precompute=s'] / m['apply_rotary_qk'] - 1:+.1%}")
    copy = m["copy into buffers"]
    print(f"module {copy / m['module rotate']:.0%} of the copy", end="")
    print(f", float32 math {copy / m['module rotate, float32 math']:.0%}" if once else "")


def hot() -> None:
    """The kernel's own rate, one thread, in place on ``[1, 16, 96, 128]`` rows that stay in L2,
    against ``x.mul_(1)`` of the same tensor: nanoseconds per row of 64 pairs."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 16, 96, 128, generator=gen).to(dtype)
        inv, _ = posenc.rope_frequencies(128)
        cos, sin = posenc.rope_cos_sin(torch.arange(96), inv, dtype=dtype)
        for name in ("half", "interleaved", "x.mul_(1)"):
            args = (x, cos, sin, name)
            for n in (100, 1000):  # warm up, then time
                t0 = time.perf_counter()
                for _ in range(n):
                    x.mul_(1) if name == "x.mul_(1)" else rope_cpu.rotate(*args, out=x)
            per_row = (time.perf_counter() - t0) / 1000 / (16 * 96) * 1e9
            print(f"{str(dtype)[6:]:9s} {name:12s} {per_row:6.1f} ns per row")


def tables() -> None:
    """Laying out a [2048, 768] sinusoidal table: sin written into strided columns against sin of
    contiguous angles plus one layout copy, and the interleaving copy by stack or by a complex view."""
    angles = torch.arange(2048.0)[:, None] * torch.rand(384)  # [s, d/2]
    table = torch.empty(2048, 768)
    sin, cos = angles.sin(), angles.cos()
    m = _medians(
        {
            "sin into every other column": lambda: torch.sin(angles, out=table[:, 0::2]),
            "sin into the first half": lambda: torch.sin(angles, out=table[:, :384]),
            "sin, contiguous": lambda: torch.sin(angles),
            "interleave: stack": lambda: torch.stack((sin, cos), -1).flatten(-2),
            "interleave: complex view": lambda: torch.view_as_real(torch.complex(sin, cos)).flatten(-2),
            "halves: cat": lambda: torch.cat((sin, cos), -1),
            "sinusoidal_table": lambda: posenc.sinusoidal_table(2048, 768),
            "sinusoidal_table t2t": lambda: posenc.sinusoidal_table(2048, 768, variant="tensor2tensor"),
        },
        rounds=21,
    )
    for name, ms in m.items():
        print(f"{name:28s} {ms:7.3f} ms")


def _biased(q, k, v, scheme, size: int | None, train: bool):
    """Causal attention of q/k/v: SDPA without a bias (``size`` 0), else with ``scheme``'s bias in
    blocks of ``size`` queries (None: automatic); ``train``: also the backward of its sum."""
    import torch.nn.functional as F

    if size == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        pos = torch.arange(q.shape[2])
        fn = blocked.scheme_bias_fn(scheme, pos, pos)
        out = blocked.causal_attention_with_bias(q, k, v, fn, block_size=size)
    if train:
        out.sum().backward()
    return out


def blocks(train: bool) -> None:
    """Causal attention with a bias (q/k/v ``[1, 16, L, 64]``), blocks of 256 and 768 queries and
    the automatic choice, over causal SDPA without a bias; ``train``: forward + backward, L = 4096."""
    cases = [("alibi", 4096), ("t5", 4096)] if train else [("alibi", n) for n in (2048, 3072, 4096, 8192)]
    for name, length in cases:
        gen = torch.Generator().manual_seed(0)
        qkv = [torch.randn(1, 16, length, 64, generator=gen).requires_grad_(train) for _ in range(3)]
        scheme = posenc.build(name, num_heads=16)
        sizes = {"sdpa": 0, "256": 256, "768": 768, "auto": None}
        times: dict[str, list[float]] = {n: [] for n in sizes}
        with torch.set_grad_enabled(train):
            for _ in range(5):
                for n, size in sizes.items():
                    t0 = time.perf_counter()
                    _biased(*qkv, scheme, size, train)
                    times[n].append(time.perf_counter() - t0)
        base = statistics.median(times["sdpa"])
        ratios = ", ".join(f"{n} {statistics.median(t) / base:.2f}x" for n, t in times.items() if n != "sdpa")
        print(f"{name} L={length}{' fwd+bwd' if train else ''}: sdpa {base * 1e3:.0f} ms; {ratios}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    what = sys.argv[1] if len(sys.argv) > 1 else "rope"
    if what == "rope":
        rope({"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[2] if len(sys.argv) > 2 else "fp32"])
    elif what == "fresh":
        fresh()
    elif what == "decode":
        decode()
    elif what == "module":
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[2] if len(sys.argv) > 2 else "fp32"]
        module(dtype, (1, 32, 16384, 128) if sys.argv[3:] == ["long"] else (4, 32, 2048, 128))
    elif what == "hot":
        hot()
    elif what == "blocks":
        blocks(train=sys.argv[2:] == ["train"])
    elif what == "tables":
        tables()
    else:
        sys.exit(
            "usage: same_process.py rope [fp32|bf16] | module [fp32|bf16] [long] | hot | fresh"
            " | blocks [train] | decode | tables"
        )
