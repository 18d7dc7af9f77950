"""Which answer tokens a task model gets right, position by position: the accuracy of each answer
token (teacher-forced argmax, as the lab scores) over fresh questions of each length.

    python benchmarks/task_answer_positions.py MODEL_FOLDER TASK N [N ...]
    python benchmarks/task_answer_positions.py runs/add-rev-10k/checkpoints/nope-seed0 addition_reversed 9

Prints one row per question length: the accuracy of answer token 0, 1, ... (the last one is the end
token), over 400 questions drawn with seed 321 (not the lab's evaluation seed). For
``addition_reversed`` token 0 is the least significant digit.
"""

from __future__ import annotations

import sys

import torch

from posenc.model import load_model
from posenc.text.tasks import generate_task


def answer_accuracy(model, task: str, n: int, examples: int = 400, seed: int = 321) -> list[float]:
    """Accuracy of each answer token (and the end token, last) of ``task`` at question length ``n``."""
    ex = generate_task(task, examples, n, seed=seed)  # tokens [examples, s], all the same length
    with torch.no_grad():
        pred = model(ex.tokens[:, :-1]).logits.argmax(-1)  # [examples, s - 1]: the next token
    target, answer = ex.tokens[:, 1:], ex.answer_mask[:, 1:].bool()  # [examples, s - 1]
    right = (pred == target)[answer].reshape(examples, -1)  # [examples, answer tokens]
    return right.double().mean(0).tolist()


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    model = load_model(argv[0]).eval()
    for n in map(int, argv[2:]):
        row = " ".join(f"{a:.3f}" for a in answer_accuracy(model, argv[1], n))
        print(f"n={n}: {row}")


if __name__ == "__main__":
    main(sys.argv[1:])
