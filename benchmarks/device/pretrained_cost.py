"""What ``posenc extrapolate --model`` costs on a GPU for a Llama-shaped checkpoint of a given size.

    PYTHONPATH=src python3 benchmarks/device/pretrained_cost.py --folder /tmp/llama -- --quick --device cuda

The model is a randomly initialised ``LlamaForCausalLM`` written with ``save_pretrained`` (byte-level: 256
ids and no tokenizer, so bytes are the ids): its numbers mean nothing, its time and memory are those of a
trained model of the same shape. The arguments after ``--`` go to ``posenc extrapolate``; the
script prints the command, its wall time and the GPU's peak memory as torch saw it in the child
(``torch.cuda.max_memory_allocated`` is not visible across processes, so ``nvidia-smi`` is read
while it runs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time


def build(folder: str, hidden: int, layers: int, heads: int, kv_heads: int, length: int) -> int:
    """Write the random model; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,  # bytes: the folder has no tokenizer.json
        hidden_size=hidden,
        intermediate_size=int(hidden * 8 / 3) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=length,
        rope_theta=10000.0,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def peak_memory(stop: threading.Event, seen: list[int]) -> None:
    """Poll ``nvidia-smi`` for the GPU's used memory (MiB) until ``stop``."""
    while not stop.is_set():
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
            seen.append(max(int(x) for x in out.split()))
        except Exception:  # no nvidia-smi: no memory figure
            return
        stop.wait(0.5)


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024, help="max_position_embeddings (L)")
    args = parser.parse_args(argv)
    params = build(args.folder, args.hidden, args.layers, args.heads, args.kv_heads, args.length)
    print(
        f"model: Llama {args.layers} layers x {args.hidden}, {params / 1e6:.0f}M parameters, L={args.length}"
    )
    cmd = [sys.executable, "-m", "posenc", "extrapolate", "--model", args.folder, "--no-progress", *extra]
    print("$", " ".join(cmd), flush=True)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=peak_memory, args=(stop, seen), daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=False)
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join(timeout=10)
    peak = f"{max(seen)} MiB" if seen else "unknown"
    print(
        f"exit {done.returncode}; wall {wall:.1f} s; GPU memory used at most {peak} (nvidia-smi)", flush=True
    )
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
