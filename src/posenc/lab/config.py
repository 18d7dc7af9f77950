"""The lab's configurations, composed: how one model is trained (:class:`TrainConfig`), which
bytes it reads (:class:`CorpusConfig`), one ``posenc train`` run (:class:`RunConfig`: a scheme, a
model, a corpus, a training) and a study (:class:`StudyConfig`: schemes, seeds, lengths and the
evaluation set around one :class:`TrainConfig`, one :class:`~posenc.model.ModelConfig` and one
:class:`CorpusConfig`), with named presets.

Every field is declared once, in the dataclass it belongs to, with its documentation in the
class docstring's ``Args`` table: the command line's flags are generated from them
(:mod:`posenc.lab.flags`). A run or study also takes its parts' fields by name
(``StudyConfig(steps=300, d_model=64)``), routed to the part that declares them.

All validate at construction and round-trip through JSON (``to_dict`` / ``from_dict``), so a
checkpoint or ``results.json`` records exactly what produced it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from .._validate import check_choice, check_fields, check_int, check_positive_float
from .grid import NOT_VARIED, SchemeEntry, scheme_entry

__all__ = [
    "AUTOCAST_MODES",
    "DEFAULT_SCHEMES",
    "IGNORE_INDEX",
    "MAX_RANDOM_POSITIONS",
    "MODES",
    "PRESETS",
    "RESUMABLE_CHANGES",
    "TASK_BUDGETS",
    "TASK_DEFAULTS",
    "BatchFn",
    "CorpusConfig",
    "RunConfig",
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
    autocast: str = field(default="auto", metadata={"choices": AUTOCAST_MODES})
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

    def updated(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` (as :func:`dataclasses.replace`); a new ``lr`` below ``min_lr``
        lowers ``min_lr`` to it unless ``changes`` set ``min_lr`` (the cosine decays lr -> min_lr)."""
        if "lr" in changes and "min_lr" not in changes and isinstance(changes["lr"], (int, float)):
            changes["min_lr"] = min(self.min_lr, changes["lr"])
        return dataclasses.replace(self, **changes)

    def within_steps(self) -> TrainConfig:
        """A copy whose warmup fits within the steps (a short run still reaches its peak rate)."""
        return dataclasses.replace(self, warmup_steps=min(self.warmup_steps, self.steps))

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


# ----------------------------------------------------------------------------------------------
# The corpus
# ----------------------------------------------------------------------------------------------
@dataclass
class CorpusConfig:
    """Which bytes a language model trains on and is scored on.

    Args:
        corpus: ``stdlib`` (this Python's standard library source) or a path to a file or folder.
        max_chars: use only the first documents of the corpus, about this many characters.
        split_seed: seeds the train/validation split (in a study, also the windows it scores), the
            same for every model, so training seeds vary the model and not the test set.
        val_fraction: share of the corpus held out for validation, by document (a single
            document: its last part).
    """

    corpus: str = "stdlib"
    max_chars: int | None = None
    split_seed: int = 0
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not isinstance(self.corpus, str) or not self.corpus:
            raise TypeError(f"corpus must be 'stdlib' or a path, got {self.corpus!r}")
        if self.max_chars is not None:
            check_int(self.max_chars, "max_chars")
        check_int(self.split_seed, "split_seed", minimum=0)
        if isinstance(self.val_fraction, bool) or not isinstance(self.val_fraction, (int, float)):
            raise TypeError(f"val_fraction must be a number in [0, 1), got {self.val_fraction!r}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")

    def load(self):
        """The :class:`~posenc.text.Corpus`, split by document."""
        from ..text import load_corpus

        return load_corpus(
            self.corpus, max_chars=self.max_chars, seed=self.split_seed, val_fraction=self.val_fraction
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CorpusConfig:
        check_fields(cls, data)
        return cls(**data)


# ----------------------------------------------------------------------------------------------
# Composition: a configuration of parts takes its parts' fields by name
# ----------------------------------------------------------------------------------------------
def _model_class():
    from ..model import ModelConfig

    return ModelConfig


def _default_model():
    """The model of a run or study before its scheme is set: :class:`~posenc.model.ModelConfig`'s
    defaults, byte-level (vocabulary 256)."""
    return _model_class()(vocab_size=256)


#: The parts a run or study is composed of: field name -> what it holds.
PARTS = ("data", "train", "model")


def part_names(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` (:class:`StudyConfig`, :class:`RunConfig`) that hold its parts."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name in PARTS)


def part_classes(cls: type) -> dict[str, type]:
    """``{part: class}`` of the parts of ``cls`` (imports the model package)."""
    classes = {"data": CorpusConfig, "train": TrainConfig, "model": _model_class()}
    return {name: classes[name] for name in part_names(cls)}


def set_fields(cls: type) -> dict[str, dict[str, str]]:
    """``{part: {field: why}}``: the fields of ``cls``'s parts that ``cls`` sets itself (so they
    are not its flags, not its fields by name, and not in its JSON)."""
    sets: dict[str, dict[str, str]] = {"model": dict(NOT_VARIED)}
    if cls is StudyConfig:
        sets["train"] = {
            "seq_len": "set the length with train_len",
            "seed": "set the seeds with seeds",
            "random_positions": "set them with randomized_positions",
        }
    return {part: sets.get(part, {}) for part in part_names(cls)}


def _route(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the parts' fields given by name moved into the parts."""
    own = {f.name for f in dataclasses.fields(cls)}
    routed = {k: v for k, v in kwargs.items() if k in own}
    rest = {k: v for k, v in kwargs.items() if k not in own}
    if not rest:
        return routed
    sets = set_fields(cls)
    for part, part_cls in part_classes(cls).items():
        names = {f.name for f in dataclasses.fields(part_cls)}
        mine = {k: rest.pop(k) for k in list(rest) if k in names}
        if not mine:
            continue
        for name in mine:
            if name in sets[part]:
                raise ValueError(f"{cls.__name__} sets {part}.{name} itself: {sets[part][name]}")
        field = next(f for f in dataclasses.fields(cls) if f.name == part)
        base = routed.get(part) or field.default_factory()
        routed[part] = base.updated(**mine) if hasattr(base, "updated") else dataclasses.replace(base, **mine)
    if rest:
        valid = sorted(
            own | {n for p in part_classes(cls).values() for n in (f.name for f in dataclasses.fields(p))}
        )
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(rest)}; valid: {', '.join(valid)}")
    return routed


def composed(cls: type) -> type:
    """Class decorator (after ``@dataclass``): the constructor also takes the parts' fields by name."""
    init = cls.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **_route(cls, kwargs))

    __init__.__doc__ = init.__doc__
    cls.__init__ = __init__
    return cls


def _parts_to_dict(config: Any) -> dict[str, Any]:
    """The parts' fields by name (each name belongs to one part: :func:`field_owners`), without
    the fields the configuration sets itself."""
    sets = set_fields(type(config))
    out: dict[str, Any] = {}
    for part in part_classes(type(config)):
        out.update({k: v for k, v in getattr(config, part).to_dict().items() if k not in sets[part]})
    return out


def field_owners(cls: type) -> dict[str, str]:
    """``{field name: "own" or the part that declares it}`` for :class:`StudyConfig` or
    :class:`RunConfig`, the fields it sets itself left out; a name declared twice is a
    ``TypeError`` (a field is given by its name)."""
    owners = {f.name: "own" for f in dataclasses.fields(cls) if f.name not in PARTS}
    sets = set_fields(cls)
    for part, part_cls in part_classes(cls).items():
        for f in dataclasses.fields(part_cls):
            if f.name in sets[part]:  # set by cls itself: not given by name
                continue
            if f.name in owners:
                raise TypeError(
                    f"{cls.__name__}: field {f.name!r} is declared by {owners[f.name]} and {part}"
                )
            owners[f.name] = part
    return owners


def _check_names(cls: type, data: dict[str, Any]) -> None:
    """``ValueError`` listing the valid names when ``data`` has a key that is no field of ``cls``
    or of its parts (or one that ``cls`` sets itself)."""
    names = set(field_owners(cls))
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; valid: {', '.join(sorted(names))}")


def _normalise_parts(config: Any, train: dict[str, Any], model: dict[str, Any]) -> None:
    """Set the fields ``config`` sets itself (so equal configurations compare equal)."""
    for part, changes in (("train", train), ("model", model)):
        current = getattr(config, part)
        if any(getattr(current, k) != v for k, v in changes.items()):
            setattr(config, part, dataclasses.replace(current, **changes))


def _check_entries(entries: list[SchemeEntry]) -> None:
    from ..registry import scheme_class

    for entry in entries:
        for name in entry.names:  # unknown name -> ValueError listing the valid ones
            if not scheme_class(name).causal_ok:
                raise ValueError(f"scheme {name!r} has no causal form, so it cannot run in a decoder-only LM")


def entry_model_config(model: Any, entry: SchemeEntry, options: dict[str, dict[str, Any]], **sizes: Any):
    """``model`` with ``entry``'s schemes and their ``options`` (``{scheme: {key: value}}``);
    ``sizes``: ``vocab_size`` and ``max_len``."""
    if entry.layers is None:
        return dataclasses.replace(
            model, position=entry.position, position_options=dict(options.get(entry.position) or {}), **sizes
        )
    return dataclasses.replace(
        model,
        position=entry.position,
        position_options={},
        layer_positions=list(entry.layers),
        layer_position_options={n: dict(options[n]) for n in entry.names if options.get(n)},
        **sizes,
    )


# ----------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------
@composed
@dataclass
class RunConfig:
    """One ``posenc train`` run: one byte-level language model of ``scheme``, trained on a corpus.

    Args:
        scheme: the model's positional scheme (``posenc list``), or a per-layer pattern such as
            ``rope*3+nope_temperature``.
        train: the training (:class:`TrainConfig`); its ``seq_len`` is the model's nominal length.
        model: the model (:class:`~posenc.model.ModelConfig`); the run sets its scheme,
            vocabulary (bytes) and length.
        data: the corpus (:class:`CorpusConfig`).
    """

    scheme: str = "rope"
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(checkpoint_every=100))
    model: Any = dataclasses.field(default_factory=_default_model)
    data: CorpusConfig = dataclasses.field(default_factory=CorpusConfig)

    def __post_init__(self) -> None:
        entry = scheme_entry(self.scheme)
        _check_entries([entry])
        self.scheme = entry.spec
        if not isinstance(self.train, TrainConfig) or not isinstance(self.data, CorpusConfig):
            raise TypeError("train and data must be a TrainConfig and a CorpusConfig")
        blank = _default_model()
        length = max(self.train.seq_len, self.train.random_positions)
        self.model = entry_model_config(self.model, entry, {}, vocab_size=256, max_len=length)
        self.model = dataclasses.replace(
            self.model, src_vocab_size=blank.src_vocab_size, memory_len=blank.memory_len
        )

    @property
    def label(self) -> str:
        return scheme_entry(self.scheme).label

    def to_dict(self) -> dict[str, Any]:
        """JSON: the scheme and the parts' fields by name (without those the run sets)."""
        return {"scheme": self.scheme, **_parts_to_dict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` listing the valid ones."""
        _check_names(cls, data)
        return cls(**{k: tuple(v) if k == "betas" else v for k, v in data.items()})


# ----------------------------------------------------------------------------------------------
# The study
# ----------------------------------------------------------------------------------------------
def _ints(values: Any, name: str, minimum: int) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} is empty: give at least one value")
    for v in values:
        check_int(v, f"{name} entry", minimum=minimum)
    if list(values) != sorted(set(values)):
        raise ValueError(f"{name} must be increasing without repeats, got {list(values)}")
    return values


@composed
@dataclass
class StudyConfig:
    """Everything that defines a study (saved in full in ``results.json``).

    A study is a grid of independent **cells**, one per (scheme, setting, seed): each trains one
    model and evaluates it (and its evaluation-time variants) at every length. Every cell trains
    with :attr:`train` (its seed and length set per cell) the model :attr:`model` (its scheme set
    per cell) on :attr:`data`.

    Args:
        schemes: the scheme entries, each trained once per seed: scheme names (``posenc list``) or
            per-layer patterns such as ``rope*3+nope_temperature`` (run name
            ``rope-x3+nope_temperature``).
        mode: ``lm`` (bits/byte on a corpus) or a synthetic task (exact-match accuracy).
        train_len: ``L``: the window length in lm mode; the longest question (digits) in task mode.
        eval_lens: the lengths ``E`` to evaluate (tokens in lm mode, digits in task mode); in lm
            mode ``L`` is added when missing (the paired deltas' short-context reference).
        seeds: training seeds, one model per scheme and seed: each seeds a model's initialisation,
            its batches and task examples.
        eval_windows: ``K``, evaluation windows sampled across the validation documents (enough
            documents for the cluster bootstrap, no document above 3%).
        score_len: ``S``, the targets scored at the end of each window by the paired delta and
            the sliding-window score; ``None`` = half the shortest of ``L`` and the eval lengths.
        variants: evaluation-time variants (RoPE scalings linear, ntk, yarn, ...), each applied to
            every scheme that declares it, with factor ``E / L``; 'none' for none.
        position_options: per scheme, options for its models (``{"t5": {"max_distance": 128}}``);
            keys must be the scheme's configuration keys (``posenc show t5``).
        eval_examples: task mode: examples per length.
        curriculum_steps: task mode: the longest training question grows linearly from 1 digit
            to ``L`` over these first steps (0 = lengths ``1..L`` from the start).
        eval_batch_tokens: at most this many tokens per evaluation forward pass.
        vary: model-config fields to vary, ``{"norm": ("pre", "post")}``: every scheme is trained
            with every combination (:mod:`posenc.lab.grid`), runs named ``rope[norm=post]``.
        randomized_positions: ``M > 0``: every scheme (and setting) is also trained at sorted
            random positions from ``[0, M)`` (Ruoss et al. 2023) and evaluated at ordinary
            positions; in task modes also with positions re-sampled from ``[0, M)`` at test time
            (runs named ``...+resampled``); its model's nominal length is ``M``. 0 = off.
        finetune_len: ``E_ft > L``: after training, each model whose scheme declares
            evaluation-time variants (RoPE's scalings) is fine-tuned at ``E_ft``, once plainly and
            once per variant with factor ``E_ft / L``, then evaluated (with finetune_steps). 0 = off.
        finetune_steps: fine-tuning steps (with finetune_len).
        diagnostic_windows: attention entropy, attended distance and mass beyond ``L`` on the
            first this many evaluation windows at every length. 0 = off.
        data: the corpus (:class:`CorpusConfig`), lm mode.
        train: the training of every cell (:class:`TrainConfig`); the study sets its seed and
            length per cell.
        model: the model of every cell (:class:`~posenc.model.ModelConfig`); the study sets its
            scheme, vocabulary and length per cell.
    """

    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    mode: str = dataclasses.field(default="lm", metadata={"flag": "--task", "choices": MODES})
    train_len: int = TrainConfig.seq_len
    eval_lens: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    seeds: tuple[int, ...] = (0,)
    eval_windows: int = 256
    score_len: int | None = None
    variants: tuple[str, ...] = dataclasses.field(
        default=("linear", "ntk", "yarn"), metadata={"aliases": ("--rope-scalings",), "empty": "none"}
    )
    position_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    eval_examples: int = 200
    curriculum_steps: int = 0
    eval_batch_tokens: int = 16384
    vary: dict[str, tuple] = dataclasses.field(default_factory=dict)
    randomized_positions: int = dataclasses.field(default=0, metadata={"metavar": "M"})
    finetune_len: int = dataclasses.field(default=0, metadata={"metavar": "E"})
    finetune_steps: int = dataclasses.field(default=0, metadata={"metavar": "N"})
    diagnostic_windows: int = dataclasses.field(
        default=0, metadata={"flag": "--diagnostics", "const": 8, "metavar": "K"}
    )
    data: CorpusConfig = dataclasses.field(default_factory=CorpusConfig)
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(checkpoint_every=100))
    model: Any = dataclasses.field(default_factory=_default_model)

    def __post_init__(self) -> None:
        from ..registry import SCHEMES

        entries = [scheme_entry(s) for s in tuple(self.schemes)]
        self.schemes = tuple(e.spec for e in entries)
        self.variants = tuple(self.variants)
        if not self.schemes:
            raise ValueError("schemes is empty: give at least one scheme, e.g. schemes=('rope', 'alibi')")
        if len(set(self.schemes)) != len(self.schemes):
            raise ValueError(f"schemes has duplicates: {list(self.schemes)}")
        _check_entries(entries)
        if not isinstance(self.train, TrainConfig) or not isinstance(self.data, CorpusConfig):
            raise TypeError("train and data must be a TrainConfig and a CorpusConfig")
        if not isinstance(self.model, _model_class()):
            raise TypeError(f"model must be a posenc.model.ModelConfig, got {type(self.model).__name__}")
        check_choice(self.mode, "mode", MODES)
        check_int(self.train_len, "train_len")
        lens = _ints(self.eval_lens, "eval_lens", 1)
        self.eval_lens = tuple(sorted({*lens, self.train_len})) if self.lm else lens
        self.seeds = _ints(self.seeds, "seeds", 0)
        for name in ("eval_examples", "eval_batch_tokens", "eval_windows"):
            check_int(getattr(self, name), name)
        if self.score_len is not None:
            check_int(self.score_len, "score_len")
            if self.score_len > min(self.eval_lens):
                raise ValueError(
                    f"score_len={self.score_len} must be <= the shortest eval length "
                    f"{min(self.eval_lens)} (every window scores its last score_len targets)"
                )
        self._normalise()
        self._check_position_options()
        self._check_curriculum()
        offered = {v for cls in SCHEMES.values() for v in cls.eval_variants}
        for v in self.variants:
            check_choice(v, "variants entry", sorted(offered))
        self._check_grid_options()

    def _normalise(self) -> None:
        """The fields of :attr:`train` and :attr:`model` the study sets: the first seed, the cells'
        sequence length, ordinary positions; the model's defaults (each cell sets its own)."""
        blank = _default_model()
        train = {"seq_len": self.cell_seq_len, "seed": self.seeds[0], "random_positions": 0}
        model = {k: getattr(blank, k) for k in set_fields(StudyConfig)["model"]}
        _normalise_parts(self, train, model)

    @property
    def cell_seq_len(self) -> int:
        """The tokens of one training window: ``L`` in lm mode, the longest example's input in task mode."""
        if self.lm:
            return self.train_len
        from ..text.tasks import task_seq_len

        return task_seq_len(self.mode, self.train_len) - 1

    def _check_grid_options(self) -> None:
        """``vary``, randomized positions, fine-tuning and diagnostics: valid and meaningful here."""
        from ..registry import scheme_class
        from .grid import check_vary

        models = [self.model_config(s) for s in self.schemes]  # each entry's model is valid
        self.vary = check_vary(self.vary, models[0])
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
        if self.randomized_positions and not self.lm and self.randomized_positions < self.cell_seq_len:
            raise ValueError(
                f"randomized_positions={self.randomized_positions} must be >= {self.cell_seq_len}, the input "
                f"length of a {self.train_len}-digit {self.mode} example (each draws that many positions)"
            )
        if bool(self.finetune_len) != bool(self.finetune_steps):
            raise ValueError(
                "finetune_len and finetune_steps go together: give both (e.g. 256 and 100) or neither"
            )
        if self.finetune_len and self.finetune_len <= self.train_len:
            raise ValueError(
                f"finetune_len={self.finetune_len} must be longer than train_len={self.train_len}"
            )
        if self.finetune_len and not any(scheme_class(s).eval_variants for s in self.schemes_by_name):
            raise ValueError(
                "fine-tuning extends the context of schemes with evaluation-time variants (RoPE's "
                f"scalings), and none of {list(self.schemes)} has any; add e.g. rope to schemes"
            )
        if self.diagnostic_windows > self.eval_windows:
            raise ValueError(
                f"diagnostic_windows={self.diagnostic_windows} must be <= eval_windows={self.eval_windows}"
            )

    @property
    def schemes_by_name(self) -> tuple[str, ...]:
        """The plain scheme entries (those that are not per-layer patterns)."""
        return tuple(e.spec for e in map(scheme_entry, self.schemes) if e.layers is None)

    def _check_position_options(self) -> None:
        from ..registry import config_keys

        if not isinstance(self.position_options, dict):
            raise TypeError(
                f"position_options must be a dict {{scheme: {{key: value}}}}, got "
                f"{type(self.position_options).__name__}"
            )
        used = list(dict.fromkeys(n for s in self.schemes for n in scheme_entry(s).names))
        for scheme, options in self.position_options.items():
            check_choice(scheme, "position_options scheme", used)
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
        if self.curriculum_steps > self.train.steps:
            raise ValueError(
                f"curriculum_steps={self.curriculum_steps} must be <= steps={self.train.steps}: the "
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
        """The :class:`TrainConfig` of a cell (``seed`` default: the first of :attr:`seeds`;
        ``seq_len`` default: :attr:`cell_seq_len`); the warmup within the steps."""
        return dataclasses.replace(
            self.train,
            seq_len=seq_len or self.cell_seq_len,
            seed=self.seeds[0] if seed is None else seed,
        ).within_steps()

    def to_dict(self) -> dict[str, Any]:
        """JSON: the study's own fields, then the fields of ``data``, ``train`` and ``model`` by
        name (without those the study sets per cell)."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in PARTS}
        own["vary"] = {k: list(v) for k, v in self.vary.items()}
        own = {k: list(v) if isinstance(v, tuple) else v for k, v in own.items()}
        own["position_options"] = {k: dict(v) for k, v in self.position_options.items()}
        return {**own, **_parts_to_dict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyConfig:
        """Inverse of :meth:`to_dict` (a subset too: the missing fields take their defaults, as
        in the ``results.json`` of earlier versions); unknown keys raise ``ValueError`` listing
        the valid ones."""
        _check_names(cls, data)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def model_config(self, scheme: str, *, vocab_size: int = 256, max_len: int | None = None):
        """The :class:`~posenc.model.ModelConfig` of ``scheme``'s model (an entry of
        :attr:`schemes`) in this study."""
        return study_model_config(self, scheme, vocab_size=vocab_size, max_len=max_len)


#: Named configurations: ``default`` is the documented study's configuration (three seeds;
#: docs/lab.md's headline runs it with five), ``quick`` a ~2-minute version (one seed: its
#: intervals are over the evaluation documents only). Fields by name
#: (a study routes the training's and the model's to them).
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
#: budget with which copy and reverse reach >= 95% exact match at L; addition does not learn with it
#: (docs/lab.md, "Reverse and addition"), see :data:`TASK_BUDGETS`.
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

#: A task's own budget where :data:`TASK_DEFAULTS`' is too short, applied after it (the user's flags
#: still win): ``addition_reversed`` reaches 99% exact match at L = 8 with NoPE in 10,000 steps and
#: none at 2,500 (docs/lab.md, "Reverse and addition").
TASK_BUDGETS: dict[str, dict[str, Any]] = {"addition_reversed": {"steps": 10_000}}


def study_model_config(
    config: StudyConfig,
    scheme: str,
    *,
    vocab_size: int = 256,
    max_len: int | None = None,
):
    """The :class:`~posenc.model.ModelConfig` of ``scheme``'s model (an entry of the study's
    schemes: a name or a per-layer pattern) in this study: the study's model with the scheme,
    its options, the vocabulary and ``max_len`` (default ``L``), the nominal trained length:
    learned positions get exactly that table, T5 sizes its buckets from it.
    """
    return entry_model_config(
        config.model,
        scheme_entry(scheme),
        config.position_options,
        vocab_size=vocab_size,
        max_len=max_len or config.train_len,
    )
