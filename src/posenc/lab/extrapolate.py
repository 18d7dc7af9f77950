"""Train short, test long: the length-extrapolation study (Press et al. 2022) on one machine or many.

One small decoder-only byte-level LM per scheme, trained at length ``L`` with the same data, the
same batches (:func:`~posenc.lab.train.batch_at` depends only on seed and step), the same seed and
the same budget; then each is evaluated at a list of lengths ``E`` on one FIXED slice of
validation bytes, so every length scores exactly the same target bytes:

* **non-overlapping windows** (default): the slice is cut into ``N / E`` windows of ``E`` tokens;
  every target is scored once, with the context its window gives it (0 .. E-1 tokens);
* **sliding windows** (``stride``): windows of ``E`` start every ``stride`` tokens; the first
  scores all its targets, each later one only its last ``stride`` (each target then sees at least
  ``E - stride`` tokens of context).

Two numbers per length (the ALiBi authors' Appendix B: short contexts at the start of each
window inflate the all-position loss, the "early token curse"): bits per byte over **all**
scored positions, and over the positions **>= L** only (``None`` for ``E <= L``), where only a
model that extrapolates can do well. A scheme with a finite table (learned positions) reports
``None`` ("n/a") past its table instead of failing. RoPE scalings (``linear``, ``ntk``, ``yarn``,
...) are applied at evaluation time to the model trained with plain RoPE, with factor ``E / L``,
as extra rows such as ``rope+yarn``.

A second mode trains on the synthetic tasks of Kazemnejad et al. 2023 (``copy``, ``reverse``,
``addition``; :mod:`posenc.text.tasks`) with question lengths ``1..L`` and reports exact-match
accuracy at longer lengths (teacher-forced argmax; exact match under teacher forcing equals exact
match of greedy decoding, since greedy decoding goes wrong exactly where the first answer token is
mispredicted).

Legend: ``L`` train length, ``E`` evaluation length, ``N`` evaluation tokens, ``w`` windows,
``b`` windows per forward pass, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .._validate import check_choice, check_int, check_positive_float
from .train import (
    IGNORE_INDEX,
    TrainConfig,
    _step_seed,
    available_memory,
    check_memory,
    dist_info,
    estimate_memory,
    seed_everything,
    train,
)

__all__ = [
    "DEFAULT_SCHEMES",
    "MODES",
    "PRESETS",
    "SCHEME_OPTIONS",
    "EvalPoint",
    "StudyConfig",
    "eval_slice",
    "evaluate_lm",
    "evaluate_task",
    "format_table",
    "plot_study",
    "run_study",
    "scaled_rope_options",
    "study_model_config",
    "task_batch_fn",
]

#: The schemes of DESIGN.md section 6 / Press et al. 2022 Table 2.
DEFAULT_SCHEMES: tuple[str, ...] = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5")

#: What the study measures: byte-level language modelling, or a synthetic task.
MODES: dict[str, str] = {
    "lm": "byte-level language model on a corpus; bits per byte vs evaluation length",
    "copy": "copy n digits; exact-match accuracy vs n",
    "reverse": "reverse n digits; exact-match accuracy vs n",
    "addition": "add two n-digit numbers; exact-match accuracy vs n",
}

#: Extra options the study gives a scheme (none today: a decoder already builds T5 with
#: one-directional buckets and ALiBi in its causal form, from the model's build context).
SCHEME_OPTIONS: dict[str, dict[str, Any]] = {}


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------
@dataclass
class StudyConfig:
    """Everything that defines a study (saved in full in ``results.json``).

    Args:
        schemes: scheme names, each trained once (``posenc list``).
        mode: a key of :data:`MODES` (``"lm"`` or a synthetic task).
        train_len: ``L``: window length in ``lm`` mode; the longest question (digits) in task mode.
        eval_lens: the lengths ``E`` to evaluate (tokens in ``lm`` mode, digits in task mode).
        steps, batch_size, lr, min_lr, warmup_steps, weight_decay, grad_clip: the training budget
            and optimizer (:class:`~posenc.lab.train.TrainConfig`), the same for every scheme.
        seed: seeds the model initialisation, the batches and the task examples.
        corpus: ``"stdlib"`` or a path (``lm`` mode).
        max_chars: use only the first documents of the corpus, about this many characters.
        d_model, num_layers, num_heads, dropout: the model (:class:`~posenc.model.ModelConfig`).
        eval_tokens: ``N``, the evaluation slice in tokens (rounded up to a multiple of every
            ``E``); ``None`` = 16 windows of the longest length.
        eval_offset: where the slice starts in the validation bytes.
        stride: sliding-window stride (``None`` = non-overlapping windows).
        rope_scalings: RoPE scaling rules applied at evaluation time to the ``rope`` model.
        eval_examples: examples per length in task mode.
        eval_batch_tokens: at most this many tokens per evaluation forward pass (and less when
            the attention matrices of long windows would not fit; see :func:`evaluate_lm`).
        checkpoint_every: write a training checkpoint this often (when the study has an output folder).
    """

    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    mode: str = "lm"
    train_len: int = TrainConfig.seq_len
    eval_lens: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    # the optimisation defaults are TrainConfig's, stated once there
    steps: int = TrainConfig.steps
    batch_size: int = TrainConfig.batch_size
    lr: float = TrainConfig.lr
    min_lr: float = TrainConfig.min_lr
    warmup_steps: int = TrainConfig.warmup_steps
    weight_decay: float = TrainConfig.weight_decay
    grad_clip: float = TrainConfig.grad_clip
    seed: int = TrainConfig.seed
    corpus: str = "stdlib"
    max_chars: int | None = None
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    dropout: float = 0.0
    eval_tokens: int | None = None
    eval_offset: int = 0
    stride: int | None = None
    rope_scalings: tuple[str, ...] = ("linear", "ntk", "yarn")
    eval_examples: int = 200
    eval_batch_tokens: int = 16384
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        from ..registry import scheme_class

        self.schemes = tuple(self.schemes)
        self.eval_lens = tuple(self.eval_lens)
        self.rope_scalings = tuple(self.rope_scalings)
        if not self.schemes:
            raise ValueError("schemes is empty: give at least one scheme, e.g. schemes=('rope', 'alibi')")
        if len(set(self.schemes)) != len(self.schemes):
            raise ValueError(f"schemes has duplicates: {list(self.schemes)}")
        for name in self.schemes:
            cls = scheme_class(name)  # unknown name -> ValueError listing the valid ones
            if not cls.causal_ok:
                raise ValueError(f"scheme {name!r} has no causal form, so it cannot run in a decoder-only LM")
        check_choice(self.mode, "mode", MODES)
        check_int(self.train_len, "train_len")
        if not self.eval_lens:
            raise ValueError("eval_lens is empty: give at least one evaluation length")
        for e in self.eval_lens:
            check_int(e, "eval_lens entry")
        if list(self.eval_lens) != sorted(set(self.eval_lens)):
            raise ValueError(f"eval_lens must be increasing without repeats, got {list(self.eval_lens)}")
        for name in ("steps", "batch_size", "d_model", "num_layers", "num_heads", "eval_examples",
                     "eval_batch_tokens"):
            check_int(getattr(self, name), name)
        check_int(self.seed, "seed", minimum=0)
        check_int(self.eval_offset, "eval_offset", minimum=0)
        check_int(self.checkpoint_every, "checkpoint_every", minimum=0)
        if self.max_chars is not None:
            check_int(self.max_chars, "max_chars")
        if self.eval_tokens is not None:
            check_int(self.eval_tokens, "eval_tokens")
        if self.stride is not None:
            check_int(self.stride, "stride")
            if self.mode != "lm":
                raise ValueError(f"stride applies to mode='lm' only, not mode={self.mode!r}")
        check_positive_float(self.lr, "lr")
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if self.rope_scalings and "rope" in self.schemes:  # used only with a plain-RoPE model
            from ..rotary import ROPE_SCALINGS

            for rule in self.rope_scalings:
                check_choice(rule, "rope_scalings entry", ROPE_SCALINGS)
        self.train_config()  # validates the optimizer settings

    @property
    def lm(self) -> bool:
        return self.mode == "lm"

    def n_eval_tokens(self) -> int:
        """``N``: the evaluation slice, a multiple of every evaluation length."""
        lcm = math.lcm(*self.eval_lens)
        want = self.eval_tokens if self.eval_tokens is not None else 16 * max(self.eval_lens)
        return max(1, math.ceil(want / lcm)) * lcm

    def train_config(self, seq_len: int | None = None) -> TrainConfig:
        """The :class:`TrainConfig` every scheme is trained with."""
        return TrainConfig(
            steps=self.steps, batch_size=self.batch_size, seq_len=seq_len or self.train_len, lr=self.lr,
            min_lr=min(self.min_lr, self.lr), warmup_steps=min(self.warmup_steps, self.steps),
            weight_decay=self.weight_decay, grad_clip=self.grad_clip, seed=self.seed,
            checkpoint_every=self.checkpoint_every, log_every=10,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


#: Named configurations: ``default`` reproduces DESIGN.md section 6 (~15 min on 2 CPU cores),
#: ``quick`` is a ~2-minute smoke version of the same study.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {
        "d_model": 64, "num_layers": 2, "num_heads": 4, "train_len": 64, "batch_size": 32, "steps": 300,
        "warmup_steps": 20, "eval_lens": (64, 128, 256, 512, 1024), "eval_tokens": 8192,
        "max_chars": 3_000_000,
    },
}

#: Task-mode defaults, applied when a synthetic task is chosen and the user did not set these.
TASK_DEFAULTS: dict[str, Any] = {"train_len": 8, "eval_lens": (4, 8, 12, 16, 24, 32), "batch_size": 64}


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
def study_model_config(config: StudyConfig, scheme: str, *, vocab_size: int = 256, max_len: int | None = None,
                       position_options: dict[str, Any] | None = None):
    """The :class:`~posenc.model.ModelConfig` of ``scheme``'s model in this study.

    ``max_len`` (default ``L``) is the nominal trained length; learned positions get exactly that
    table. ``position_options`` default to :data:`SCHEME_OPTIONS`.
    """
    from ..model import ModelConfig

    options = dict(SCHEME_OPTIONS.get(scheme, {}) if position_options is None else position_options)
    return ModelConfig(
        vocab_size=vocab_size, d_model=config.d_model, num_layers=config.num_layers,
        num_heads=config.num_heads, position=scheme, position_options=options,
        max_len=max_len or config.train_len, dropout=config.dropout,
    )


def scaled_rope_options(rule: str, factor: float, original_len: int) -> dict[str, Any]:
    """``position_options`` for a RoPE model evaluated with scaling ``rule`` at ``factor = E / L``.

    Adds ``original_max_position_embeddings = L`` for the rules that need it (YaRN, dynamic NTK,
    Llama 3, ...), as Hugging Face's ``rope_parameters`` name it.
    """
    from ..rotary import ROPE_SCALINGS

    scaling: dict[str, Any] = {"rope_type": rule, "factor": float(factor)}
    required = getattr(ROPE_SCALINGS[rule], "required", ())
    if "original_max_position_embeddings" in required:
        scaling["original_max_position_embeddings"] = original_len
    return {"scaling": scaling}


def _position_limit(model_config) -> int | None:
    """The longest input the scheme can encode (learned: its table), built on the meta device."""
    from ..registry import build_with_context

    with torch.device("meta"):
        scheme = build_with_context(model_config.position, model_config.scheme_context(True),
                                    model_config.position_options)
    return getattr(scheme, "max_len", None)


# ----------------------------------------------------------------------------------------------
# Evaluation: language modelling
# ----------------------------------------------------------------------------------------------
@dataclass
class EvalPoint:
    """One evaluation length of one model.

    Attributes:
        length: ``E``.
        bpb_all: bits per byte (token) over every scored position; ``None`` = n/a.
        bpb_beyond: the same over positions ``>= L`` of their window; ``None`` when ``E <= L`` or n/a.
        n_scored / n_beyond: how many targets each average is over.
        accuracy: exact-match accuracy (task mode), else ``None``.
        note: why a value is missing.
        wall_s: evaluation time.
    """

    length: int
    bpb_all: float | None = None
    bpb_beyond: float | None = None
    n_scored: int = 0
    n_beyond: int = 0
    accuracy: float | None = None
    note: str = ""
    wall_s: float = 0.0


def eval_slice(val_tokens: torch.Tensor, n_tokens: int, offset: int = 0) -> torch.Tensor:
    """The fixed evaluation slice: ``N + 1`` tokens ``[offset, offset + N]`` of the validation data
    (inputs are the first ``N``, targets the last ``N``)."""
    need = offset + n_tokens + 1
    if val_tokens.shape[0] < need:
        raise ValueError(
            f"the validation data has {val_tokens.shape[0]:,} tokens, fewer than eval_offset + "
            f"eval_tokens + 1 = {need:,}; use fewer eval tokens, shorter eval lengths or a larger corpus"
        )
    return val_tokens[offset:need]


def _windows(n: int, length: int, stride: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Window starts ``[w]`` and the first scored position of each ``[w]`` for ``N = n`` targets."""
    if stride is None:
        starts = torch.arange(0, n, length)  # [w], non-overlapping
        return starts, torch.zeros_like(starts)
    if (n - length) % stride:
        raise ValueError(
            f"stride={stride} does not tile {n} tokens with windows of {length}: (N - E) must be a "
            f"multiple of the stride; use a stride dividing {length} (e.g. {length // 2})"
        )
    starts = torch.arange(0, n - length + 1, stride)  # [w]
    first = torch.full_like(starts, length - stride)
    first[0] = 0  # the first window scores all its targets
    return starts, first


def _eval_batch(model_config, length: int, n_windows: int, budget_tokens: int, device: torch.device) -> int:
    """Windows per forward pass: at most ``budget_tokens`` tokens, and halved until the inference
    memory estimate (attention matrices ``[b, h, E, E]`` included) fits in a quarter of free memory."""
    b = max(1, min(n_windows, budget_tokens // length))
    free = available_memory(device)
    while b > 1 and estimate_memory(model_config, b, length, training=False).total > free / 4:
        b //= 2
    return b


@torch.no_grad()
def evaluate_lm(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    length: int,
    train_len: int,
    *,
    stride: int | None = None,
    batch_tokens: int = 16384,
    device: str | torch.device | None = None,
    autocast: bool = False,
) -> EvalPoint:
    """Bits per byte of ``model`` at evaluation length ``E = length`` on a fixed slice.

    Args:
        model: ids ``[b, E]`` -> logits ``[b, E, V]``.
        tokens: ``[N + 1]`` the slice from :func:`eval_slice` (``N`` a multiple of ``E``).
        length: ``E``.
        train_len: ``L``; positions ``>= L`` of each window also go into ``bpb_beyond``.
        stride: sliding-window stride, or ``None`` for non-overlapping windows.
        batch_tokens: at most this many tokens per forward pass (fewer when long windows'
            attention would not fit in memory).
        autocast: bf16 autocast (CUDA runs).

    Returns:
        an :class:`EvalPoint`.
    """
    t0 = time.perf_counter()
    n = tokens.shape[0] - 1
    if n % length:
        raise ValueError(f"the evaluation slice ({n} tokens) must be a multiple of the length {length}")
    if device is None:
        device = next(model.parameters()).device
    device = torch.device(device)
    starts, first = _windows(n, length, stride)
    config = getattr(model, "config", None)
    b = _eval_batch(config, length, len(starts), batch_tokens, device) if config is not None else 1
    if config is not None:
        check_memory(estimate_memory(config, b, length, training=False), device,
                     what=f"evaluation at length {length} (batch {b})")
    positions = torch.arange(length)  # [E]
    total_bits = beyond_bits = 0.0
    n_scored = n_beyond = 0
    model.eval()
    for i in range(0, len(starts), b):
        s, f = starts[i : i + b], first[i : i + b]  # [b'] window starts, first scored positions
        index = s[:, None] + torch.arange(length + 1)  # [b', 1] + [E + 1] -> [b', E + 1]
        window = tokens[index].long().to(device)  # [b', E + 1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(window[:, :-1])
        logits = getattr(out, "logits", out).float()  # [b', E, V]
        nats = F.cross_entropy(logits.transpose(1, 2), window[:, 1:], reduction="none").cpu()  # [b', E]
        scored = positions[None, :] >= f[:, None]  # [b', E] which targets count
        beyond = scored & (positions[None, :] >= train_len)  # [b', E]
        total_bits += float(nats[scored].double().sum()) / math.log(2)
        beyond_bits += float(nats[beyond].double().sum()) / math.log(2)
        n_scored += int(scored.sum())
        n_beyond += int(beyond.sum())
    return EvalPoint(
        length=length,
        bpb_all=total_bits / n_scored,
        bpb_beyond=beyond_bits / n_beyond if n_beyond else None,
        n_scored=n_scored,
        n_beyond=n_beyond,
        wall_s=time.perf_counter() - t0,
    )


# ----------------------------------------------------------------------------------------------
# Synthetic tasks
# ----------------------------------------------------------------------------------------------
def task_batch_fn(task: str, batch_size: int, max_len: int, seed: int) -> Callable:
    """A :data:`~posenc.lab.train.BatchFn` of task examples with question lengths ``1..max_len``:
    ids ``[b, s-1]``, targets ``[b, s-1]`` with only the answer tokens (and ``[EOS]``) counted."""
    from ..text.tasks import generate_task

    def batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        ex = generate_task(task, batch_size, (1, max_len), seed=_step_seed(seed, step) % 2**62)
        per_rank = batch_size // world_size
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        tokens, mask = ex.tokens[rows], ex.answer_mask[rows]  # [b, s]
        targets = tokens[:, 1:].masked_fill(~mask[:, 1:], IGNORE_INDEX)  # [b, s - 1]: score answers only
        return tokens[:, :-1], targets

    return batch


def task_seq_len(task: str, n: int) -> int:
    """Tokens in one example of ``task`` with question length ``n`` (BOS, question, SEP, answer, EOS)."""
    from ..text.tasks import generate_task

    return int(generate_task(task, 1, n, seed=0).tokens.shape[1])


@torch.no_grad()
def evaluate_task(model: torch.nn.Module, task: str, n: int, examples: int, seed: int,
                  device: str | torch.device | None = None) -> EvalPoint:
    """Exact-match accuracy of ``model`` on ``examples`` fresh examples of ``task`` with question
    length ``n`` (teacher-forced argmax over the answer tokens and ``[EOS]``)."""
    from ..text.tasks import exact_match, generate_task

    t0 = time.perf_counter()
    if device is None:
        device = next(model.parameters()).device
    ex = generate_task(task, examples, n, seed=seed)  # [n_ex, s], all the same length
    correct = []
    model.eval()
    for i in range(0, examples, 64):
        tokens, mask = ex.tokens[i : i + 64].to(device), ex.answer_mask[i : i + 64].to(device)  # [b, s]
        out = model(tokens[:, :-1])
        pred = getattr(out, "logits", out).argmax(-1)  # [b, s - 1]: prediction for position t + 1
        correct.append(exact_match(pred, tokens[:, 1:], mask[:, 1:]).cpu())
    acc = float(torch.cat(correct).float().mean())
    return EvalPoint(length=n, accuracy=acc, n_scored=examples, wall_s=time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------
# The study
# ----------------------------------------------------------------------------------------------
@dataclass
class _Run:
    name: str
    scheme: str
    scaling: str | None = None
    params: int = 0
    train: dict[str, Any] = field(default_factory=dict)
    eval: list[EvalPoint] = field(default_factory=list)


def _environment(device: torch.device, threads: int | None) -> dict[str, Any]:
    from .. import __version__

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "posenc": __version__,
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "device": str(device),
        "world_size": dist_info().world_size,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "command": " ".join(sys.argv),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        env["load_avg_start"] = list(os.getloadavg())
    return env


def run_study(
    config: StudyConfig,
    *,
    out: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    resume: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] | None = print,
    threads: int | None = None,
) -> dict[str, Any]:
    """Run the study: train every scheme, evaluate at every length, return (and write) the results.

    Args:
        config: the :class:`StudyConfig`.
        out: a folder for ``results.json``, the plot (``extrapolation.png``/``.svg``) and the
            training checkpoints (``checkpoints/<scheme>.safetensors``); ``None`` = write nothing.
        device: where to train and evaluate (``cuda`` trains with bf16 autocast).
        resume: continue each scheme from its checkpoint in ``out`` (finished schemes are not retrained).
        progress: tqdm bars (``None`` = when stderr is a terminal).
        log: where progress lines go (rank 0 only); ``None`` = silent.
        threads: recorded in the results (the caller sets torch's threads).

    Returns:
        the results dict (the content of ``results.json``): ``config``, ``environment``,
        ``corpus``, ``eval``, ``runs`` (one per scheme and RoPE scaling, each with ``train`` and
        ``eval`` entries per length) and ``wall_s``.
    """
    t_start = time.perf_counter()
    device = torch.device(device)
    info = dist_info()
    say = log if (log is not None and info.is_main) else (lambda _msg: None)
    out_dir = Path(out) if out is not None else None
    env = _environment(device, threads)
    results: dict[str, Any] = {"config": config.to_dict(), "environment": env}

    if config.lm:
        from ..text import load_corpus

        corpus = load_corpus(config.corpus, max_chars=config.max_chars, seed=config.seed)
        say(corpus.info.summary())
        train_data = corpus.train_bytes
        n_eval = config.n_eval_tokens()
        tokens = eval_slice(corpus.val_bytes, n_eval, config.eval_offset)
        results["corpus"] = dataclasses.asdict(corpus.info)
        results["eval"] = {"tokens": n_eval, "offset": config.eval_offset, "stride": config.stride,
                           "windows": {str(e): n_eval // e for e in config.eval_lens}}
        vocab, seq_len, max_len = 256, config.train_len, config.train_len
    else:
        from ..text.tasks import TASK_VOCAB

        vocab = len(TASK_VOCAB)
        seq_len = task_seq_len(config.mode, config.train_len) - 1
        max_len = seq_len  # learned positions: a table exactly as long as the longest training example
        train_data = task_batch_fn(config.mode, config.batch_size, config.train_len, config.seed)
        results["eval"] = {"examples": config.eval_examples, "metric": "exact match (teacher-forced argmax)"}
    tc = config.train_config(seq_len)
    if out_dir is None:  # nowhere to write checkpoints
        tc = dataclasses.replace(tc, checkpoint_every=0)
    results["train_config"] = tc.to_dict()

    runs: list[_Run] = []
    for scheme in config.schemes:
        mc = study_model_config(config, scheme, vocab_size=vocab, max_len=max_len)
        model, run = _train_scheme(config, mc, tc, train_data, scheme, device, out_dir, resume, progress, say)
        results.setdefault("model_configs", {})[scheme] = mc.to_dict()
        runs.append(run)
        if info.is_main:
            run.eval = _evaluate(config, model, mc, tokens if config.lm else None, device, run.name, say)
            if scheme == "rope" and config.lm:
                runs.extend(_scaled_rope_runs(config, model, mc, tokens, device, say))
        if info.world_size > 1:
            torch.distributed.barrier()
    results["runs"] = [_run_dict(r) for r in runs]
    results["wall_s"] = time.perf_counter() - t_start
    with contextlib.suppress(OSError):
        env["load_avg_end"] = list(os.getloadavg())
    if out_dir is not None and info.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / ".results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1))
        os.replace(tmp, out_dir / "results.json")
        try:
            plot_study(results, out_dir / "extrapolation.png")
        except ImportError as err:  # matplotlib is an optional extra
            say(f"no plot: {err}")
    return results


def _train_scheme(config, mc, tc, train_data, scheme, device, out_dir, resume, progress, say):
    from ..model import TransformerLM

    seed_everything(config.seed)  # the same initialisation stream for every scheme
    model = TransformerLM(mc).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    ckpt = out_dir / "checkpoints" / f"{scheme}.safetensors" if out_dir is not None else None
    result = train(model, train_data, tc, device=device, checkpoint=ckpt, resume=resume, progress=progress,
                   desc=scheme)
    losses = result.losses
    tail = losses[-max(1, len(losses) // 10):]
    steps = result.end_step - result.start_step
    bits = sum(tail) / len(tail) / math.log(2)
    say(f"{scheme:>12}: {n_params:,} params, {steps} steps in {result.wall_s:.1f} s "
        f"({result.tokens_per_s:,.0f} tok/s), final train loss {bits:.3f} bits")
    run = _Run(scheme, scheme, params=n_params, train={
        "steps": result.end_step, "resumed_from": result.start_step, "wall_s": result.wall_s,
        "tokens_per_s": result.tokens_per_s, "final_loss_nats": sum(tail) / len(tail),
        "loss_every_10_steps": losses[::10],
    })
    return model, run


def _evaluate(config, model, mc, tokens, device, name, say) -> list[EvalPoint]:
    limit = _position_limit(mc)
    points = []
    for e in config.eval_lens:
        if config.lm:
            if limit is not None and e > limit:
                points.append(EvalPoint(e, note=f"n/a: {mc.position} positions stop at {limit}"))
                continue
            points.append(evaluate_lm(model, tokens, e, config.train_len, stride=config.stride,
                                      batch_tokens=config.eval_batch_tokens, device=device,
                                      autocast=device.type == "cuda"))
        else:
            need = task_seq_len(config.mode, e) - 1
            if limit is not None and need > limit:
                points.append(EvalPoint(e, note=f"n/a: {mc.position} positions stop at {limit}"))
                continue
            points.append(evaluate_task(model, config.mode, e, config.eval_examples,
                                        seed=config.seed + 1_000_003 + e, device=device))
    took = sum(p.wall_s for p in points)
    say(f"{name:>12}: " + "  ".join(_cell(p, config.lm) for p in points) + f"  (eval {took:.0f} s)")
    return points


def _scaled_rope_runs(config, model, mc, tokens, device, say) -> list[_Run]:
    """Evaluate the plain-RoPE model with each scaling rule, factor ``max(1, E / L)`` per length."""
    from ..model import TransformerLM

    runs = []
    state = model.state_dict()
    for rule in config.rope_scalings:
        run = _Run(f"rope+{rule}", "rope", scaling=rule, params=sum(p.numel() for p in model.parameters()))
        for e in config.eval_lens:
            factor = max(1.0, e / config.train_len)
            options = {**mc.position_options, **scaled_rope_options(rule, factor, config.train_len)}
            scaled = TransformerLM(dataclasses.replace(mc, position_options=options)).to(device)
            scaled.load_state_dict(state)  # the same weights; only the rotation frequencies change
            point = evaluate_lm(scaled, tokens, e, config.train_len, stride=config.stride,
                                batch_tokens=config.eval_batch_tokens, device=device,
                                autocast=device.type == "cuda")
            point.note = f"factor {factor:g}"
            run.eval.append(point)
        took = sum(p.wall_s for p in run.eval)
        say(f"{run.name:>12}: " + "  ".join(_cell(p, True) for p in run.eval) + f"  (eval {took:.0f} s)")
        runs.append(run)
    return runs


def _run_dict(run: _Run) -> dict[str, Any]:
    return {"name": run.name, "scheme": run.scheme, "scaling": run.scaling, "params": run.params,
            "train": run.train, "eval": [dataclasses.asdict(p) for p in run.eval]}


# ----------------------------------------------------------------------------------------------
# Output: terminal table and plot
# ----------------------------------------------------------------------------------------------
def _cell(p: EvalPoint, lm: bool) -> str:
    if not lm:
        return f"{p.length}:{'n/a' if p.accuracy is None else f'{p.accuracy:.2f}'}"
    if p.bpb_all is None:
        return f"{p.length}:n/a"
    beyond = "-" if p.bpb_beyond is None else f"{p.bpb_beyond:.3f}"
    return f"{p.length}:{p.bpb_all:.3f}/{beyond}"


def _fmt(v: float | None, missing: str) -> str:
    return missing if v is None else f"{v:.3f}"


def format_table(results: dict[str, Any]) -> str:
    """The study as plain-text tables: bits/byte over all positions and over positions >= L per
    length (``lm`` mode), or exact-match accuracy per length (task mode)."""
    cfg = results["config"]
    lens = cfg["eval_lens"]
    runs = results["runs"]
    width = max(8, *(len(r["name"]) for r in runs))
    head = f"{'scheme':<{width}}" + "".join(f"{e:>9}" for e in lens)
    lines = []
    if cfg["mode"] == "lm":
        L = cfg["train_len"]
        sections = [("bits/byte, all positions", "bpb_all"),
                    (f"bits/byte, positions >= L={L} only", "bpb_beyond")]
        for title, key in sections:
            lines += [title, head]
            for r in runs:
                cells = []
                for p in r["eval"]:
                    missing = "n/a" if p["bpb_all"] is None else "-"
                    cells.append(f"{_fmt(p[key], missing):>9}")
                lines.append(f"{r['name']:<{width}}" + "".join(cells))
            lines.append("")
        lines.append(f"L = {L}; '-' = no positions >= L at this length; n/a = the scheme cannot run so long")
    else:
        title = f"exact-match accuracy, task {cfg['mode']!r}, trained on lengths 1..{cfg['train_len']}"
        lines += [title, head]
        for r in runs:
            cells = ("n/a" if p["accuracy"] is None else f"{p['accuracy']:.3f}" for p in r["eval"])
            lines.append(f"{r['name']:<{width}}" + "".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


def plot_study(results: dict[str, Any], path: str | os.PathLike) -> list[Path]:
    """Plot the study to ``path`` (png) and the same name with ``.svg``; returns the files written.

    ``lm`` mode: left, bits/byte over all positions vs evaluation length; right, bits/byte over
    positions >= L (the point at ``E = L`` is the all-position, in-distribution value, so each line
    starts where the model stands inside its trained length). Log-2 x axis. Task mode: exact-match
    accuracy vs length.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    L = cfg["train_len"]
    lm = cfg["mode"] == "lm"
    fig, axes = plt.subplots(1, 2 if lm else 1, figsize=(11 if lm else 6, 4.2), squeeze=False)
    for r in results["runs"]:
        style = "--" if r["scaling"] else "-"
        pts = r["eval"]
        if lm:
            xs = [p["length"] for p in pts if p["bpb_all"] is not None]
            axes[0, 0].plot(xs, [p["bpb_all"] for p in pts if p["bpb_all"] is not None], style, marker="o",
                            label=r["name"])
            # the in-distribution point (E = L, all positions), then beyond-L values for E > L
            beyond = [(p["length"], p["bpb_all"] if p["length"] == L else p["bpb_beyond"]) for p in pts
                      if p["length"] >= L and p["bpb_all"] is not None]
            beyond = [(x, y) for x, y in beyond if y is not None]
            if beyond:
                axes[0, 1].plot(*zip(*beyond), style, marker="o", label=r["name"])
        else:
            acc = [(p["length"], p["accuracy"]) for p in pts if p["accuracy"] is not None]
            if acc:
                axes[0, 0].plot(*zip(*acc), style, marker="o", label=r["name"])
    titles = ([f"all positions (trained at L={L})", "positions >= L only (point at L: all positions)"]
              if lm else [f"{cfg['mode']}: trained on lengths 1..{L}"])
    for ax, title in zip(axes[0], titles):
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg["eval_lens"], [str(e) for e in cfg["eval_lens"]])
        ax.minorticks_off()
        ax.axvline(L, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("evaluation length (tokens)" if lm else "question length (digits)")
        ax.set_ylabel("bits per byte" if lm else "exact-match accuracy")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    if lm:
        for ax in axes[0]:  # 8 bits/byte = a uniform guess; a diverging scheme must not squash the rest
            ax.set_ylim(top=min(ax.get_ylim()[1], 8.0))
    axes[0, -1].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    written = [path, path.with_suffix(".svg")]
    for p in written:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return written
