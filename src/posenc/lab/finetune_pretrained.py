"""Context extension of a loaded model by fine-tuning, with the lab's control: a pretrained model
(trained at ``L``) is trained on for ``N`` steps at ``E_ft``, plainly and under each variant of
its scheme at the fixed factor ``E_ft / L``; the **control** is the same model continued at ``L``
for the same steps and tokens. Each fine-tuned model is compared, on the same windows, with the
control (the gain at ``E`` beyond what more training gives; at ``L``, its cost) and with itself
before fine-tuning (the same variant, read with factor ``max(1, E / L)``).

The recipe (one for every run, the control's too): AdamW at a constant learning rate after a
linear warmup over the first tenth of the steps, ``B L`` tokens per step (``B`` windows of ``L``
for the control, ``B L / E_ft`` windows of ``E_ft`` for the others), batches drawn from the
corpus's training documents (:func:`~posenc.lab.train.train`), ordinary positions. Full
fine-tuning by default; ``peft="lora"`` trains low-rank adapters on the attention and MLP
projections through the ``peft`` package (when installed) and merges them before evaluation.

Legend: ``L`` trained length, ``E_ft`` fine-tuning length, ``E`` evaluation length, ``N`` steps,
``B`` windows of ``L`` per step.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._validate import check_int, check_positive_float
from .config import TrainConfig
from .memory import check_memory, estimate_memory
from .pretrained_eval import Setup, at_variant, format_rows
from .stats import format_interval

__all__ = ["DEFAULT_BATCH", "DEFAULT_LR", "LORA", "FinetunePlan", "check_peft", "format_finetune"]

#: Windows of ``L`` per step by default (the lab's training batch).
DEFAULT_BATCH = 32
#: The constant learning rate by default: where the lab's own models' cosine ends (``min_lr``).
DEFAULT_LR = 3e-4
#: Dtypes a model is stored in but not trained in (trained on float32 weights).
_HALF = (torch.bfloat16, torch.float16)
#: ``peft="lora"``: rank, scale and the projections adapted (posenc's linear layer names).
LORA = {
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate", "up", "down"],
}


def check_peft() -> None:
    """``ValueError`` with the fix when the ``peft`` package is not installed."""
    if importlib.util.find_spec("peft") is None:
        raise ValueError(
            "--peft lora fine-tunes through the peft package, which is not installed (pip install peft); "
            "leave out --peft to fine-tune every parameter"
        )


@dataclass(frozen=True)
class FinetunePlan:
    """What to fine-tune and how (checked before any work: :meth:`checked`).

    Attributes:
        length: ``E_ft``.
        steps: ``N``.
        batch_size: ``B``, windows of ``L`` per step (the control's batch).
        lr: the constant learning rate.
        seed: the batches' seed (the same for every run).
        peft: ``None`` (every parameter) or ``"lora"``.
    """

    length: int
    steps: int
    batch_size: int = DEFAULT_BATCH
    lr: float = DEFAULT_LR
    seed: int = 0
    peft: str | None = None

    @classmethod
    def checked(
        cls,
        setup: Setup,
        length: int,
        steps: int,
        *,
        batch_size: int | None = None,
        lr: float | None = None,
        seed: int = 0,
        peft: str | None = None,
    ) -> FinetunePlan:
        """The plan for ``setup``'s model; ``ValueError`` for a length its positions cannot read,
        too little training text, or ``peft`` without the package."""
        check_int(length, "--finetune-len")
        check_int(steps, "--finetune-steps")
        check_int(seed, "--seed", minimum=0)
        batch = check_int(DEFAULT_BATCH if batch_size is None else batch_size, "--batch-size")
        lr = check_positive_float(DEFAULT_LR if lr is None else lr, "--lr")
        if length <= setup.train_len:
            raise ValueError(
                f"--finetune-len {length} is not longer than the trained length L={setup.train_len}: "
                "fine-tuning extends the context (the control already continues the model at L); "
                f"give a length above {setup.train_len}"
            )
        if setup.limit is not None and length > setup.limit:
            raise ValueError(
                f"--finetune-len {length} is longer than the model's positions allow ({setup.limit}: a "
                f"learned table); fine-tune at {setup.limit} or less"
            )
        if peft is not None:
            if peft != "lora":
                raise ValueError(f"--peft {peft!r} is not offered; use lora")
            check_peft()
        n = int(setup.text.train.numel())
        if n <= max(length, setup.train_len) + 1:
            raise ValueError(
                f"the corpus's training documents hold {n:,} {setup.text.unit}s, too few for fine-tuning "
                f"windows of {length}; use a larger --corpus or a shorter --finetune-len"
            )
        plan = cls(length, steps, batch, lr, seed, peft)
        plan.check_memory(setup)
        return plan

    def check_memory(self, setup: Setup) -> None:
        """Refuse, before the evaluation that precedes fine-tuning, a run whose training would not
        fit in memory (:func:`~posenc.lab.train.train` checks the same again when it starts)."""
        n_params = sum(p.numel() for p in setup.model.parameters())
        for length in (self.length, setup.train_len):
            tc = self.config(length, setup.train_len)
            check_memory(
                estimate_memory(setup.model.config, tc.batch_size, length, num_params=n_params),
                setup.device,
                what=f"fine-tuning at {length} (batch {tc.batch_size} x {length})",
            )

    def config(self, length: int, train_len: int) -> TrainConfig:
        """The :class:`~posenc.lab.config.TrainConfig` of a run at ``length``: ``B L`` tokens per step."""
        return TrainConfig(
            steps=self.steps,
            batch_size=max(1, self.batch_size * train_len // length),
            seq_len=length,
            lr=self.lr,
            min_lr=self.lr,
            warmup_steps=self.steps // 10,
            seed=self.seed,
            checkpoint_every=0,
        )

    def runs(self, setup: Setup) -> list[tuple[str, str | None, bool]]:
        """``(name, variant, control)`` per run: the plain model and each variant fine-tuned at
        ``E_ft``, then the control continued at ``L`` (``cont64``)."""
        out = [(f"ft{self.length}", None, False)]
        out += [(f"+{v}+ft{self.length}", v, False) for v in setup.variants]
        return [*out, (f"cont{setup.train_len}", None, True)]

    def run(
        self,
        setup: Setup,
        results: dict[str, Any],
        *,
        progress: bool | None = None,
        train_all: Callable[[list], list] | None = None,
    ) -> dict[str, Any]:
        """Fine-tune every run of :meth:`runs` from ``setup.model`` and score it on ``setup``'s
        windows; ``results`` (:func:`~posenc.lab.pretrained_eval.evaluate_setup`) gives the runs before.

        ``train_all``: ``[runs] -> [(points, train record) of each]``, e.g. on several processes or
        machines (:func:`posenc.lab.pretrained_jobs.train_all`); default: :meth:`train_and_score`
        of each, here.

        Returns:
            ``{"length", "steps", "lr", "seed", "peft", "control", "runs": [{"name", "variant",
            "control", "before", "train": {...}, "eval": [points with vs_control, vs_before]}]}``.
        """
        L = setup.train_len
        before = {r["variant"]: r for r in results["runs"]}
        runs = self.runs(setup)
        if train_all is None:
            trained = [self.train_and_score(setup, *run, progress=progress) for run in runs]
        else:
            trained = train_all(runs)
        done = [
            {
                "name": name,
                "variant": variant,
                "control": control,
                "before": before[variant]["name"],
                "factor": self.length / L if variant else 1.0,
                "train": train,
                "eval": points,
            }
            for (name, variant, control), (points, train) in zip(runs, trained)
        ]
        control = done[-1]
        for run in done:
            for p, vs_control, vs_before in zip(
                run["eval"],
                setup.against(run["eval"], control["eval"]),
                setup.against(run["eval"], before[run["variant"]]["eval"]),
            ):
                p["vs_control"] = None if run["control"] else vs_control
                p["vs_before"] = vs_before
        return {**dataclasses.asdict(self), "train_len": L, "control": control["name"], "runs": done}

    def train_and_score(
        self, setup: Setup, name: str, variant: str | None, control: bool, *, progress: bool | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One run of :meth:`runs`: trained (at ``L`` for the control, else ``E_ft``), then scored at
        every length. Returns ``(points, train record)``."""
        length = setup.train_len if control else self.length
        model, train = self._train(setup, variant, length, name, progress)
        return setup.score(lambda e: model), train

    def _train(self, setup: Setup, variant: str | None, length: int, name: str, progress) -> tuple[Any, dict]:
        """One run: a copy of the model (with the variant at factor ``E_ft / L``) trained at ``length``."""
        from .train import seed_everything, train

        L = setup.train_len
        model = (
            copy.deepcopy(setup.model)
            if variant is None
            else at_variant(setup.model, variant, self.length / L, L)
        )
        # a model stored in 16 bits is trained on float32 weights (steps of lr * update are far below
        # bf16's spacing and would round away), then stored back, so every run is scored in the
        # model's own dtype
        dtype = next(setup.model.parameters()).dtype
        if dtype in _HALF:
            model = model.float()
        tc = self.config(length, L)
        seed_everything(self.seed)
        trained = _with_lora(model) if self.peft else model
        trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
        result = train(
            trained,
            setup.text.train,
            tc,
            device=setup.device,
            progress=progress,
            desc=name,
            data_id=setup.text.data_id,
        )
        if self.peft:
            model = trained.merge_and_unload()
        train_dtype = next(model.parameters()).dtype
        model = model.to(dtype)
        record = {
            "length": length,
            "steps": tc.steps,
            "batch_size": tc.batch_size,
            "tokens": tc.steps * tc.tokens_per_step,
            "lr": tc.lr,
            "warmup_steps": tc.warmup_steps,
            "loss_first": result.losses[0] if result.losses else None,
            "loss_last": result.losses[-1] if result.losses else None,
            "wall_s": result.wall_s,
            "trainable": trainable,
            "dtype": str(train_dtype).removeprefix("torch."),
        }
        return model.eval(), record


def _with_lora(model):
    """``model`` with LoRA adapters (:data:`LORA`) on its projections, through ``peft``."""
    import peft

    present = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    targets = [t for t in LORA["target_modules"] if t in present]
    config = peft.LoraConfig(r=LORA["r"], lora_alpha=LORA["lora_alpha"], target_modules=targets)
    return peft.get_peft_model(model, config)


def format_finetune(results: dict[str, Any], unit: str) -> list[str]:
    """The fine-tuning tables: sliding-window score, paired delta against the control (at ``L``:
    the cost) and against the same model before fine-tuning, 95% intervals over documents."""
    ft = results["finetune"]
    runs, L = ft["runs"], ft["train_len"]
    lens = [p["length"] for p in runs[0]["eval"]]
    first = runs[0]["train"]
    how = "LoRA adapters (peft)" if ft["peft"] else "every parameter"
    lines = [
        f"fine-tuned at {ft['length']} for {ft['steps']} steps ({first['tokens']:,} tokens, {how}, "
        f"lr {ft['lr']:g}); control {ft['control']}: the same steps and tokens continued at L={L}"
    ]
    lines += format_rows(
        f"sliding-window bits/{unit} after fine-tuning", runs, lens, lambda p: format_interval(p.get("score"))
    )
    lines += format_rows(
        f"paired delta vs the control {ft['control']}, bits/{unit} (< 0 = fine-tuning at {ft['length']} "
        f"beats more training at L; at {L}: its cost)",
        [r for r in runs if not r["control"]],
        lens,
        lambda p: format_interval(p.get("vs_control"), signed=True),
    )
    lines += format_rows(
        f"paired delta vs before fine-tuning (the same variant), bits/{unit}",
        runs,
        lens,
        lambda p: format_interval(p.get("vs_before"), signed=True),
    )
    return lines
