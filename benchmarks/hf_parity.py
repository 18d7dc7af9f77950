"""Max |logit difference| between tiny random Hugging Face models and their posenc conversions,
prefill and KV-cache decoding, for every family posenc converts (float32, CPU).

    PYTHONPATH=src python benchmarks/hf_parity.py

Needs transformers. Prefill: one forward of 12 tokens (20 for the length-dependent rules, past
their original length 8). Decode: a prefill of 5 tokens then one token at a time with posenc's KV
cache, against transformers' forward of the same tokens (within the original length for the
length-dependent rules, where a full forward is not causal-consistent past it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _hf_families import FAMILY_CONFIGS, V, hf_model
from posenc.model.hf import from_transformers

LENGTH_DEPENDENT = ("llama_dynamic", "phi3_longrope")


def main() -> None:
    print("| entry | HF class | prefill | decode | max abs logit |")
    print("|---|---|---|---|---|")
    for name in FAMILY_CONFIGS:
        hf = hf_model(name)
        ids = torch.randint(
            0, V, (2, 20 if name in LENGTH_DEPENDENT else 12), generator=torch.Generator().manual_seed(1)
        )
        short = ids[:, :8] if name in LENGTH_DEPENDENT else ids
        with torch.no_grad():
            ref_short = hf(short).logits
            ref = hf(ids).logits
            model = from_transformers(hf)
            prefill = (model(ids).logits - ref).abs().max().item()
            cache = model.new_cache()
            steps = [model(short[:, :5], cache=cache).logits]
            steps += [model(short[:, t : t + 1], cache=cache).logits for t in range(5, short.shape[1])]
            decode = (torch.cat(steps, 1) - ref_short).abs().max().item()
        print(
            f"| {name} | {type(hf).__name__} | {prefill:.1e} | {decode:.1e} | {ref.abs().max().item():.2f} |"
        )


if __name__ == "__main__":
    main()
