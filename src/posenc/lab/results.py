"""A study's results as typed records: what ``results.json`` and each ``cells/NAME.json`` hold.

``results.json`` is written from a :class:`StudyResults` (with :data:`SCHEMA_VERSION`) and read
back into one (:func:`read_results`, what ``posenc extrapolate --from``, ``--compare`` and the
docs' tables use). A file of schema 1 (written before the version was recorded: no
``schema_version``, the study's configuration flat) is migrated as it is read; a file of a
newer schema, or one that is not a study's results, is refused with one line naming the file.

* :class:`TrainingRecord` - how a cell's model trained (steps, time, losses);
* :class:`RunRecord` - one evaluated model (a trained run, a variant of it, or a fine-tuned one)
  at every length;
* :class:`CellRecord` - one cell of the grid: what it is, its key, its training and its runs;
* :class:`StudyResults` - the study: configuration, environment, data, cells, runs, summaries.

The per-length points (:class:`~posenc.lab.evaluate.EvalPoint` as dicts) and the summaries
(per-length intervals, comparisons) stay JSON objects inside these records: the code that makes
them (:mod:`posenc.lab.evaluate`, :mod:`posenc.lab.extrapolate`) defines their fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import StudyConfig

__all__ = [
    "SCHEMA_VERSION",
    "CellRecord",
    "RunRecord",
    "StudyResults",
    "TrainingRecord",
    "read_results",
]

#: The version of ``results.json`` this posenc writes. 1: no ``schema_version`` field, the
#: configuration flat (``steps``, ``d_model``, ``corpus`` beside ``schemes``); 2: the
#: configuration in parts (``train``, ``model``, ``data``).
SCHEMA_VERSION = 2


def _check(cls: type, data: Any, what: str) -> dict[str, Any]:
    """``data`` as the fields of record ``cls``: a dict with every required field and no unknown one."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} is a {type(data).__name__}, not a {cls.__name__} object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{what} has unknown field(s) {unknown} for a {cls.__name__}")
    required = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in data]
    if missing:
        raise ValueError(f"{what} lacks field(s) {missing} of a {cls.__name__}")
    return data


def _compact(record: Any, optional: tuple[str, ...]) -> dict[str, Any]:
    """``record``'s fields as a dict, without the ``optional`` ones that are ``None``."""
    d = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return {k: v for k, v in d.items() if not (k in optional and v is None)}


@dataclass
class TrainingRecord:
    """How a cell's model trained.

    Attributes:
        steps: the step training ended at.
        resumed_from: the step it started from (0, or a checkpoint's step).
        wall_s: seconds of training in this run.
        tokens_per_s: training throughput.
        threads: torch CPU threads.
        final_loss_nats: the mean training loss of the last 10% of steps, nats per token.
        loss_every_10_steps: the loss of every 10th step.
        loss_mean_10_steps: the mean loss of every 10 steps (cells of older versions lack it).
    """

    steps: int
    resumed_from: int
    wall_s: float
    tokens_per_s: float
    threads: int
    final_loss_nats: float
    loss_every_10_steps: list[float]
    loss_mean_10_steps: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _compact(self, ("loss_mean_10_steps",))

    @classmethod
    def from_dict(cls, data: Any, what: str = "train") -> TrainingRecord:
        return cls(**_check(cls, data, what))


@dataclass
class RunRecord:
    """One evaluated model at every length: a trained run (``variant`` ``None``), the same weights
    with an evaluation-time variant (``rope+yarn``), re-sampled positions, or a fine-tuned run.

    Attributes:
        name: the run's name in tables (``rope``, ``rope[norm=post]+yarn``, ``rope+ft256``).
        variant: the evaluation-time variant, ``"resampled"``, or ``None``.
        eval: one :class:`~posenc.lab.evaluate.EvalPoint` dict per evaluation length.
        finetune: a fine-tuned (or control) run.
        scheme, setting, seed, params: in a study's list of runs, its cell's scheme entry,
            setting, seed and parameter count (``None`` inside a cell's own record).
    """

    name: str
    variant: str | None
    eval: list[dict[str, Any]]
    finetune: bool | None = None
    scheme: str | None = None
    setting: dict[str, Any] | None = None
    seed: int | None = None
    params: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return _compact(self, ("finetune", "scheme", "setting", "seed", "params"))

    @classmethod
    def from_dict(cls, data: Any, what: str = "run") -> RunRecord:
        data = _check(cls, data, what)
        if not isinstance(data["eval"], list) or not all(isinstance(p, dict) for p in data["eval"]):
            raise ValueError(f"{what} field 'eval' is not a list of objects")
        return cls(**data)


@dataclass
class CellRecord:
    """One cell of a study (a trained model, or a fine-tuning of one): ``cells/NAME.json``.

    Attributes:
        cell: its name (``rope[norm=post]-seed1``).
        scheme: its scheme entry.
        seed: its training seed.
        run: the name of its trained model (the cell name without the seed).
        setting: its setting (``{"norm": "post"}``; ``{}`` = plain).
        run_id: the run (:class:`~posenc.lab.runs.RunFolder`) that trained it.
        params: parameters of its model.
        train: how it trained.
        key: what it was run with (:func:`~posenc.lab.cells.full_key`); a resumed study reuses a
            cell whose key matches.
        model_config: its model's :class:`~posenc.model.ModelConfig` as a dict.
        runs: its evaluated models.
        reused: read back from its file by a resumed study, not run again.
        variant, finetune: a fine-tuning cell's variant and cost (its length, steps, tokens,
            the run it extends).
    """

    cell: str
    scheme: str
    seed: int
    run: str
    setting: dict[str, Any]
    run_id: str | None
    params: int
    train: TrainingRecord
    key: dict[str, Any] | None = None
    model_config: dict[str, Any] | None = None
    runs: list[RunRecord] = field(default_factory=list)
    reused: bool | None = None
    variant: str | None = None
    finetune: dict[str, Any] | None = None

    def to_dict(self, *, brief: bool = False) -> dict[str, Any]:
        """JSON; ``brief``: without ``runs``, ``model_config`` and ``key`` (a study's list of cells)."""
        d = _compact(self, ("key", "model_config", "reused", "variant", "finetune"))
        d["train"] = self.train.to_dict()
        d["runs"] = [r.to_dict() for r in self.runs]
        if self.finetune is None and "variant" in d and d["variant"] is None:
            del d["variant"]
        if brief:
            for k in ("runs", "model_config", "key"):
                d.pop(k, None)
        return d

    @classmethod
    def from_dict(cls, data: Any, what: str = "cell") -> CellRecord:
        data = dict(_check(cls, data, what))
        data["train"] = TrainingRecord.from_dict(data["train"], f"{what} field 'train'")
        if not isinstance(data.get("runs", []), list):
            raise ValueError(f"{what} field 'runs' is not a list")
        data["runs"] = [RunRecord.from_dict(r, f"{what} run {i}") for i, r in enumerate(data.get("runs", []))]
        return cls(**data)


@dataclass
class StudyResults:
    """A finished study: the content of ``results.json``.

    Attributes:
        config: the study.
        environment: where and how it ran (versions, device, threads, workers, load average).
        eval: the evaluation set (windows, documents, scored targets) or the task's examples.
        runs: every evaluated model of every cell, in the grid's order.
        summary: per (run, length), each metric's mean and interval across seeds.
        cells: every cell, briefly (without its runs, key and model config).
        corpus: the corpus (name, documents, sha256); ``None`` in task mode.
        train_config: the training of the cells (the first seed's).
        model_configs: per trained run, its model's configuration.
        training: per trained run, the final loss and loss curve across seeds.
        comparisons: every pair of schemes at every length (lm mode: bits/byte; task modes: exact
            match past L, per question), paired, Holm-corrected.
        probe: lm mode: the effective-context probe per run and distance.
        settings: with ``vary`` or randomized positions: each setting minus the first, paired.
        finetune: with fine-tuning: fine-tuned minus not, and minus the control, paired.
        ranking, ranking_by_length: task mode: the schemes ranked past the trained length.
        wall_s: the study's wall time.
        schema_version: :data:`SCHEMA_VERSION` (the file's, once migrated: this one).
    """

    config: StudyConfig
    eval: dict[str, Any]
    runs: list[RunRecord]
    summary: list[dict[str, Any]]
    environment: dict[str, Any] = field(default_factory=dict)
    cells: list[CellRecord] = field(default_factory=list)
    corpus: dict[str, Any] | None = None
    train_config: dict[str, Any] | None = None
    model_configs: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    comparisons: list[dict[str, Any]] | None = None
    probe: list[dict[str, Any]] | None = None
    settings: list[dict[str, Any]] | None = None
    finetune: list[dict[str, Any]] | None = None
    ranking: list[dict[str, Any]] | None = None
    ranking_by_length: list[dict[str, Any]] | None = None
    wall_s: float | None = None
    schema_version: int = SCHEMA_VERSION

    def run_dicts(self) -> list[dict[str, Any]]:
        """:attr:`runs` as JSON objects (what the summaries and comparisons read)."""
        return [r.to_dict() for r in self.runs]

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``results.json``: ``schema_version`` first, absent sections left out."""
        optional = ("corpus", "train_config", "comparisons", "probe", "settings", "finetune", "ranking")
        optional += ("ranking_by_length", "wall_s")
        d = _compact(self, optional)
        d = {"schema_version": d.pop("schema_version"), **d}
        d["config"] = self.config.to_dict()
        d["runs"] = self.run_dicts()
        d["cells"] = [c.to_dict(brief=True) for c in self.cells]
        return d

    @classmethod
    def from_dict(cls, data: Any, what: str = "results") -> StudyResults:
        """The results in ``data`` (a ``results.json`` object of any schema up to
        :data:`SCHEMA_VERSION`, migrated); errors name ``what``."""
        if not isinstance(data, dict):
            raise ValueError(f"{what} is a {type(data).__name__}, not a results object")
        version = data.get("schema_version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"{what} has schema_version {version!r}, not a version number")
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"{what} has schema_version {version}; this posenc reads up to {SCHEMA_VERSION}: "
                "upgrade posenc"
            )
        data = {**data, "schema_version": SCHEMA_VERSION}
        types = {"config": dict, "runs": list, "eval": dict, "summary": list, "cells": list}
        wrong = [k for k, kind in types.items() if k in data and not isinstance(data[k], kind)]
        if wrong:
            raise ValueError(f"{what} field {wrong[0]!r} is not a {types[wrong[0]].__name__}")
        _check(cls, data, what)
        try:
            config = StudyConfig.from_dict(
                {k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()}
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"{what} field 'config': {err}") from None
        runs = [RunRecord.from_dict(r, f"{what} run {i}") for i, r in enumerate(data["runs"])]
        cells = [CellRecord.from_dict(c, f"{what} cell {i}") for i, c in enumerate(data.get("cells", []))]
        return cls(**{**data, "config": config, "runs": runs, "cells": cells})


def read_results(spec: str | Path, flag: str = "--compare") -> StudyResults:
    """The :class:`StudyResults` of a finished study (``results.json`` or its folder), migrated
    from an older schema; every error is one line naming ``flag`` and the file."""
    from ..model.io import parse_json

    path = Path(spec)
    if path.is_dir():
        path = path / "results.json"
    try:
        text = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{flag}: cannot read a study from {str(spec)!r}: {err}") from None
    data = parse_json(text, f"{flag} {str(path)!r}")
    if not isinstance(data, dict) or not {"config", "runs", "eval", "summary"} <= data.keys():
        raise ValueError(f"{flag}: {str(path)!r} is not a results.json of posenc extrapolate")
    return StudyResults.from_dict(data, f"{flag}: {str(path)!r}")
