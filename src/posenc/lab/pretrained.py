"""The lab's evaluation on a model it did not train: a posenc save or a Hugging Face checkpoint,
scored as it is and under each evaluation-time variant its scheme declares (RoPE's scalings), at
each length, with paired deltas against its trained length and intervals over windows.

::

    results = evaluate_pretrained("exported-model", train_len=128, eval_lens=(128, 256, 512))
    print(format_pretrained(results))

The text is read as bytes, so the model's vocabulary must be byte-level (ids 0-255: posenc's own
models and their exports); checkpoints with a subword tokenizer are refused. Scores are bits per
byte, the lab's sliding-window score and paired delta (:mod:`posenc.lab.evaluate`).

Legend: ``L`` trained length, ``E`` evaluation length, ``K`` windows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .._validate import check_int
from .evalset import sample_eval_set
from .evaluate import EvalPoint, evaluate_lm, paired_deltas
from .stats import format_interval

__all__ = ["evaluate_pretrained", "format_pretrained", "load_pretrained"]


def load_pretrained(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
):
    """A posenc save (a ``.safetensors`` file or ``save_pretrained`` folder) or a Hugging Face
    checkpoint folder, as a posenc ``TransformerLM`` in eval mode."""
    from ..model import load_model
    from ..model.hf import from_transformers
    from ..model.hf_files import read_json

    path = Path(path)
    config = path / "config.json"
    if path.is_dir() and config.is_file() and "posenc_model" not in read_json(config):
        return from_transformers(path, device=device, dtype=dtype)
    return load_model(path, device=device, dtype=dtype)


def _limit(model) -> int | None:
    """The longest input the model's positions allow (a learned table's length), else None."""
    limits = [getattr(s, "max_len", None) for s in (model.decoder.embed.position, model.decoder.scheme(0))]
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def _scored(model, evalset, lens, train_len, score_len, batch_tokens, device, at_length) -> list[EvalPoint]:
    limit, points = _limit(model), []
    for e in lens:
        if limit is not None and e > limit:
            points.append(EvalPoint(e, note=f"n/a: positions stop at {limit}"))
            continue
        point = evaluate_lm(
            at_length(e),
            evalset,
            e,
            train_len,
            score_len,
            batch_tokens=batch_tokens,
            device=device,
            autocast=torch.device(device).type == "cuda",
        )
        points.append(point)
    paired_deltas(points, train_len, clusters=evalset.clusters)
    return points


def _byte_model(model: Any, device: str | torch.device):
    """``model`` (or the one saved at that path) in eval mode on ``device``; it must read bytes."""
    from ..model import TransformerLM

    if not isinstance(model, TransformerLM):
        model = load_pretrained(model, device=device)
    if model.config.vocab_size < 256:
        raise ValueError(
            f"the model's vocabulary has {model.config.vocab_size} ids; the lab reads text as bytes "
            "(ids 0-255), so it needs a byte-level model"
        )
    return model.to(device).eval()


def _variant_runs(
    model, variants: tuple[str, ...] | None, train_len: int, args: tuple
) -> list[dict[str, Any]]:
    """The model under each variant its scheme declares (``variants``: a subset), factor ``max(1, E / L)``."""
    from ..model.surgery import with_position

    scheme = model.decoder.scheme(0)
    offered = type(scheme).eval_variants if scheme is not None else ()
    unknown = [v for v in (variants or ()) if v not in offered]
    if unknown:
        raise ValueError(
            f"variants {unknown} are not offered by this model's scheme; it offers {list(offered)}"
        )
    runs = []
    for variant in offered if variants is None else variants:

        def scaled(e: int, variant: str = variant):
            options = type(scheme).variant_options(variant, max(1.0, e / train_len), train_len)
            return with_position(model, options).eval()

        runs.append({"name": f"+{variant}", "variant": variant, "eval": _scored(model, *args, scaled)})
    return runs


def evaluate_pretrained(
    model: Any,
    *,
    train_len: int,
    eval_lens: tuple[int, ...],
    variants: tuple[str, ...] | None = None,
    corpus: str = "stdlib",
    max_chars: int | None = None,
    eval_windows: int = 32,
    score_len: int | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    batch_tokens: int = 16384,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Score ``model`` as it is and under each variant, at every length.

    Args:
        model: a posenc ``TransformerLM`` or a path for :func:`load_pretrained`.
        train_len: ``L``, the length the model was trained at (the paired deltas' reference).
        eval_lens: the lengths ``E`` (``L`` is added when missing).
        variants: evaluation-time variants (default: every one the model's scheme declares, e.g.
            RoPE's ``linear``, ``ntk``, ``yarn``, ``dynamic``), each applied with factor
            ``max(1, E / L)`` and original length ``L`` (it replaces the model's own scaling).
        corpus, max_chars, val_fraction, split_seed: the text (:func:`posenc.text.load_corpus`);
            its validation documents are scored.
        eval_windows, score_len: ``K`` windows and the scored last targets of each (default
            ``min(L, E) / 2``).
        batch_tokens, device: as :func:`~posenc.lab.evaluate.evaluate_lm`.

    Returns:
        ``{"corpus", "eval", "train_len", "runs": [{"name", "variant", "eval": [EvalPoint dicts]}]}``.
    """
    from ..text import load_corpus

    model = _byte_model(model, device)
    check_int(train_len, "train_len")
    lens = tuple(sorted({*(check_int(e, "eval_lens entry") for e in eval_lens), train_len}))
    score_len = score_len or max(1, min(lens) // 2)
    text = load_corpus(corpus, max_chars=max_chars, seed=split_seed, val_fraction=val_fraction)
    evalset = sample_eval_set(
        text.val_bytes,
        eval_windows,
        max(lens),
        split_seed,
        doc_names=[d.name for d in text.val],
        doc_starts=text.val_starts,
    )
    args = (evalset, lens, train_len, score_len, batch_tokens, device)
    runs = [{"name": "as is", "variant": None, "eval": _scored(model, *args, lambda e: model)}]
    runs += _variant_runs(model, variants, train_len, args)
    for run in runs:
        run["eval"] = [p.to_dict() for p in run["eval"]]
    record = {"score_len": score_len, "split_seed": split_seed, **evalset.record()}
    return {"corpus": text.info.summary(), "eval": record, "train_len": train_len, "runs": runs}


def format_pretrained(results: dict[str, Any]) -> str:
    """The paired deltas (bits/byte, 95% intervals over windows) and sliding-window scores as text."""
    lens = [p["length"] for p in results["runs"][0]["eval"]]
    width = max(len(r["name"]) for r in results["runs"]) + 2
    head = "run".ljust(width) + "".join(f"{e:>16}" for e in lens)
    lines = [
        results["corpus"],
        f"paired delta vs L={results['train_len']}, bits/byte (> 0 = worse with the "
        "longer window; 95% interval over windows)",
        head,
    ]
    for run in results["runs"]:
        cells = [
            format_interval(
                p["delta"], signed=True, missing="-" if not p["note"].startswith("n/a") else "n/a"
            )
            for p in run["eval"]
        ]
        lines.append(run["name"].ljust(width) + "".join(f"{c:>16}" for c in cells))
    lines += ["sliding-window bits/byte (the same bytes at every length; lower is better)", head]
    for run in results["runs"]:
        cells = ["n/a" if p["bpb_window"] is None else f"{p['bpb_window']:.3f}" for p in run["eval"]]
        lines.append(run["name"].ljust(width) + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m posenc.lab.pretrained --model PATH --train-len L``: print the tables; a mistake
    prints one line and returns 2."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m posenc.lab.pretrained", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a posenc save or a Hugging Face checkpoint folder")
    p.add_argument("--train-len", type=int, required=True, help="the length the model was trained at (L)")
    p.add_argument("--eval-lens", default=None, help="comma list of lengths (default L, 2L, 4L, 8L)")
    p.add_argument("--variants", default=None, help="comma list (default: every variant the scheme offers)")
    p.add_argument("--corpus", default="stdlib", help="stdlib (default) or a path")
    p.add_argument("--max-chars", type=int, default=None, help="use only the first ~N chars of the corpus")
    p.add_argument("--eval-windows", type=int, default=32, help="evaluation windows (default 32)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    try:
        lens = tuple(int(x) for x in args.eval_lens.split(",")) if args.eval_lens else None
        results = evaluate_pretrained(
            args.model,
            train_len=args.train_len,
            eval_lens=lens or tuple(args.train_len * k for k in (1, 2, 4, 8)),
            variants=tuple(args.variants.split(",")) if args.variants else None,
            corpus=args.corpus,
            max_chars=args.max_chars,
            eval_windows=args.eval_windows,
            device=args.device,
        )
    except (TypeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_pretrained(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
