"""Relative position schemes whose bias depends on the query content: Shaw et al. and Transformer-XL.

Both act through the ``score_bias`` hook, which receives the projected queries ``q`` (before any
``rotate`` or ``queries`` hook) and returns the term added to the *scaled* logits (so it divides
by ``sqrt(d_h)``):

* **Shaw et al. 2018**: ``e_ij = q_i . (k_j + a^K_ij) / sqrt(d_h)`` with learned vectors
  ``a^K_ij = w^K_{clip(j - i, -k, k)}`` (``2k + 1`` of them, shared by all heads and layers of
  the attention that owns the scheme, as in the paper). The bias is ``q_i . a^K_ij / sqrt(d_h)``.
  Optional value vectors ``a^V_ij = w^V_{clip(j - i, -k, k)}`` add ``sum_j p_ij a^V_ij`` to each
  head's output (:meth:`ShawRelative.relative_values`, :meth:`ShawRelative.relative_value_output`).
* **Transformer-XL** (Dai et al. 2019, section 3.3): with ``R_{i-j}`` the sinusoidal encoding of
  the distance ``i - j`` and learned ``u, v [h, d_h]`` and ``W_R``::

      A_ij = q_i.k_j (a) + q_i.W_R R_{i-j} (b) + u.k_j (c) + v.W_R R_{i-j} (d)
           = (q_i + u).k_j + (q_i + v).W_R R_{i-j}

  (a)+(c) go through the ``queries`` hook (it returns ``q + u``: the keys are untouched),
  (b)+(d) through ``score_bias``.

Legend: ``b`` batch, ``h`` heads, ``s_q``/``s_k`` query/key lengths, ``d_h`` head width, ``d``
model width (``d_model``), ``k`` Shaw's clipping distance.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._alloc import factory_kwargs
from ._precision import autocast_off
from ._validate import check_choice, check_int, check_positive_float
from .absolute import sinusoidal_table
from .base import PositionalScheme
from .bias import check_relative_positions, relative_positions

__all__ = ["ShawRelative", "TransformerXLRelative"]


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_q(q: object, positions: torch.Tensor, num_heads: int, head_dim: int, scheme: str) -> torch.Tensor:
    if q is None:
        raise ValueError(
            f"{scheme}.score_bias needs the queries: pass q=[b, h, s_q, d_h] "
            "(projected, before rotate/queries)"
        )
    if not isinstance(q, torch.Tensor) or not q.is_floating_point():
        what = q.dtype if isinstance(q, torch.Tensor) else type(q).__name__
        raise TypeError(f"q must be a float tensor [b, h, s_q, d_h], got {what}")
    s_q = positions.shape[-1]
    if q.dim() != 4 or q.shape[1] != num_heads or q.shape[2] != s_q or q.shape[3] != head_dim:
        raise ValueError(
            f"q must have shape [b, {num_heads}, {s_q}, {head_dim}] ([b, num_heads, s_q, head_dim] "
            f"of this scheme and q_positions), got {tuple(q.shape)}"
        )
    return q


def _check_batch(q: torch.Tensor, position_batch: int) -> int:
    """The broadcast batch size of ``q [b, ...]`` and positions ``[b' | 1, ...]``."""
    if q.shape[0] != position_batch and 1 not in (q.shape[0], position_batch):
        raise ValueError(
            f"q has batch size {q.shape[0]} but the positions have {position_batch}; pass [s] positions "
            "or [b, s] positions with the same b as q"
        )
    return max(q.shape[0], position_batch)


# ----------------------------------------------------------------------------------------------
# Shaw et al. 2018
# ----------------------------------------------------------------------------------------------
class ShawRelative(PositionalScheme):
    """Clipped relative position representations (Shaw, Uszkoreit and Vaswani 2018).

    Args:
        head_dim: ``d_h``, the width of each head (and of the relative vectors).
        num_heads: ``h``; the relative vectors are shared by all heads, as in the paper.
        max_relative_position: ``k``, the clipping distance: distances beyond ``k`` share the
            outermost vector (the paper uses 16 and finds little change for ``k >= 2``).
        values: also learn the value vectors ``a^V`` (the paper's full form); the model must
            then add :meth:`relative_value_output` to each head's output.

    Parameters: ``key_embeddings [2k + 1, d_h]`` (row ``r + k`` for ``clip(j - i) = r``) and, with
    ``values``, ``value_embeddings [2k + 1, d_h]``; Xavier-uniform init (tensor2tensor's default).

    Shapes: ``score_bias(q_positions [s_q] | [b, s_q], k_positions [s_k] | [b, s_k],
    q [b, h, s_q, d_h]) -> [b, h, s_q, s_k]`` float32 (float64 for float64 ``q``), computed as
    ``q @ key_embeddings^T`` (``[b, h, s_q, 2k + 1]``) gathered at ``clip(j - i) + k``: no
    ``[s_q, s_k, d_h]`` tensor is built.
    """

    name = "shaw"
    score_bias_uses_query = True
    hooks = ("score_bias",)
    summary = "learned vectors for clipped distances, dotted with the query (Shaw et al. 2018)"

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        max_relative_position: int = 16,
        values: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        factory = factory_kwargs(device, dtype)
        self.head_dim = check_int(head_dim, "head_dim")
        self.num_heads = check_int(num_heads, "num_heads")
        self.max_relative_position = check_int(max_relative_position, "max_relative_position")
        if not isinstance(values, bool):
            raise TypeError(f"values must be a bool, got {type(values).__name__} ({values!r})")
        self.values = values
        n = 2 * self.max_relative_position + 1
        self.key_embeddings = nn.Parameter(torch.empty(n, self.head_dim, **factory))
        self.value_embeddings = nn.Parameter(torch.empty(n, self.head_dim, **factory)) if values else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.key_embeddings)
        if self.value_embeddings is not None:
            nn.init.xavier_uniform_(self.value_embeddings)

    def clipped_index(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Table row of each pair, ``clip(j - i, -k, k) + k``: int64 ``[b | 1, s_q, s_k]``."""
        k = self.max_relative_position
        return relative_positions(q_positions, k_positions).clamp(-k, k) + k

    def score_bias(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, q: torch.Tensor | None = None
    ) -> torch.Tensor:
        q = _check_q(
            q, check_relative_positions(q_positions, "q_positions"), self.num_heads, self.head_dim, "shaw"
        )
        idx = self.clipped_index(q_positions, k_positions)  # [b'|1, s_q, s_k]
        cdt = _compute_dtype(q)
        with autocast_off(q.device):
            # [b, h, s_q, d_h] @ [d_h, 2k+1] -> [b, h, s_q, 2k+1]: q_i . w^K_r for every clipped r
            per_distance = q.to(cdt) @ self.key_embeddings.to(cdt).t() / math.sqrt(self.head_dim)
            batch = _check_batch(q, idx.shape[0])
            shape = (batch, self.num_heads, idx.shape[1], idx.shape[2])  # [b, h, s_q, s_k]
            index = idx[:, None].expand(shape)  # [b'|1, 1, s_q, s_k] -> [b, h, s_q, s_k] (a view)
            return per_distance.expand(batch, -1, -1, -1).gather(-1, index)

    @property
    def has_relative_values(self) -> bool:
        """True with ``values``: the model adds ``P a^V`` to each head's output (needs the attention
        probabilities, so attention takes its explicit-softmax path)."""
        return self.values

    def relative_values(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """The value vectors ``a^V_ij``: ``[s_q, s_k, d_h]`` for 1-D positions, ``[b, 1, s_q, s_k, d_h]``
        for ``[b, s]`` positions (broadcasts over heads); ``None`` when built with ``values=False``.

        Materialises ``s_q * s_k * d_h`` numbers; :meth:`relative_value_output` does not.
        """
        if self.value_embeddings is None:
            return None
        idx = self.clipped_index(q_positions, k_positions)  # [b'|1, s_q, s_k]
        vectors = nn.functional.embedding(idx, self.value_embeddings)  # [b'|1, s_q, s_k, d_h]
        both_1d = q_positions.dim() == 1 and k_positions.dim() == 1
        return vectors[0] if both_1d else vectors[:, None]  # [s_q, s_k, d_h] | [b, 1, s_q, s_k, d_h]

    def relative_value_output(
        self, probs: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> torch.Tensor:
        """``sum_j p_ij a^V_ij`` for every head: add it to ``probs @ v``.

        Computed without the ``[s_q, s_k, d_h]`` vectors: the probabilities of keys that share a
        clipped distance are summed first (``[b, h, s_q, 2k + 1]``), then multiplied by the table.

        Args:
            probs: ``[b, h, s_q, s_k]`` attention probabilities (after softmax and masking).
            q_positions, k_positions: as in :meth:`score_bias`.

        Returns:
            ``[b, h, s_q, d_h]`` in float32 (float64 for float64 ``probs``).
        """
        if self.value_embeddings is None:
            raise ValueError("this Shaw scheme has no value vectors; build it with values=True")
        if not isinstance(probs, torch.Tensor) or not probs.is_floating_point() or probs.dim() != 4:
            raise TypeError("probs must be a float tensor [b, h, s_q, s_k] of attention probabilities")
        idx = self.clipped_index(q_positions, k_positions)  # [b'|1, s_q, s_k]
        if probs.shape[1] != self.num_heads or tuple(probs.shape[2:]) != tuple(idx.shape[1:]):
            raise ValueError(
                f"probs must have shape [b, {self.num_heads}, {idx.shape[1]}, {idx.shape[2]}], "
                f"got {tuple(probs.shape)}"
            )
        cdt = _compute_dtype(probs)
        with autocast_off(probs.device):
            batch = max(probs.shape[0], idx.shape[0])
            p = probs.to(cdt).expand(batch, -1, -1, -1)  # [b, h, s_q, s_k]
            index = idx[:, None].expand(p.shape)  # [b, h, s_q, s_k]
            n = 2 * self.max_relative_position + 1
            summed = p.new_zeros(*p.shape[:3], n).scatter_add(-1, index, p)  # [b, h, s_q, 2k+1]
            return summed @ self.value_embeddings.to(cdt)  # [b, h, s_q, 2k+1] @ [2k+1, d_h]

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"max_relative_position={self.max_relative_position}, values={self.values}"
        )


# ----------------------------------------------------------------------------------------------
# Transformer-XL
# ----------------------------------------------------------------------------------------------
class TransformerXLRelative(PositionalScheme):
    """Transformer-XL's relative attention (Dai et al. 2019): content and position terms with u, v.

    Args:
        d_model: ``d``, the width of the sinusoidal distance encoding ``R`` (even).
        num_heads: ``h``.
        head_dim: ``d_h``.
        base: the sinusoid's wavelength base (10000).
        init_std: std of the normal init of ``u``, ``v`` and ``W_R`` (0.02, the official code's).

    Parameters: ``u [h, d_h]`` (``r_w_bias``), ``v [h, d_h]`` (``r_r_bias``) and
    ``r_net.weight [h d_h, d]`` (``W_R``, no bias), named as in the official code.

    ``R_{i-j}`` is ``posenc.sinusoidal_table(i - j, d)`` with the paper's frequencies
    ``10000^(-2f/d)``. The official code lays it out ``[sin | cos]``; posenc's table interleaves
    ``(sin, cos)`` pairs. Since ``R`` only enters through the learned ``W_R``, the two are the same
    model up to a permutation of ``W_R``'s columns (see :meth:`load_official_r_net`).

    Shapes: ``queries(q [b, h, s_q, d_h], q_positions) -> q + u``; ``score_bias(q_positions [s_q] |
    [b, s_q], k_positions [s_k] | [b, s_k], q [b, h, s_q, d_h]) -> [b, h, s_q, s_k]`` float32
    (float64 for float64 ``q``). Keys may include a memory (earlier positions, ``s_k > s_q``).
    """

    name = "transformer_xl"
    score_bias_uses_query = True
    hooks = ("queries", "score_bias")
    summary = "sinusoidal relative distance through W_R, with global u, v biases (Dai et al. 2019)"

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        base: float = 10000.0,
        init_std: float = 0.02,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = factory_kwargs(device, dtype)
        self.d_model = check_int(d_model, "d_model", minimum=2, even=True)
        self.num_heads = check_int(num_heads, "num_heads")
        self.head_dim = check_int(head_dim, "head_dim")
        self.base = check_positive_float(base, "base")
        self.init_std = check_positive_float(init_std, "init_std")
        self.r_w_bias = nn.Parameter(torch.empty(self.num_heads, self.head_dim, **factory))  # u
        self.r_r_bias = nn.Parameter(torch.empty(self.num_heads, self.head_dim, **factory))  # v
        self.r_net = nn.Linear(self.d_model, self.num_heads * self.head_dim, bias=False, **factory)  # W_R
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.r_w_bias, self.r_r_bias, self.r_net.weight):
            nn.init.normal_(p, std=self.init_std)

    def queries(
        self,
        q: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> torch.Tensor:
        """``q + u``: the content bias ``u`` on every query, whatever its position (``qk_layout`` as
        in :meth:`PositionalScheme.queries`: ``"bhsd"``, the default, or ``"bshd"``)."""
        bshd = check_choice(qk_layout or "bhsd", "qk_layout", ("bhsd", "bshd")) == "bshd"
        head_axis = 2 if bshd else 1
        if (
            not isinstance(q, torch.Tensor)
            or q.dim() != 4
            or q.shape[head_axis] != self.num_heads
            or (q.shape[-1] != self.head_dim)
        ):
            form = "[b, s_q, {h}, {d}]" if bshd else "[b, {h}, s_q, {d}]"
            raise ValueError(
                f"q must have shape {form.format(h=self.num_heads, d=self.head_dim)}, "
                f"got {tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}"
            )
        u = self.r_w_bias.to(q.dtype)  # [h, d_h]
        return q + (u[None, None] if bshd else u[None, :, None, :])  # (q + u).k = (a) + (c)

    def score_bias(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, q: torch.Tensor | None = None
    ) -> torch.Tensor:
        qp = check_relative_positions(q_positions, "q_positions")
        q = _check_q(q, qp, self.num_heads, self.head_dim, "transformer_xl")
        kp = check_relative_positions(k_positions, "k_positions")
        _check_batch(q, relative_positions(qp, kp).shape[0])  # validates batch sizes
        qp = qp if qp.dim() == 2 else qp[None]  # [b'|1, s_q]
        kp = kp if kp.dim() == 2 else kp[None]  # [b'|1, s_k]
        # Only i - j matters: measure positions from each row's first key so the angles stay small.
        ref = kp.amin(-1, keepdim=True)  # [b'|1, 1]
        cdt = _compute_dtype(q)
        half = self.d_model // 2
        with autocast_off(q.device):
            tq = sinusoidal_table(qp - ref, self.d_model, self.base, dtype=cdt)  # [b'|1, s_q, d] (sin, cos)
            tk = sinusoidal_table(kp - ref, self.d_model, self.base, dtype=cdt)  # [b'|1, s_k, d]
            w = self.r_net.weight.to(cdt).view(self.num_heads, self.head_dim, self.d_model)  # [h, d_h, d]
            qv = q.to(cdt) + self.r_r_bias.to(cdt)[None, :, None, :]  # q + v: [b, h, s_q, d_h]
            p = torch.einsum("bhqe,hed->bhqd", qv, w)  # W_R^T (q + v): [b, h, s_q, d]
            p = p.unflatten(-1, (half, 2))  # [b, h, s_q, d/2, 2]: (sin, cos) slots of R
            ps, pc = p[..., 0], p[..., 1]  # [b, h, s_q, d/2]
            tq = tq.unflatten(-1, (half, 2))[:, None]  # [b'|1, 1, s_q, d/2, 2]
            si, ci = tq[..., 0], tq[..., 1]  # sin(i w_f), cos(i w_f)
            # p . R_{i-j} = sum_f ps sin((i-j)w) + pc cos((i-j)w), and by the angle-difference
            # identities = sum_f sin(j w)(pc sin(i w) - ps cos(i w)) + cos(j w)(ps sin(i w) + pc cos(i w)):
            # a dot product of a per-query vector with R_j, exact for any positions.
            coeff = torch.stack((pc * si - ps * ci, ps * si + pc * ci), dim=-1).flatten(-2)  # [b, h, s_q, d]
            bias = coeff @ tk[:, None].transpose(-1, -2)  # [b, h, s_q, d] @ [b'|1, 1, d, s_k]
            return bias / math.sqrt(self.head_dim)  # [b, h, s_q, s_k]

    @torch.no_grad()
    def load_official_r_net(self, weight: torch.Tensor) -> None:
        """Load the official code's ``r_net.weight [h d_h, d]`` (its ``R`` is ``[sin | cos]``).

        Column ``f`` (``sin``) and ``d/2 + f`` (``cos``) of the official matrix become columns
        ``2f`` and ``2f + 1`` here.
        """
        expected = (self.num_heads * self.head_dim, self.d_model)
        if tuple(weight.shape) != expected:
            raise ValueError(f"weight must have shape {list(expected)}, got {tuple(weight.shape)}")
        half = self.d_model // 2
        # [hd, 2, d/2] (sin block, cos block) -> [hd, d/2, 2] -> [hd, d] interleaved
        self.r_net.weight.copy_(weight.view(-1, 2, half).transpose(1, 2).reshape(expected))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, base={self.base}"
        )
