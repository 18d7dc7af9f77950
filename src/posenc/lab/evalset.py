"""The evaluation set: windows sampled across many validation documents, the same for every model.

A model is scored on ``K`` windows that all end at fixed **anchors** ``a_1 .. a_K`` in the
validation bytes. At evaluation length ``E``, window ``i`` is ``tokens[a_i - E : a_i + 1]``
(``E`` inputs, ``E`` next-byte targets), so every length scores the same last targets
``tokens[a_i - S + 1 .. a_i]`` of each window: those are the bytes the paired comparison and the
sliding-window score use (:mod:`posenc.lab.evaluate`).

How the anchors are chosen (each rule makes the set able to carry a claim):

* **Stratified candidates.** The range where the longest window fits is cut into ``C`` equal
  strata and one candidate anchor is drawn uniformly in each, with a generator seeded by the
  **split seed** (never the training seed, so seeds vary the model and not the test set). With
  documents or training bytes given, ``C = 4 K`` candidates, so that the rules below still leave
  ``K``; otherwise ``C = K`` and every candidate is kept.
* **Near-duplicates of the training bytes removed.** A candidate is dropped when at least
  :data:`DUPLICATE_SHARE` of its scored targets, each read with the ``n - 1`` bytes before it
  (a shingle of :data:`SHINGLE` bytes), occur in the training bytes: such a target can be recited
  from memory rather than predicted, and near-identical files (codecs, generated tables) are
  common in a code corpus. Shingles are compared by a 64-bit polynomial hash
  (:func:`shingle_hashes`); the number found and dropped is recorded. A corpus too small to
  leave ``K`` windows keeps its least-overlapping near-duplicates, and the record counts them
  (``kept``).
* **No document dominates.** Candidates are taken in a seeded random order and a document's are
  refused once it holds ``cap`` windows: ``cap`` is the smallest count, at least
  ``max_document_share * K`` (default :data:`MAX_DOCUMENT_SHARE`), that still lets ``K`` windows
  be chosen. The windows of one document are not independent, so intervals resample documents
  (:func:`~posenc.lab.stats.paired_bootstrap`), and an interval is only as narrow as the number of
  documents allows.

Legend: ``K`` windows, ``C`` candidates, ``E`` evaluation length, ``E_max`` the longest, ``n``
validation bytes, ``S`` scored targets per window, ``D`` documents.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .._validate import check_int

__all__ = [
    "DUPLICATE_SHARE",
    "MAX_DOCUMENT_SHARE",
    "SHINGLE",
    "EvalSet",
    "TrainingShingles",
    "sample_eval_set",
    "shingle_hashes",
]

#: Bytes per shingle: a target byte with the 31 bytes before it. Long enough that ordinary code
#: idioms (``"        return self."`` is 20 bytes) rarely make a whole window look copied.
SHINGLE = 32
#: A candidate window whose scored targets have at least this share of shingles in the training
#: bytes is a near-duplicate and is dropped.
DUPLICATE_SHARE = 0.5
#: Default largest share of the windows one document may hold: 3% puts the windows of a
#: 256-window set in at least 34 documents (the cluster bootstrap needs many documents).
MAX_DOCUMENT_SHARE = 0.03
#: How the lab's intervals on these windows are made, for the record (:mod:`posenc.lab.stats`).
INTERVALS = (
    "95% percentile bootstrap, 2000 resamples of the documents (clusters of windows, "
    "window_documents); across seeds, seeds and documents resampled independently, so the interval "
    "covers both; each interval's 'over' names what it covers; numbers without per-window values "
    "take Student's t over seeds"
)
#: Candidates drawn per window kept when duplicates or documents are checked.
OVERSAMPLE = 4

_HASH_BASE = np.uint64(0x100000001B3)  # the FNV-1 64-bit prime: odd, so the hash mixes every byte


def shingle_hashes(tokens: torch.Tensor | np.ndarray, n: int = SHINGLE) -> np.ndarray:
    """64-bit polynomial hashes of every ``n``-byte shingle of ``tokens``.

    Args:
        tokens: ``[m]`` integer tokens (bytes).
        n: shingle length.

    Returns:
        ``[max(0, m - n + 1)]`` uint64: entry ``i`` hashes ``tokens[i : i + n]`` (arithmetic
        modulo 2^64; equal shingles always get equal hashes).
    """
    check_int(n, "n")
    x = np.asarray(tokens.numpy() if isinstance(tokens, torch.Tensor) else tokens).astype(np.uint64)
    count = x.shape[0] - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)

    # h_w[i] = sum_j (x[i + j] + 1) * base^(w - 1 - j) over a span of w bytes, modulo 2^64. Spans
    # join: h_(a+b)[i] = h_a[i] * base^b + h_b[i + a]; spans of 1, 2, 4, ... are built by doubling
    # and joined along the binary digits of n (2 log2(n) passes instead of n).
    def join(a: np.ndarray, wa: int, b: np.ndarray, wb: int) -> np.ndarray:
        m = x.shape[0] - (wa + wb) + 1
        return a[:m] * _HASH_BASE ** np.uint64(wb) + b[wa : wa + m]

    with np.errstate(over="ignore"):
        powers, w = {1: x + np.uint64(1)}, 1
        while 2 * w <= n:
            powers[2 * w] = join(powers[w], w, powers[w], w)
            w *= 2
        h, width = None, 0
        for w in sorted(powers, reverse=True):
            if n & w:
                h, width = (powers[w], w) if h is None else (join(h, width, powers[w], w), width + w)
    return h[:count]


class TrainingShingles:
    """The set of shingle hashes of the training bytes, to test evaluation bytes against.

    Args:
        train_tokens: ``[m]`` the training bytes.
        n: shingle length (:data:`SHINGLE`).
    """

    def __init__(self, train_tokens: torch.Tensor, n: int = SHINGLE) -> None:
        self.n = n
        self.hashes = np.sort(shingle_hashes(train_tokens, n))  # [m - n + 1] sorted, for searchsorted

    def share(self, tokens: torch.Tensor, anchors: torch.Tensor, score_len: int) -> torch.Tensor:
        """Per anchor, the share of its ``score_len`` scored targets whose shingle (the target and
        the ``n - 1`` bytes before it) occurs in the training bytes: ``[k]`` float64."""
        check_int(score_len, "score_len")
        h = shingle_hashes(tokens, self.n)  # [m - n + 1]: entry i ends at byte i + n - 1
        ends = anchors[:, None] - torch.arange(score_len)  # [k, S] the scored targets
        index = (ends - (self.n - 1)).clamp_min(0).numpy()  # the shingle ending at each target
        found = _contains(self.hashes, h[index])  # [k, S]
        found &= (ends >= self.n - 1).numpy()  # a target without a full shingle counts as new
        return torch.from_numpy(found.mean(axis=1, dtype=np.float64))


def _contains(sorted_values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    if sorted_values.size == 0:
        return np.zeros(queries.shape, dtype=bool)
    at = np.searchsorted(sorted_values, queries).clip(max=sorted_values.size - 1)
    return sorted_values[at] == queries


@dataclass(frozen=True)
class EvalSet:
    """Fixed evaluation windows over a token stream.

    Attributes:
        tokens: ``[n]`` integer tokens (uint8 bytes).
        anchors: ``[K]`` int64, the index of each window's last target; ``anchors >= E_max``.
        documents: the document each anchor falls in (``[K]`` names); empty = unnamed.
        selection: how the windows were chosen (candidates, near-duplicates dropped, the document
            cap), for the record.
    """

    tokens: torch.Tensor
    anchors: torch.Tensor
    documents: tuple[str, ...] = field(default=())
    selection: dict = field(default_factory=dict)

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

    @property
    def clusters(self) -> list[int]:
        """``[K]`` the index of each window's document (first appearance order): the unit the
        bootstrap resamples. Without document names every window is its own cluster."""
        if not self.documents:
            return list(range(int(self.anchors.numel())))
        ids: dict[str, int] = {}
        return [ids.setdefault(name, len(ids)) for name in self.documents]

    def record(self) -> dict:
        """What ``results.json`` keeps: how many windows, which documents and how often, how the
        windows were chosen, and each window's document (``window_documents``, for the bootstrap)."""
        counts = Counter(self.documents)
        return {
            "windows": int(self.anchors.numel()),
            "anchors": self.anchors.tolist(),
            "n_documents": len(counts) if counts else int(self.anchors.numel()),
            "documents": dict(counts.most_common()),
            "largest_document_share": max(counts.values()) / len(self.documents) if counts else None,
            "window_documents": self.clusters,
            **self.selection,
            "intervals": INTERVALS,
        }


def _stratified(span: int, count: int, g: torch.Generator) -> torch.Tensor:
    """``[count]`` offsets in ``[0, span)``, one uniform draw in each of ``count`` equal strata."""
    edges = torch.linspace(0, span, count + 1, dtype=torch.float64).floor().long()  # [C + 1]
    widths = (edges[1:] - edges[:-1]).clamp_min(1)  # [C], every stratum non-empty since span >= C
    offsets = (torch.rand(count, generator=g, dtype=torch.float64) * widths).long()  # [C]
    return edges[:-1] + offsets.minimum(widths - 1)


def _document_cap(counts: Sequence[int], k: int, share: float) -> int:
    """The smallest per-document cap, at least ``floor(share * k)`` (and 1), with which documents
    holding ``counts`` candidates can give ``k`` windows."""
    cap = max(1, math.floor(share * k))
    while sum(min(c, cap) for c in counts) < k:
        cap += 1
    return cap


def sample_eval_set(
    tokens: torch.Tensor,
    n_windows: int,
    max_len: int,
    seed: int,
    *,
    doc_names: Sequence[str] = (),
    doc_starts: Sequence[int] = (),
    train_tokens: torch.Tensor | None = None,
    score_len: int | None = None,
    max_document_share: float = MAX_DOCUMENT_SHARE,
) -> EvalSet:
    """Choose ``K = n_windows`` anchors across the documents, near-duplicates of training removed.

    Args:
        tokens: ``[n]`` integer tokens (the validation bytes).
        n_windows: ``K``.
        max_len: ``E_max``, the longest evaluation length (every window must fit before its anchor).
        seed: the split seed.
        doc_names, doc_starts: each document's name and first token index (increasing): the
            documents the cap counts and the bootstrap resamples; empty = unnamed (no cap).
        train_tokens: ``[m]`` the training bytes; given, windows whose scored targets are
            near-duplicates of them are dropped (needs ``score_len``).
        score_len: ``S``, the scored targets per window (checked against the training bytes).
        max_document_share: the share of ``K`` one document may hold, in ``(0, 1]`` (raised only
            as far as the candidates require; the record states the cap used).

    Returns:
        an :class:`EvalSet` with anchors sorted ascending.

    Raises:
        ValueError: fewer tokens than ``max_len + n_windows``.
    """
    check_int(n_windows, "n_windows")
    check_int(max_len, "max_len")
    check_int(seed, "seed", minimum=0)
    if not 0 < max_document_share <= 1:
        raise ValueError(f"max_document_share={max_document_share!r} must be in (0, 1], e.g. 0.03")
    if train_tokens is not None and score_len is None:
        raise ValueError("score_len is needed to check windows against train_tokens (the scored targets)")
    if len(doc_names) != len(doc_starts):
        raise ValueError(f"doc_names ({len(doc_names)}) and doc_starts ({len(doc_starts)}) differ in length")
    n = int(tokens.shape[0])
    span = n - max_len  # anchors in [max_len, n - 1]: `span` candidates
    if span < n_windows:
        raise ValueError(
            f"the validation data has {n:,} tokens: too few for {n_windows} windows of up to {max_len} "
            f"tokens (needs at least {max_len + n_windows:,}); use fewer eval windows, shorter eval "
            "lengths or a larger corpus"
        )
    g = torch.Generator().manual_seed(seed)
    checked = bool(doc_names) or train_tokens is not None
    n_candidates = min(span, OVERSAMPLE * n_windows) if checked else n_windows
    candidates = max_len + _stratified(span, n_candidates, g)  # [C] ascending
    selection: dict = {}
    if train_tokens is not None:
        share = TrainingShingles(train_tokens).share(tokens, candidates, score_len)  # [C]
        keep = share < DUPLICATE_SHARE
        if int(keep.sum()) < n_windows:  # a small corpus: keep the least-overlapping (ties too), say so
            keep = share <= share.sort().values[n_windows - 1]
        selection["near_duplicates"] = {
            "rule": f"dropped when >= {DUPLICATE_SHARE:.0%} of the {score_len} scored targets' "
            f"{SHINGLE}-byte shingles occur in the training bytes",
            "candidates": n_candidates,
            "found": int((share >= DUPLICATE_SHARE).sum()),
            "verbatim": int((share == 1).sum()),
            "dropped": int((~keep).sum()),
            "kept": int((keep & (share >= DUPLICATE_SHARE)).sum()),
        }
        candidates = candidates[keep]
    names: tuple[str, ...] = ()
    if doc_names:
        starts = list(doc_starts)
        where = [doc_names[max(0, bisect.bisect_right(starts, int(a)) - 1)] for a in candidates]
        cap = _document_cap(list(Counter(where).values()), n_windows, max_document_share)
        held: Counter = Counter()
        chosen = []
        for i in torch.randperm(candidates.numel(), generator=g).tolist():  # seeded random order
            if held[where[i]] < cap:
                held[where[i]] += 1
                chosen.append(i)
                if len(chosen) == n_windows:
                    break
        order = torch.tensor(sorted(chosen), dtype=torch.long)
        candidates = candidates[order]
        names = tuple(where[i] for i in order.tolist())
        selection["document_cap"] = cap
    elif candidates.numel() > n_windows:
        pick = torch.randperm(candidates.numel(), generator=g)[:n_windows].sort().values
        candidates = candidates[pick]
    return EvalSet(tokens=tokens, anchors=candidates, documents=names, selection=selection)
