"""``posenc extrapolate`` and ``posenc train``: the lab from the command line.

Both run unchanged under ``torchrun --nproc-per-node N`` (DistributedDataParallel, gloo on CPU,
NCCL on CUDA; the global batch stays ``--batch-size``). Imported only when a lab command runs, so
``import posenc`` stays light.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from . import pretrained

__all__ = [
    "extrapolate_args",
    "extrapolate_run",
    "parse_options",
    "run_config",
    "study_config",
    "train_args",
    "train_run",
]

#: Flags named otherwise than their field: the names the commands had before their flags were
#: generated (the generated name stays as an alias).
FLAG_NAMES = {"num_layers": "--layers", "num_heads": "--heads", "seq_len": "--train-len"}

#: The source of :class:`~posenc.model.ModelConfig`, whose fields are read without importing torch.
MODEL_SOURCE = Path(__file__).resolve().parents[1] / "model" / "config.py"


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


def _specs(cls: type) -> dict[str, list]:
    """``{"own" | part: [FieldSpec]}`` of a run or study configuration class: its own fields and
    each part's fields but those ``cls`` sets itself (the model's read from its source)."""
    from .config import CorpusConfig, TrainConfig, part_names, set_fields
    from .flags import field_specs, source_field_specs

    parts = part_names(cls)
    sets = set_fields(cls)
    classes = {"data": field_specs(CorpusConfig), "train": field_specs(TrainConfig)}
    classes["model"] = source_field_specs(MODEL_SOURCE, "ModelConfig")
    out = {"own": [s for s in field_specs(cls, skip=parts) if s.name not in ("position_options", "vary")]}
    for part in parts:
        out[part] = [s for s in classes[part] if s.name not in sets[part]]
    return out


def _defaults(cls: type, part: str) -> dict[str, Any]:
    """The field values of ``cls``'s default ``part`` (the model's: its dataclass defaults)."""
    factory = cls.__dataclass_fields__[part].default_factory
    if part == "model":
        return {}  # ModelConfig's own defaults, read from its source with its fields
    return {f: getattr(factory(), f) for f in factory().__dataclass_fields__}


def _add_config_flags(
    p: argparse.ArgumentParser, cls: type, preset: dict[str, Any], others: dict[str, dict[str, Any]]
) -> None:
    """Every field of ``cls`` (:class:`~posenc.lab.config.StudyConfig` or
    :class:`~posenc.lab.config.RunConfig`) and of its parts as a flag, in a group per part; the
    help shows the default with ``preset`` (fields by name) and, where they differ, the values of
    ``others`` (``{"--quick": {field: value}}``)."""
    from .flags import add_field_flags

    titles = {"own": None, "data": "corpus", "train": "training", "model": "model"}
    for part, specs in _specs(cls).items():
        group = p if titles[part] is None else p.add_argument_group(titles[part])
        defaults = {**({} if part == "own" else _defaults(cls, part)), **preset}
        notes = {}
        for spec in specs:
            default = defaults.get(spec.name, spec.default)
            shown = [
                f"{what}: {_shown(v[spec.name])}"
                for what, v in others.items()
                if v.get(spec.name, default) != default
            ]
            notes[spec.name] = "".join(f"; {x}" for x in shown)
        add_field_flags(group, specs, part, defaults, names=FLAG_NAMES, notes=notes)


def _given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """``{field: value}`` of the configuration flags given, the parts' fields by name."""
    from .flags import given_fields

    out: dict[str, Any] = {}
    for part, specs in _specs(cls).items():
        out.update(given_fields(args, part, specs))
    return out


def _pretrained_args(args: argparse.Namespace) -> argparse.Namespace:
    """The flags of ``--model`` by field name: the hand-declared ones as parsed, the configuration's
    converted by type; ``config_fields`` maps each configuration field given to its flag."""
    from .config import StudyConfig

    given = _given(args, StudyConfig)
    flat = {k: v for k, v in vars(args).items() if "__" not in k}
    flat.update(given)
    flat["config_fields"] = {name: FLAG_NAMES.get(name, "--" + name.replace("_", "-")) for name in given}
    return argparse.Namespace(**flat)


def _executor_flags(p: argparse.ArgumentParser) -> None:
    """Where a study's cells (or a loaded model's jobs) run: local processes or a Dask cluster."""
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="cells (with --model: the variants and fine-tuning runs) run at once in local processes "
        "(default: the free cores; with --model: 1)",
    )
    p.add_argument(
        "--cluster",
        default=None,
        help="run the cells (with --model: its jobs) on a Dask cluster at this scheduler address "
        "(tcp://host:8786)",
    )


def _run_flags(p: argparse.ArgumentParser) -> None:
    """The flags of how a command runs (not what it computes), shared by both commands."""
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
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: on a terminal)")


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
    """Arguments of ``posenc extrapolate``: what the command does (read a finished study, compare,
    regenerate docs; where and how it runs), then one flag per field of the study and its parts."""
    from .config import PRESETS, TASK_BUDGETS, TASK_DEFAULTS, StudyConfig

    p.add_argument(
        "--quick",
        action="store_true",
        help="a ~1-minute smoke version of the language-model study (one seed, smaller model, "
        "L=64); with --task, one seed of the task at its own budget (task mode in each flag's default)",
    )
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
    p.add_argument("--seed", type=int, default=None, help="one training seed (the same as --seeds N)")
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
    _executor_flags(p)
    _run_flags(p)
    # --quick starts from the class defaults, not from the documented study's (one seed, not three)
    own = {f.name: f.default for f in dataclasses.fields(StudyConfig)}
    quick = {**{k: own[k] for k in PRESETS["default"]}, **PRESETS["quick"]}
    presets = {"--quick": quick, "task mode": TASK_DEFAULTS}
    presets.update({f"--task {task}": budget for task, budget in TASK_BUDGETS.items()})
    _add_config_flags(p, StudyConfig, PRESETS["default"], presets)
    pretrained.add_model_flags(p)  # --model: a pretrained model (posenc.lab.pretrained)


def _shown(value: Any) -> str:
    from .flags import shown

    return shown(value)


def study_config(args: argparse.Namespace):
    """The :class:`~posenc.lab.config.StudyConfig` the flags describe: the preset (``--quick`` or
    the documented study), a task's defaults, then every field given."""
    from .config import PRESETS, TASK_BUDGETS, TASK_DEFAULTS, StudyConfig
    from .grid import parse_vary

    given = _given(args, StudyConfig)
    mode = given.get("mode", "lm")
    fields: dict[str, Any] = dict(PRESETS["quick" if args.quick else "default"])
    if mode != "lm":
        fields.update(TASK_DEFAULTS)
        fields.update(TASK_BUDGETS.get(mode, {}))
        fields.pop("max_chars", None)
    fields.update(given)
    if "eval_lens" not in given and mode != "lm":
        from .tasks import task_eval_lens

        fields["eval_lens"] = task_eval_lens(fields["train_len"])
    if args.seed is not None and "seeds" in given:
        raise ValueError("give --seed or --seeds, not both")
    if args.seed is not None:
        fields["seeds"] = (args.seed,)
    if args.option:
        fields["position_options"] = parse_options(args.option)
    if "curriculum_steps" in fields and "curriculum_steps" not in given:  # the task default, within --steps
        fields["curriculum_steps"] = min(fields["curriculum_steps"], fields["steps"])
    if args.vary:
        fields["vary"] = parse_vary(args.vary)
    return StudyConfig(**fields)


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
        return pretrained.run(_pretrained_args(args))
    if args.regenerate is not None:
        from .doctables import regenerate_run

        return regenerate_run(args.regenerate)
    if args.compare is not None:
        from .compare import compare_run

        return compare_run(args.compare)
    if args.from_file is not None:
        from .results import read_results
        from .tables import format_table

        print(format_table(read_results(args.from_file, "--from"), markdown=args.markdown))
        return 0
    if args.markdown:
        raise ValueError("--markdown formats a finished study: use it with --from RESULTS")
    from .extrapolate import STUDY_ARTIFACTS, run_study
    from .runs import RunFolder
    from .tables import format_table

    config = study_config(args)
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
        env = results.environment
        print(
            f"\nwall time {results.wall_s:.0f} s on {env['device']} ({env['workers']} worker(s) x "
            f"{env['threads']} thread(s), {env['world_size']} DDP process(es)); load average at start/end "
            f"{env.get('load_avg_start', ['?'])[0]:.2f}/{env.get('load_avg_end', ['?'])[0]:.2f}"
        )
        if args.out is not None:
            out = Path(args.out)
            print(f"wrote {out / 'results.json'} and {out / 'extrapolation.png'} (and .svg)")
    return 0


# ---------------------------------------------------------------------------------------- train
def train_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``posenc train``: where and how it runs, then one flag per field of the run
    (:class:`~posenc.lab.config.RunConfig`) and its parts."""
    from .config import RunConfig

    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="folder for checkpoint/ (resumable), model/ (the trained model), train.json",
    )
    _run_flags(p)
    _add_config_flags(p, RunConfig, {}, {})


def run_config(args: argparse.Namespace):
    """The :class:`~posenc.lab.config.RunConfig` the flags describe."""
    from .config import RunConfig

    return RunConfig(**_given(args, RunConfig))


#: What ``posenc train`` writes into its folder (their presence means the folder holds a run),
#: and the single files earlier versions wrote instead of the two folders (``--resume`` converts
#: the checkpoint).
TRAIN_ARTIFACTS = ("checkpoint", "model", "train.json", "checkpoint.safetensors", "model.safetensors")


def train_run(args: argparse.Namespace) -> int:
    """Run ``posenc train``: one byte-level LM, checkpointed and resumable."""
    from .distributed import is_lock_holder
    from .runs import RunFolder, writing_for

    run = run_config(args)
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
            _train_one(args, run, folder.path, info, device, threads)
    finally:
        _teardown()
    return 0


def _train_one(args, run, out: Path, info, device, threads) -> None:
    import dataclasses

    from ..model import TransformerLM, save_model
    from .runs import write_json
    from .train import seed_everything, train

    corpus = run.data.load()
    tc, mc = run.train.within_steps(), run.model
    seed_everything(tc.seed)
    model = TransformerLM(mc).to(device)
    t0 = time.perf_counter()
    result = train(
        model,
        corpus.train_bytes,
        tc,
        device=device,
        checkpoint=out / "checkpoint",
        resume=args.resume,
        progress=False if args.no_progress else None,
        desc=run.label,
        # a resume on other data is refused
        data_id=f"{corpus.info.sha256}:split{run.data.split_seed}"
        + ("" if run.data.val_fraction == 0.1 else f":val{run.data.val_fraction}"),
    )
    if not info.is_main:
        return
    save_model(model, out / "model")
    write_json(
        out / "train.json",
        {
            "run_config": run.to_dict(),
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
        f"{run.label}: steps {result.start_step}->{result.end_step} in {result.wall_s:.1f} s "
        f"({result.tokens_per_s:,.0f} tok/s, {info.world_size} process(es)), last loss {last:.4f}; "
        f"wrote {out / 'model'}"
    )
