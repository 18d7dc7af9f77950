"""The study grid: independent cells (scheme x seed), run here, in local processes, or on a cluster.

A **cell** trains one model (one scheme, one seed) and evaluates it, and each evaluation-time
variant its scheme declares (RoPE's scalings), at every length. Cells share nothing but the
read-only data, so they run in any order and anywhere:

* **in this process**, one after another (``workers=1``, and always under ``torchrun``, where
  the processes of DDP train each cell together);
* **in local processes** (``workers > 1``): a ``concurrent.futures.ProcessPoolExecutor``;
* **on a cluster** (``cluster="tcp://scheduler:8786"`` or a ``distributed.Client``): Dask
  distributed's executor. Dask over Ray: it installs from PyPI as pure Python, has no object
  store or daemon of its own to manage, speaks the standard ``concurrent.futures`` interface
  used here for local processes too, and its ``LocalCluster`` lets the tests run a real
  scheduler with two workers on one machine.

A cell is a pure function of the study config and its (scheme, seed): each one sets its own
thread count and seeds, so a cell gives bit-identical numbers in this process and on a worker
with the same thread count (tested). Each finished cell is written to ``OUT/cells/NAME.json``; a
study run again with ``resume`` skips the cells whose file matches the config, and a cell killed
mid-training continues from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .config import RESUMABLE_CHANGES, StudyConfig, field_owners
from .data import StudyData, study_data, task_batch_fn
from .distributed import dist_info
from .evaluate import EVALUATORS, evaluate_lengths
from .executor import cell_executor, finished
from .grid import Setting, run_name, scheme_entry, split_setting, study_settings
from .memory import check_memory, estimate_memory
from .results import CellRecord, RunRecord, TrainingRecord
from .runs import check_owner, current_run_id, write_json, writing_for
from .train import seed_everything, train

__all__ = [
    "FLAT_KEY_FIELDS",
    "NOT_IN_CELL",
    "Cell",
    "cell_key",
    "cell_model_config",
    "cell_record",
    "finished_cell",
    "full_key",
    "iter_cells",
    "own_checkpoint",
    "run_cell",
    "study_cells",
]

#: Study fields that do not change a cell's numbers (so a finished cell is still valid when they
#: change); a cell's own setting is in its key instead of the whole grid's.
NOT_IN_CELL = (
    "schemes",
    "seeds",
    "eval_batch_tokens",
    "vary",
    "randomized_positions",
    "finetune_len",
    "finetune_steps",
)

#: The training and model fields always in a cell key: the keys of the cell files written before
#: studies had parts. The parts' other fields are in a key when they differ from the study's
#: default, so the key of an existing cell file is unchanged.
FLAT_KEY_FIELDS = (
    "steps",
    "batch_size",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "position_lr_scale",
    "d_model",
    "num_layers",
    "num_heads",
    "dropout",
)


@dataclass(frozen=True)
class Cell:
    """One (scheme, setting, seed) of a study; ``setting`` as in :mod:`posenc.lab.grid` (``()`` = plain)."""

    scheme: str
    seed: int
    setting: Setting = ()

    @property
    def run(self) -> str:
        """The name of this cell's trained model in tables: ``rope`` or ``rope[norm=post]``."""
        return run_name(self.scheme, self.setting)

    @property
    def name(self) -> str:
        return f"{self.run}-seed{self.seed}"


def study_cells(config: StudyConfig) -> list[Cell]:
    """The grid, scheme-major: every scheme with every setting and every seed."""
    settings = study_settings(config.vary, config.randomized_positions)
    return [Cell(s, seed, setting) for s in config.schemes for setting in settings for seed in config.seeds]


def cell_key(config: StudyConfig) -> dict[str, Any]:
    """What a finished cell must have been run with to be reused: the study's fields that change its
    numbers, the corpus, and the training and model fields (:data:`FLAT_KEY_FIELDS` always, the
    others when not at the study's default; fields that do not change the numbers left out)."""
    owners = field_owners(StudyConfig)
    defaults = {
        **StudyConfig.__dataclass_fields__["train"].default_factory().to_dict(),
        **StudyConfig.__dataclass_fields__["model"].default_factory().to_dict(),
    }
    key = {}
    for name, value in config.to_dict().items():
        if name in NOT_IN_CELL or name in RESUMABLE_CHANGES:
            continue
        if owners[name] in ("own", "data") or name in FLAT_KEY_FIELDS or value != defaults.get(name):
            key[name] = value
    return key


# ----------------------------------------------------------------------------------------------
# One cell
# ----------------------------------------------------------------------------------------------
def _variant_runs(config: StudyConfig, cell: Cell, evaluator, model, mc, device) -> list[RunRecord]:
    """The trained weights evaluated with each variant the scheme declares, factor ``max(1, E / L)``."""
    from ..model import TransformerLM
    from ..registry import scheme_class

    cls = scheme_class(scheme_entry(cell.scheme).position)  # variants act on the input scheme's options
    runs = []
    state = model.state_dict()
    for variant in (v for v in config.variants if v in cls.eval_variants):

        def scaled(e: int, variant: str = variant) -> torch.nn.Module:
            factor = max(1.0, e / config.train_len)
            options = {**mc.position_options, **cls.variant_options(variant, factor, config.train_len)}
            m = TransformerLM(dataclasses.replace(mc, position_options=options)).to(device)
            m.load_state_dict(state)  # the same weights; only the positional maths changes
            return m.eval()

        points = evaluate_lengths(
            config, evaluator, scaled, mc, note=lambda e: f"factor {max(1.0, e / config.train_len):g}"
        )
        name = f"{cell.run}+{variant}"
        runs.append(RunRecord(name, variant, [p.to_dict() for p in points]))
    return runs


def run_cell(
    config: StudyConfig,
    cell: Cell,
    *,
    out: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    resume: bool = False,
    progress: bool | None = False,
    threads: int | None = None,
) -> CellRecord:
    """Train and evaluate one cell; return its record (and write ``OUT/cells/NAME.json``).

    Args:
        config: the study.
        cell: which scheme and seed.
        out: the study folder (checkpoints and the cell file), or ``None``.
        device: where to train and evaluate.
        resume: reuse a finished cell file that matches the config, continue a checkpoint.
        progress: the training progress bar.
        threads: torch CPU threads for this cell (``None`` = leave as set).

    Returns:
        its :class:`~posenc.lab.results.CellRecord`, whose ``runs`` hold the trained model's
        evaluation and one entry per evaluation-time variant (empty on ranks other than 0 under
        ``torchrun``).
    """
    out_dir = Path(out) if out is not None else None
    cell_file = out_dir / "cells" / f"{cell.name}.json" if out_dir is not None else None
    device = torch.device(device)
    data = study_data(config)
    key = full_key(config, cell, data, device)
    if resume and (record := finished_cell(cell_file, key)) is not None:
        return record
    check_owner(cell_file)  # a worker of a run that lost its folder starts nothing
    if threads is not None:
        torch.set_num_threads(threads)
    mc = cell_model_config(config, cell, data)
    ckpt = out_dir / "checkpoints" / cell.name if out_dir is not None else None
    if config.lm:  # the longest evaluation must fit too: refuse before training, on every rank
        longest = max(config.eval_lens)
        need = estimate_memory(mc, 1, longest, training=False)
        check_memory(need, device, what=f"evaluation at length {longest} (one window)")
    model, result = _train_cell(config, cell, data, mc, device, ckpt, resume, progress)
    record = cell_record(cell, key, model, mc, result)
    info = dist_info()
    if info.is_main:  # under torchrun, rank 0 alone evaluates and writes
        evaluator = EVALUATORS[config.mode](config, data.evalset, device)
        points = evaluate_lengths(config, evaluator, lambda e: model, mc)
        record.runs = [RunRecord(cell.run, None, [p.to_dict() for p in points])]
        if config.lm:
            record.runs += _variant_runs(config, cell, evaluator, model, mc, device)
        m = split_setting(cell.setting)[1].get("random_positions", 0)
        if m and not config.lm:  # Ruoss et al.'s protocol too: positions re-sampled at test time
            again = [evaluator.resampled(model, e, m).to_dict() for e in config.eval_lens]
            record.runs.append(RunRecord(f"{cell.run}+resampled", "resampled", again))
        if cell_file is not None:
            write_json(cell_file, record.to_dict())
    if info.world_size > 1:
        torch.distributed.barrier()
    return record


def full_key(config: StudyConfig, cell, data: StudyData, device: torch.device) -> dict[str, Any]:
    """What a cell's numbers depend on: the config's cell fields (:func:`cell_key`), the bytes it
    trains on and reads, the device type, the cell's own setting, and the posenc and torch
    versions (a resume after an upgrade reruns the cells)."""
    from .. import __version__

    return {
        **cell_key(config),
        "data": data.data_id,
        "eval": data.eval_id,
        "device": device.type,
        "setting": [list(kv) for kv in cell.setting],
        "versions": {"posenc": __version__, "torch": torch.__version__},
    }


def finished_cell(cell_file: Path | None, key: dict[str, Any]) -> CellRecord | None:
    """The record in ``cell_file`` when it was run with ``key`` (marked ``reused``), else ``None``."""
    from ..model.io import parse_json

    if cell_file is None or not cell_file.is_file():
        return None
    data = parse_json(cell_file.read_bytes(), f"the cell file {str(cell_file)!r}")
    if isinstance(data, dict) and isinstance(data.get("runs"), list) and data.get("key") != key:
        return None  # run with other settings (or by another version): run again
    try:
        record = CellRecord.from_dict(data, f"the cell file {str(cell_file)!r}")
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{err}; it is not a cell record: delete it and resume to run the cell again"
        ) from None
    if record.key != key:
        return None
    record.reused = True
    return record


def own_checkpoint(ckpt: Path | None) -> bool:
    """``ckpt`` was written by this run (its run id is this process's, see
    :func:`~posenc.lab.runs.writing_for`): a cell started again on a cluster after its worker
    died continues it instead of refusing it."""
    from .checkpoint import checkpoint_exists, read_checkpoint_meta

    run_id = current_run_id()
    if not run_id or ckpt is None or not checkpoint_exists(ckpt):
        return False
    try:
        return read_checkpoint_meta(ckpt).get("run_id") == run_id
    except ValueError:  # unreadable: train() refuses or resumes it with its own message
        return False


def cell_model_config(config: StudyConfig, cell: Cell, data: StudyData):
    """The cell's :class:`~posenc.model.ModelConfig`: the study's for its scheme, with its setting's
    fields; trained at randomized positions from ``[0, M)``, its nominal length is ``M``."""
    fields, training = split_setting(cell.setting)
    max_len = max(data.max_len, training.get("random_positions", 0))
    mc = config.model_config(cell.scheme, vocab_size=data.vocab, max_len=max_len)
    return dataclasses.replace(mc, **fields)


def cell_record(cell: Cell, key: dict[str, Any], model, mc, result) -> CellRecord:
    """A cell's record before evaluation: what it is, what it trained, its losses."""
    tail = result.losses[-max(1, len(result.losses) // 10) :]
    train = TrainingRecord(
        steps=result.end_step,
        resumed_from=result.start_step,
        wall_s=result.wall_s,
        tokens_per_s=result.tokens_per_s,
        threads=torch.get_num_threads(),
        final_loss_nats=sum(tail) / len(tail) if tail else math.nan,
        loss_every_10_steps=result.losses[::10],
        loss_mean_10_steps=[sum(block) / len(block) for block in _blocks(result.losses, 10)],
    )
    return CellRecord(
        cell=cell.name,
        scheme=cell.scheme,
        seed=cell.seed,
        run=cell.run,
        setting=dict(cell.setting),
        key=key,
        run_id=current_run_id(),
        params=sum(p.numel() for p in model.parameters()),
        model_config=mc.to_dict(),
        train=train,
    )


def _blocks(values: list[float], size: int) -> list[list[float]]:
    """``values`` in consecutive blocks of ``size`` (the last may be shorter)."""
    return [values[i : i + size] for i in range(0, len(values), size)]


def _train_cell(
    config: StudyConfig,
    cell: Cell,
    data: StudyData,
    mc,
    device: torch.device,
    ckpt: Path | None,
    resume: bool,
    progress: bool | None,
):
    """The cell's model, seeded by the cell's seed, trained (or resumed) on the study's data."""
    from ..model import TransformerLM

    tc = dataclasses.replace(config.train_config(data.seq_len, cell.seed), **split_setting(cell.setting)[1])
    if ckpt is None:
        tc = dataclasses.replace(tc, checkpoint_every=0)
    train_data = (
        data.train_bytes
        if config.lm
        else task_batch_fn(
            config.mode, config.train.batch_size, config.train_len, cell.seed, config.curriculum_steps
        )
    )
    seed_everything(cell.seed)
    model = TransformerLM(mc).to(device)
    result = train(
        model,
        train_data,
        tc,
        device=device,
        checkpoint=ckpt,
        resume=resume or own_checkpoint(ckpt),
        progress=progress,
        desc=cell.name,
        data_id=data.data_id or None,
    )
    return model, result


# ----------------------------------------------------------------------------------------------
# Running many cells
# ----------------------------------------------------------------------------------------------
def _cell_task(
    config_dict: dict[str, Any],
    cell: Cell,
    out: str | None,
    device: str,
    resume: bool,
    threads: int | None,
    run_id: str | None = None,
) -> CellRecord:
    """What a worker runs: a plain function of JSON-able arguments (picklable for any executor).
    It writes into ``out`` only while run ``run_id`` holds it (:func:`~posenc.lab.runs.writing_for`)."""
    with writing_for(out, run_id):
        return _runner(cell)(
            StudyConfig.from_dict(config_dict),
            cell,
            out=out,
            device=device,
            resume=resume,
            progress=False,
            threads=threads,
        )


def _runner(cell) -> Callable[..., CellRecord]:
    """The function that runs ``cell``: :func:`run_cell`, or the cell's own (a fine-tuning cell's)."""
    return cell.runner() if hasattr(cell, "runner") else run_cell


def iter_cells(
    config: StudyConfig,
    cells: list[Cell],
    *,
    out: str | os.PathLike | None,
    device: torch.device,
    resume: bool,
    progress: bool | None,
    workers: int = 1,
    cluster: Any = None,
    threads: int | None = None,
    run_id: str | None = None,
) -> Iterator[CellRecord]:
    """Run ``cells`` and yield each record as it finishes (in completion order).

    ``cluster``: a Dask scheduler address or a ``distributed.Client`` (then ``workers`` is
    ignored); else ``workers > 1`` local processes (:func:`~posenc.lab.workers.process_pool`:
    they die with this process); else this process. ``run_id``: the run that holds ``out``
    (:class:`~posenc.lab.runs.RunFolder`); every write into ``out`` checks it still does.
    """
    if cluster is None and workers <= 1:
        with writing_for(out, run_id):
            for cell in cells:
                yield _runner(cell)(
                    config, cell, out=out, device=device, resume=resume, progress=progress, threads=threads
                )
        return
    args = (config.to_dict(), None if out is None else str(out), str(device), resume, threads, run_id)
    with cell_executor(workers, cluster) as executor:
        futures = [executor.submit(_cell_task, args[0], cell, *args[1:]) for cell in cells]
        lost = "the finished cells are kept: start it again and rerun with --resume"
        yield from finished(futures, cluster, "study", lost)
