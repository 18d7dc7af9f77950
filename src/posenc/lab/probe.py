"""The effective-context probe: how far back can a model still retrieve what it has read?

A random byte string of ``m`` bytes is written into ordinary text twice, the second copy starting
``d`` bytes after the first. Random bytes cannot be predicted from language (about 8 bits each),
so the model's loss on the second copy (its first byte aside: nothing says a copy starts) measures
retrieval alone: near 0 bits where the model attends back ``d`` tokens and copies, and where it
cannot, what it pays on bytes it has never seen. The **gain** pairs each trial with a control
whose first copy is a different random string (nothing to retrieve): control bits minus copy
bits, 0 = no retrieval at that distance, up to the control's bits = perfect copying. It needs no
task training, so any language model takes it, and it is scored by
distance: the largest ``d`` at which a scheme still retrieves is its effective context.

Each trial draws its own text (a random window of the validation bytes) and string; the same
trials for every model (a generator seeded by the split seed). Per distance the result is the
mean bits/byte and the share of bytes predicted right (argmax) over the trials, with bootstrap
intervals over trials (:func:`~posenc.lab.stats.bootstrap_interval`), and across seeds a t
interval of the per-seed means.

Legend: ``m`` string bytes, ``d`` distance between the copies' starts, ``T`` trials, ``P`` bytes of
text before the first copy, ``E`` window length ``P + d + m``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .._validate import check_int
from .stats import bootstrap_interval, seed_interval

__all__ = ["PREFIX", "probe_distances", "probe_summary", "repeated_string_probe"]

#: Bytes of ordinary text before the first copy (the model reads text, not only noise).
PREFIX = 16


def probe_distances(max_len: int, string_len: int) -> list[int]:
    """Distances ``d = 2 m, 4 m, ...`` (doubling) whose window ``PREFIX + d + m`` fits in ``max_len``."""
    out, d = [], 2 * string_len
    while PREFIX + d + string_len <= max_len:
        out.append(d)
        d *= 2
    return out


@torch.no_grad()
def repeated_string_probe(
    model: torch.nn.Module,
    text: torch.Tensor,
    distances: list[int],
    *,
    string_len: int = 16,
    trials: int = 32,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> list[dict[str, Any]]:
    """Score ``model`` on the second copy of a random string at each distance.

    Args:
        model: byte ids ``[b, E]`` -> logits ``[b, E, 256]`` (or an object with ``.logits``).
        text: ``[n]`` uint8 ordinary text (the validation bytes) the strings are written into.
        distances: the ``d`` to probe, each ``>= string_len`` (copies do not overlap).
        string_len: ``m``.
        trials: ``T`` per distance.
        seed: the trials' seed (the split seed: the same trials for every model).

    Returns:
        one dict per distance: ``distance``, ``length`` (``E``), ``bits``, ``accuracy`` and
        ``gain`` (Interval dicts over trials) and the per-trial ``trial_bits``.
    """
    check_int(string_len, "string_len", minimum=2)
    check_int(trials, "trials")
    if device is None:
        device = next(model.parameters()).device
    rows = []
    for d in distances:
        check_int(d, "distance")
        if d < string_len:
            raise ValueError(
                f"distance {d} is shorter than string_len={string_len}: the copies would overlap"
            )
        e = PREFIX + d + string_len  # window length
        if text.numel() < e + 1:
            raise ValueError(f"the text has {text.numel()} bytes, too few for a probe window of {e}")
        g = torch.Generator().manual_seed(seed * 1_000_003 + d)
        starts = torch.randint(0, text.numel() - e, (trials,), generator=g)  # [T]
        window = text[starts[:, None] + torch.arange(e)].long()  # [T, E]
        string = torch.randint(0, 256, (trials, string_len), generator=g)  # [T, m]
        other = torch.randint(0, 256, (trials, string_len), generator=g)  # [T, m] the control's first string
        window[:, e - string_len :] = string
        control = window.clone()
        window[:, PREFIX : PREFIX + string_len] = string
        control[:, PREFIX : PREFIX + string_len] = other  # nothing to retrieve: the model's own prior
        model.eval()
        bits, right = _second_copy(model, window, string_len, device)  # [T], [T]
        baseline, _ = _second_copy(model, control, string_len, device)
        rows.append(
            {
                "distance": d,
                "length": e,
                "bits": bootstrap_interval(bits, seed=d).to_dict(),
                "accuracy": bootstrap_interval(right, seed=d).to_dict(),
                "gain": bootstrap_interval(baseline - bits, seed=d).to_dict(),
                "trial_bits": bits.tolist(),
            }
        )
    return rows


def _second_copy(model, window: torch.Tensor, m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per trial, bits/byte and the share right (argmax) on bytes 2..m of the last ``m`` bytes."""
    e = window.shape[1]
    out = model(window[:, :-1].to(device))
    logits = out.logits if hasattr(out, "logits") else out  # [T, E - 1, V]
    logits = logits[:, e - m : e - 1].double()  # predictions of the copy's bytes 2..m
    target = window[:, e - m + 1 :].to(logits.device)  # [T, m - 1]
    nats = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")  # [T, m - 1]
    return (nats.mean(dim=1) / math.log(2)).cpu(), (logits.argmax(-1) == target).double().mean(dim=1).cpu()


def probe_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run name and distance (from the evaluation point that carries a ``probe``), across
    seeds: mean bits, accuracy and gain on the second copy (a t
    interval of the per-seed means; one seed keeps its bootstrap over trials)."""
    by_name: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {}
    for run in runs:
        probe = next((p["probe"] for p in run["eval"] if p.get("probe")), None)
        if probe:
            by_name.setdefault(run["name"], []).append((run["seed"], probe))
    out = []
    for name, group in by_name.items():
        for i, row in enumerate(group[0][1]):
            rows = [probe[i] for _, probe in group]
            entry = {"name": name, "distance": row["distance"], "seeds": [seed for seed, _ in group]}
            for metric in ("bits", "accuracy", "gain"):
                if any(metric not in r for r in rows):
                    continue
                values = [r[metric]["mean"] for r in rows]
                entry[metric] = rows[0][metric] if len(rows) == 1 else seed_interval(values).to_dict()
            out.append(entry)
    return out
