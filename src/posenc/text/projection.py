"""The learned token space seen in 2D: PCA and t-SNE of an embedding matrix.

:func:`project_2d` maps the rows of a ``[V, d]`` weight to ``[V, 2]`` by a method from
:data:`PROJECTIONS`; :func:`plot_embedding_space` draws the ``top_k`` most frequent tokens (or the
first ``top_k`` ids) and labels them.

* ``pca``: the two leading principal directions of the centred rows (an SVD in float64); the
  axes are oriented so that the largest |coordinate| on each is positive (the SVD's sign is
  arbitrary).
* ``tsne``: scikit-learn's t-SNE (van der Maaten & Hinton 2008) with PCA initialisation and a
  fixed seed; it keeps neighbourhoods, not distances, so only clusters are meaningful.

Caveat: at initialisation an embedding matrix is random, so neither picture shows structure; the
clusters often described ("dog", "puppy", ...) appear only after training.

Legend: ``V`` vocabulary size, ``d`` model width, ``k`` tokens shown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .._validate import check_int

__all__ = ["PROJECTIONS", "pca_2d", "plot_embedding_space", "project_2d", "tsne_2d"]


def pca_2d(weight: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``[V, d]`` -> ``[V, 2]`` float64: coordinates on the two leading principal directions."""
    x = weight.detach().double()
    x = x - x.mean(0, keepdim=True)  # centre the rows
    _, _, vh = torch.linalg.svd(x, full_matrices=False)  # vh [min(V, d), d]: principal directions
    coords = x @ vh[:2].T  # [V, d] @ [d, 2] -> [V, 2]
    flip = torch.sign(coords.gather(0, coords.abs().argmax(0, keepdim=True)))  # [1, 2]
    return coords * torch.where(flip == 0, 1.0, flip)


def tsne_2d(weight: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``[V, d]`` -> ``[V, 2]`` float64 by scikit-learn's t-SNE (perplexity ``min(30, (V-1)/3)``)."""
    from sklearn.manifold import TSNE

    x = weight.detach().double().cpu().numpy()
    perplexity = max(1.0, min(30.0, (x.shape[0] - 1) / 3))
    out = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x)
    return torch.from_numpy(out).double()


#: method name -> ``(weight [V, d], seed) -> [V, 2]``.
PROJECTIONS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {"pca": pca_2d, "tsne": tsne_2d}


def _check_weight(weight: torch.Tensor, minimum: int) -> None:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a [V, d] tensor (an embedding matrix), got {shape}")
    if weight.shape[0] < minimum or weight.shape[1] < 2:
        raise ValueError(
            f"weight {tuple(weight.shape)} is too small to project: need at least {minimum} "
            "rows and 2 columns"
        )
    if not weight.is_floating_point() or not torch.isfinite(weight).all():
        raise ValueError("weight must be a finite floating-point tensor")


def project_2d(weight: torch.Tensor, method: str = "pca", seed: int = 0) -> torch.Tensor:
    """Project the rows of ``weight`` ``[V, d]`` to ``[V, 2]`` with a method from :data:`PROJECTIONS`."""
    if method not in PROJECTIONS:
        raise ValueError(f"unknown projection method {method!r}; valid: {', '.join(PROJECTIONS)}")
    _check_weight(weight, 3 if method == "pca" else 5)
    return PROJECTIONS[method](weight, seed)


def plot_embedding_space(
    weight: torch.Tensor,
    labels: Sequence[str],
    out_path: str | Path,
    method: str = "pca",
    top_k: int = 300,
    *,
    counts: Sequence[int] | torch.Tensor | None = None,
    annotate: int = 60,
    seed: int = 0,
) -> Path:
    """Draw the token embedding space in 2D and write it to ``out_path`` (format from the suffix).

    Args:
        weight: ``[V, d]`` embedding matrix (e.g. ``model.embedding.token.weight``).
        labels: ``V`` token strings (``tokenizer.id_to_token(i)``).
        out_path: the figure file.
        method: ``"pca"`` or ``"tsne"``.
        top_k: project only the ``k`` most frequent tokens (by ``counts``; without counts, the
            first ``k`` ids), which keeps t-SNE fast and the picture readable.
        counts: ``[V]`` token frequencies (e.g. ``torch.bincount(ids, minlength=V)``).
        annotate: write the label of this many of the shown tokens (the most frequent).
        seed: seed of t-SNE.

    Returns:
        ``out_path`` as a Path.
    """
    _check_weight(weight, 3)
    V = weight.shape[0]
    if len(labels) != V:
        raise ValueError(f"labels has {len(labels)} entries but weight has {V} rows; one label per token")
    check_int(top_k, "top_k", minimum=3)
    check_int(annotate, "annotate", minimum=0)
    if counts is not None:
        counts = torch.as_tensor(counts)
        if counts.shape != (V,):
            raise ValueError(f"counts must have shape [V]=({V},), got {tuple(counts.shape)}")
        order = torch.argsort(counts, descending=True, stable=True)
    else:
        order = torch.arange(V)
    chosen = order[: min(top_k, V)]  # [k] ids, most frequent first
    coords = project_2d(weight[chosen], method, seed)  # [k, 2]
    out_path = Path(out_path)
    if not out_path.parent.exists():
        raise ValueError(f"folder {str(out_path.parent)!r} does not exist; create it first")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 7))
    ax.scatter(coords[:, 0].numpy(), coords[:, 1].numpy(), s=8, alpha=0.6)
    for j in range(min(annotate, len(chosen))):
        ax.annotate(labels[int(chosen[j])], (float(coords[j, 0]), float(coords[j, 1])), fontsize=7)
    which = "most frequent" if counts is not None else "first"
    ax.set_title(f"token embeddings [{V}, {weight.shape[1]}]: {method.upper()} of the {len(chosen)} {which}")
    ax.set_xlabel(f"{method} 1")
    ax.set_ylabel(f"{method} 2")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
