"""Files in the layouts earlier versions of posenc wrote, built here (never kept in git), for the
tests of posenc.model.legacy and of the loaders that read them:

- ``write_single_file``: a model as one ``.safetensors`` file, the class and config in its metadata
  (``posenc_defaults`` "2", or none at all for a file from before format version 2);
- ``write_old_folder``: a folder whose ``config.json`` has ``posenc_defaults`` and no
  ``posenc_format``, its ``model.safetensors`` the single file above;
- ``write_single_file_checkpoint``: a training checkpoint as one ``.safetensors`` file (format
  ``posenc-checkpoint-1``): the weights under ``model.`` (tied ones once, their other names in
  ``aliases``), the AdamW state, the RNG states and the loss history.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from torch import nn


def write_single_file(model: nn.Module, path: Path, defaults: str | None = "2") -> Path:
    """``model`` in the single-file layout at ``path``; ``defaults=None``: a file from before
    format version 2 (no ``posenc_defaults`` mark)."""
    metadata = {
        "format": "pt",
        "posenc_model": type(model).__name__,
        "posenc_config": json.dumps(model.config.to_dict()),
    }
    if defaults is not None:
        metadata["posenc_defaults"] = defaults
    if hasattr(model, "cross_attention"):
        metadata["cross_attention"] = str(model.cross_attention)
    safetensors.torch.save_model(model, str(path), metadata=metadata)
    return path


def write_old_folder(model: nn.Module, folder: Path, defaults: str | None = "2") -> Path:
    """``model`` in the folder layout of before ``posenc_format``: ``config.json`` (class,
    ``posenc_defaults``, config) + the single file as ``model.safetensors``."""
    folder.mkdir(parents=True, exist_ok=True)
    write_single_file(model, folder / "model.safetensors", defaults)
    config = {"posenc_model": type(model).__name__, "config": model.config.to_dict()}
    if defaults is not None:
        config["posenc_defaults"] = defaults
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_single_file_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    path: Path,
    *,
    step: int,
    train_config: dict,
    losses: list[float],
    data_id: str = "",
    run_id: str = "",
) -> Path:
    """A training checkpoint of ``model`` and ``optimizer`` at ``step`` in the single-file layout."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    tensors = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items() if k not in aliases}
    opt = optimizer.state_dict()
    scalars: dict[str, dict] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().clone()
            else:
                scalars.setdefault(str(index), {})[key] = value
    tensors["rng.torch"] = torch.get_rng_state()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(keys.astype(np.int64))
    tensors["history.loss"] = torch.tensor(losses, dtype=torch.float64)
    py = random.getstate()
    rng = {"numpy": [kind, int(pos), int(has_gauss), float(cached)], "python": [py[0], list(py[1]), py[2]]}
    metadata = {
        "format": "pt",
        "posenc_checkpoint": "posenc-checkpoint-1",
        "step": str(step),
        "elapsed_s": "1.0",
        "train_config": json.dumps(train_config),
        "model_config": json.dumps(model.config.to_dict()),
        "model_class": type(model).__name__,
        "aliases": json.dumps(aliases),
        "optimizer_groups": json.dumps(opt["param_groups"]),
        "optimizer_scalars": json.dumps(scalars),
        "rng": json.dumps(rng),
        "torch_version": torch.__version__,
        "data_id": data_id,
        "posenc_defaults": "2",
        "run_id": run_id,
    }
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)
    return path
