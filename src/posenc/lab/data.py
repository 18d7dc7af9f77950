"""What the cells of a study read: the corpus's training bytes and the evaluation windows
(:class:`StudyData`, built once per process and shared by its cells), and the batches of a
synthetic task (:func:`task_batch_fn`, with its curriculum).

Legend: ``b`` batch, ``s`` sequence length.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..text.tasks import task_seq_len
from .config import StudyConfig
from .evalset import EvalSet, sample_eval_set

__all__ = ["StudyData", "curriculum_len", "study_data", "task_batch_fn"]


@dataclass(frozen=True)
class StudyData:
    """What every cell of a study reads: training bytes (``lm``), the evaluation set, sizes."""

    train_bytes: torch.Tensor | None
    evalset: EvalSet | None
    vocab: int
    seq_len: int
    max_len: int
    record: dict[str, Any]
    data_id: str = ""  # the corpus sha256 and the split: what a cell trains on
    eval_id: str = ""  # the evaluation anchors, hashed: what a cell reads


@functools.lru_cache(maxsize=2)
def _study_data(key: str) -> StudyData:
    config = StudyConfig.from_dict(json.loads(key))
    if not config.lm:
        from ..text.tasks import TASK_VOCAB

        seq_len = task_seq_len(config.mode, config.train_len) - 1  # learned positions: the longest example
        record = {"examples": config.eval_examples, "metric": "exact match (teacher-forced argmax)"}
        return StudyData(None, None, len(TASK_VOCAB), seq_len, seq_len, {"eval": record})
    corpus = config.data.load()
    evalset = sample_eval_set(
        corpus.val_bytes,
        config.eval_windows,
        max(config.eval_lens),
        config.data.split_seed,
        doc_names=[d.name for d in corpus.val],
        doc_starts=corpus.val_starts,
        train_tokens=corpus.train_bytes,
        score_len=config.targets_per_window,
    )
    record = {
        "corpus": dataclasses.asdict(corpus.info),
        "eval": {
            "score_len": config.targets_per_window,
            "split_seed": config.data.split_seed,
            "val_bytes": int(corpus.val_bytes.numel()),
            **evalset.record(),
        },
    }
    data_id = f"{corpus.info.sha256}:split{config.data.split_seed}"  # the bytes a cell trains on
    eval_id = hashlib.sha256(evalset.anchors.numpy().tobytes()).hexdigest()[:16]  # the windows it reads
    return StudyData(
        corpus.train_bytes, evalset, 256, config.train_len, config.train_len, record, data_id, eval_id
    )


def study_data(config: StudyConfig) -> StudyData:
    """The :class:`StudyData` of ``config`` (cached per process: cells of one study share it)."""
    data_fields = ("mode", "train_len", "eval_lens", "eval_windows", "score_len", "eval_examples")
    key = {k: v for k, v in config.to_dict().items() if k in data_fields}
    key.update(config.data.to_dict())  # the corpus, all of it
    return _study_data(json.dumps(key, sort_keys=True))


def curriculum_len(step: int, max_len: int, curriculum_steps: int) -> int:
    """The longest question at ``step`` of a length curriculum: it grows linearly from 1 at step 0
    to ``max_len`` at step ``curriculum_steps`` and stays there (``curriculum_steps = 0``: always
    ``max_len``)."""
    if curriculum_steps <= 0 or step >= curriculum_steps:
        return max_len
    return 1 + (max_len - 1) * step // curriculum_steps


def task_batch_fn(task: str, batch_size: int, max_len: int, seed: int, curriculum_steps: int = 0) -> Callable:
    """A :data:`~posenc.lab.train.BatchFn` of task examples with question lengths drawn from
    ``1..max_len`` (``1..curriculum_len(step, ...)`` while a curriculum runs): ids ``[b, s-1]``,
    targets ``[b, s-1]`` with only the answer tokens (and ``[EOS]``) counted."""
    from ..text.tasks import generate_task
    from .train import IGNORE_INDEX, step_seed

    def batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        hi = curriculum_len(step, max_len, curriculum_steps)
        ex = generate_task(task, batch_size, (1, hi), seed=step_seed(seed, step) % 2**62)
        per_rank = batch_size // world_size
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        tokens, mask = ex.tokens[rows], ex.answer_mask[rows]  # [b, s]
        targets = tokens[:, 1:].masked_fill(~mask[:, 1:], IGNORE_INDEX)  # [b, s - 1]: score answers only
        return tokens[:, :-1], targets

    return batch
