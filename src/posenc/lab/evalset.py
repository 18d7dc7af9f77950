"""The evaluation set: windows sampled across every validation document, the same for every model.

A model is scored on ``K`` windows that all end at fixed **anchors** ``a_1 .. a_K`` in the
validation bytes. At evaluation length ``E``, window ``i`` is ``tokens[a_i - E : a_i + 1]``
(``E`` inputs, ``E`` next-byte targets), so every length scores the same last targets
``tokens[a_i - S + 1 .. a_i]`` of each window: those are the bytes the paired comparison and the
sliding-window score use (:mod:`posenc.lab.evaluate`).

The anchors are stratified over the validation bytes: the range where the longest window fits is
cut into ``K`` equal strata and one anchor is drawn uniformly in each, with a generator seeded by
the **split seed** (never the training seed, so seeds vary the model and not the test set). Every
part of the validation text is therefore represented in proportion to its size, instead of a
prefix that falls inside one or two files.

Legend: ``K`` windows, ``E`` evaluation length, ``E_max`` the longest, ``n`` validation bytes.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .._validate import check_int

__all__ = ["EvalSet", "sample_eval_set"]


@dataclass(frozen=True)
class EvalSet:
    """Fixed evaluation windows over a token stream.

    Attributes:
        tokens: ``[n]`` integer tokens (uint8 bytes).
        anchors: ``[K]`` int64, the index of each window's last target; ``anchors >= E_max``.
        documents: the document each anchor falls in (``[K]`` names), for the record.
    """

    tokens: torch.Tensor
    anchors: torch.Tensor
    documents: tuple[str, ...] = field(default=())

    def windows(self, length: int, rows: slice = slice(None)) -> torch.Tensor:
        """``[k, E + 1]`` int64: window ``i`` is ``tokens[a_i - E : a_i + 1]``; inputs are
        ``[:, :-1]``, targets ``[:, 1:]`` (the last target of every window is ``tokens[a_i]``)."""
        a = self.anchors[rows]  # [k]
        if length > int(self.anchors.min()):
            raise ValueError(
                f"length {length} is longer than the evaluation set allows ({int(self.anchors.min())}); "
                "sample it with a max_len of at least the longest evaluation length"
            )
        index = a[:, None] + torch.arange(-length, 1)  # [k, 1] + [E + 1] -> [k, E + 1]
        return self.tokens[index].long()

    def record(self) -> dict:
        """What ``results.json`` keeps: how many windows, which documents and how often."""
        counts = Counter(self.documents)
        return {
            "windows": int(self.anchors.numel()),
            "anchors": self.anchors.tolist(),
            "n_documents": len(counts),
            "documents": dict(counts.most_common()),
            "largest_document_share": max(counts.values()) / len(self.documents) if counts else None,
        }


def sample_eval_set(
    tokens: torch.Tensor,
    n_windows: int,
    max_len: int,
    seed: int,
    *,
    doc_names: Sequence[str] = (),
    doc_starts: Sequence[int] = (),
) -> EvalSet:
    """Sample ``K = n_windows`` anchors, one per equal stratum of ``[max_len, n - 1]``.

    Args:
        tokens: ``[n]`` integer tokens (the validation bytes).
        n_windows: ``K``.
        max_len: ``E_max``, the longest evaluation length (every window must fit before its anchor).
        seed: the split seed.
        doc_names, doc_starts: each document's name and first token index (increasing), to record
            which documents the anchors fall in; empty = unnamed.

    Returns:
        an :class:`EvalSet` with anchors sorted ascending.

    Raises:
        ValueError: fewer tokens than ``max_len + n_windows``.
    """
    check_int(n_windows, "n_windows")
    check_int(max_len, "max_len")
    check_int(seed, "seed", minimum=0)
    n = int(tokens.shape[0])
    span = n - max_len  # anchors in [max_len, n - 1]: `span` candidates
    if span < n_windows:
        raise ValueError(
            f"the validation data has {n:,} tokens: too few for {n_windows} windows of up to {max_len} "
            f"tokens (needs at least {max_len + n_windows:,}); use fewer eval windows, shorter eval "
            "lengths or a larger corpus"
        )
    g = torch.Generator().manual_seed(seed)
    edges = torch.linspace(0, span, n_windows + 1, dtype=torch.float64).floor().long()  # [K + 1]
    widths = (edges[1:] - edges[:-1]).clamp_min(1)  # [K], every stratum non-empty since span >= K
    offsets = (torch.rand(n_windows, generator=g, dtype=torch.float64) * widths).long()  # [K]
    anchors = max_len + edges[:-1] + offsets.minimum(widths - 1)  # [K]
    names: tuple[str, ...] = ()
    if doc_names:
        starts = list(doc_starts)
        names = tuple(doc_names[max(0, bisect.bisect_right(starts, int(a)) - 1)] for a in anchors)
    return EvalSet(tokens=tokens, anchors=anchors, documents=names)
