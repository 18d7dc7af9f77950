"""Tests of posenc.text.projection: PCA against scikit-learn, t-SNE clusters, the figure, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.text.projection import PROJECTIONS, pca_2d, plot_embedding_space, project_2d


def _clusters(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three well separated clusters of 20 tokens in d=16: weight [60, 16], cluster id [60]."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, 16, generator=g) * 10
    which = torch.arange(60) // 20
    return centres[which] + torch.randn(60, 16, generator=g) * 0.5, which


def test_pca_matches_sklearn():
    from sklearn.decomposition import PCA

    w, _ = _clusters()
    ours = project_2d(w, "pca")
    ref = torch.from_numpy(PCA(n_components=2).fit_transform(w.double().numpy()))
    for j in range(2):  # same axes up to sign
        sign = torch.sign((ours[:, j] * ref[:, j]).sum())
        torch.testing.assert_close(ours[:, j], sign * ref[:, j], atol=1e-8, rtol=1e-8)


@settings(deadline=None, max_examples=30)
@given(v=st.integers(3, 40), d=st.integers(2, 12), seed=st.integers(0, 1000))
def test_pca_properties(v, d, seed):
    w = torch.randn(v, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    c = pca_2d(w)
    assert c.shape == (v, 2)
    torch.testing.assert_close(c.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-9, rtol=0)
    var = c.var(0)
    assert var[0] >= var[1] - 1e-9  # first axis explains the most variance
    # variance of the first axis = largest eigenvalue of the covariance
    eig = torch.linalg.eigvalsh(torch.cov(w.T).reshape(d, d))  # ascending
    assert abs(float(var[0]) - float(eig[-1])) < 1e-8 * max(1, float(var[0]))
    # a rotation of the input space does not change the picture (up to axis signs); the axes are
    # only defined when the leading eigenvalues are distinct, so check it only then
    gaps = eig[-3:].diff() if d > 2 else eig.diff()
    if float(gaps.min()) > 1e-3 * float(eig[-1]):
        g = torch.Generator().manual_seed(seed + 1)
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))  # a random rotation
        torch.testing.assert_close(pca_2d(w @ q).abs(), c.abs(), atol=1e-7, rtol=1e-7)


def test_tsne_keeps_clusters():
    w, which = _clusters()
    c = project_2d(w, "tsne", seed=0)
    centres = torch.stack([c[which == k].mean(0) for k in range(3)])
    spread = max(float((c[which == k] - centres[k]).norm(dim=-1).max()) for k in range(3))
    gap = float(torch.cdist(centres, centres)[~torch.eye(3, dtype=torch.bool)].min())
    assert gap > 2 * spread  # every cluster stays apart from the others
    assert torch.equal(c, project_2d(w, "tsne", seed=0))  # deterministic for a seed


def test_plot(tmp_path):
    w, _ = _clusters()
    labels = [f"tok{i}" for i in range(60)]
    counts = torch.arange(60)
    out = plot_embedding_space(w, labels, tmp_path / "space.png", method="pca", top_k=30, counts=counts)
    assert out.read_bytes()[:4] == b"\x89PNG"
    out = plot_embedding_space(w, labels, tmp_path / "space.svg", method="pca", top_k=40)
    assert "<svg" in out.read_text()[:500]


def test_errors(tmp_path):
    w, _ = _clusters()
    labels = [str(i) for i in range(60)]
    assert set(PROJECTIONS) == {"pca", "tsne"}
    with pytest.raises(ValueError, match="unknown projection method 'umap'; valid: pca, tsne"):
        project_2d(w, "umap")
    with pytest.raises(ValueError, match=r"weight must be a \[V, d\] tensor .* got \(60,\)"):
        project_2d(w[:, 0])
    with pytest.raises(ValueError, match="too small to project"):
        project_2d(w[:2])
    with pytest.raises(ValueError, match="finite floating-point"):
        project_2d(torch.full((5, 3), float("nan")))
    with pytest.raises(ValueError, match="labels has 3 entries but weight has 60 rows"):
        plot_embedding_space(w, labels[:3], tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"counts must have shape \[V\]=\(60,\), got \(5,\)"):
        plot_embedding_space(w, labels, tmp_path / "x.png", counts=[1] * 5)
    with pytest.raises(ValueError, match="does not exist; create it first"):
        plot_embedding_space(w, labels, tmp_path / "nope" / "x.png")
    with pytest.raises(ValueError, match="top_k must be >= 3"):
        plot_embedding_space(w, labels, tmp_path / "x.png", top_k=1)
