"""Two builds of one C kernel in one process, alternated: the source at a git revision against the
working tree's, on the shapes of benchmarks/RESULTS.md, 2 threads, allocator keep.

    python benchmarks/ab_kernel.py embed REV eval        # the input layer, eval forward
    python benchmarks/ab_kernel.py embed REV train       # train forward (dropout 0.1)
    python benchmarks/ab_kernel.py embed REV backward    # train forward + backward
    python benchmarks/ab_kernel.py rope REV bf16 half    # RoPE in place (also: fp32, interleaved)
    python benchmarks/ab_kernel.py rope REV bf16once half  # bf16 with compute_dtype=torch.float32
    python benchmarks/ab_kernel.py rope REV bf16 half out  # out of place (a fresh output; limit: a copy)

Each round times the old build, the new one (the order alternates) and the case's limit (a copy,
or ``x.mul_(1)`` for RoPE in place), each call warmed once; it prints the medians and the median
of the per-round ratios new / old with their quartiles. Outputs are compared first: eval and RoPE
must be bit-identical between the builds (a change meant to keep the numbers).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch

import posenc
from posenc.benchmarks.harness import set_allocator
from posenc.kernels import _cbuild, input_cpu, rope_cpu

_KERNELS = {"embed": (input_cpu, "embed_cpu", input_cpu._fns), "rope": (rope_cpu, "rope_cpu", rope_cpu._fn)}


CSRC = f"{__file__.rsplit('/', 2)[0]}/src/posenc/kernels/csrc"  # from the repository root


def build(kind: str, read, check: bool = True) -> dict:
    """The loaded state of ``kind``'s kernel built from the sources ``read(filename) -> text`` gives;
    ``check=False`` skips its self-check (the caller compares outputs instead)."""
    module, name, load = _KERNELS[kind]
    _cbuild._loaded.pop(name, None)
    module._state.clear()
    module._SOURCE = _cbuild.source(name, read)
    saved = getattr(module, "_self_check", None)
    if saved is not None and not check:
        module._self_check = lambda: True
    try:
        loaded = load()
    finally:
        if saved is not None:
            module._self_check = saved
    if loaded is None:
        raise SystemExit(f"the {name} build did not load or failed its self-check")
    return dict(module._state)


def _builds(kind: str, rev: str) -> tuple[object, dict[str, dict]]:
    """The kernel module and its loaded state for each source: ``{"old": ..., "new": ...}``."""

    def at_rev(filename: str) -> str:  # a path from the top of the tree, whatever the directory
        spec = f"{rev}:src/posenc/kernels/csrc/{filename}"
        return subprocess.run(
            ["git", "show", spec], capture_output=True, text=True, check=True, cwd=CSRC
        ).stdout

    def here(filename: str) -> str:
        with open(f"{CSRC}/{filename}") as f:
            return f.read()

    # today's self-check may ask an old build for more (the outputs are compared in main instead)
    return _KERNELS[kind][0], {"old": build(kind, at_rev, check=False), "new": build(kind, here)}


def _embed_case(mode: str):
    """(timed call, limit, the output to compare between builds) for the input layer."""
    b, s, d, v = 8, 2048, 768, 32000
    ids = torch.randint(0, v, (b, s))
    model = posenc.InputEmbedding(v, d, "sinusoidal", dropout=0.1, scheme_options={"precompute": s})
    model.train(mode != "eval")
    grad = torch.randn(b, s, d)

    def call():
        if mode == "backward":
            out = model(ids)
            out.backward(grad)
            model.zero_grad(set_to_none=True)
            return out.detach()
        with torch.no_grad():
            return model(ids)

    def output():
        torch.manual_seed(0)  # the same dropout seed for both builds
        return call()

    dst, src = torch.empty(b, s, d), torch.randn(b, s, d)
    return call, (lambda: dst.copy_(src)), output


def _rope_case(dtype: str, layout: str, out: bool):
    """(timed call, its limit, the out-of-place output to compare) for RoPE: in place against
    ``x.mul_(1)``, or (``out``) out of place against a copy into an existing buffer."""
    x = torch.randn(4, 32, 2048, 128).to(torch.float32 if dtype == "fp32" else torch.bfloat16)
    angles = torch.arange(2048.0)[:, None] * torch.rand(64)  # [s, r/2]
    # bf16once: float32 tables and arithmetic, one rounding; otherwise x's dtype, every operation rounded
    once = dtype == "bf16once"
    math = {"compute_dtype": torch.float32 if once else "input"}
    cos, sin = (t if once else t.to(x.dtype) for t in (angles.cos(), angles.sin()))
    y = x.clone()
    if out:
        return (
            lambda: posenc.apply_rotary(x, cos, sin, layout=layout, **math),
            lambda: y.copy_(x),
            lambda: posenc.apply_rotary(x, cos, sin, layout=layout, **math),
        )
    return (
        lambda: posenc.apply_rotary(y, cos, sin, layout=layout, out=y, **math),
        lambda: x.mul_(1),
        lambda: posenc.apply_rotary(x, cos, sin, layout=layout, **math),
    )


def _time(call, limit, use, rounds: int, tags: tuple[str, ...] = ("old", "new")) -> dict[str, list[float]]:
    """Per-round seconds of each build in ``tags`` (the order rotating from round to round: two
    builds alternate) and of the limit (``"limit"``); ``use(tag)`` switches to a build."""
    times: dict[str, list[float]] = {tag: [] for tag in (*tags, "limit")}
    for r in range(rounds):
        k = r % len(tags)
        for tag in (*tags[k:], *tags[:k], "limit"):
            fn = limit if tag == "limit" else call
            if tag != "limit":
                use(tag)
            fn()
            t0 = time.perf_counter()
            fn()
            times[tag].append(time.perf_counter() - t0)
    return times


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] not in _KERNELS or (argv[0] == "rope" and len(argv) < 4):
        raise SystemExit(__doc__)
    torch.set_num_threads(2)
    set_allocator("keep")
    kind, rev, rounds = argv[0], argv[1], 15
    module, states = _builds(kind, rev)
    if kind == "embed":
        call, limit, output = _embed_case(argv[2])
    else:
        call, limit, output = _rope_case(argv[2], argv[3], argv[4:] == ["out"])

    def use(tag: str) -> None:
        module._state.clear()
        module._state.update(states[tag])

    outs = []
    for tag in ("old", "new"):
        use(tag)
        outs.append(output())
    if not torch.equal(*outs):
        raise SystemExit("the two builds give different outputs")
    times = _time(call, limit, use, rounds)
    ratios = [n / o for n, o in zip(times["new"], times["old"])]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{' '.join(argv)}: old {med['old']:.2f} ms, new {med['new']:.2f} ms, limit {med['limit']:.2f} ms")
    print(f"new / old {statistics.median(ratios):.3f} ({q1:.3f}-{q3:.3f}), {rounds} rounds, same outputs")


if __name__ == "__main__":
    main(sys.argv[1:])
