"""``posenc extrapolate`` and ``posenc train``: the lab from the command line.

Both run unchanged under ``torchrun --nproc-per-node N`` (DistributedDataParallel, gloo on CPU,
NCCL on CUDA; the global batch stays ``--batch-size``). Imported only when a lab command runs, so
``import posenc`` stays light.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from . import pretrained

__all__ = ["extrapolate_args", "extrapolate_run", "parse_list", "parse_options", "train_args", "train_run"]


def parse_list(spec: str, kind: type = str, *, flag: str) -> tuple:
    """``"a,b,c"`` -> ``("a", "b", "c")`` (converted with ``kind``); a clear error naming ``flag``."""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    if not items:
        example = "128,256" if kind is int else "a,b"
        raise ValueError(f"{flag} {spec!r} is empty; give a comma list like {example}")
    try:
        return tuple(kind(x) for x in items)
    except ValueError:
        raise ValueError(f"{flag} {spec!r} is not a comma list of {kind.__name__}s (e.g. 128,256)") from None


def parse_options(specs: list[str]) -> dict[str, dict[str, Any]]:
    """``["t5.max_distance=128", ...]`` -> ``{"t5": {"max_distance": 128}}``; values are JSON when
    they parse as JSON (numbers, true/false, lists), else strings."""
    options: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        scheme, dot, key = name.partition(".")
        if not (sep and dot and scheme and key):
            raise ValueError(f"--option {spec!r} is not SCHEME.KEY=VALUE (e.g. t5.max_distance=128)")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        options.setdefault(scheme, {})[key] = parsed
    return options


def _common_args(p: argparse.ArgumentParser, *, study: bool = True) -> None:
    """Flags shared by ``posenc extrapolate`` (``study``) and ``posenc train``, worded for each."""
    p.add_argument(
        "--train-len",
        type=int,
        default=None,
        help="train length L (default 128; task mode: 8 digits)"
        if study
        else "training window in bytes (default 128)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per scheme (default 600)" if study else "optimizer steps (default 600)",
    )
    p.add_argument("--batch-size", type=int, default=None, help="global batch in windows (default 32)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 3e-3)")
    p.add_argument("--seed", type=int, default=None, help="training seed (default 0)")
    p.add_argument(
        "--split-seed",
        type=int,
        default=None,
        help="seed of the train/validation split and the evaluation windows (default 0)"
        if study
        else "seed of the train/validation split (default 0)",
    )
    p.add_argument("--corpus", default=None, help="stdlib (default: this Python's stdlib source) or a path")
    p.add_argument("--max-chars", type=int, default=None, help="use only the first ~N chars of the corpus")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        help="share held out for validation (default 0.1): by file, or the end of a single file",
    )
    p.add_argument("--d-model", type=int, default=None, help="model width (default 128)")
    p.add_argument("--layers", type=int, default=None, help="Transformer layers (default 4)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default 4)")
    p.add_argument("--dropout", type=float, default=None, help="dropout (default 0)")
    p.add_argument(
        "--position-lr-scale",
        type=float,
        default=None,
        help="learning-rate multiplier of positional parameters (default 10; docs/lab.md)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda (bf16 autocast); under torchrun each process takes cuda:LOCAL_RANK",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads per process (default: free cores, see docs/lab.md)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--checkpoint-every", type=int, default=None, help="checkpoint interval (default 100)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: on a terminal)")


_FLAG_TO_FIELD = {
    "train_len": "train_len",
    "steps": "steps",
    "batch_size": "batch_size",
    "lr": "lr",
    "split_seed": "split_seed",
    "position_lr_scale": "position_lr_scale",
    "corpus": "corpus",
    "max_chars": "max_chars",
    "val_fraction": "val_fraction",
    "d_model": "d_model",
    "layers": "num_layers",
    "heads": "num_heads",
    "dropout": "dropout",
    "checkpoint_every": "checkpoint_every",
}


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    given = {flag: getattr(args, flag) for flag in _FLAG_TO_FIELD}
    return {_FLAG_TO_FIELD[flag]: value for flag, value in given.items() if value is not None}


def _setup(args: argparse.Namespace):
    import torch

    from .distributed import configure_threads, env_int, init_distributed

    try:
        torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device {args.device!r} is not a device; use cpu, cuda or cuda:N") from None
    info, device = init_distributed(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device; use --device cpu")
    local = env_int("LOCAL_WORLD_SIZE", info.world_size, minimum=1)
    threads = configure_threads(args.threads, world_size=local) if device.type == "cpu" else None
    return info, device, threads


def _teardown() -> None:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------------------- extrapolate
def extrapolate_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``posenc extrapolate``."""
    from .config import DEFAULT_SCHEMES, MODES
    from .config import TASK_DEFAULTS as task

    p.add_argument(
        "--schemes", default=None, help=f"comma list of schemes (default {','.join(DEFAULT_SCHEMES)})"
    )
    p.add_argument("--eval-lens", default=None, help="comma list of evaluation lengths (default 128,..,2048)")
    p.add_argument("--quick", action="store_true", help="a ~1-minute smoke version (smaller model, L=64)")
    p.add_argument(
        "--from",
        dest="from_file",
        default=None,
        metavar="RESULTS",
        help="train nothing: print the tables of a finished study (results.json or its folder)",
    )
    p.add_argument("--markdown", action="store_true", help="with --from: Markdown tables")
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="compare two finished studies (results.json files or folders) on the same bytes; trains nothing",
    )
    p.add_argument(
        "--regenerate",
        default=None,
        metavar="PAGE",
        help="refill the <!-- posenc-results: PATH --> blocks of a Markdown page from results files; "
        "trains nothing",
    )
    p.add_argument("--out", default=None, help="folder for results.json, extrapolation.png/svg, checkpoints")
    p.add_argument(
        "--task",
        default="lm",
        choices=list(MODES),
        help="lm (default: bits/byte on a corpus) or a synthetic task (exact-match accuracy; its own "
        f"defaults: d-model {task['d_model']}, {task['num_layers']} layers, {task['steps']} steps, a "
        f"{task['curriculum_steps']}-step curriculum, L {task['train_len']}, eval lengths "
        f"{','.join(map(str, task['eval_lens']))})",
    )
    p.add_argument(
        "--curriculum-steps",
        type=int,
        default=None,
        help="task mode: the longest question grows from 1 to L over these first steps (default "
        f"{task['curriculum_steps']}, at most --steps; 0 = no curriculum)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        help="comma list of training seeds, one model per scheme and seed (default 0,1,2; --quick: 0)",
    )
    p.add_argument(
        "--eval-windows",
        type=int,
        default=None,
        help="evaluation windows sampled across the validation documents (default 32)",
    )
    p.add_argument(
        "--score-len",
        type=int,
        default=None,
        help="targets scored at the end of each window (default: half the shortest length)",
    )
    p.add_argument(
        "--variants",
        "--rope-scalings",
        dest="variants",
        default=None,
        help="evaluation-time variants, e.g. RoPE scalings (default linear,ntk,yarn; 'none')",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="SCHEME.KEY=VALUE",
        help="a scheme's option for its model, e.g. t5.max_distance=128 (repeatable)",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="train every scheme with each value of a model setting, e.g. norm=pre,post (repeatable)",
    )
    p.add_argument(
        "--randomized-positions",
        type=int,
        default=None,
        metavar="M",
        help="also train each scheme at sorted random positions from [0, M) (Ruoss et al. 2023)",
    )
    p.add_argument(
        "--finetune-len",
        type=int,
        default=None,
        metavar="E",
        help="after training, fine-tune RoPE and each of its scalings at length E (with --finetune-steps)",
    )
    p.add_argument("--finetune-steps", type=int, default=None, metavar="N", help="fine-tuning steps")
    p.add_argument(
        "--diagnostics",
        type=int,
        nargs="?",
        const=8,
        default=None,
        metavar="K",
        help="attention entropy, distance and mass beyond L on K windows per length (default 8)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="cells run at once in local processes (default: the free cores)",
    )
    p.add_argument(
        "--cluster",
        default=None,
        help="run the cells on a Dask cluster at this scheduler address (tcp://host:8786)",
    )
    _common_args(p)
    pretrained.add_model_flags(p)  # --model: a pretrained model (posenc.lab.pretrained)


def _study_config(args: argparse.Namespace):
    """The :class:`~posenc.lab.config.StudyConfig` the flags describe (preset, task, overrides)."""
    from .config import PRESETS, TASK_DEFAULTS, StudyConfig

    fields: dict[str, Any] = dict(PRESETS["quick" if args.quick else "default"])
    if args.task != "lm":
        fields.update(TASK_DEFAULTS)
        fields.pop("max_chars", None)
    fields["mode"] = args.task
    fields.update(_overrides(args))
    if args.schemes is not None:
        fields["schemes"] = parse_list(args.schemes, flag="--schemes")
    if args.eval_lens is not None:
        fields["eval_lens"] = parse_list(args.eval_lens, int, flag="--eval-lens")
    elif args.task != "lm":
        from .tasks import task_eval_lens

        fields["eval_lens"] = task_eval_lens(fields["train_len"])
    if args.seed is not None and args.seeds is not None:
        raise ValueError("give --seed or --seeds, not both")
    if args.seed is not None:
        fields["seeds"] = (args.seed,)
    if args.seeds is not None:
        fields["seeds"] = parse_list(args.seeds, int, flag="--seeds")
    if args.eval_windows is not None:
        fields["eval_windows"] = args.eval_windows
    if args.score_len is not None:
        fields["score_len"] = args.score_len
    if args.variants is not None:
        fields["variants"] = () if args.variants == "none" else parse_list(args.variants, flag="--variants")
    if args.option:
        fields["position_options"] = parse_options(args.option)
    if args.curriculum_steps is not None:
        fields["curriculum_steps"] = args.curriculum_steps
    elif "curriculum_steps" in fields:  # the task default, within a shorter --steps
        fields["curriculum_steps"] = min(fields["curriculum_steps"], fields["steps"])
    from .grid import grid_fields

    return StudyConfig(**fields, **grid_fields(args))


def _workers(args: argparse.Namespace, info, device, cells: int) -> int:
    """Cells run at once: 1 under DDP or on a GPU, else --workers or the free cores, at most ``cells``."""
    from .distributed import free_cores

    if info.world_size > 1 or device.type != "cpu":
        workers = 1  # DDP trains each cell with every process; a GPU takes one cell at a time
    elif args.workers is not None:
        workers = args.workers
    else:  # the free cores, one cell each (not --threads, which sets the threads of each cell)
        workers = free_cores()
    return min(workers, cells)


def extrapolate_run(args: argparse.Namespace) -> int:
    """Run ``posenc extrapolate``: train, evaluate, print the table, write the JSON and plot."""
    if getattr(args, "model", None):
        return pretrained.run(args)
    if args.regenerate is not None:
        from .doctables import regenerate_run

        return regenerate_run(args.regenerate)
    if args.compare is not None:
        from .compare import compare_run

        return compare_run(args.compare)
    if args.from_file is not None:
        from .compare import read_results
        from .extrapolate import format_table

        print(format_table(read_results(args.from_file, "--from"), markdown=args.markdown))
        return 0
    if args.markdown:
        raise ValueError("--markdown formats a finished study: use it with --from RESULTS")
    from .extrapolate import STUDY_ARTIFACTS, format_table, run_study
    from .runs import RunFolder

    config = _study_config(args)
    if (args.resume or args.overwrite) and args.out is None:
        raise ValueError("--resume and --overwrite need --out (the folder holding the run)")
    if args.out is not None:
        RunFolder(args.out, STUDY_ARTIFACTS, resume=args.resume, overwrite=args.overwrite)  # checks the path
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    info, device, threads = _setup(args)
    from .cells import study_cells

    workers = _workers(args, info, device, len(study_cells(config)))
    if workers > 1 and args.threads is None:
        threads = 1  # one thread per cell process: the cores go to the cells
    try:
        progress = False if args.no_progress else None
        results = run_study(
            config,
            out=args.out,
            device=device,
            resume=args.resume,
            overwrite=args.overwrite,
            progress=progress,
            threads=threads,
            workers=workers,
            cluster=args.cluster,
        )
    finally:
        _teardown()
    if info.is_main:
        print()
        print(format_table(results))
        env = results["environment"]
        print(
            f"\nwall time {results['wall_s']:.0f} s on {env['device']} ({env['workers']} worker(s) x "
            f"{env['threads']} thread(s), {env['world_size']} DDP process(es)); load average at start/end "
            f"{env.get('load_avg_start', ['?'])[0]:.2f}/{env.get('load_avg_end', ['?'])[0]:.2f}"
        )
        if args.out is not None:
            out = Path(args.out)
            print(f"wrote {out / 'results.json'} and {out / 'extrapolation.png'} (and .svg)")
    return 0


# ---------------------------------------------------------------------------------------- train
def train_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``posenc train``."""
    p.add_argument(
        "--scheme",
        default="rope",
        help="positional scheme of the model (default rope; posenc list shows them)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="folder for checkpoint.safetensors (resumable), model.safetensors, train.json",
    )
    p.add_argument(
        "--autocast",
        default="auto",
        choices=["auto", "bf16", "off"],
        help="auto (default: bf16 on CUDA), bf16 or off",
    )
    _common_args(p, study=False)


#: What ``posenc train`` writes into its folder (their presence means the folder holds a run).
TRAIN_ARTIFACTS = ("checkpoint.safetensors", "model.safetensors", "train.json")


def train_run(args: argparse.Namespace) -> int:
    """Run ``posenc train``: one byte-level LM, checkpointed and resumable."""
    import dataclasses

    from .config import StudyConfig
    from .distributed import is_lock_holder
    from .runs import RunFolder, writing_for

    fields = {"schemes": (args.scheme,), "variants": (), **_overrides(args)}
    fields["eval_lens"] = (fields.get("train_len", 128),)
    if args.seed is not None:
        fields["seeds"] = (args.seed,)
    study = StudyConfig(**fields)
    tc = dataclasses.replace(study.train_config(), autocast=args.autocast)
    mc = study.model_config(args.scheme)
    folder = RunFolder(
        args.out,
        TRAIN_ARTIFACTS,
        resume=args.resume,
        overwrite=args.overwrite,
        lock=is_lock_holder(),
    )  # checks the path before any work
    info, device, threads = _setup(args)
    try:
        with folder, writing_for(folder.path, folder.run_id):
            _train_one(args, study, tc, mc, folder.path, info, device, threads)
    finally:
        _teardown()
    return 0


def _train_one(args, study, tc, mc, out: Path, info, device, threads) -> None:
    import dataclasses

    from ..model import TransformerLM, save_model
    from ..text import load_corpus
    from .runs import write_json
    from .train import seed_everything, train

    corpus = load_corpus(
        study.corpus, max_chars=study.max_chars, seed=study.split_seed, val_fraction=study.val_fraction
    )
    seed_everything(tc.seed)
    model = TransformerLM(mc).to(device)
    t0 = time.perf_counter()
    result = train(
        model,
        corpus.train_bytes,
        tc,
        device=device,
        checkpoint=out / "checkpoint.safetensors",
        resume=args.resume,
        progress=False if args.no_progress else None,
        desc=args.scheme,
        # a resume on other data is refused
        data_id=f"{corpus.info.sha256}:split{study.split_seed}"
        + ("" if study.val_fraction == 0.1 else f":val{study.val_fraction}"),
    )
    if not info.is_main:
        return
    save_model(model, out / "model.safetensors")
    write_json(
        out / "train.json",
        {
            "model_config": mc.to_dict(),
            "train_config": tc.to_dict(),
            "corpus": dataclasses.asdict(corpus.info),
            "world_size": info.world_size,
            "threads": threads,
            "device": str(device),
            "start_step": result.start_step,
            "end_step": result.end_step,
            "wall_s": time.perf_counter() - t0,
            "tokens_per_s": result.tokens_per_s,
            "losses": result.losses,
        },
    )
    last = result.losses[-1] if result.losses else float("nan")
    print(
        f"{args.scheme}: steps {result.start_step}->{result.end_step} in {result.wall_s:.1f} s "
        f"({result.tokens_per_s:,.0f} tok/s, {info.world_size} process(es)), last loss {last:.4f}; "
        f"wrote {out / 'model.safetensors'}"
    )
