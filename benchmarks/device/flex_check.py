"""FlexAttention for positional biases on a CUDA GPU: are the numbers right, and is it faster?

Run from the repository root (posenc need not be installed)::

    PYTHONPATH=src python3 benchmarks/device/flex_check.py --out $OUT/flex.json

What it does, in order of priority, within a time budget (``--budget``, default 82 s, compile time
included: no new item starts after ``budget - 12`` s, a running item is interrupted at ``budget``,
and the process exits at ``budget + 6`` s whatever it is doing; the JSON is rewritten after every
item, so what was done survives):

1. **Checks** (``checks``): posenc's attention layer (``MultiHeadAttention`` with an attention plan,
   the model's own path) on CUDA, which takes FlexAttention (the plan's decision, not forced here;
   the check fails if it does not), against the same layer forced onto SDPA with the full
   materialised bias; forward output and the gradients of the input, the layer's weights and the
   scheme's parameters. ALiBi, T5 (a learned table) and KERPLE (learned r1, r2), causal, at a few
   sizes (GQA at s = 1024 first, MHA at s = 256; T5 with left padding at s = 512), float32 and
   bfloat16, d_h = 64.

   Errors are ``max |a - b| / max |b|`` per tensor (the worst over output and gradients is
   reported). A float64 run of the SDPA path is the reference for both.

   * float32 passes when flex's error against float64 is at most 4x SDPA-fp32's own, or 5e-6 (~40
     float32 ulps): both accumulate in float32 and differ only in the order of their sums (a learned
     table's gradient sums every (batch, query, key) pair, ~2e6 terms, in an order each kernel
     chooses). An indexing error moves values far more: an ALiBi table read one distance off (which
     softmax's shift invariance hides except on the diagonal) moved the output by 2e-5 to 2e-4 of
     its scale in runs of this script on a CPU, a T5 table by 0.6.
   * bfloat16 passes when flex's error against float64 is at most twice SDPA-bf16's own error
     against float64 (plus 1e-3): both round q, k, v, the probabilities and the output to bf16
     (unit roundoff 2^-8 ~ 4e-3) in different places, so neither matches the other to better than
     that; the established kernel's own error on the same inputs is the fair bar. (SDPA also
     rounds the bias to bf16; FlexAttention adds it to float32 scores.)

2. **Timings** (``timings``): bf16, d_h = 64, ``b, h, s`` from (2, 8, 512) to (8, 16, 4096), ALiBi
   and T5 (in that order: (4, 16, 2048) first), forward and forward + backward (the forward with
   autograd recording, as in training: the kernel compiled for the backward serves it, so no
   separate inference kernel is compiled within the budget): FlexAttention through the plan (score_mod and
   block mask built per call, as once per forward), FlexAttention with both prebuilt (a layer's
   cost), FlexAttention looking up the materialised bias (``flex_lookup``: the alternative for a
   learned table, whose gradient the distance form accumulates with atomic adds onto ``h x 2s``
   entries), SDPA with the materialised bias (the full-bias path), posenc's blocked path (queries 256
   at a time) and causal SDPA without any bias (the limit). CUDA events, warm-up calls first (the
   first call's time, compile included, is reported as ``first_s``), median of ``--repeats``;
   peak memory above the inputs (``torch.cuda.max_memory_allocated``).

``--cpu``: the same on a CPU with tiny sizes, FlexAttention forced (eager; its backward through
PyTorch's eager reference, which PyTorch otherwise refuses on a CPU): to test this script without a
GPU. Timings there are wall-clock and only show that the code runs.

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s`` sequence length, ``d_h``
head width.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
import traceback
import warnings

T0 = time.monotonic()


class Budget(Exception):
    """The time budget ran out during an item."""


def elapsed() -> float:
    return time.monotonic() - T0


# ----------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------
SCHEME_KW = {"alibi": {}, "t5": {"causal": True}, "kerple_log": {}}


def build_scheme(name, h, device):
    import torch

    import posenc

    torch.manual_seed(1)
    scheme = posenc.build(name, num_heads=h, **SCHEME_KW[name]).to(device)
    with torch.no_grad():  # away from the initial values, so every parameter matters
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return scheme


@contextlib.contextmanager
def path(flex_on: bool, cpu: bool):
    """Route posenc's attention: ``flex_on`` the plan's own decision (forced on a CPU), else SDPA
    with the full bias (both fast paths declined). Yields the list of FlexAttention calls."""
    import torch.nn.attention.flex_attention as torch_flex

    from posenc.model import blocked, flex

    calls = []
    saved = (flex.usable, blocked.usable, flex.flex_attention_function)
    validate = getattr(torch_flex, "_validate_device", None)  # patched on a CPU only
    original_fn = flex.flex_attention_function

    def counted(device):
        calls.append(1)
        return original_fn(device)

    try:
        flex.flex_attention_function = counted
        if not flex_on:
            flex.usable = lambda q: False
        elif cpu:
            flex.usable = lambda q: True
            torch_flex._validate_device = lambda *t: None  # PyTorch's eager reference backward on CPU
        blocked.usable = lambda q: False
        yield calls
    finally:
        flex.usable, blocked.usable, flex.flex_attention_function = saved
        if cpu and validate is not None:
            torch_flex._validate_device = validate


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


# ----------------------------------------------------------------------------------------------
# 1. Checks: the model's attention layer, FlexAttention against SDPA with the full bias
# ----------------------------------------------------------------------------------------------
def layer_run(scheme_name, b, h, h_kv, s, dtype, padded, device, flex_on, cpu, d_h):
    """Output and gradients of one attention layer (its weights from seed 0) in ``dtype``."""
    import torch

    from posenc.model import ModelConfig
    from posenc.model.attention import MultiHeadAttention
    from posenc.model.plan import plan_attention

    cfg = ModelConfig(vocab_size=16, d_model=h * d_h, num_heads=h, num_kv_heads=h_kv, position=scheme_name)
    torch.manual_seed(0)
    layer = MultiHeadAttention(cfg).to(device=device, dtype=dtype)
    scheme = build_scheme(scheme_name, h, device)
    if dtype == torch.float64:
        scheme = scheme.double()
    gen = torch.Generator(device="cpu").manual_seed(3)
    x = torch.randn(b, s, h * d_h, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    g = torch.randn(b, s, h * d_h, generator=gen).to(device=device, dtype=dtype)
    mask = None
    if padded:
        mask = torch.ones(b, s, dtype=torch.bool)
        mask[0, : s // 3] = False  # left padding in row 0
        mask = mask.to(device)
    with path(flex_on, cpu) as calls:
        plan = plan_attention(b, s, torch.device(device), causal=True, attention_mask=mask)
        out = layer(x, plan, scheme)
        out.backward(g)
    tensors = {"output": out.detach()}
    if mask is not None:  # padding queries' outputs are unused: compare the real tokens
        tensors["output"] = out.detach()[mask]
    tensors["grad_x"] = x.grad if mask is None else x.grad[mask]
    for name, p in [*layer.named_parameters(), *(("scheme." + n, p) for n, p in scheme.named_parameters())]:
        if p.grad is not None:
            tensors["grad_" + name] = p.grad
    return tensors, len(calls)


def check(scheme_name, b, h, h_kv, s, dtype_name, padded, device, cpu, d_h=64):
    import torch

    dtype = getattr(torch, dtype_name)
    flex_t, flex_calls = layer_run(scheme_name, b, h, h_kv, s, dtype, padded, device, True, cpu, d_h)
    sdpa_t, sdpa_calls = layer_run(scheme_name, b, h, h_kv, s, dtype, padded, device, False, cpu, d_h)
    ref_t, _ = layer_run(scheme_name, b, h, h_kv, s, torch.float64, padded, device, False, cpu, d_h)
    if flex_calls == 0:
        raise AssertionError("the attention plan did not take FlexAttention on this device")
    if sdpa_calls:
        raise AssertionError("the reference run took FlexAttention")
    if set(flex_t) != set(sdpa_t):
        raise AssertionError(f"gradients differ in which tensors get one: {set(flex_t) ^ set(sdpa_t)}")
    worst = {"flex_vs_sdpa": 0.0, "flex_vs_f64": 0.0, "sdpa_vs_f64": 0.0}
    where = {}
    for name in flex_t:
        for key, (a, r) in {
            "flex_vs_sdpa": (flex_t[name], sdpa_t[name]),
            "flex_vs_f64": (flex_t[name], ref_t[name]),
            "sdpa_vs_f64": (sdpa_t[name], ref_t[name]),
        }.items():
            e = rel_err(a, r)
            if not math.isfinite(e):
                e = float("inf")
            if e >= worst[key]:
                worst[key], where[key] = e, name
    fwd = {
        "flex_vs_sdpa": rel_err(flex_t["output"], sdpa_t["output"]),
        "flex_vs_f64": rel_err(flex_t["output"], ref_t["output"]),
        "sdpa_vs_f64": rel_err(sdpa_t["output"], ref_t["output"]),
    }
    if dtype == torch.float32:
        rule = "float32: flex's err vs float64 <= max(4 x SDPA-fp32's, 5e-6) (output and every gradient)"
        factor, floor = 4.0, 5e-6
    else:
        rule = "bf16: flex's err vs float64 <= 2 x SDPA-bf16's + 1e-3 (output and every gradient)"
        factor, floor = 2.0, 1e-3
    per_tensor = {n: (rel_err(flex_t[n], ref_t[n]), rel_err(sdpa_t[n], ref_t[n])) for n in flex_t}
    if dtype == torch.float32:
        failing = [n for n, (f, r) in per_tensor.items() if not f <= max(factor * r, floor)]
    else:
        failing = [n for n, (f, r) in per_tensor.items() if not f <= factor * r + floor]
    ok = not failing
    return {
        "ok": bool(ok),
        "rule": rule,
        "forward": fwd,
        "worst_over_output_and_grads": worst,
        "worst_tensor": where,
        "failing_tensors": failing,
        "tensors_compared": sorted(flex_t),
        "flex_calls": flex_calls,
    }


# ----------------------------------------------------------------------------------------------
# 2. Timings
# ----------------------------------------------------------------------------------------------
def timer(device, repeats, warmup):
    import torch

    def run(fn):
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
        for _ in range(warmup - 1):
            fn()
        times = []
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        peak = None
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        return {"median_s": statistics.median(times), "min_s": min(times), "first_s": first, "peak_mib": peak}

    return run


def timing(scheme_name, b, h, s, device, cpu, repeats, warmup, d_h=64, dtype_name="bfloat16"):
    """Per implementation: ``fwd`` (autograd recording, as in training: the kernel compiled for
    the backward serves it, so no separate inference kernel is compiled within the budget) and
    ``fwd+bwd``; q, k, v ``[b, h, s, d_h]`` and the scheme's parameters get gradients."""
    import torch
    import torch.nn.functional as F

    from posenc.model import flex
    from posenc.model.attention import attend
    from posenc.model.blocked import causal_attention_with_bias, scheme_bias_fn
    from posenc.model.plan import plan_attention

    dtype = getattr(torch, dtype_name)
    scheme = build_scheme(scheme_name, h, device)
    gen = torch.Generator(device="cpu").manual_seed(4)
    q, k, v = (torch.randn(b, h, s, d_h, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    g = torch.randn(b, h, s, d_h, generator=gen).to(device, dtype)
    pos = torch.arange(s, device=device)
    dev = torch.device(device)

    def flex_plan():
        return plan_attention(b, s, dev, causal=True).bias_blocks(scheme, q)(q, k, v)

    with path(True, cpu):
        prebuilt = plan_attention(b, s, dev, causal=True).bias_blocks(scheme, q)
    if not isinstance(prebuilt, flex.FlexBiasedAttention):
        raise AssertionError(f"the plan chose {type(prebuilt).__name__}, not FlexAttention")

    def flex_lookup():  # the bias materialised, then looked up (each pair's gradient its own element)
        plan = plan_attention(b, s, dev, causal=True)
        mod = flex.bias_lookup_mod(plan.score_bias(scheme, q))
        return flex.FlexBiasedAttention(mod, prebuilt.block_mask, lambda: None)(q, k, v)

    def sdpa_full_bias():
        plan = plan_attention(b, s, dev, causal=True)
        return attend(q, k, v, plan=plan, bias=plan.score_bias(scheme, q))

    impls = {
        "flex_plan": flex_plan,
        "flex_prebuilt": lambda: prebuilt(q, k, v),
        "sdpa_full_bias": sdpa_full_bias,
        "blocked_256": lambda: causal_attention_with_bias(q, k, v, scheme_bias_fn(scheme, pos, pos)),
        "sdpa_causal_no_bias": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    if any(p.requires_grad for p in scheme.parameters()):  # a learned table: the alternative form
        impls["flex_lookup"] = flex_lookup
    run = timer(device, repeats, warmup)
    out = {}
    for name, fn in impls.items():

        def forward(fn=fn):
            fn()

        def step(fn=fn, name=name):
            for t in (q, k, v, *scheme.parameters()):
                t.grad = None
            # the prebuilt table's own graph (T5's gather) serves every call: kept
            fn().backward(g, retain_graph=name == "flex_prebuilt")

        out[name] = {}
        for mode, call in (("fwd", forward), ("fwd+bwd", step)):
            try:
                with path(name.startswith("flex"), cpu):
                    out[name][mode] = run(call)
            except Budget:
                raise
            except Exception as err:  # one implementation failing does not lose the others
                out[name][mode] = {"error": f"{type(err).__name__}: {err}"[:400]}
        if elapsed() > BUDGET["stop"]:
            out["note"] = "time budget reached: later implementations not timed"
            break
    for mode in ("fwd", "fwd+bwd"):
        base = out.get("sdpa_causal_no_bias", {}).get(mode, {}).get("median_s")
        for r in out.values():
            if isinstance(r, dict) and base and r.get(mode, {}).get("median_s"):
                r[mode]["x_causal_sdpa"] = r[mode]["median_s"] / base
    return out


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------
BUDGET = {"stop": 70.0, "alarm": 82.0}


def environment(device):
    import torch

    import posenc

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "posenc_file": posenc.__file__,
        "device": device,
        "argv": sys.argv,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def plan_items(cpu: bool, repeats: int):
    """(section, name, function) in priority order. Each distinct (bias form, dtype, whether the
    bias needs a gradient) compiles FlexAttention once for its first shape and once more, with
    dynamic shapes, for all later ones: the checks the GPU is for come first, and later sizes
    reuse compiled kernels."""
    dev = "cpu" if cpu else "cuda"
    items = []
    if cpu:
        check_sizes = [(2, 4, 2, 130, False), (2, 4, 4, 40, False), (2, 4, 4, 130, True)]
        time_sizes = [(1, 4, 130), (2, 4, 260)]
        d_h, warm = 16, 2
    else:
        check_sizes = [(2, 8, 2, 1024, False), (2, 8, 8, 256, False), (2, 8, 8, 512, True)]
        time_sizes = [(4, 16, 2048), (8, 16, 4096), (2, 8, 512)]
        d_h, warm = 64, 3

    def add_check(name, size, dtype, width=None):
        b, h, h_kv, s, padded = size
        width = width or d_h
        label = f"{name} b={b} h={h} h_kv={h_kv} s={s} d_h={width}{' padded' if padded else ''} {dtype}"
        items.append(("checks", label, lambda: check(name, b, h, h_kv, s, dtype, padded, dev, cpu, width)))

    def add_timing(name, size):
        b, h, s = size
        label = f"{name} b={b} h={h} s={s} d_h={d_h} bf16"
        items.append(("timings", label, lambda: timing(name, b, h, s, dev, cpu, repeats, warm, d_h)))

    for dtype in ("float32", "bfloat16"):
        add_check("alibi", check_sizes[0], dtype)  # a fixed table
        add_check("t5", check_sizes[0], dtype)  # a learned table: the gradient reaches it
        add_check("kerple_log", check_sizes[0], dtype)  # compiled as T5 (a learned distance table)
    add_timing("alibi", time_sizes[0])
    add_timing("t5", time_sizes[0])
    for size in time_sizes[1:]:
        add_timing("alibi", size)
        add_timing("t5", size)
    for name in ("alibi", "t5", "kerple_log"):  # MHA, another length
        add_check(name, check_sizes[1], "float32")
        add_check(name, check_sizes[1], "bfloat16")
    add_check("t5", check_sizes[2], "float32")  # left padding: positions [b, s], the plan's mask
    add_check("t5", check_sizes[2], "bfloat16")
    for width in (16, 128):  # the other head widths a model sends to FlexAttention
        add_check("t5", check_sizes[1], "bfloat16", width)
    return items


def print_table(result) -> None:
    env = result["env"]
    print(f"\n== checks ({env.get('gpu') or env.get('device')}, torch {env.get('torch')})")
    for item in result["checks"]:
        r = item.get("result")
        if r is None:
            print(f"  {item['name']:<50} {item.get('status')}: {item.get('error', '')[:120]}")
            continue
        w = r["worst_over_output_and_grads"]
        print(
            f"  {item['name']:<50} {'ok  ' if r['ok'] else 'FAIL'} fwd {r['forward']['flex_vs_sdpa']:.1e}  "
            f"worst flex/sdpa {w['flex_vs_sdpa']:.1e}  flex/f64 {w['flex_vs_f64']:.1e}  "
            f"sdpa/f64 {w['sdpa_vs_f64']:.1e}  ({item['seconds']:.1f} s)"
        )
    print("\n== timings (bf16): median ms fwd | fwd+bwd (x causal SDPA, no bias) [peak MiB]; first call s")
    for item in result["timings"]:
        r = item.get("result")
        if r is None:
            print(f"  {item['name']:<40} {item.get('status')}: {item.get('error', '')[:120]}")
            continue
        print(f"  {item['name']}")
        for name, modes in r.items():
            if not isinstance(modes, dict):
                print(f"    {name}: {modes}")
                continue
            cells = []
            for mode in ("fwd", "fwd+bwd"):
                t = modes.get(mode, {})
                if "median_s" not in t:
                    cells.append(f"{mode} ERROR {t.get('error', 'not run')[:90]}")
                    continue
                peak = "" if t["peak_mib"] is None else f" [{t['peak_mib']:.0f}]"
                ratio = f" ({t['x_causal_sdpa']:.2f}x)" if "x_causal_sdpa" in t else ""
                cells.append(f"{t['median_s'] * 1e3:8.2f}{ratio}{peak} first {t['first_s']:.1f}")
            print(f"    {name:<20} " + " | ".join(cells))
    skipped, errors = len(result["skipped"]), len(result["errors"])
    print(f"\nskipped {skipped}, errors {errors}, total {result['seconds']:.1f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where to write the JSON results")
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (tests this script)")
    parser.add_argument("--budget", type=float, default=82.0, help="seconds for everything (default 82)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per implementation (median)")
    parser.add_argument("--no-timings", action="store_true", help="checks only")
    args = parser.parse_args(argv)
    if args.budget <= 15:
        parser.error(f"--budget must be > 15 seconds, got {args.budget}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    BUDGET["stop"], BUDGET["alarm"] = args.budget - 12.0, args.budget
    faulthandler.dump_traceback_later(args.budget + 6.0, exit=True)  # never hang, whatever runs
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)

    result = {"env": {}, "checks": [], "timings": [], "skipped": [], "errors": [], "warnings": []}

    def save():
        result["seconds"] = elapsed()
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=str)
        os.replace(tmp, args.out)

    def on_alarm(signum, frame):
        raise Budget(f"time budget of {args.budget:.0f} s reached")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(args.budget - elapsed(), 1.0))
    try:
        import torch

        device = "cpu" if args.cpu else "cuda"
        if not args.cpu and not torch.cuda.is_available():
            result["errors"].append({"name": "setup", "error": "no CUDA device (use --cpu to test on a CPU)"})
            save()
            print("no CUDA device: nothing checked (use --cpu)", file=sys.stderr)
            return 1
        result["env"] = environment(device)
        try:  # many shapes and dtypes: more compiled variants than dynamo's default keeps
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            result["env"]["dynamo_cache_size_limit"] = torch._dynamo.config.cache_size_limit
        except Exception as err:
            result["env"]["dynamo_cache_size_limit"] = f"not set: {err}"
        save()
        items = plan_items(args.cpu, args.repeats)
        if args.no_timings:
            items = [it for it in items if it[0] == "checks"]
        for section, name, fn in items:
            if elapsed() > BUDGET["stop"]:
                result["skipped"].append({"section": section, "name": name, "why": "time budget"})
                continue
            t0 = time.monotonic()
            entry = {"name": name}
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    entry["result"] = fn()
                for w in caught:
                    text = f"{w.category.__name__}: {str(w.message)[:300]}"
                    if text not in result["warnings"]:
                        result["warnings"].append(text)
                entry["status"] = "ok" if entry["result"].get("ok", True) else "FAIL"
            except Budget as err:
                entry["status"], entry["error"] = "interrupted", str(err)
            except BaseException as err:  # record and go on (KeyboardInterrupt included: save first)
                entry["status"] = "error"
                entry["error"] = f"{type(err).__name__}: {err}"[:1000]
                entry["traceback"] = traceback.format_exc()[-3000:]
                result["errors"].append({"name": name, "error": entry["error"]})
                if isinstance(err, KeyboardInterrupt):
                    raise
            finally:
                entry["seconds"] = time.monotonic() - t0
                result[section].append(entry)
                if device == "cuda":
                    with contextlib.suppress(Exception):
                        torch.cuda.empty_cache()
                save()
            print(f"[{elapsed():5.1f} s] {section}: {name}: {entry['status']}", flush=True)
        try:
            from torch._dynamo.utils import counters

            result["dynamo_counters"] = {
                k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles")
            }
        except Exception as err:
            result["dynamo_counters"] = f"unavailable: {err}"
    except (Budget, Exception) as err:  # setup failed (an import, no device): recorded, not lost
        result["errors"].append(
            {
                "name": "driver",
                "error": f"{type(err).__name__}: {err}"[:1000],
                "traceback": traceback.format_exc()[-3000:],
            }
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        save()
    print_table(result)
    failed = [c["name"] for c in result["checks"] if c.get("status") != "ok"]
    print(f"wrote {args.out}; checks not ok: {failed or 'none'}")
    faulthandler.cancel_dump_traceback_later()
    return 0 if not failed and not result["errors"] else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the results are written: no exit handler (compile workers) may hold the process
