"""Learnable schemes as training leaves them, next to their initialisation.

A learned position table, T5's bias or Shaw's vectors at initialisation are random numbers: what
they *learn* is what a reader wants to see. The report therefore trains one small byte-level
language model per learnable scheme with posenc's lab (:func:`~posenc.lab.extrapolate.run_study`,
~1 minute on 2 cores), or reads the checkpoints of a study a user ran (``posenc extrapolate
--out DIR``), and pairs each trained scheme with the same scheme at the same seed's
initialisation.

Trained models are cached in a folder keyed by everything that decides them (the study's
configuration and the posenc version), so a second report reuses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..base import PositionalScheme
from .kernel import Probe, make_probe

__all__ = [
    "REPORT_STUDY",
    "TrainedScheme",
    "default_cache_dir",
    "learnable",
    "read_study",
    "read_study_results",
    "report_study",
    "train_for_report",
]

#: The report's training: a 2-layer, d = 64 byte-level language model per learnable scheme, trained
#: at L = 64 for 200 steps of 32 windows on the first ~1 MB of the Python standard library's source.
#: Training is most of a full build's time; at 200 steps every learnable scheme's trained captions
#: say what they say at 400 (recency or not, neighbours more alike or not), with the kernels' values
#: about half as far from their initialisation (docs/report.md has the comparison).
REPORT_STUDY: dict[str, Any] = {
    "train_len": 64,
    "eval_lens": (64,),
    "steps": 200,
    "batch_size": 32,
    "warmup_steps": 20,
    "d_model": 64,
    "num_layers": 2,
    "num_heads": 4,
    "max_chars": 1_000_000,
    "eval_windows": 8,
    "variants": (),
    "checkpoint_every": 0,
    "seeds": (0,),
}


@dataclass(frozen=True)
class TrainedScheme:
    """One learnable scheme, trained and at initialisation.

    Attributes:
        name: the scheme's registry name.
        initial: the scheme as the model built it (same seed), before any step.
        trained: the scheme after training (layer 0 when each layer has its own).
        steps: optimizer steps trained.
        train_len: ``L``, the training window length (positions past it were never trained).
        final_loss: mean training loss over the last tenth of the steps, nats per byte.
        source: where the checkpoint came from (a study folder).
    """

    name: str
    initial: Probe
    trained: Probe
    steps: int
    train_len: int
    final_loss: float
    source: str


def learnable(probes: Sequence[Probe]) -> list[str]:
    """Names of the probes whose scheme has trainable parameters and encodes token sequences (the
    lab trains language models on 1-D positions)."""
    return [p.name for p in probes if p.trainable and p.scheme.position_dims == 1]


def report_study(schemes: Sequence[str], **overrides: Any):
    """The :class:`~posenc.lab.config.StudyConfig` the report trains: :data:`REPORT_STUDY`, with
    ``overrides`` (any study field, e.g. ``steps``)."""
    from ..lab.config import StudyConfig

    return StudyConfig(schemes=tuple(schemes), **{**REPORT_STUDY, **overrides})


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/posenc/report`` (``~/.cache/posenc/report`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "posenc" / "report"


def _study_key(config) -> str:
    """A short hash of what decides the trained weights: the study, posenc's version and defaults."""
    from ..model.saving import FORMAT_VERSION

    text = json.dumps(
        {"config": config.to_dict(), "posenc": __version__, "defaults": str(FORMAT_VERSION)},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def train_for_report(
    schemes: Sequence[str],
    cache_dir: str | os.PathLike,
    *,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
    workers: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[TrainedScheme]:
    """Train (or reuse from ``cache_dir``) one small model per scheme of ``schemes``.

    Args:
        schemes: learnable scheme names (:func:`learnable`).
        cache_dir: the cache folder; the study goes into ``cache_dir/study-KEY``.
        progress: progress bars (``None`` = when stderr is a terminal).
        log: where one line per finished model goes (``None`` = silent).
        workers: processes training at once (default: up to 2).
        overrides: study fields replacing :data:`REPORT_STUDY`'s (e.g. fewer ``steps``).
    """
    from ..lab.extrapolate import run_study

    if not schemes:
        return []
    config = report_study(schemes, **(overrides or {}))
    out = Path(cache_dir) / f"study-{_study_key(config)}"
    workers = min(2, os.cpu_count() or 1, len(schemes)) if workers is None else workers
    out.mkdir(parents=True, exist_ok=True)
    with _cache_lock(out / ".report-training.lock", log):  # inside: the cache holds study folders only
        run_study(config, out=out, resume=True, progress=progress, log=log, workers=workers)
    return read_study(out, schemes)


@contextlib.contextmanager
def _cache_lock(path: Path, log: Callable[[str], None] | None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created, never deleted) while the cache is trained.

    Two reports sharing a cache take turns: the second waits for the first's training, then
    resumes the same study folder and trains only what is still missing (usually nothing). The
    lock is released when its holder exits, however it exits (an OS file lock, not a marker file).
    Where ``fcntl`` is missing (Windows), there is no lock and the study folder's own lock refuses
    the second writer instead.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    # opened without following a link planted at its name (the lock file holds nothing)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as err:
        raise ValueError(
            f"the report cache's lock {str(path)!r} cannot be opened ({err.strerror}): a link or an "
            "unwritable place; remove it or pass another --cache-dir"
        ) from None
    with os.fdopen(fd, "r+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is not None:
                log("another posenc report is training the same models in this cache; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _first_scheme(model: torch.nn.Module) -> PositionalScheme:
    """The model's first positional scheme (layer 0's, or the input layer's), found by type.

    Raises:
        ValueError: the model holds none (a scheme without hooks, such as NoPE).
    """
    found = next((m for m in model.modules() if isinstance(m, PositionalScheme)), None)
    if found is None:
        raise ValueError(f"{type(model).__name__} holds no positional scheme module: nothing trained to show")
    return found


def _pair(path: Path, name: str, seed: int) -> tuple[Probe, Probe]:
    """The trained scheme of checkpoint ``path`` and the same model's scheme at initialisation."""
    from ..lab.checkpoint import load_trained_model
    from ..lab.train import seed_everything

    model = load_trained_model(path)
    context = model.config.scheme_context(True)  # the lab trains causal language models
    with torch.random.fork_rng(devices=[]):  # the same initialisation the lab drew, RNG untouched
        seed_everything(seed)
        initial = type(model)(model.config)
    probes = []
    for m in (initial, model):
        scheme = _first_scheme(m).eval()
        probe = make_probe(scheme, context)
        probes.append(dataclasses.replace(probe, name=name))
    return probes[0], probes[1]


def _learnable_names(names: Sequence[str]) -> list[str]:
    """The names among ``names`` whose scheme has trainable parameters (by building each one; a
    name this process does not know is left out)."""
    from ..registry import schemes as registered

    known = set(registered())
    return learnable([make_probe(n) for n in names if n in known])


def read_study_results(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``results.json`` of a study folder, checked
    (:func:`~posenc.analysis.default_study.check_study`).

    Raises:
        ValueError: one line naming the file and the fix: no such file, not JSON, or a field the
            report reads is missing or malformed.
    """
    from .default_study import check_study

    results_file = Path(folder) / "results.json"
    if not results_file.is_file():
        raise ValueError(
            f"--study {str(folder)!r} holds no results.json: give the --out folder of a finished "
            "`posenc extrapolate` run"
        )
    try:
        results = json.loads(results_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{results_file}: not a JSON file ({err}); give the results.json of a finished "
            "`posenc extrapolate` run"
        ) from None
    return check_study(results, str(results_file))


def read_study(folder: str | os.PathLike, schemes: Sequence[str] | None = None) -> list[TrainedScheme]:
    """The learnable schemes of a finished study in ``folder`` (its first seed's checkpoints).

    Args:
        folder: a ``posenc extrapolate --out`` folder (``results.json`` and ``checkpoints/``).
        schemes: only these (default: every scheme of the study with trainable parameters).

    Raises:
        ValueError: no ``results.json`` in ``folder``, or a requested scheme has no checkpoint.
    """
    folder = Path(folder)
    results = read_study_results(folder)
    cfg = results["config"]
    if not cfg["seeds"]:
        return []
    seed = cfg["seeds"][0]
    cells = results.get("cells") if isinstance(results.get("cells"), list) else []
    losses = {c.get("cell"): c.get("train") or {} for c in cells if isinstance(c, dict)}
    known = cfg.get("schemes") if isinstance(cfg.get("schemes"), list) else []
    out = []
    for name in schemes if schemes is not None else _learnable_names([str(n) for n in known]):
        path = folder / "checkpoints" / f"{name}-seed{seed}"
        if not path.is_dir():
            if schemes is not None:
                raise ValueError(f"study {str(folder)!r} has no checkpoint for {name!r} ({path.name})")
            continue
        initial, trained = _pair(path, name, seed)
        if not trained.trainable:
            continue
        train = losses.get(f"{name}-seed{seed}", {})
        out.append(
            TrainedScheme(
                name=name,
                initial=initial,
                trained=trained,
                steps=int(train.get("steps", cfg["steps"])),
                train_len=int(cfg["train_len"]),
                final_loss=float(train.get("final_loss_nats", float("nan"))),
                source=str(folder),
            )
        )
    return out
