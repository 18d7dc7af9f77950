"""Check posenc's Triton RoPE (the op ``posenc::rope_triton``) on a CUDA device, and time it.

    PYTHONPATH=src python3 benchmarks/device/rope_triton_check.py --out rope_triton.json
    PYTHONPATH=src python3 benchmarks/device/rope_triton_check.py --interpret --out /tmp/rt.json

Checks, each recorded (pass, fail or error with its traceback) and the run going on after a failure:

* the kernel's first-use self-check passes on the device;
* :func:`posenc.apply_rotary`, :func:`posenc.apply_rotary_qk` and ``RotaryEmbedding.rotate`` on
  the device equal posenc's PyTorch reference bit for bit (the same call with fast paths off, on
  the device and on CPU) for float32/bfloat16/float16, half and interleaved pairs, full and
  partial rotary, shared, per-token and packed tables, ``bhsd`` and ``bshd`` axis orders, out of
  place, in place and ``out=``, both ``compute_dtype`` settings;
* gradients and double backward equal the reference's bit for bit, and a float32 gradcheck passes;
* the eager calls reach the registered op (a ``TorchDispatchMode`` sees ``posenc.rope_triton``);
* ``torch.compile(fullgraph=True)`` of a function calling them puts the op in the graph and gives
  the eager numbers, forward and backward; the profiler sees the Triton kernel run, eager and compiled;
* speed: q and k ``[b, 32, s, 128]`` in bfloat16 and float32, ``s`` from 1 (a decoding step) to
  8192: posenc (out of place, in place), posenc's PyTorch reference, Hugging Face's
  ``apply_rotary_pos_emb`` (eager), and a same-size copy into existing buffers (and ``mul_(1)``
  in place) as the bandwidth yardsticks, timed with CUDA events (warm-up, median of 15 windows).

``--interpret`` runs the same checks on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``,
tiny sizes, no timing), with the C kernel's decision switched off so that CPU tensors reach the
Triton op; it is how this script is tested without a GPU. The whole run stops itself after
``--budget`` seconds (default 80, a hard stop 5 s later): what ran is in the JSON, written after
every check.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

STARTED = time.perf_counter()  # the budget counts from here, imports included

ARGS = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ARGS.add_argument("--out", type=Path, required=True, help="where to write the JSON record")
ARGS.add_argument("--interpret", action="store_true", help="CPU tensors in Triton's interpreter, no timing")
ARGS.add_argument(
    "--budget", type=float, default=80.0, help="seconds after which no check starts (hard stop 5 s later)"
)
ARGS.add_argument("--skip-timing", action="store_true", help="checks only")

if "--interpret" in sys.argv:  # read when the @triton.jit functions are defined: before posenc uses them
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import posenc  # noqa: E402
from posenc.kernels import rope_cpu, rope_triton, set_enabled  # noqa: E402
from posenc.rotary import reference as rope_reference  # noqa: E402


class Record:
    """The JSON record, rewritten after every check so that a killed run leaves what it did."""

    def __init__(self, path: Path, started: float):
        self.path, self.started = path, started
        self.data: dict = {"env": {}, "checks": [], "timings": [], "tuning": [], "notes": []}

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.started, 2)
        checks = self.data["checks"]
        self.data["summary"] = {
            "passed": sum(c["status"] == "pass" for c in checks),
            "failed": [c["name"] for c in checks if c["status"] in ("fail", "error")],
            "skipped": [c["name"] for c in checks if c["status"] == "skipped"],
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout("check ran past its time limit")


def check(rec: Record, name: str, fn, limit_s: float = 30.0) -> object:
    """Run ``fn()`` (returns a detail dict, or raises AssertionError on a failed check), record it."""
    start = time.perf_counter()
    left = rec.budget_end - start
    entry: dict = {"name": name}
    if left < 3:
        entry.update(status="skipped", detail="out of time budget")
        rec.data["checks"].append(entry)
        rec.save()
        print(f"SKIP  {name}: out of time", flush=True)
        return None
    # then again every second: a Timeout raised where Python swallows it (a destructor, a
    # callback) must not leave the check running
    signal.setitimer(signal.ITIMER_REAL, max(1.0, min(limit_s, left - 2)), 1.0)
    result = None
    try:
        try:
            result = fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # before anything else: no Timeout past here
        entry.update(status="pass", detail=result)
    except AssertionError as err:
        entry.update(status="fail", detail=str(err), traceback=traceback.format_exc(limit=-4))
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        entry.update(status="error", detail=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    entry["seconds"] = round(time.perf_counter() - start, 3)
    rec.data["checks"].append(entry)
    rec.save()
    line = entry["detail"] if entry["status"] != "pass" else ""
    print(f"{entry['status'].upper():5} {name} ({entry['seconds']} s) {str(line)[:300]}", flush=True)
    return result


# ------------------------------------------------------------------------------------------- helpers
class OpCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the posenc ops that reach the dispatcher (aten ops are left out)."""

    def __enter__(self):
        self.names = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "posenc":
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def reference(fn, *tensors):
    """``fn(*tensors)`` with posenc's fast paths off (the PyTorch expression), on the same device."""
    set_enabled(False)
    try:
        return fn(*tensors)
    finally:
        set_enabled(None)


def on_cpu(fn, *tensors):
    """The reference on CPU copies, back on the tensors' device (an independent device's arithmetic)."""
    device = tensors[0].device
    out = reference(fn, *(t.cpu() for t in tensors))
    return tuple(o.to(device) for o in out) if isinstance(out, tuple) else out.to(device)


def equal(a, b) -> bool:
    if isinstance(a, tuple):
        return all(equal(x, y) for x, y in zip(a, b))
    return rope_triton.same_values(a, b)


def max_diff(a, b) -> float:
    if isinstance(a, tuple):
        return max(max_diff(x, y) for x, y in zip(a, b))
    nan = a.isnan() | b.isnan()
    return float((a.float() - b.float()).abs().masked_fill(nan, 0).max())


def tables(angles, device, dtype=torch.float32):
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


# --------------------------------------------------------------------------------------------- checks
def check_self_check(device):
    start = time.perf_counter()
    status = rope_triton.status(device)
    assert status == "ok", f"status {status!r}"
    return {"status": status, "first_use_s": round(time.perf_counter() - start, 3)}


def _cases(device, small: bool):
    """(label, fn, tensors): calls of posenc's API whose results must equal the reference."""
    gen = torch.Generator().manual_seed(0)
    b, h, s, d = (2, 3, 9, 16) if small else (2, 4, 33, 128)
    cases = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for layout in ("half", "interleaved"):
            for r in (d, d // 2) if dtype == torch.bfloat16 else (d,):  # each variant compiles once
                x = torch.randn(b, h, s, d, generator=gen).to(device, dtype)
                ang = torch.rand(s, r // 2, generator=gen, dtype=torch.float64) * 200
                cos, sin = tables(ang, device)
                tag = f"{str(dtype)[6:]} {layout} r={r}"
                for cd in (None, "input"):
                    kw = {"layout": layout, "compute_dtype": cd}
                    cases.append(
                        (
                            f"{tag} shared cd={cd}",
                            lambda t, c, s_, kw=kw: posenc.apply_rotary(t, c, s_, **kw),
                            (x, cos, sin),
                        )
                    )
                pt = torch.rand(b, 1, s, r // 2, generator=gen, dtype=torch.float64) * 200
                pc, ps = tables(pt, device)
                cases.append(
                    (
                        f"{tag} per-token",
                        lambda t, c, s_, lo=layout: posenc.apply_rotary(t, c, s_, layout=lo),
                        (x, pc, ps),
                    )
                )
                xs = x.transpose(1, 2).contiguous()  # [b, s, h, d]
                cases.append(
                    (
                        f"{tag} bshd",
                        lambda t, c, s_, lo=layout: posenc.apply_rotary(
                            t, c, s_, layout=lo, qk_layout="bshd"
                        ),
                        (xs, cos, sin),
                    )
                )
                view = xs.transpose(1, 2)  # strided [b, h, s, d] view of a [b, s, h, d] projection
                cases.append(
                    (
                        f"{tag} strided bhsd",
                        lambda t, c, s_, lo=layout: posenc.apply_rotary(t, c, s_, layout=lo),
                        (view, cos, sin),
                    )
                )
                total = b * s  # packed documents: [total, h, d] as [1, h, total, d], one row per token
                packed = torch.randn(total, h, d, generator=gen).to(device, dtype).transpose(0, 1)[None]
                kc, ks = tables(torch.rand(total, r // 2, generator=gen, dtype=torch.float64) * 200, device)
                cases.append(
                    (
                        f"{tag} packed",
                        lambda t, c, s_, lo=layout: posenc.apply_rotary(t, c, s_, layout=lo),
                        (packed, kc, ks),
                    )
                )

                def inplace(t, c, s_, lo=layout):
                    y = t.clone()
                    with torch.no_grad():
                        posenc.apply_rotary(y, c, s_, layout=lo, out=y)
                    return y

                def into(t, c, s_, lo=layout):
                    y = torch.full_like(t, 3.0)
                    with torch.no_grad():
                        posenc.apply_rotary(t, c, s_, layout=lo, out=y)
                    return y

                cases.append((f"{tag} in place", inplace, (x, cos, sin)))
                cases.append((f"{tag} out=", into, (x, cos, sin)))
                k = torch.randn(b, 1, s + 5, d, generator=gen).to(device, dtype)  # GQA keys, longer
                ka = torch.rand(s + 5, r // 2, generator=gen, dtype=torch.float64) * 200
                kcos, ksin = tables(ka, device)
                cases.append(
                    (
                        f"{tag} qk",
                        lambda q_, k_, c, s_, kc_, ks_, lo=layout: posenc.apply_rotary_qk(
                            q_, k_, c, s_, kc_, ks_, layout=lo
                        ),
                        (x, k, cos, sin, kcos, ksin),
                    )
                )
    return cases


def kernel_in_use(device) -> None:
    """Fail a check whose calls would fall back to the reference (a vacuous comparison)."""
    status = rope_triton.status(device)
    assert status == "ok", (
        f"the Triton kernel is not in use here ({status}): the check would compare the reference with itself"
    )


def check_equals_reference(device, small):
    kernel_in_use(device)
    done, bad, cpu_diff = 0, [], []
    for label, fn, tensors in _cases(device, small):
        got = fn(*tensors)
        want = reference(fn, *tensors)
        if not equal(got, want):
            bad.append(f"{label}: max |diff| {max_diff(got, want):.3g}")
        cpu = on_cpu(fn, *tensors)
        if not equal(got, cpu):
            cpu_diff.append(f"{label}: max |diff| {max_diff(got, cpu):.3g}")
        done += 1
    assert not bad, f"{len(bad)}/{done} differ from the reference on the device: {bad[:8]}"
    assert not cpu_diff, f"{len(cpu_diff)}/{done} differ from the CPU reference: {cpu_diff[:8]}"
    return {"cases": done}


def check_module(device, d):
    """RotaryEmbedding.rotate at a decode offset (positions 40..42, GQA) equals the reference."""
    kernel_in_use(device)
    rope = posenc.RotaryEmbedding(d)
    rope.to(device)
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = torch.randn(2, 8, 3, d).to(device, dtype)
        k = torch.randn(2, 2, 3, d).to(device, dtype)
        pos = torch.arange(40, 43, device=device)
        got = rope.rotate(q, k, pos)
        want = reference(lambda a, b_, p=pos: rope.rotate(a, b_, p), q, k)
        assert equal(got, want), f"{dtype}: max |diff| {max_diff(got, want):.3g}"
        out[str(dtype)] = "equal"
    return out


def check_dispatch_mode(device, d):
    rope = posenc.RotaryEmbedding(d).to(device)
    q = torch.randn(2, 4, 6, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 6, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    with OpCalls() as ops:
        rq, rk = rope.rotate(q, k)
        (rq.float().square().sum() + rk.float().square().sum()).backward()
        with torch.no_grad():
            cos, sin = rope.cos_sin(torch.arange(6, device=device))
            y = q.detach().clone()
            posenc.apply_rotary(y, cos, sin, out=y)
            posenc.apply_rotary(q.detach(), cos, sin)
    want = ["posenc.rope_triton.default"] * 2 + [
        "posenc.rope_triton_out.default",
        "posenc.rope_triton.default",
    ]
    assert ops.names == want, f"ops seen: {ops.names}"
    return {"ops": ops.names}


def check_autograd(device, d):
    kernel_in_use(device)
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for layout in ("half", "interleaved"):
            for r in (d, d // 2) if dtype == torch.bfloat16 else (d,):  # the variants compiled above
                gen = torch.Generator().manual_seed(1)
                x = torch.randn(2, 3, 7, d, generator=gen).to(device, dtype).requires_grad_()
                g = torch.randn(2, 3, 7, d, generator=gen).to(device, dtype).requires_grad_()
                w = torch.randn(2, 3, 7, d, generator=gen).to(device, dtype)
                cos, sin = tables(torch.rand(7, r // 2, generator=gen, dtype=torch.float64) * 20, device)

                def run(x=x, g=g, w=w, cos=cos, sin=sin, layout=layout):
                    y = posenc.apply_rotary(x, cos, sin, layout=layout)
                    (dx,) = torch.autograd.grad(y, x, g, create_graph=True)
                    (dg,) = torch.autograd.grad(dx, g, w)
                    return y.detach(), dx.detach(), dg

                got, want = run(), reference(run)
                names = ("forward", "backward", "double backward")
                bad = [n for n, a, b in zip(names, got, want) if not equal(a, b)]
                assert not bad, f"{dtype} {layout} r={r}: {bad} differ from the reference"
                out[f"{str(dtype)[6:]} {layout} r={r}"] = "equal"
    x = torch.randn(1, 1, 3, d, device=device).requires_grad_()
    cos, sin = tables(torch.rand(3, d // 2, dtype=torch.float64) * 7, device)

    def f(t):
        return posenc.apply_rotary(t, cos, sin, layout="interleaved")

    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Input #. requires gradient and is not a double")
        assert torch.autograd.gradcheck(f, (x,), eps=1e-2, atol=1e-4, rtol=1e-3, fast_mode=True)
        assert torch.autograd.gradgradcheck(f, (x,), eps=1e-2, atol=1e-4, rtol=1e-3, fast_mode=True)
    out["gradcheck float32"] = "pass"
    return out


def _kernel_names(fn) -> list[str]:
    """Names of the device kernels the profiler saw while ``fn()`` ran (CUDA only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages()})


def check_compile(device, d, interpret: bool):
    kernel_in_use(device)
    import torch._dynamo

    rope = posenc.RotaryEmbedding(d).to(device)
    q = torch.randn(2, 8, 16, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 16, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rope.cos_sin(torch.arange(16, device=device))

    def fn(a, b):
        qa, kb = rope.rotate(a, b)
        return qa, kb, posenc.apply_rotary(a, cos, sin, layout="interleaved")

    targets = []

    def capture(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=capture)(q, k)
    assert "posenc.rope_triton.default" in targets, f"graph targets: {sorted(set(targets))}"
    backend = "aot_eager" if interpret else "inductor"
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    got = compiled(q, k)
    want = fn(q, k)
    assert equal(tuple(t.detach() for t in got), tuple(t.detach() for t in want)), "compiled != eager"
    ga = torch.autograd.grad(sum(t.float().square().sum() for t in got), (q, k))
    gw = torch.autograd.grad(sum(t.float().square().sum() for t in want), (q, k))
    assert equal(ga, gw), "compiled gradients != eager gradients"
    COMPILED.update(eager=lambda: fn(q, k), compiled=lambda: compiled(q, k))

    def inplace(t):  # inference, out=x: posenc::rope_triton_out in the graph
        posenc.apply_rotary(t, cos, sin, out=t)
        return t

    in_place_targets = []

    def capture_in_place(gm, example_inputs):
        in_place_targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(inplace, fullgraph=True, backend=capture_in_place)(q.detach().clone())
        assert "posenc.rope_triton_out.default" in in_place_targets, f"graph targets: {in_place_targets}"
        assert equal(got, want[0].detach()), "compiled in place != eager"
        got = torch.compile(inplace, fullgraph=True, backend="aot_eager")(q.detach().clone())
        assert equal(got, want[0].detach()), "compiled (aot_eager) in place != eager"
    ops = sorted({t for t in targets + in_place_targets if "posenc" in t})
    return {"graph_ops": ops, "backend": backend}


#: the function and its compiled form from :func:`check_compile`, for :func:`check_profiler`
COMPILED: dict = {}


def check_profiler():
    """The profiler sees the Triton kernel run, in eager mode and in the compiled function."""
    assert COMPILED, "the compile check did not finish"
    eager_k = _kernel_names(COMPILED["eager"])
    compiled_k = _kernel_names(COMPILED["compiled"])
    assert any("rope_pair_kernel" in n for n in eager_k), f"eager kernels: {eager_k}"
    assert any("rope_pair_kernel" in n for n in compiled_k), f"compiled kernels: {compiled_k}"
    return {"eager_kernels": eager_k, "compiled_kernels": compiled_k}


# --------------------------------------------------------------------------------------------- timing
def time_ms(fn, device, windows: int = 15) -> float:
    """Median milliseconds per call of ``fn`` over ``windows`` CUDA-event windows (after warm-up);
    each window runs ``fn`` enough times to last about a millisecond (decode sizes: many calls).
    On CPU (``--interpret``: the code path only) a wall-clock time of two calls."""
    if device.type == "cpu":
        start = time.perf_counter()
        fn()
        fn()
        return (time.perf_counter() - start) / 2 * 1e3
    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(1, min(200, int(1.0 / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(windows):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def _hf():
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"
    import transformers

    return apply_rotary_pos_emb, transformers.__version__


def timing_rows(device, rec: Record, reserve_s: float):
    if time.perf_counter() > rec.budget_end - reserve_s - 5:
        rec.data["notes"].append("timing skipped: out of time budget")
        print("SKIP  timing: out of time", flush=True)
        return
    hf, hf_version = _hf()
    rec.data["env"]["transformers"] = hf_version
    sizes = [(1, 1), (8, 1), (1, 128), (1, 1024), (8, 1024), (1, 8192), (8, 8192)]
    h, d = 32, 128
    if device.type == "cpu":  # --interpret: tiny sizes, the code path only (times mean nothing)
        sizes, h, d = [(1, 1), (2, 8)], 2, 16
        rec.data["notes"].append(
            "interpret: timings ran at tiny sizes on CPU to test the code; they mean nothing"
        )
    for dtype in (torch.bfloat16, torch.float32):
        for b, s in sizes:
            if time.perf_counter() > rec.budget_end - reserve_s:
                rec.data["notes"].append(f"timing stopped at {dtype} b={b} s={s}: out of time budget")
                return
            label = f"{str(dtype)[6:]} b={b} h={h} s={s} d={d}"
            check(
                rec,
                f"time {label}",
                lambda b=b, s=s, dtype=dtype: _time_one(device, rec, hf, b, h, s, d, dtype),
                20,
            )


def _time_one(device, rec, hf, b, h, s, d, dtype):
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, h, s, d, device=device, dtype=dtype, generator=gen)
    k = torch.randn(b, h, s, d, device=device, dtype=dtype, generator=gen)
    rope = posenc.RotaryEmbedding(d).to(device)
    pos = torch.arange(4096, 4096 + s, device=device) if s == 1 else torch.arange(s, device=device)
    cos, sin = rope.cos_sin(pos)  # [s, d/2] float32
    qb, kb = torch.empty_like(q), torch.empty_like(k)
    full_cos = torch.cat((cos, cos), -1).to(dtype)[None]  # HF's [1, s, d] tables in the model dtype
    full_sin = torch.cat((sin, sin), -1).to(dtype)[None]
    nbytes = 2 * 2 * q.numel() * q.element_size()  # q and k read once and written once
    impls = {
        "posenc qk": lambda: posenc.apply_rotary_qk(q, k, cos, sin),
        "posenc qk in place": lambda: (
            posenc.apply_rotary(q, cos, sin, out=q),
            posenc.apply_rotary(k, cos, sin, out=k),
        ),
        "posenc module.rotate": lambda: rope.rotate(q, k, pos),
        "reference (PyTorch ops)": lambda: (
            rope_reference.rotate(q, cos, sin, "half"),
            rope_reference.rotate(k, cos, sin, "half"),
        ),
        "copy_ into buffers": lambda: (qb.copy_(q), kb.copy_(k)),
        "mul_(1) in place": lambda: (q.mul_(1), k.mul_(1)),
    }
    if dtype != torch.float32:
        impls["posenc qk compute_dtype=input"] = lambda: posenc.apply_rotary_qk(
            q, k, cos, sin, compute_dtype="input"
        )
    if hf is not None:
        impls["HF apply_rotary_pos_emb"] = lambda: hf(q, k, full_cos, full_sin)
        with torch.no_grad():
            same = equal(
                hf(q, k, full_cos, full_sin), posenc.apply_rotary_qk(q, k, cos, sin, compute_dtype="input")
            )
    row = {"dtype": str(dtype), "b": b, "h": h, "s": s, "d": d, "bytes_qk_rw": nbytes, "ms": {}}
    if hf is not None:
        row["hf_equals_posenc_input_rounding"] = same
    with torch.no_grad():
        for name, fn in impls.items():
            row["ms"][name] = round(time_ms(fn, device), 5)
    copy = row["ms"]["copy_ into buffers"]
    row["x_copy"] = {n: round(t / copy, 3) for n, t in row["ms"].items()}
    row["GB_s"] = {n: round(nbytes / t / 1e6, 1) for n, t in row["ms"].items()}
    rec.data["timings"].append(row)
    return {"x_copy": row["x_copy"]}


def print_table(rec: Record) -> None:
    rows = rec.data["timings"]
    if not rows:
        return
    names = list(dict.fromkeys(n for r in rows for n in r["ms"]))
    print("\nms per call (q and k together), and in brackets the ratio to copy_ into buffers")
    for i, n in enumerate(names):
        print(f"  [{i}] {n}")
    print(f"{'case':26}" + "".join(f"{f'[{i}]':>20}" for i in range(len(names))))
    for r in rows:
        head = f"{r['dtype'][6:]} b={r['b']} s={r['s']}"
        cells = []
        for n in names:
            t = r["ms"].get(n)
            cells.append(f"{'-':>20}" if t is None else f"{t:>10.4f} ({r['x_copy'][n]:>6.2f})")
        print(f"{head:26}" + "".join(cells))


def tuning_sweep(device, rec: Record):
    """Diagnostic: the kernel's two launch knobs (rows per program, warps) at a large and a decode
    size (bf16), to tune them; each pair compiles a variant, so it runs last, as time allows."""
    old = rope_triton._BLOCK_ROWS, rope_triton._NUM_WARPS
    if device.type == "cpu":  # --interpret: the code path only
        plan = [((1, 2, 4, 16), ((16, 4), (32, 4)))]
    else:
        big = tuple((rows, warps) for rows in (8, 16, 32, 64) for warps in (2, 4, 8))
        plan = [((8, 32, 4096, 128), big), ((8, 32, 1, 128), ((4, 1), (4, 4), (16, 1), (16, 4)))]
    try:
        for shape, knobs in plan:
            q = torch.randn(*shape, device=device, dtype=torch.bfloat16)
            k = torch.randn_like(q)
            rope = posenc.RotaryEmbedding(shape[-1]).to(device)
            cos, sin = rope.cos_sin(torch.arange(shape[2], device=device))
            with torch.no_grad():
                want = posenc.apply_rotary_qk(q, k, cos, sin)  # the default knobs' numbers
            entry = {"shape": list(shape), "ms_by_rows_warps": {}, "differ_from_default": []}
            rec.data["tuning"].append(entry)
            for rows, warps in knobs:
                if time.perf_counter() > rec.budget_end - 4:
                    break
                rope_triton._BLOCK_ROWS, rope_triton._NUM_WARPS = rows, warps
                with torch.no_grad():
                    if not equal(posenc.apply_rotary_qk(q, k, cos, sin), want):
                        entry["differ_from_default"].append(f"{rows}x{warps}")
                    ms = time_ms(lambda q=q, k=k, c=cos, s_=sin: posenc.apply_rotary_qk(q, k, c, s_), device)
                entry["ms_by_rows_warps"][f"{rows}x{warps}"] = round(ms, 5)
                rec.save()
            assert not entry["differ_from_default"], f"knobs that change the numbers: {entry}"
        return rec.data["tuning"]
    finally:
        rope_triton._BLOCK_ROWS, rope_triton._NUM_WARPS = old


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = ARGS.parse_args(argv)
    started = STARTED
    # never hang: a hard stop (the JSON holds every check finished before it)
    faulthandler.dump_traceback_later(max(1.0, args.budget + 5 - (time.perf_counter() - started)), exit=True)
    signal.signal(signal.SIGALRM, _alarm)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rec = Record(args.out, started)
    rec.budget_end = started + args.budget
    interpret = args.interpret
    if not interpret and not torch.cuda.is_available():
        rec.data["notes"].append("no CUDA device: run with --interpret to check on CPU")
        rec.save()
        print("no CUDA device; use --interpret", file=sys.stderr)
        return 2
    device = torch.device("cpu" if interpret else "cuda")
    env = rec.data["env"]
    env.update(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=("cpu (Triton interpreter)" if interpret else torch.cuda.get_device_name(device)),
        posenc=str(Path(posenc.__file__).parent),
        interpret=interpret,
    )
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as err:
        env["triton"] = f"unusable: {err}"
    if interpret:  # CPU tensors would go to the C kernel's op: switch its decision off here only
        rope_cpu.takes = lambda *a: False
        rec.data["notes"].append(
            "interpret: rope_cpu.takes switched off so CPU tensors reach posenc::rope_triton"
        )
    rec.save()
    small = interpret
    check(rec, "self-check", lambda: check_self_check(device), 60)
    check(rec, "equals the reference", lambda: check_equals_reference(device, small), 40)
    d = 16 if small else 128  # one head width throughout: each kernel variant compiles once
    check(rec, "RotaryEmbedding.rotate", lambda: check_module(device, d))
    check(rec, "dispatch mode sees the op", lambda: check_dispatch_mode(device, d))
    check(rec, "autograd and double backward", lambda: check_autograd(device, d))
    if not args.skip_timing:  # bounded: leaves 30 s of the budget to the compile check
        timing_rows(device, rec, reserve_s=30)
    check(rec, "torch.compile fullgraph", lambda: check_compile(device, d, interpret), 50)
    if not interpret:
        check(rec, "profiler sees the kernel", check_profiler, 15)
    if not args.skip_timing:
        check(rec, "tuning sweep (diagnostic)", lambda: tuning_sweep(device, rec), 15)
        print_table(rec)
    rec.save()
    faulthandler.cancel_dump_traceback_later()
    summary = rec.data["summary"]
    passed, failed = summary["passed"], summary["failed"]
    skipped, took = summary["skipped"], rec.data["elapsed_s"]
    print(f"\n{passed} passed, failed: {failed}, skipped: {skipped}; {took} s; wrote {args.out}")
    return 0 if not summary["failed"] and not summary["skipped"] else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no wait on compile workers or other exit handlers: the record is written
