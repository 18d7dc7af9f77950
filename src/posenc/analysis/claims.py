"""Common claims about positional encodings, each measured with posenc's own code.

Tutorials and notes on Transformers repeat a handful of statements about sinusoidal encodings
(and print numbers for them). :func:`common_claims` measures each one in float64 and returns the
measured value with a verdict, so the report, the docs and the tests read the same numbers.

A claim about training (does an encoding let a model read longer inputs?) is measured only from
a study with several seeds: :func:`study_claims` reads a ``posenc extrapolate`` result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..absolute import sinusoidal_frequencies, sinusoidal_table
from .page import esc
from .properties import fit_shift_map

__all__ = ["INPUT_LAYER_CLAIMS", "Claim", "common_claims", "input_layer_claims", "study_claims"]


@dataclass(frozen=True)
class Claim:
    """One claim and its measurement.

    Attributes:
        claim: the statement as it is usually made.
        quoted: the number or form usually given with it ("" when none).
        measured: what posenc measures (with the setting).
        verdict: ``"right"``, ``"wrong"`` or ``"not measured"``, then why.
        value: the key measured number (for tests and JSON); ``nan`` when not measured.
        how: how to reproduce the measurement (a formula or a command).
    """

    claim: str
    quoted: str
    measured: str
    verdict: str
    value: float
    how: str


def _orthogonal() -> Claim:
    pe = sinusoidal_table(20, 32, dtype=torch.float64)  # [20, 32]: 20 positions, d = 32
    dots = pe @ pe.T  # [20, 20]
    iu = torch.triu_indices(20, 20, offset=1)
    avg = float(dots[iu[0], iu[1]].abs().mean())
    cos = avg / 16  # |PE(p)|^2 = d/2 = 16 for every p
    random_cos = math.sqrt(2 / (math.pi * 32))  # E|cos| of two random directions in 32-D (normal approx.)
    return Claim(
        "sinusoidal encodings of different positions are nearly orthogonal (d = 32, 20 positions)",
        "mean |PE(i)·PE(j)| = 0.0128",
        f"mean |PE(i)·PE(j)| = {avg:.4f} with |PE|² = 16, i.e. mean |cos| = {cos:.3f}; "
        f"two random directions in 32-D have mean |cos| ≈ {random_cos:.3f}",
        "wrong: neighbouring encodings are strongly aligned, more than random vectors; "
        "PE(i)·PE(j) = Σ<sub>k</sub> cos((i − j)ω<sub>k</sub>) depends only on i − j",
        avg,
        "sinusoidal_table(20, 32) in float64; mean over the 190 pairs i < j",
    )


def _wavelengths() -> Claim:
    lam = 2 * math.pi / sinusoidal_frequencies(512, dtype=torch.float64)  # [256] wavelengths
    return Claim(
        "the first dimensions of a sinusoidal encoding have the longest wavelengths",
        "",
        f"dims 0–1: {float(lam[0]):.3f} tokens; dims 510–511: {float(lam[-1]):.4g} tokens (d = 512)",
        "wrong: wavelengths grow with the dimension index, from 2π to almost 2π·10000",
        float(lam[0]),
        "2π / ω<sub>k</sub> with ω<sub>k</sub> = 10000<sup>−2k/d</sup>",
    )


def _neighbours() -> Claim:
    p = sinusoidal_table(torch.tensor([0, 1, 100, 101]), 512, dtype=torch.float64)  # [4, 512]
    d01, d100 = float((p[1] - p[0]).norm()), float((p[3] - p[2]).norm())
    return Claim(
        "neighbouring positions differ more near the start of a sequence",
        "|PE(1) − PE(0)| ≫ |PE(101) − PE(100)|",
        f"|PE(1) − PE(0)| = {d01:.6f}, |PE(101) − PE(100)| = {d100:.6f} (d = 512)",
        "wrong: PE(p + 1) = M<sub>1</sub> PE(p) with M<sub>1</sub> a rotation, so every neighbouring "
        "pair is equally far apart",
        d01 / d100,
        "Euclidean distances in float64",
    )


def _lowest_frequency() -> Claim:
    low = float(sinusoidal_frequencies(32, dtype=torch.float64).min())
    return Claim(
        "for d = 32 the lowest sinusoidal frequency is about 0.0245",
        "0.024543",
        f"{low:.6g} rad/token = 10000<sup>−30/32</sup>",
        "wrong: the formula's lowest frequency for d = 32 is 1.78·10<sup>−4</sup>",
        low,
        "min over k of 10000<sup>−2k/d</sup>, k = 0..d/2 − 1",
    )


def _linear_shift() -> Claim:
    enc = sinusoidal_table(256, 64, dtype=torch.float64)  # [256, 64]
    _, resid = fit_shift_map(enc, 5)
    return Claim(
        "a fixed linear map takes PE(p) to PE(p + k) for every p (why the sinusoids were chosen)",
        "",
        f"least-squares M<sub>5</sub> over 256 positions, d = 64: relative residual {resid:.1e}",
        "right: float64 rounding; M<sub>k</sub> is a block rotation by k·ω<sub>i</sub>",
        resid,
        "posenc verify sinusoidal --property relative_linear",
    )


def _gpt_positions() -> Claim:
    how = "transformers.GPT2Model(GPT2Config(n_layer=1)).wpe, built without weights"
    try:
        from transformers import GPT2Config, GPT2Model
    except ImportError:
        return Claim(
            "GPT models use sinusoidal position encodings",
            "",
            "not measured here: transformers is not installed (pip install transformers)",
            "not measured: GPT-2's published code keeps a trained table, wpe",
            math.nan,
            how,
        )
    with torch.random.fork_rng(devices=[]):  # building initialises weights: leave the caller's RNG alone
        model = GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64))
    wpe = model.wpe
    learned = isinstance(wpe, torch.nn.Embedding) and wpe.weight.requires_grad
    return Claim(
        "GPT models use sinusoidal position encodings",
        "",
        f"GPT-2's position layer is {type(wpe).__name__}{tuple(wpe.weight.shape)}, "
        f"requires_grad={wpe.weight.requires_grad}",
        "wrong: GPT-2 learns its position table (posenc's <code>learned</code>)"
        if learned
        else "right: GPT-2's position table is fixed",
        1.0 if learned else 0.0,
        how,
    )


def common_claims() -> list[Claim]:
    """Measure the common claims about sinusoidal encodings (float64, no data)."""
    return [
        _wavelengths(),
        _neighbours(),
        _orthogonal(),
        _lowest_frequency(),
        _linear_shift(),
        _gpt_positions(),
    ]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def study_claims(results: dict[str, Any]) -> list[Claim]:
    """Claims a study settles: does each absolute encoding hold up at twice the trained length?

    Reads the paired delta (bits/byte at ``E = 2L`` minus at ``L`` on the same bytes) of every
    scheme with an ``embed`` hook the study trained, with its 95% interval.
    """
    from ..registry import describe
    from ..registry import schemes as registered_schemes

    registered = set(registered_schemes())
    cfg = results["config"]
    L = cfg["train_len"]
    if not _is_number(L):
        return input_layer_claims(results)
    out = []
    for row in results.get("summary", []):
        d = row.get("delta")
        if row.get("variant") or row.get("setting") or row.get("length") != 2 * L or not isinstance(d, dict):
            continue
        if row.get("scheme") not in registered or "embed" not in describe(row["scheme"])["hooks"]:
            continue  # a scheme this process does not know, or one that does not add to the input
        low, high, mean = d.get("low"), d.get("high"), d.get("mean")
        if not _is_number(mean):
            continue  # a malformed row settles nothing
        bounded = _is_number(low) and _is_number(high)
        interval = f" (95%: {low:+.3f} to {high:+.3f})" if bounded else ""
        worse = bounded and low > 0
        seeds = row.get("seeds")
        out.append(
            Claim(
                f"{row['scheme']} encodings let a model read inputs longer than it was trained on",
                "",
                f"bits/byte at E = {2 * L} minus at L = {L} on the same bytes: {mean:+.3f}{interval}, "
                f"{len(seeds) if isinstance(seeds, list) else '?'} seed(s)",
                "wrong: the model is measurably worse at twice its trained length"
                if worse
                else "not contradicted by this study: no significant loss at 2L",
                float(mean),
                f"posenc extrapolate (this study: {esc(cfg.get('steps', '?'))} steps, L = {L})",
            )
        )
    return out + input_layer_claims(results)


#: Claims about the input layer that a study varying one model field settles: the field, the
#: value the claim says is better, and the claim as it is usually made.
INPUT_LAYER_CLAIMS: dict[str, tuple[Any, str]] = {
    "embed_scale": (
        "sqrt_d_model",
        "scaling the token embedding by sqrt(d_model) keeps the positions "
        "from drowning the tokens (or the reverse), so it trains a better model",
    ),
    "embed_norm": (True, "a LayerNorm right after the embedding speeds training"),
    "tie": ("output", "tying the output layer to the token embedding helps small models"),
    "init_std": (0.02, "initialising the weights with std 0.02 (GPT-2) works better than other scales"),
    "norm": ("pre", "pre-LayerNorm trains better than post-LayerNorm"),
}


def input_layer_claims(results: dict[str, Any]) -> list[Claim]:
    """The :data:`INPUT_LAYER_CLAIMS` a study with one ``vary`` field settles, per scheme and
    other value: held-out bits/byte at ``L`` with the other value minus with the claimed one, on
    the same bytes, seed for seed (> 0: the claim holds)."""
    from ..lab.compare import paired_rows
    from ..lab.grid import run_name

    cfg = results.get("config", {})
    vary = cfg.get("vary") or {}
    if len(vary) != 1 or cfg.get("randomized_positions"):
        return []  # several fields at once: each comparison would mix them
    field, values = next(iter(vary.items()))
    if field not in INPUT_LAYER_CLAIMS or INPUT_LAYER_CLAIMS[field][0] not in values:
        return []
    better, text = INPUT_LAYER_CLAIMS[field]
    runs = {(r["name"], r["seed"]): r for r in results.get("runs", [])}
    out = []
    for scheme in cfg["schemes"]:
        ref = run_name(scheme, ((field, better),))
        for value in (v for v in values if v != better):
            other = run_name(scheme, ((field, value),))
            pairs = [
                (runs[ref, s], runs[other, s])
                for s in cfg["seeds"]
                if (ref, s) in runs and (other, s) in runs
            ]
            row = (
                next((r for r in paired_rows(other, pairs) if r["length"] == cfg["train_len"]), None)
                if pairs
                else None
            )
            if row is not None:
                out.append(_input_layer_claim(text, scheme, field, better, value, row, cfg))
    return out


def _input_layer_claim(text, scheme, field, better, value, row, cfg) -> Claim:
    d = row["diff"]
    low, high = d.get("low"), d.get("high")
    interval = f" (95%: {low:+.3f} to {high:+.3f})" if low is not None and high is not None else ""
    if low is not None and low > 0:
        verdict = f"right for {scheme}: {field}={value} is measurably worse"
    elif high is not None and high < 0:
        verdict = f"wrong for {scheme}: {field}={value} is measurably better"
    else:
        verdict = f"not shown for {scheme} at this budget: the interval includes 0"
    return Claim(
        text,
        f"{field}={better}",
        f"{scheme}: bits/byte at L = {cfg['train_len']} with {field}={value} minus with {field}={better} "
        f"on the same bytes: {d['mean']:+.3f}{interval}, {len(row['seeds'])} seed(s)",
        verdict,
        float(d["mean"]),
        f"posenc extrapolate --vary {field}=... (this study: {cfg['steps']} steps, L = {cfg['train_len']})",
    )
