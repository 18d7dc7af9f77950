"""Context extension by fine-tuning (Chen et al. 2023; Peng et al. 2023): a model trained at
``L`` is trained on for ``N`` more steps at a longer length ``E_ft``, then evaluated.

Every trained model gets one **fine-tuning cell** without a variant and, when its scheme declares
evaluation-time variants (RoPE's scalings; the lab asks the scheme,
:attr:`~posenc.base.PositionalScheme.eval_variants`), one per variant of the study: the
variant's positional maths at the fixed
factor ``E_ft / L`` (position interpolation, YaRN, ...) or the plain scheme, trained at ``E_ft``.
A fine-tuning cell starts from the trained cell's checkpoint (weights, AdamW moments and RNG
states) and runs the second phase of a study, after every trained cell has finished, through
the same cell engine (local processes or a cluster).

**Controls.** Every trained cell (every scheme, not only those with variants) also gets a
**control cell**: the same ``N`` steps and tokens continued at ``L`` (run ``rope+cont64``), and
every scheme whose positions reach ``E_ft`` is fine-tuned at ``E_ft`` with the same budget.
A fine-tuned run is compared with its control, seed for seed: the gain at ``E_ft`` beyond what
more training alone gives, and the cost at ``L`` against the same budget spent at ``L``.

The fine-tuning recipe: ``N`` steps at a constant learning rate, the study's ``min_lr`` (where the
trained run's cosine ended), no warmup (the AdamW moments are resumed), the same number of tokens
per step as training (``B L / E_ft`` windows of ``E_ft``), ordinary positions. The run named
``rope+linear+ft256`` is compared with ``rope+linear`` (the same weights before fine-tuning, read
with factor ``E / L`` at each length) on the same bytes, seed for seed.

Legend: ``L`` train length, ``E_ft`` fine-tuning length, ``E`` evaluation length, ``N`` steps,
``B`` training batch (windows).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .cells import (
    Cell,
    cell_model_config,
    cell_record,
    finished_cell,
    full_key,
    own_checkpoint,
)
from .config import StudyConfig, TrainConfig
from .data import study_data
from .distributed import dist_info
from .evaluate import EVALUATORS, evaluate_lengths, position_limit
from .grid import scheme_entry
from .results import CellRecord, RunRecord
from .runs import write_json

__all__ = ["FinetuneCell", "finetune_cells", "finetune_config", "finetune_summary", "run_finetune"]


@dataclass(frozen=True)
class FinetuneCell:
    """One trained cell fine-tuned at the study's ``finetune_len``, with ``variant`` (``None`` =
    the plain scheme)."""

    base: Cell
    variant: str | None
    length: int
    control: bool = False

    scheme = property(lambda self: self.base.scheme)
    seed = property(lambda self: self.base.seed)
    setting = property(lambda self: self.base.setting)

    @property
    def before(self) -> str:
        """The run it is compared with: the same weights before fine-tuning (``rope+linear``)."""
        return self.base.run if self.variant is None else f"{self.base.run}+{self.variant}"

    @property
    def run(self) -> str:
        """``rope+linear+ft256`` (fine-tuned at 256), or for the control ``rope+cont64`` (the same
        steps and tokens continued at the training length)."""
        return f"{self.before}+{'cont' if self.control else 'ft'}{self.length}"

    @property
    def name(self) -> str:
        return f"{self.run}-seed{self.seed}"

    def runner(self):
        return run_finetune


def finetune_cells(config: StudyConfig, cells: list[Cell]) -> list[FinetuneCell]:
    """The second phase of a study: for each trained cell whose scheme declares evaluation-time
    variants, one cell without a variant and one per variant of the study that the scheme offers."""
    from ..registry import scheme_class

    if not config.finetune_len:
        return []
    data = study_data(config)
    out = []
    for cell in cells:
        offered = scheme_class(scheme_entry(cell.scheme).position).eval_variants
        variants = [None, *(v for v in config.variants if v in offered)]
        if _can_encode(config, cell, data, config.finetune_len):
            out += [FinetuneCell(cell, v, config.finetune_len) for v in variants]
        out.append(FinetuneCell(cell, None, config.train_len, control=True))
    return out


def _can_encode(config: StudyConfig, cell: Cell, data, length: int) -> bool:
    """Whether the cell's scheme can read ``length`` positions (learned tables stop at theirs)."""
    limit = position_limit(cell_model_config(config, cell, data))
    return limit is None or limit >= length


def finetune_config(config: StudyConfig, seed: int, length: int | None = None) -> TrainConfig:
    """The fine-tuning :class:`~posenc.lab.config.TrainConfig`: ``finetune_steps`` at ``length``
    (default ``finetune_len``; the control: ``train_len``), a constant ``min_lr``, the training
    run's tokens per step."""
    length = config.finetune_len if length is None else length
    base = config.train_config(length, seed)
    batch = max(1, config.train.batch_size * config.train_len // length)
    return dataclasses.replace(
        base,
        steps=config.finetune_steps,
        batch_size=batch,
        lr=config.train.min_lr,
        min_lr=config.train.min_lr,
        warmup_steps=0,
        random_positions=0,
    )


def _model_config(config: StudyConfig, ft: FinetuneCell, data):
    """The trained cell's model config, with the variant's options at factor ``E_ft / L``."""
    from ..registry import scheme_class

    mc = cell_model_config(config, ft.base, data)
    if ft.variant is None:
        return mc
    factor = config.finetune_len / config.train_len
    options = scheme_class(scheme_entry(ft.scheme).position).variant_options(
        ft.variant, factor, config.train_len
    )
    return dataclasses.replace(mc, position_options={**mc.position_options, **options})


def _start_from_base(base: Path, ckpt: Path, model, tc: TrainConfig, data_id: str) -> None:
    """Write the fine-tuning checkpoint at step 0: the trained weights, AdamW state and RNG."""
    from .checkpoint import checkpoint_exists, load_checkpoint, save_checkpoint
    from .train import make_optimizer

    if not checkpoint_exists(base):
        raise ValueError(
            f"fine-tuning starts from the trained checkpoint {str(base)!r}, which is missing; "
            "run the study again with --resume to train it"
        )
    optimizer = make_optimizer(model, tc)
    load_checkpoint(base, model, optimizer)  # weights, AdamW moments, RNG states
    save_checkpoint(ckpt, model, optimizer, 0, train_config=tc, data_id=data_id)


def run_finetune(
    config: StudyConfig,
    ft: FinetuneCell,
    *,
    out: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    resume: bool = False,
    progress: bool | None = False,
    threads: int | None = None,
) -> CellRecord:
    """Fine-tune one trained cell and evaluate it; return its record (``OUT/cells/NAME.json``).

    Arguments as :func:`~posenc.lab.cells.run_cell`; ``out`` is required (the trained checkpoint
    lives there). The record is a cell record plus ``variant``, ``finetune`` (length, steps,
    batch, learning rate, tokens, the run it extends) and one run named :attr:`FinetuneCell.run`.
    """
    from ..model import TransformerLM
    from .checkpoint import checkpoint_exists
    from .train import seed_everything, train

    if out is None:
        raise ValueError(
            "fine-tuning resumes from each trained model's checkpoint: give an output folder (out=)"
        )
    out, device, data = Path(out), torch.device(device), study_data(config)
    key = {
        **full_key(config, ft, data, device),
        "finetune": [ft.variant, ft.length, config.finetune_steps, ft.control],
    }
    cell_file = out / "cells" / f"{ft.name}.json"
    if resume and (record := finished_cell(cell_file, key)) is not None:
        return record
    if threads is not None:
        torch.set_num_threads(threads)
    mc, tc = _model_config(config, ft, data), finetune_config(config, ft.seed, ft.length)
    ckpt = out / "checkpoints" / ft.name
    seed_everything(ft.seed)
    model = TransformerLM(mc).to(device)
    if dist_info().is_main and not ((resume or own_checkpoint(ckpt)) and checkpoint_exists(ckpt)):
        _start_from_base(out / "checkpoints" / ft.base.name, ckpt, model, tc, data.data_id)
    if dist_info().world_size > 1:
        torch.distributed.barrier()
    result = train(
        model,
        data.train_bytes,
        tc,
        device=device,
        checkpoint=ckpt,
        resume=True,
        progress=progress,
        desc=ft.name,
        data_id=data.data_id,
    )
    record = cell_record(ft, key, model, mc, result)
    record.variant, record.finetune = ft.variant, _cost(config, tc, ft)
    if dist_info().is_main:
        record.runs = [_evaluate_finetuned(config, ft, model, mc, data, device)]
        write_json(cell_file, record.to_dict())
    return record


def _evaluate_finetuned(config: StudyConfig, ft: FinetuneCell, model, mc, data, device) -> RunRecord:
    """The fine-tuned model at every length, its factor fixed at ``E_ft / L`` (1 without a variant)."""
    factor = config.finetune_len / config.train_len if ft.variant else 1.0
    how = "continued at" if ft.control else "fine-tuned at"
    note = f"{how} {ft.length} for {config.finetune_steps} steps, factor {factor:g}"
    evaluator = EVALUATORS[config.mode](config, data.evalset, device)
    points = evaluate_lengths(config, evaluator, lambda e: model, mc, note=lambda e: note)
    return RunRecord(ft.run, ft.variant, [p.to_dict() for p in points], finetune=True)


def _cost(config: StudyConfig, tc: TrainConfig, ft: FinetuneCell) -> dict[str, Any]:
    return {
        "length": ft.length,
        "steps": tc.steps,
        "batch_size": tc.batch_size,
        "lr": tc.lr,
        "tokens": tc.steps * tc.tokens_per_step,
        "train_tokens": config.train.steps * config.train.batch_size * config.train_len,
        "before": ft.before,
        "trained": ft.base.run,
        "control": ft.control,
    }


def finetune_summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per fine-tuned run: its paired difference from the same weights before fine-tuning (the run
    named in ``before``: ``rows``) and from the **control**, the same weights continued at ``L`` for
    the same steps and tokens (``control``, ``rows_vs_control``: what fine-tuning at the longer
    length adds beyond more training; at ``L`` its cost), per length, on the same bytes
    (:func:`~posenc.lab.compare.paired_rows`: a bootstrap over seeds and documents), and the cost.
    Controls have entries too (``control: true``: continued minus before)."""
    from .compare import paired_rows

    runs = {(r["name"], r["seed"]): r for r in results["runs"]}
    clusters = results["eval"].get("window_documents")
    controls = {  # trained run -> its control run name
        c["finetune"]["trained"]: c["run"] for c in results["cells"] if c.get("finetune", {}).get("control")
    }
    out: dict[str, dict[str, Any]] = {}
    for cell in (c for c in results["cells"] if "finetune" in c):
        cost = cell["finetune"]
        after = runs.get((cell.get("run"), cell["seed"]))
        before = runs.get((cost["before"], cell["seed"]))
        control_name = None if cost.get("control") else controls.get(cost.get("trained"))
        control = runs.get((control_name, cell["seed"])) if control_name else None
        if after is not None and before is not None:
            fields = {
                "run": after["name"],
                **cost,
                "against_control": control_name,
                "pairs": [],
                "cpairs": [],
            }
            entry = out.setdefault(after["name"], fields)
            entry["pairs"].append((before, after))
            if control is not None:
                entry["cpairs"].append((control, after))
    return [
        {
            **{k: v for k, v in e.items() if k not in ("pairs", "cpairs")},
            "rows": paired_rows(e["run"], e["pairs"], clusters),
            "rows_vs_control": paired_rows(e["run"], e["cpairs"], clusters) if e["cpairs"] else [],
        }
        for e in out.values()
    ]
