"""Which answer tokens a task model gets right, position by position: the accuracy of each answer
token (teacher-forced argmax, as the lab scores) over fresh questions of each length.

    python benchmarks/task_answer_positions.py MODEL_FOLDER TASK N [N ...]
    python benchmarks/task_answer_positions.py runs/add-rev-10k/checkpoints/nope-seed0 addition_reversed 9

Prints one row per question length: the accuracy of answer token 0, 1, ... (the last one is the end
token), over 400 questions drawn with seed 321 (not the lab's evaluation seed). For
``addition_reversed`` token 0 is the least significant digit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from posenc.model import load_model
from posenc.text.tasks import TASKS, generate_task


def answer_accuracy(model, task: str, n: int, examples: int = 400, seed: int = 321) -> list[float]:
    """Accuracy of each answer token (and the end token, last) of ``task`` at question length ``n``."""
    ex = generate_task(task, examples, n, seed=seed)  # tokens [examples, s], all the same length
    with torch.no_grad():
        pred = model(ex.tokens[:, :-1]).logits.argmax(-1)  # [examples, s - 1]: the next token
    target, answer = ex.tokens[:, 1:], ex.answer_mask[:, 1:].bool()  # [examples, s - 1]
    right = (pred == target)[answer].reshape(examples, -1)  # [examples, answer tokens]
    return right.double().mean(0).tolist()


def trained_task(folder: Path) -> str | None:
    """The task a lab checkpoint (``OUT/checkpoints/RUN``) was trained on, read from its study's
    ``OUT/results.json``; None where there is none to read."""
    results = folder.parent.parent / "results.json"
    try:
        return json.loads(results.read_text(encoding="utf-8"))["config"]["mode"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _length(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"N {text!r} must be a question length >= 1 (digits)")
    return int(text)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="task_answer_positions.py", description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="a model folder (a lab checkpoint: OUT/checkpoints/RUN)")
    p.add_argument("task", choices=sorted(TASKS), help="the task the model was trained on")
    p.add_argument("lengths", nargs="+", type=_length, metavar="N", help="question lengths")
    args = p.parse_args(argv)
    trained = trained_task(args.model)
    if trained is not None and trained != args.task:
        p.error(f"{args.model} was trained on {trained!r} (its study's results.json), not {args.task!r}")
    torch.set_num_threads(1)
    try:
        model = load_model(args.model).eval()
    except (OSError, ValueError) as err:
        p.error(str(err).splitlines()[0])
    for n in args.lengths:
        row = " ".join(f"{a:.3f}" for a in answer_accuracy(model, args.task, n))
        print(f"n={n}: {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
