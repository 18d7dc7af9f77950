"""The lab's evaluation on a model it did not train: a posenc save or a Hugging Face checkpoint,
scored as it is and under each evaluation-time variant its scheme declares (RoPE's scalings), at
each length, with paired deltas against its trained length and against the model as it is, the
effective-context probe, and intervals over documents.

::

    results = evaluate_pretrained("exported-model", eval_lens=(128, 256, 512))
    print(format_pretrained(results))

or from a shell: ``posenc extrapolate --model DIR [--quick] [--out OUT]``.

**Text.** A folder holding a ``tokenizer.json`` is read with that tokenizer
(:func:`posenc.text.load_tokenizer`; nothing is downloaded) and scored in **bits per token**; a
model without one is read as bytes (ids 0-255) and scored in **bits per byte**, which needs a
byte-level vocabulary (at most :data:`BYTE_VOCAB_LIMIT` ids: 256 bytes and special ids). The
corpus is split by document as the lab splits it; its validation documents are scored, windows
that repeat its training documents are dropped (:func:`~posenc.lab.evalset.sample_eval_set`).

**Scores** (:mod:`posenc.lab.evaluate`): per length ``E`` the sliding-window score (the same last
``S`` targets of each window at every length), its paired delta against ``E = L`` (``delta``) and,
for a variant, against the model as it is at the same ``E`` (``vs_as_is``), each with a 95%
bootstrap interval over documents; at the longest length the repeated-string probe
(:mod:`posenc.lab.probe`; for a tokenized model its random strings are ids 0-255).

Legend: ``L`` trained length, ``E`` evaluation length, ``K`` windows, ``S`` scored targets per window.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._validate import check_int

if TYPE_CHECKING:
    import torch

# torch and the lab's evaluators are imported inside the functions: `posenc extrapolate --help`
# builds its parser with add_model_flags and must not load torch.

__all__ = [
    "BYTE_VOCAB_LIMIT",
    "PretrainedText",
    "Setup",
    "add_model_flags",
    "at_variant",
    "evaluate_pretrained",
    "evaluate_setup",
    "format_pretrained",
    "format_probe",
    "format_rows",
    "load_pretrained",
    "main",
    "model_tokenizer",
    "position_limit",
    "prepare_pretrained",
    "read_text",
    "run",
    "score_model",
    "trained_length",
]

#: The largest vocabulary read as bytes without a tokenizer: the 256 byte values and up to 256
#: special ids. Real subword vocabularies are far larger (GPT-2: 50,257), so a checkpoint that
#: lost its ``tokenizer.json`` is refused rather than fed bytes as if they were its tokens.
BYTE_VOCAB_LIMIT = 512

#: Evaluation lengths by default: these multiples of ``L`` (``--quick``: the first three) that the
#: model's positions allow.
DEFAULT_MULTIPLES = (1, 2, 4, 8)

#: ``--quick``: the corpus subset of the lab's quick preset, fewer windows and probe trials.
QUICK = {"max_chars": 3_000_000, "eval_windows": 16, "multiples": (1, 2, 4), "probe_trials": 16}

#: Probe trials per distance by default.
PROBE_TRIALS = 32

#: What ``--out`` holds (present: the folder already holds a run).
ARTIFACTS = ("results.json",)


# ----------------------------------------------------------------------------------------------
# The model and its tokenizer
# ----------------------------------------------------------------------------------------------
def load_pretrained(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
):
    """A posenc save (a ``.safetensors`` file or ``save_pretrained`` folder) or a Hugging Face
    checkpoint folder, as a posenc ``TransformerLM`` in eval mode.

    Raises:
        ValueError: the path is missing, a folder holds no ``config.json``, or its ``model_type`` is
            not a family posenc reads (each message names the path and the fix).
    """
    from ..model import load_model
    from ..model.hf import from_transformers
    from ..model.hf_families import family_for
    from ..model.hf_files import read_json

    path = Path(path)
    if not path.exists():
        raise ValueError(
            f"--model {str(path)!r} does not exist; give a Hugging Face checkpoint folder or a posenc save"
        )
    config = path / "config.json"
    if path.is_dir() and not config.is_file():
        raise ValueError(
            f"--model {str(path)!r} holds no config.json; give a Hugging Face checkpoint folder "
            "(save_pretrained) or a folder written by posenc's save_pretrained"
        )
    if path.is_dir() and "posenc_model" not in (fields := read_json(config)):
        family_for(fields.get("model_type"), str(config))  # an unknown architecture, before any weight
        return from_transformers(path, device=device, dtype=dtype)
    return load_model(path, device=device, dtype=dtype)


def model_tokenizer(path: str | os.PathLike | None):
    """The :class:`posenc.text.Tokenizer` of the ``tokenizer.json`` beside the model (``None``: the
    model has none, or ``path`` is not a folder)."""
    from ..text import load_tokenizer

    if path is None or not Path(path).is_dir() or not (Path(path) / "tokenizer.json").is_file():
        return None
    return load_tokenizer(path)


def position_limit(model) -> int | None:
    """The longest input the model's positions allow (a learned table's length), else ``None``."""
    schemes = (model.decoder.embed.position, model.decoder.scheme(0))
    limits = [x for x in (getattr(s, "max_len", None) for s in schemes) if x is not None]
    return min(limits) if limits else None


def _checked_model(model: Any, device: str | torch.device):
    """``(model, tokenizer)``: ``model`` (or the one saved at that path) in eval mode on
    ``device`` and the tokenizer saved with it (``None``: bytes)."""
    from ..model import TransformerLM

    tokenizer = None
    if not isinstance(model, TransformerLM):
        tokenizer = model_tokenizer(model)
        model = load_pretrained(model, device=device)
    vocab = model.config.vocab_size
    if tokenizer is not None and tokenizer.vocab_size > vocab:
        raise ValueError(
            f"the model's tokenizer.json has {tokenizer.vocab_size:,} ids but the model only "
            f"{vocab:,}; the folder mixes a model and another model's tokenizer"
        )
    if tokenizer is None and not 256 <= vocab <= BYTE_VOCAB_LIMIT:
        raise ValueError(
            f"the model's vocabulary has {vocab:,} ids and its folder no tokenizer.json; without "
            f"one posenc reads text as bytes (ids 0-255), which needs a byte-level model (256 to "
            f"{BYTE_VOCAB_LIMIT} ids): put the checkpoint's tokenizer.json in the folder"
        )
    return model.to(device).eval(), tokenizer


# ----------------------------------------------------------------------------------------------
# The text
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PretrainedText:
    """The corpus as the model reads it: token ids (or bytes) of its training and validation
    documents.

    Attributes:
        unit: ``"byte"`` or ``"token"`` (scores are bits per ``unit``).
        train: ``[m]`` integer ids of the training documents (uint8 bytes, or int64 tokens).
        val: ``[n]`` the same for the validation documents.
        val_names, val_starts: each validation document's name and first index in ``val``.
        summary: one line naming the corpus (and the tokenizer).
        info: the corpus record (:class:`posenc.text.CorpusInfo` as a dict).
        data_id: the corpus hash and split (what a fine-tuned model trained on).
    """

    unit: str
    train: torch.Tensor
    val: torch.Tensor
    val_names: tuple[str, ...]
    val_starts: tuple[int, ...]
    summary: str
    info: dict[str, Any]
    data_id: str


def _token_ids(docs, tokenizer) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``docs`` tokenized and joined by the corpus's document separator: ``([n] int64, starts)``."""
    import torch

    from ..text.corpus import DOC_SEPARATOR

    sep = tokenizer.encode_tensor(DOC_SEPARATOR, add_special_tokens=False)
    parts, starts, at = [], [], 0
    for i, doc in enumerate(docs):
        ids = tokenizer.encode_tensor(doc.text, add_special_tokens=False)
        if i + 1 < len(docs):
            ids = torch.cat([ids, sep])
        starts.append(at)
        parts.append(ids)
        at += ids.numel()
    return (torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)), tuple(starts)


def read_text(
    corpus: str | os.PathLike = "stdlib",
    tokenizer: Any = None,
    *,
    vocab_size: int | None = None,
    max_chars: int | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
) -> PretrainedText:
    """The corpus (:func:`posenc.text.load_corpus`) as bytes, or as ``tokenizer``'s ids (checked to
    be below ``vocab_size``)."""
    import dataclasses

    from ..text import load_corpus

    text = load_corpus(corpus, max_chars=max_chars, seed=split_seed, val_fraction=val_fraction)
    names = tuple(d.name for d in text.val)
    data_id = f"{text.info.sha256}:split{split_seed}"
    info = dataclasses.asdict(text.info)
    if tokenizer is None:
        summary = text.info.summary() + "; read as bytes"
        return PretrainedText(
            "byte", text.train_bytes, text.val_bytes, names, text.val_starts, summary, info, data_id
        )
    train, _ = _token_ids(text.train, tokenizer)
    val, starts = _token_ids(text.val, tokenizer)
    top = int(max(train.max() if train.numel() else 0, val.max() if val.numel() else 0))
    if vocab_size is not None and top >= vocab_size:
        raise ValueError(
            f"the tokenizer gives id {top:,} but the model has {vocab_size:,} ids; the tokenizer.json "
            "is not this model's"
        )
    summary = f"{text.info.summary()}; {val.numel():,} validation tokens ({tokenizer.kind} tokenizer.json)"
    info = {**info, "tokenizer": tokenizer.kind, "tokenizer_vocab": tokenizer.vocab_size}
    data_id = f"{data_id}:{tokenizer.kind}{tokenizer.vocab_size}"
    return PretrainedText("token", train, val, names, starts, summary, info, data_id)


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------
def _interval(values: list[float], clusters: list[int], seed: int) -> dict[str, Any]:
    import torch

    from .stats import paired_bootstrap

    return paired_bootstrap(torch.tensor(values, dtype=torch.float64), clusters, seed=seed).to_dict()


def score_model(
    model_at,
    evalset,
    lens: tuple[int, ...],
    train_len: int,
    score_len: int,
    *,
    limit: int | None = None,
    probe_trials: int = 0,
    split_seed: int = 0,
    batch_tokens: int = 16384,
    device: str | torch.device = "cpu",
) -> list[dict[str, Any]]:
    """One model at every length: :func:`~posenc.lab.evaluate.evaluate_lm`, the paired deltas
    against ``L`` (intervals over documents), a ``score`` interval of ``bpb_window``, and at the
    longest measured length the repeated-string probe (``probe_trials`` > 0, where a distance fits).

    Args:
        model_at: ``E -> model`` (the model read at length ``E``: a variant's factor depends on it).
        evalset, lens, train_len, score_len: the windows, the lengths ``E``, ``L``, ``S``.
        limit: the longest input the positions allow (longer lengths are ``n/a``).

    Returns:
        one :class:`~posenc.lab.evaluate.EvalPoint` dict per length, with ``score``.
    """
    import torch

    from .evaluate import PROBE_STRING, EvalPoint, evaluate_lm, paired_deltas
    from .probe import probe_distances, repeated_string_probe

    points = []
    for e in lens:
        if limit is not None and e > limit:
            points.append(EvalPoint(e, note=f"n/a: positions stop at {limit}"))
            continue
        points.append(
            evaluate_lm(
                model_at(e),
                evalset,
                e,
                train_len,
                score_len,
                batch_tokens=batch_tokens,
                device=device,
                autocast=torch.device(device).type == "cuda",
            )
        )
    paired_deltas(points, train_len, seed=split_seed, clusters=evalset.clusters)
    measured = [p for p in points if p.window_bits]
    longest = max(measured, key=lambda p: p.length)
    distances = probe_distances(longest.length, PROBE_STRING)
    if probe_trials and distances:
        longest.probe = repeated_string_probe(
            model_at(longest.length),
            evalset.tokens,
            distances,
            string_len=PROBE_STRING,
            trials=probe_trials,
            seed=split_seed,
            device=device,
        )
    out = []
    for p in points:
        d = p.to_dict()
        d["score"] = _interval(p.window_bits, evalset.clusters, split_seed) if p.window_bits else None
        out.append(d)
    return out


def _offered(model, variants: tuple[str, ...] | None) -> tuple[str, ...]:
    """The variants to run: those the model's scheme declares, or the requested subset of them."""
    scheme = model.decoder.scheme(0)
    offered = type(scheme).eval_variants if scheme is not None else ()
    unknown = [v for v in (variants or ()) if v not in offered]
    if unknown:
        raise ValueError(
            f"variants {unknown} are not offered by this model's scheme; it offers {list(offered) or 'none'}"
        )
    return offered if variants is None else tuple(variants)


def at_variant(model, variant: str | None, factor: float, train_len: int):
    """``model`` with ``variant``'s positional options at ``factor`` and original length ``L``
    (replacing its own scaling); ``variant=None``: the model itself."""
    from ..model.surgery import with_position

    if variant is None:
        return model
    scheme = model.decoder.scheme(0)
    return with_position(model, type(scheme).variant_options(variant, factor, train_len)).eval()


def _lengths(
    eval_lens: tuple[int, ...] | None, train_len: int, limit: int | None, multiples: tuple[int, ...]
) -> tuple[int, ...]:
    """The lengths to score (``L`` added); by default the ``multiples`` of ``L`` the positions allow;
    a requested length past them is an error."""
    if eval_lens is None:
        lens = [train_len * k for k in multiples if limit is None or train_len * k <= limit]
    else:
        lens = [check_int(e, "eval_lens entry") for e in eval_lens]
        beyond = [e for e in lens if limit is not None and e > limit]
        if beyond:
            raise ValueError(
                f"--eval-lens {beyond} are longer than the model's positions allow ({limit}: a "
                f"learned table); use lengths up to {limit}"
            )
    return tuple(sorted({*lens, train_len}))


def trained_length(model) -> int:
    """``L`` from the model's config (``max_len``: Hugging Face's ``max_position_embeddings``)."""
    length = model.config.max_len
    if length is None:
        raise ValueError("the model's config holds no trained length (max_len); give it with --train-len")
    return length


@dataclass
class Setup:
    """A loaded model and what it is scored on: the text, the windows, the lengths.

    Attributes:
        model: the posenc ``TransformerLM`` in eval mode.
        text: the corpus as the model reads it.
        evalset: the ``K`` windows (:class:`~posenc.lab.evalset.EvalSet`).
        train_len, lens, score_len: ``L``, the lengths ``E`` (``L`` among them), ``S``.
        limit: the longest input the positions allow (``None``: no limit).
        variants: the evaluation-time variants to run.
    """

    model: Any
    text: PretrainedText
    evalset: Any
    train_len: int
    lens: tuple[int, ...]
    score_len: int
    limit: int | None
    variants: tuple[str, ...]
    split_seed: int = 0
    probe_trials: int = PROBE_TRIALS
    batch_tokens: int = 16384
    device: str | torch.device = "cpu"

    def score(self, model_at) -> list[dict[str, Any]]:
        """:func:`score_model` on this setup's windows and lengths."""
        return score_model(
            model_at,
            self.evalset,
            self.lens,
            self.train_len,
            self.score_len,
            limit=self.limit,
            probe_trials=self.probe_trials,
            split_seed=self.split_seed,
            batch_tokens=self.batch_tokens,
            device=self.device,
        )

    def against(self, points: list[dict], reference: list[dict]) -> list[dict | None]:
        """Per length, the paired difference ``points - reference`` on the same windows, with a 95%
        interval over documents (``None`` where either is not measured)."""
        out = []
        for p, r in zip(points, reference):
            both = p["window_bits"] and r["window_bits"]
            diff = [a - b for a, b in zip(p["window_bits"], r["window_bits"])] if both else None
            out.append(_interval(diff, self.evalset.clusters, self.split_seed) if diff else None)
        return out


def prepare_pretrained(
    model: Any,
    *,
    train_len: int | None = None,
    eval_lens: tuple[int, ...] | None = None,
    variants: tuple[str, ...] | None = None,
    corpus: str | os.PathLike = "stdlib",
    max_chars: int | None = None,
    eval_windows: int = 32,
    score_len: int | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    probe_trials: int = PROBE_TRIALS,
    multiples: tuple[int, ...] = DEFAULT_MULTIPLES,
    batch_tokens: int = 16384,
    device: str | torch.device = "cpu",
) -> Setup:
    """Load and check the model, read the text, choose the windows (arguments as
    :func:`evaluate_pretrained`). Every check runs here, before any scoring."""
    model, tokenizer = _checked_model(model, device)
    train_len = trained_length(model) if train_len is None else check_int(train_len, "train_len")
    check_int(probe_trials, "probe_trials", minimum=0)
    limit = position_limit(model)
    lens = _lengths(eval_lens, train_len, limit, multiples)
    chosen = _offered(model, variants)
    score_len = score_len or max(1, min(lens) // 2)
    if not 1 <= score_len <= min(lens):
        raise ValueError(f"score_len={score_len} must be in [1, {min(lens)}] (the shortest length)")
    text = read_text(
        corpus,
        tokenizer,
        vocab_size=model.config.vocab_size,
        max_chars=max_chars,
        split_seed=split_seed,
        val_fraction=val_fraction,
    )
    from .evalset import sample_eval_set

    evalset = sample_eval_set(
        text.val,
        eval_windows,
        max(lens),
        split_seed,
        doc_names=list(text.val_names),
        doc_starts=list(text.val_starts),
        train_tokens=text.train if text.train.numel() > score_len else None,
        score_len=score_len,
    )
    return Setup(
        model,
        text,
        evalset,
        train_len,
        lens,
        score_len,
        limit,
        chosen,
        split_seed,
        probe_trials,
        batch_tokens,
        device,
    )


def evaluate_setup(setup: Setup) -> dict[str, Any]:
    """The model as it is and under each variant at every length (see :func:`evaluate_pretrained`)."""
    t0 = time.perf_counter()
    model, L = setup.model, setup.train_len
    as_is = setup.score(lambda e: model)
    runs = [{"name": "as is", "variant": None, "eval": as_is}]
    for v in setup.variants:
        points = setup.score(lambda e, v=v: at_variant(model, v, max(1.0, e / L), L))
        for p, d in zip(points, setup.against(points, as_is)):
            p["vs_as_is"] = d
        runs.append({"name": f"+{v}", "variant": v, "eval": points})
    return {
        "unit": setup.text.unit,
        "corpus": setup.text.summary,
        "corpus_info": setup.text.info,
        "data_id": setup.text.data_id,
        "eval": {"score_len": setup.score_len, "split_seed": setup.split_seed, **setup.evalset.record()},
        "train_len": L,
        "eval_lens": list(setup.lens),
        "position_limit": setup.limit,
        "model_config": model.config.to_dict(),
        "runs": runs,
        "wall_s": time.perf_counter() - t0,
    }


def evaluate_pretrained(model: Any, **options: Any) -> dict[str, Any]:
    """Score ``model`` as it is and under each variant, at every length.

    Args:
        model: a posenc ``TransformerLM`` (read as bytes) or a path for :func:`load_pretrained`
            (with the ``tokenizer.json`` beside it, if any).
        train_len: ``L``, the length the model was trained at (default: its config's ``max_len``).
        eval_lens: the lengths ``E`` (``L`` is added); default: ``multiples`` of ``L`` within the
            model's positions. A length past a learned table is a ``ValueError``.
        variants: evaluation-time variants (default: every one the model's scheme declares, e.g.
            RoPE's ``linear``, ``ntk``, ``dynamic``, ``yarn``), each with factor ``max(1, E / L)``
            and original length ``L`` (it replaces the model's own scaling).
        corpus, max_chars, val_fraction, split_seed: the text (:func:`read_text`).
        eval_windows, score_len: ``K`` windows and ``S`` (default ``min(E) / 2``).
        probe_trials: trials per probe distance (0: no probe).
        batch_tokens, device: as :func:`~posenc.lab.evaluate.evaluate_lm`.

    Returns:
        ``{"unit", "corpus", "eval", "train_len", "eval_lens", "runs": [{"name", "variant",
        "eval": [points]}], ...}``; each point as :func:`score_model`, a variant's with ``vs_as_is``.
    """
    return evaluate_setup(prepare_pretrained(model, **options))


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------
def format_rows(title: str, runs: list[dict], lens: list[int], cell) -> list[str]:
    width = max(len(r["name"]) for r in runs) + 2
    lines = [title, "run".ljust(width) + "".join(f"{e:>17}" for e in lens)]
    for run in runs:
        lines.append(run["name"].ljust(width) + "".join(f"{cell(p):>17}" for p in run["eval"]))
    return lines


def _missing(p: dict) -> str:
    return "n/a" if p["note"].startswith("n/a") else "-"


def format_probe(runs: list[dict], unit: str) -> list[str]:
    """The probe's gain per run and distance (bits per ``unit`` on the second copy: control minus
    copy, 95% interval over trials)."""
    from .stats import format_interval

    rows = [(r["name"], p) for r in runs for p in r["eval"] if p.get("probe")]
    if not rows:
        return []
    distances = [x["distance"] for x in rows[0][1]["probe"]]
    width = max(len(name) for name, _ in rows) + 2
    lines = [
        f"effective-context probe at E={rows[0][1]['length']}: gain in bits/{unit} on a repeated random "
        "string by distance (0 = no retrieval; 95% interval over trials)",
        "run".ljust(width) + "".join(f"{d:>17}" for d in distances),
    ]
    for name, p in rows:
        lines.append(name.ljust(width) + "".join(f"{format_interval(x['gain']):>17}" for x in p["probe"]))
    return lines


def format_pretrained(results: dict[str, Any]) -> str:
    """The per-variant tables: sliding-window loss, paired deltas against ``L`` and against the
    model as it is (95% intervals over documents), the probe, and fine-tuning when it ran."""
    from .stats import format_interval

    unit = results.get("unit", "byte")
    runs, lens = results["runs"], [p["length"] for p in results["runs"][0]["eval"]]
    L = results["train_len"]
    lines = [results["corpus"]]
    lines += format_rows(
        f"sliding-window bits/{unit} (the same last {results['eval']['score_len']} targets at every length; "
        "lower is better)",
        runs,
        lens,
        lambda p: format_interval(p.get("score"), missing=_missing(p)),
    )
    lines += format_rows(
        f"paired delta vs L={L}, bits/{unit} (> 0 = worse with the longer window)",
        runs,
        lens,
        lambda p: format_interval(p["delta"], signed=True, missing=_missing(p)),
    )
    if len(runs) > 1:
        lines += format_rows(
            f"paired delta vs as is at the same length, bits/{unit} (< 0 = the variant helps)",
            runs[1:],
            lens,
            lambda p: format_interval(p.get("vs_as_is"), signed=True, missing=_missing(p)),
        )
    lines += format_probe(runs, unit)
    if results.get("finetune"):
        from .finetune_pretrained import format_finetune

        lines += format_finetune(results, unit)
    ev = results["eval"]
    lines.append(
        f"intervals: 95% bootstrap over the {ev['n_documents']} validation documents the "
        f"{ev['windows']} windows fall in"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The command: posenc extrapolate --model PATH
# ----------------------------------------------------------------------------------------------
def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The flags ``posenc extrapolate`` adds for a pretrained model (the rest are the study's:
    --train-len, --eval-lens, --variants, --corpus, --max-chars, --eval-windows, --score-len,
    --finetune-len, --finetune-steps, --batch-size, --lr, --seed, --split-seed, --quick, --out)."""
    parser.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="evaluate (and with --finetune-len, fine-tune) this Hugging Face checkpoint folder or "
        "posenc save instead of training models; --train-len defaults to its config's length",
    )
    parser.add_argument(
        "--peft",
        default=None,
        choices=["lora"],
        help="with --model --finetune-len: parameter-efficient fine-tuning through the peft package "
        "(default: every parameter)",
    )


#: Study flags that mean nothing for one loaded model: (attribute, the flag as typed).
_STUDY_ONLY = (
    ("schemes", "--schemes"),
    ("seeds", "--seeds"),
    ("vary", "--vary"),
    ("option", "--option"),
    ("randomized_positions", "--randomized-positions"),
    ("diagnostics", "--diagnostics"),
    ("cluster", "--cluster"),
    ("workers", "--workers"),
    ("from_file", "--from"),
    ("compare", "--compare"),
    ("regenerate", "--regenerate"),
    ("markdown", "--markdown"),
    ("resume", "--resume"),
    ("steps", "--steps"),
    ("d_model", "--d-model"),
    ("layers", "--layers"),
    ("heads", "--heads"),
    ("dropout", "--dropout"),
    ("curriculum_steps", "--curriculum-steps"),
    ("checkpoint_every", "--checkpoint-every"),
)


def _check_flags(args: argparse.Namespace) -> None:
    given = [flag for attr, flag in _STUDY_ONLY if getattr(args, attr, None) not in (None, False, [], ())]
    if getattr(args, "task", "lm") != "lm":
        given.append("--task")
    if given:
        raise ValueError(
            f"{', '.join(given)} train models of their own; with --model posenc evaluates (and "
            "fine-tunes) the model given: leave them out"
        )
    ft_len, ft_steps = getattr(args, "finetune_len", None), getattr(args, "finetune_steps", None)
    if (ft_len is None) != (ft_steps is None):
        raise ValueError("--finetune-len and --finetune-steps go together: give both (e.g. 256 and 100)")
    if getattr(args, "peft", None) and ft_len is None:
        raise ValueError("--peft chooses how to fine-tune: give it with --finetune-len and --finetune-steps")


def _given(args: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def run(args: argparse.Namespace) -> int:
    """``posenc extrapolate --model PATH``: evaluate (and fine-tune), print the tables, write
    ``--out/results.json``. A user mistake raises ``ValueError`` (one line, exit code 2)."""
    from .runs import RunFolder

    _check_flags(args)
    out = getattr(args, "out", None)
    if out is None:
        return _run(args, None)
    with RunFolder(out, ARTIFACTS, overwrite=bool(getattr(args, "overwrite", False))) as folder:
        return _run(args, folder.path)


def _run(args: argparse.Namespace, out: Path | None) -> int:
    import torch

    from .._paths import write_json
    from .commands import parse_list

    quick = bool(getattr(args, "quick", False))
    eval_lens, variants = getattr(args, "eval_lens", None), getattr(args, "variants", None)
    device = _given(args, "device", "cpu")
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(check_int(args.threads, "--threads"))
    load_avg, t0 = list(os.getloadavg()), time.perf_counter()
    setup = prepare_pretrained(
        args.model,
        train_len=getattr(args, "train_len", None),
        eval_lens=parse_list(eval_lens, int, flag="--eval-lens") if eval_lens else None,
        variants=None
        if variants is None
        else ()
        if variants == "none"
        else parse_list(variants, flag="--variants"),
        corpus=_given(args, "corpus", "stdlib"),
        max_chars=_given(args, "max_chars", QUICK["max_chars"] if quick else None),
        eval_windows=_given(args, "eval_windows", QUICK["eval_windows"] if quick else 32),
        score_len=getattr(args, "score_len", None),
        split_seed=_given(args, "split_seed", 0),
        val_fraction=_given(args, "val_fraction", 0.1),
        probe_trials=QUICK["probe_trials"] if quick else PROBE_TRIALS,
        multiples=QUICK["multiples"] if quick else DEFAULT_MULTIPLES,
        device=device,
    )
    plan = None
    if getattr(args, "finetune_len", None) is not None:
        from .finetune_pretrained import FinetunePlan

        plan = FinetunePlan.checked(
            setup,
            args.finetune_len,
            args.finetune_steps,
            batch_size=getattr(args, "batch_size", None),
            lr=getattr(args, "lr", None),
            seed=_given(args, "seed", 0),
            peft=getattr(args, "peft", None),
        )
    results = evaluate_setup(setup)
    if plan is not None:
        results["finetune"] = plan.run(
            setup, results, progress=False if getattr(args, "no_progress", False) else None
        )
    results["wall_s"] = time.perf_counter() - t0
    results["model"] = str(args.model)
    results["environment"] = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "load_avg_start": load_avg,
        "load_avg_end": list(os.getloadavg()),
        "quick": quick,
    }
    print(format_pretrained(results))
    print(
        f"\nwall time {results['wall_s']:.0f} s on {device} ({torch.get_num_threads()} thread(s)); "
        f"load average at start/end {load_avg[0]:.2f}/{results['environment']['load_avg_end'][0]:.2f}"
    )
    if out is not None:
        write_json(out / "results.json", results)
        print(f"wrote {out / 'results.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m posenc.lab.pretrained --model PATH [flags of posenc extrapolate]``: the same as
    ``posenc extrapolate --model PATH``."""
    import sys

    from ..cli import main as cli_main

    return cli_main(["extrapolate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
