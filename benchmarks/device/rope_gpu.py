"""RoPE on a GPU: posenc's path (the Triton kernel where it runs) against the PyTorch reference,
``torch.compile`` of the reference, Hugging Face's ``apply_rotary_pos_emb`` and a same-size copy,
outputs checked equal before anything is timed.

    PYTHONPATH=src python3 benchmarks/device/rope_gpu.py --out rope_gpu.json
    PYTHONPATH=src python3 benchmarks/device/rope_gpu.py --device cpu --quick   # the script's own check

Each case is ``q, k [b, h, s, d_h]`` with shared tables ``[s, d_h/2]`` (float32, posenc's default
for every dtype), rotated out of place, and in place where the path allows it. Times are medians of
CUDA-event timings after a warm-up; ratios are to the copy of the same bytes (``q`` and ``k`` read
and written once), the floor of any out-of-place rotation.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence, ``d_h`` head width.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback

import torch

import posenc
from posenc.kernels import rope_triton, set_enabled

CASES = [  # (b, h, s, d_h)
    (4, 32, 2048, 128),
    (1, 32, 8192, 128),
    (8, 32, 1, 128),  # one decode step
]
QUICK_CASES = [(1, 2, 16, 32), (2, 2, 1, 32)]


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn()``."""
    for _ in range(5):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def graph_timed(fn, repeats: int) -> float:
    """Median seconds of one replay of a CUDA graph holding 10 calls of ``fn`` (divided by 10): the
    GPU's time alone, without Python or launch overhead."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    return timed(graph.replay, torch.device("cuda"), repeats) / 10


def tables(s: int, d_h: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [s, d_h/2]`` in float32 from posenc's own RoPE."""
    rope = posenc.build("rope", head_dim=d_h).to(device)
    return rope.cos_sin(torch.arange(s, device=device))


def hf_rotate():
    """HF Llama's ``apply_rotary_pos_emb`` (full-width tables ``[b, s, d_h]``), or None."""
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except Exception:  # transformers missing or changed: the peer is left out
        return None
    return apply_rotary_pos_emb


def run_case(shape, dtype, device, repeats, record) -> None:
    b, _, s, d_h = shape
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    cos, sin = tables(s, d_h, device)
    rec = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "times_s": {}, "checks": {}}

    def posenc_out():
        return posenc.apply_rotary(q, cos, sin), posenc.apply_rotary(k, cos, sin)

    def posenc_qk():
        return posenc.apply_rotary_qk(q, k, cos, sin)

    def reference():
        set_enabled(False)
        try:
            return posenc_out()
        finally:
            set_enabled(None)

    qb, kb = q.clone(), k.clone()

    def posenc_inplace():
        posenc.apply_rotary(qb, cos, sin, out=qb)
        posenc.apply_rotary(kb, cos, sin, out=kb)

    oq, ok = torch.empty_like(q), torch.empty_like(k)

    def copy():
        oq.copy_(q)
        ok.copy_(k)

    rec["triton_used"] = bool(
        device.type == "cuda" and rope_triton.takes(q, cos, sin) and rope_triton.available(q.device)
    )
    fast, ref = posenc_out(), reference()
    rec["checks"]["fast_equals_reference"] = all(rope_triton.same_values(a, r) for a, r in zip(fast, ref))
    rec["checks"]["qk_equals_reference"] = all(
        rope_triton.same_values(a, r) for a, r in zip(posenc_qk(), ref)
    )
    exact = torch.view_as_complex(torch.stack(q.double().chunk(2, -1), -1).contiguous()) * torch.polar(
        torch.ones_like(cos.double()), torch.atan2(sin.double(), cos.double())
    )
    want = torch.cat((exact.real, exact.imag), dim=-1)
    ulp = torch.finfo(dtype).eps
    # the largest error against the float64 rotation, in units of eps at the largest output
    err = (fast[0].double() - want).abs().max() / want.abs().max()
    rec["checks"]["max_err_vs_float64_in_eps"] = float(err / ulp)

    paths = {"posenc": posenc_out, "posenc_qk": posenc_qk, "reference": reference, "copy": copy}
    paths["posenc_inplace"] = posenc_inplace
    compiled = torch.compile(
        lambda: (posenc.apply_rotary(q, cos, sin), posenc.apply_rotary(k, cos, sin)), fullgraph=True
    )
    try:
        got = compiled()
        rec["checks"]["compiled_equals_reference"] = all(
            rope_triton.same_values(a, r) for a, r in zip(got, ref)
        )
        paths["compiled"] = compiled
    except Exception as err:  # recorded, the other paths still run
        rec["checks"]["compiled_error"] = f"{type(err).__name__}: {err}"[:500]
    apply_hf = hf_rotate()
    if apply_hf is not None:
        full_c = torch.cat((cos, cos), -1).to(dtype)[None].expand(b, s, d_h)
        full_s = torch.cat((sin, sin), -1).to(dtype)[None].expand(b, s, d_h)
        hf_q, hf_k = apply_hf(q, k, full_c, full_s)
        same = posenc.apply_rotary_qk(q, k, cos.to(dtype), sin.to(dtype), compute_dtype="input")
        rec["checks"]["input_rounding_equals_hf"] = all(
            rope_triton.same_values(a, r) for a, r in zip(same, (hf_q, hf_k))
        )
        paths["hf"] = lambda: apply_hf(q, k, full_c, full_s)
    for name, fn in paths.items():
        try:
            rec["times_s"][name] = timed(fn, device, repeats)
        except Exception as err:
            rec["times_s"][name] = None
            rec["checks"][f"{name}_error"] = f"{type(err).__name__}: {err}"[:500]
    if device.type == "cuda":  # the GPU's own time: CUDA graphs (the compiled path has its own)
        rec["graph_times_s"] = {}
        for name in ("posenc", "posenc_inplace", "hf", "copy"):
            if name not in paths:
                continue
            try:
                rec["graph_times_s"][name] = graph_timed(paths[name], repeats)
            except Exception as err:
                rec["graph_times_s"][name] = None
                rec["checks"][f"{name}_graph_error"] = f"{type(err).__name__}: {err}"[:300]
    record.append(rec)
    floor = rec["times_s"]["copy"]
    row = "  ".join(
        f"{n} {t * 1e6:8.1f}us ({t / floor:4.2f}x)" for n, t in rec["times_s"].items() if t is not None
    )
    print(f"{shape} {rec['dtype']:8s} triton={rec['triton_used']} {row}", flush=True)
    if rec.get("graph_times_s", {}).get("copy"):
        g = rec["graph_times_s"]
        row = "  ".join(
            f"{n} {t * 1e6:8.1f}us ({t / g['copy']:4.2f}x)" for n, t in g.items() if t is not None
        )
        print(f"   GPU time (CUDA graphs) {row}", flush=True)
    print(f"   checks {rec['checks']}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 3 repeats")
    parser.add_argument("--out", default=None, help="write the records here as JSON")
    args = parser.parse_args()
    device = torch.device(args.device)
    env = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["triton_available"] = rope_triton.available(device)
    print(env, flush=True)
    record: list = []
    for shape in QUICK_CASES if args.quick else CASES:
        for dtype in (torch.bfloat16, torch.float32):
            try:
                run_case(shape, dtype, device, 3 if args.quick else 50, record)
            except Exception:
                record.append(
                    {"shape": list(shape), "dtype": str(dtype), "error": traceback.format_exc()[-2000:]}
                )
                print(traceback.format_exc(), file=sys.stderr, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"environment": env, "cases": record}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
