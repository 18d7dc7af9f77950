"""The lab's configurations: how one model is trained (:class:`TrainConfig`) and what a study is
(:class:`StudyConfig`: schemes, seeds, lengths, evaluation set, model size), with named presets.

Both validate at construction and round-trip through JSON (``to_dict`` / ``from_dict``), so a
checkpoint or ``results.json`` records exactly what produced it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from .._validate import check_choice, check_fields, check_int, check_positive_float

__all__ = [
    "AUTOCAST_MODES",
    "DEFAULT_SCHEMES",
    "IGNORE_INDEX",
    "MAX_RANDOM_POSITIONS",
    "MODES",
    "PRESETS",
    "RESUMABLE_CHANGES",
    "TASK_DEFAULTS",
    "BatchFn",
    "StudyConfig",
    "TrainConfig",
    "check_random_positions",
    "study_model_config",
]

#: ``TrainConfig.autocast`` values: mixed precision for the forward pass.
AUTOCAST_MODES: dict[str, str] = {
    "auto": "bf16 autocast on CUDA, full float32 elsewhere",
    "bf16": "bf16 autocast on any device (slow on CPUs without bf16 units)",
    "off": "full float32",
}

#: Targets with this value are left out of the loss (``F.cross_entropy``'s default).
IGNORE_INDEX = -100

#: A batch source: ``(step, rank, world_size) -> (ids [b, s], targets [b, s])``, this rank's rows of
#: the step's global batch; a pure function of its arguments (so resume and DDP stay exact).
#: (a string annotation: this module imports no torch, so ``posenc extrapolate --help`` stays light)
BatchFn = Callable[[int, int, int], "tuple[torch.Tensor, torch.Tensor]"]


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------
#: The largest range of randomized training positions: each step draws one key per position of
#: ``[0, M)`` for every row (``[batch, M]`` floats), and a learned table has ``M`` rows.
MAX_RANDOM_POSITIONS = 1 << 20


def check_random_positions(value: int, name: str) -> None:
    """``value`` (already an int >= 0) at most :data:`MAX_RANDOM_POSITIONS`, else a ``ValueError``."""
    if value > MAX_RANDOM_POSITIONS:
        raise ValueError(
            f"{name}={value} is larger than {MAX_RANDOM_POSITIONS:,}: each training step draws a key for "
            f"every position of the range ([batch, {name}] floats); use a few times the longest "
            "evaluation length"
        )


@dataclass
class TrainConfig:
    """How to train: budget, batch, optimizer, schedule, checkpoints.

    Args:
        steps: optimizer steps.
        batch_size: ``B``, the *global* batch (windows per step, all processes together).
        seq_len: ``s``, tokens per window (the train length L).
        lr: peak learning rate (reached after warmup).
        min_lr: learning rate at the end of the cosine decay.
        warmup_steps: linear warmup from ``lr / warmup_steps`` to ``lr``.
        weight_decay: AdamW decoupled weight decay, on matrices and embeddings only (not on
            biases, LayerNorm gains or other vectors).
        betas: AdamW ``(beta1, beta2)``.
        grad_clip: clip the global gradient norm to this (0 = no clipping).
        seed: seeds the batches (with the step) and, via :func:`seed_everything`, the RNGs.
        checkpoint_every: write a checkpoint every this many steps (0 = only at the end);
            needs a checkpoint path in :func:`train`.
        log_every: how often the history and progress bar are refreshed (each refresh reads
            the loss from the device, a synchronisation on CUDA).
        autocast: a key of :data:`AUTOCAST_MODES`.
        position_lr_scale: the learning rate of positional parameters (those of every
            :class:`~posenc.base.PositionalScheme` in the model: T5's bias table, learned position
            tables, Shaw's and Transformer-XL's vectors) is ``lr * position_lr_scale``, without
            weight decay. Adam moves a parameter by about its learning rate per step whatever the
            gradient's size, so over a run an entry travels at most the sum of the learning rates
            (~1.0 at the defaults); T5's bias needs values of +-2.5 (docs/lab.md has the measurement).
        random_positions: 0 = ordinary positions ``0 .. s-1``; ``M > 0`` = each training window
            gets ``s`` sorted positions drawn without replacement from ``[0, M)`` (randomized
            positional encodings, Ruoss et al. 2023), a pure function of ``(seed, step)``.
    """

    steps: int = 600
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 0
    log_every: int = 10
    autocast: str = "auto"
    position_lr_scale: float = 10.0
    random_positions: int = 0

    def __post_init__(self) -> None:
        check_int(self.steps, "steps")
        check_int(self.batch_size, "batch_size")
        check_int(self.seq_len, "seq_len")
        check_positive_float(self.lr, "lr")
        check_positive_float(self.min_lr, "min_lr")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr={self.min_lr} must be <= lr={self.lr} (the cosine decays lr -> min_lr)")
        check_int(self.warmup_steps, "warmup_steps", minimum=0)
        if (
            isinstance(self.weight_decay, bool)
            or not isinstance(self.weight_decay, (int, float))
            or not 0 <= self.weight_decay < 1
        ):
            raise ValueError(f"weight_decay must be a number in [0, 1), got {self.weight_decay!r}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(x, (int, float)) and 0 <= x < 1 for x in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        self.betas = (float(betas[0]), float(betas[1]))
        clip = self.grad_clip
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
            raise ValueError(f"grad_clip must be a number >= 0 (0 = no clipping), got {self.grad_clip!r}")
        check_int(self.seed, "seed", minimum=0)
        check_int(self.checkpoint_every, "checkpoint_every", minimum=0)
        check_int(self.log_every, "log_every")
        check_choice(self.autocast, "autocast", AUTOCAST_MODES)
        check_positive_float(self.position_lr_scale, "position_lr_scale")
        check_int(self.random_positions, "random_positions", minimum=0)
        check_random_positions(self.random_positions, "random_positions")
        if 0 < self.random_positions < self.seq_len:
            raise ValueError(
                f"random_positions={self.random_positions} must be 0 (off) or >= seq_len={self.seq_len}: "
                f"each window draws seq_len distinct positions from [0, random_positions)"
            )

    @property
    def tokens_per_step(self) -> int:
        """``B * s``: tokens in one global batch."""
        return self.batch_size * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` listing the valid ones."""
        check_fields(cls, data)
        data = dict(data)
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        return cls(**data)


#: Fields that may change between a run and its resumption (they do not change the result).
RESUMABLE_CHANGES = ("checkpoint_every", "log_every")


# ----------------------------------------------------------------------------------------------
# The study
# ----------------------------------------------------------------------------------------------
#: The schemes of Press et al. 2022 Table 2, plus NoPE and learned positions.
DEFAULT_SCHEMES: tuple[str, ...] = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5")

#: What a study measures: byte-level language modelling, or a synthetic task.
MODES: dict[str, str] = {
    "lm": "byte-level language model on a corpus; bits per byte vs evaluation length",
    "copy": "copy n digits; exact-match accuracy vs n",
    "reverse": "reverse n digits; exact-match accuracy vs n",
    "addition": "add two n-digit numbers; exact-match accuracy vs n",
    "sort": "sort n digits; exact-match accuracy vs n",
    "parity": "the parity of n bits; exact-match accuracy vs n",
    "addition_reversed": "add two n-digit numbers, answer least-significant digit first; exact match vs n",
}


def _ints(values: Any, name: str, minimum: int) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} is empty: give at least one value")
    for v in values:
        check_int(v, f"{name} entry", minimum=minimum)
    if list(values) != sorted(set(values)):
        raise ValueError(f"{name} must be increasing without repeats, got {list(values)}")
    return values


@dataclass
class StudyConfig:
    """Everything that defines a study (saved in full in ``results.json``).

    A study is a grid of independent **cells**, one per (scheme, seed): each trains one model and
    evaluates it (and its evaluation-time variants) at every length.

    Args:
        schemes: scheme names, each trained once per seed (``posenc list``).
        mode: a key of :data:`MODES` (``"lm"`` or a synthetic task).
        train_len: ``L``: window length in ``lm`` mode; the longest question (digits) in task mode.
        eval_lens: the lengths ``E`` to evaluate (tokens in ``lm`` mode, digits in task mode); in
            ``lm`` mode ``L`` is added when missing (the paired deltas' short-context reference).
        steps, batch_size, lr, min_lr, warmup_steps, weight_decay, grad_clip, position_lr_scale:
            the training budget and optimizer (:class:`TrainConfig`), the same for every cell.
        seeds: training seeds: each seeds a model's initialisation, its batches and task examples.
        split_seed: seeds the train/validation split and the evaluation windows, the same for
            every cell, so seeds vary the model and not the test set.
        corpus: ``"stdlib"`` or a path (``lm`` mode).
        max_chars: use only the first documents of the corpus, about this many characters.
        val_fraction: share of the corpus held out for validation, by document (one document:
            its last part, see :func:`posenc.text.split_documents`).
        d_model, num_layers, num_heads, dropout: the model (:class:`~posenc.model.ModelConfig`).
        eval_windows: ``K``, evaluation windows sampled across the validation documents (256:
            enough documents for the cluster bootstrap, no document above 3%; :mod:`posenc.lab.evalset`).
        score_len: ``S``, the last targets of each window that the paired delta and the
            sliding-window score use; ``None`` = half of the shortest of ``L`` and the eval lengths.
        variants: evaluation-time variants (RoPE: scalings ``linear``, ``ntk``, ``yarn``, ...), each
            applied to every scheme that declares it, with factor ``E / L``.
        position_options: per scheme, constructor options for its model (``{"t5": {"max_distance":
            128}}``); keys must be the scheme's configuration keys (``posenc show t5``).
        eval_examples: examples per length in task mode.
        curriculum_steps: task mode: the longest training question grows linearly from 1 digit at
            step 0 to ``train_len`` at this step (0 = lengths ``1..train_len`` from the start).
        eval_batch_tokens: at most this many tokens per evaluation forward pass.
        checkpoint_every: write a training checkpoint this often (when the study has an output folder).
        vary: model-config fields to vary, ``{"norm": ("pre", "post")}``: every scheme is trained
            with every combination (:mod:`posenc.lab.grid`), runs named ``rope[norm=post]``.
        randomized_positions: ``M > 0``: every scheme (and setting) is also trained at positions
            drawn sorted without replacement from ``[0, M)`` (Ruoss et al. 2023) and evaluated at
            ordinary positions; in task modes also with positions re-sampled from ``[0, M)`` at test
            time, as the paper does (runs named ``...+resampled``); its model's nominal length
            (``max_len``) is ``M``. 0 = off.
        finetune_len, finetune_steps: ``E_ft > L`` and ``N``: after training, each model whose scheme
            declares evaluation-time variants (RoPE's scalings) is fine-tuned at ``E_ft`` for ``N``
            steps, once plainly and once per variant with factor ``E_ft / L``, then evaluated
            (:mod:`posenc.lab.finetune`). 0 = off.
        diagnostic_windows: attention diagnostics (entropy, attended distance, mass beyond ``L``) on
            the first this many evaluation windows at every length (:mod:`posenc.lab.diagnostics`);
            0 = off.
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
    position_lr_scale: float = TrainConfig.position_lr_scale
    seeds: tuple[int, ...] = (0,)
    split_seed: int = 0
    corpus: str = "stdlib"
    max_chars: int | None = None
    val_fraction: float = 0.1
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    dropout: float = 0.0
    eval_windows: int = 256
    score_len: int | None = None
    variants: tuple[str, ...] = ("linear", "ntk", "yarn")
    position_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    eval_examples: int = 200
    curriculum_steps: int = 0
    eval_batch_tokens: int = 16384
    checkpoint_every: int = 100
    vary: dict[str, tuple] = dataclasses.field(default_factory=dict)
    randomized_positions: int = 0
    finetune_len: int = 0
    finetune_steps: int = 0
    diagnostic_windows: int = 0

    def __post_init__(self) -> None:
        from ..registry import SCHEMES, scheme_class

        self.schemes = tuple(self.schemes)
        self.variants = tuple(self.variants)
        if not self.schemes:
            raise ValueError("schemes is empty: give at least one scheme, e.g. schemes=('rope', 'alibi')")
        if len(set(self.schemes)) != len(self.schemes):
            raise ValueError(f"schemes has duplicates: {list(self.schemes)}")
        for name in self.schemes:
            if not scheme_class(name).causal_ok:  # unknown name -> ValueError listing the valid ones
                raise ValueError(f"scheme {name!r} has no causal form, so it cannot run in a decoder-only LM")
        check_choice(self.mode, "mode", MODES)
        check_int(self.train_len, "train_len")
        lens = _ints(self.eval_lens, "eval_lens", 1)
        self.eval_lens = tuple(sorted({*lens, self.train_len})) if self.lm else lens
        self.seeds = _ints(self.seeds, "seeds", 0)
        for name in (
            "steps",
            "batch_size",
            "d_model",
            "num_layers",
            "num_heads",
            "eval_examples",
            "eval_batch_tokens",
            "eval_windows",
        ):
            check_int(getattr(self, name), name)
        check_int(self.split_seed, "split_seed", minimum=0)
        if isinstance(self.val_fraction, bool) or not isinstance(self.val_fraction, (int, float)):
            raise TypeError(f"val_fraction must be a number in [0, 1), got {self.val_fraction!r}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        check_int(self.checkpoint_every, "checkpoint_every", minimum=0)
        if self.max_chars is not None:
            check_int(self.max_chars, "max_chars")
        if self.score_len is not None:
            check_int(self.score_len, "score_len")
            if self.score_len > min(self.eval_lens):
                raise ValueError(
                    f"score_len={self.score_len} must be <= the shortest eval length "
                    f"{min(self.eval_lens)} (every window scores its last score_len targets)"
                )
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        self._check_position_options()
        self._check_curriculum()
        offered = {v for cls in SCHEMES.values() for v in cls.eval_variants}
        for v in self.variants:
            check_choice(v, "variants entry", sorted(offered))
        self.train_config()  # validates the optimizer settings
        self._check_grid_options()

    def _check_grid_options(self) -> None:
        """``vary``, randomized positions, fine-tuning and diagnostics: valid and meaningful here."""
        from ..registry import scheme_class
        from .grid import check_vary

        self.vary = check_vary(self.vary, self.model_config(self.schemes[0]))
        for name in ("randomized_positions", "finetune_len", "finetune_steps", "diagnostic_windows"):
            check_int(getattr(self, name), name, minimum=0)
        extras = {
            "finetune_len": self.finetune_len,
            "diagnostic_windows": self.diagnostic_windows,
        }
        for name, value in extras.items():
            if value and not self.lm:
                raise ValueError(
                    f"{name}={value} applies to language-model studies (mode 'lm'), not {self.mode!r}"
                )
        check_random_positions(self.randomized_positions, "randomized_positions")
        if 0 < self.randomized_positions < self.train_len:
            raise ValueError(
                f"randomized_positions={self.randomized_positions} must be >= train_len="
                f"{self.train_len} (each window draws train_len distinct positions from it)"
            )
        if self.randomized_positions and not self.lm:
            from ..text.tasks import task_seq_len

            seq = task_seq_len(self.mode, self.train_len) - 1  # the longest training example's input
            if self.randomized_positions < seq:
                raise ValueError(
                    f"randomized_positions={self.randomized_positions} must be >= {seq}, the input length "
                    f"of a {self.train_len}-digit {self.mode} example (each draws that many positions)"
                )
        if bool(self.finetune_len) != bool(self.finetune_steps):
            raise ValueError(
                "finetune_len and finetune_steps go together: give both (e.g. 256 and 100) or neither"
            )
        if self.finetune_len and self.finetune_len <= self.train_len:
            raise ValueError(
                f"finetune_len={self.finetune_len} must be longer than train_len={self.train_len}"
            )
        if self.finetune_len and not any(scheme_class(s).eval_variants for s in self.schemes):
            raise ValueError(
                "fine-tuning extends the context of schemes with evaluation-time variants (RoPE's "
                f"scalings), and none of {list(self.schemes)} has any; add e.g. rope to schemes"
            )
        if self.diagnostic_windows > self.eval_windows:
            raise ValueError(
                f"diagnostic_windows={self.diagnostic_windows} must be <= eval_windows={self.eval_windows}"
            )

    def _check_position_options(self) -> None:
        from ..registry import config_keys

        if not isinstance(self.position_options, dict):
            raise TypeError(
                f"position_options must be a dict {{scheme: {{key: value}}}}, got "
                f"{type(self.position_options).__name__}"
            )
        for scheme, options in self.position_options.items():
            check_choice(scheme, "position_options scheme", self.schemes)
            valid = config_keys(scheme)
            for key in options:
                check_choice(key, f"position_options key of {scheme!r}", list(valid))

    def _check_curriculum(self) -> None:
        check_int(self.curriculum_steps, "curriculum_steps", minimum=0)
        if self.curriculum_steps and self.lm:
            raise ValueError(
                f"curriculum_steps={self.curriculum_steps} needs a synthetic task (--task copy, ...); "
                "mode 'lm' trains on windows of one length: leave it at 0"
            )
        if self.curriculum_steps > self.steps:
            raise ValueError(
                f"curriculum_steps={self.curriculum_steps} must be <= steps={self.steps}: the "
                "curriculum must reach train_len before training ends"
            )

    @property
    def lm(self) -> bool:
        return self.mode == "lm"

    @property
    def targets_per_window(self) -> int:
        """``S``: the scored targets per window."""
        return self.score_len or max(1, min(self.train_len, *self.eval_lens) // 2)

    def train_config(self, seq_len: int | None = None, seed: int | None = None) -> TrainConfig:
        """The :class:`TrainConfig` of every cell (``seed`` default: the first of :attr:`seeds`)."""
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            seq_len=seq_len or self.train_len,
            lr=self.lr,
            min_lr=min(self.min_lr, self.lr),
            warmup_steps=min(self.warmup_steps, self.steps),
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            seed=self.seeds[0] if seed is None else seed,
            position_lr_scale=self.position_lr_scale,
            checkpoint_every=self.checkpoint_every,
            log_every=10,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["vary"] = {k: list(v) for k, v in self.vary.items()}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` listing the valid ones."""
        check_fields(cls, data)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def model_config(self, scheme: str, *, vocab_size: int = 256, max_len: int | None = None):
        """The :class:`~posenc.model.ModelConfig` of ``scheme``'s model in this study."""
        return study_model_config(
            self,
            scheme,
            vocab_size=vocab_size,
            max_len=max_len,
            position_options=self.position_options.get(scheme),
        )


#: Named configurations: ``default`` is the study of docs/lab.md (three seeds), ``quick`` a
#: ~2-minute version (one seed: its intervals are over evaluation windows only).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {"seeds": (0, 1, 2)},
    "quick": {
        "d_model": 64,
        "num_layers": 2,
        "num_heads": 4,
        "train_len": 64,
        "batch_size": 32,
        "steps": 300,
        "warmup_steps": 20,
        "eval_lens": (64, 128, 256, 512, 1024),
        "max_chars": 3_000_000,
    },
}

#: Task-mode defaults, applied when a synthetic task is chosen and the user did not set these: the
#: budget with which copy, reverse and addition reach >= 95% exact match at L (docs/lab.md).
TASK_DEFAULTS: dict[str, Any] = {
    "train_len": 8,
    "eval_lens": (8, 9, 10, 11, 12, 13, 14, 15, 16, 24),  # posenc extrapolate: lab.tasks.task_eval_lens(L)
    "batch_size": 64,
    "d_model": 64,
    "num_layers": 4,
    "num_heads": 4,
    "steps": 2500,
    "curriculum_steps": 600,
}


def study_model_config(
    config: StudyConfig,
    scheme: str,
    *,
    vocab_size: int = 256,
    max_len: int | None = None,
    position_options: dict[str, Any] | None = None,
):
    """The :class:`~posenc.model.ModelConfig` of ``scheme``'s model in this study.

    ``max_len`` (default ``L``) is the nominal trained length: learned positions get exactly that
    table, T5 sizes its buckets from it.
    """
    from ..model import ModelConfig

    return ModelConfig(
        vocab_size=vocab_size,
        d_model=config.d_model,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        position=scheme,
        position_options=dict(position_options or {}),
        max_len=max_len or config.train_len,
        dropout=config.dropout,
    )
