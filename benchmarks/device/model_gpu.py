"""Every causal scheme in posenc's model on a GPU: a training step under bf16 autocast, the KV cache
against the full forward pass (float32), and ``torch.compile(fullgraph=True)`` of the forward pass
against eager (float32).

    PYTHONPATH=src python3 benchmarks/device/model_gpu.py --out model_gpu.json
    PYTHONPATH=src python3 benchmarks/device/model_gpu.py --device cpu   # the script's own check

Each check is recorded per scheme (``ok``, the largest difference, or the error) and the script
goes on after a failure. Tolerances: the cache and compiled paths reorder float32 sums (TF32 is
off), so they agree to 1e-4 relative to the logits' scale, not bit for bit.
"""

from __future__ import annotations

import argparse
import json
import traceback

import torch

import posenc
from posenc.model import KVCache, ModelConfig, TransformerLM
from posenc.registry import scheme_class


def tiny(position: str, device: torch.device) -> TransformerLM:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=61, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, position=position, max_len=128
    )
    return TransformerLM(config).to(device)


def scale_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def check(position: str, device: torch.device) -> dict:
    rec: dict = {}
    ids = torch.randint(0, 61, (2, 40), generator=torch.Generator().manual_seed(1)).to(device)
    model = tiny(position, device)
    try:  # one training step in bf16 autocast (on CPU: float32)
        model.train()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        rec["train_step"] = bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads)
    except Exception as err:
        rec["train_step"] = f"{type(err).__name__}: {err}"[:300]
    model.eval()
    with torch.no_grad():
        full = model(ids).logits
        try:  # prefill 24 tokens, then one token at a time
            cache = KVCache(model.config.num_layers)
            parts = [model(ids[:, :24], cache=cache).logits]
            parts += [model(ids[:, i : i + 1], cache=cache).logits for i in range(24, ids.shape[1])]
            diff = scale_diff(torch.cat(parts, dim=1), full)
            rec["kv_cache"] = diff < 1e-4 or diff
        except Exception as err:
            rec["kv_cache"] = f"{type(err).__name__}: {err}"[:300]
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=True)
            diff = scale_diff(compiled(ids).logits, full)
            rec["compile"] = diff < 1e-4 or diff
        except Exception as err:
            rec["compile"] = f"{type(err).__name__}: {err}"[:300]
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--schemes", default=None, help="comma list (default: every causal scheme)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    names = args.schemes.split(",") if args.schemes else posenc.schemes()
    results = {}
    for name in names:
        cls = scheme_class(name)
        if not cls.causal_ok or getattr(cls, "position_dims", 1) != 1:
            continue  # grids and encoder-only schemes have no causal LM form
        try:
            results[name] = check(name, device)
        except Exception:
            results[name] = {"error": traceback.format_exc()[-1500:]}
        print(f"{name:18s} {results[name]}", flush=True)
    bad = [n for n, r in results.items() if any(v is not True for v in r.values())]
    print(f"{len(results)} schemes, {len(bad)} with a failed check: {', '.join(bad) or '-'}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": str(device), "torch": torch.__version__, "schemes": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
