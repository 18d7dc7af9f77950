"""The rotary scheme :class:`RotaryEmbedding` (``rope``): configuration and fixed frequencies, no
cache. Its variants (``xpos``, ``rope_2d``) are in :mod:`posenc.rotary.variants`.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d_h`` head width, ``r`` rotary width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import torch

from .._alloc import check_allocation
from .._precision import angle_dtype, gather_kept
from .._validate import check_choice, check_int, check_positive_float
from ..base import PositionalScheme
from ..positions import resolve_positions
from .apply import (
    QK_LAYOUTS,
    _seq_mismatch,
    _wide,
    apply_rotary,
    apply_rotary_qk,
    check_compute_dtype,
    describe_value,
    is_integer_dtype,
    seq_axis,
)
from .reference import ROTARY_LAYOUTS
from .scalings import (
    ORIGINAL_LENGTH,
    ROPE_SCALINGS,
    check_scaling,
    document_lengths,
    resolve_rotary_dim,
    rope_cos_sin,
)


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------
def check_qk(
    q: torch.Tensor,
    k: torch.Tensor | None,
    head_dim: int,
    qk_layout: str = "bhsd",
    num_heads: int | None = None,
) -> None:
    """Types and shapes of ``q`` and ``k`` (``k`` None: one tensor rotated alone, which may be
    queries or keys), the head axis against ``num_heads`` when the module knows it."""
    form = f"[b, h, s, {head_dim}]" if qk_layout == "bhsd" else f"[b, s, h, {head_dim}]"
    for name, t in (("q", q), ("k", k)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor {form}, got {describe_value(t)}")
        if t.dim() != 4 or t.shape[-1] != head_dim:
            raise ValueError(f"{name} must have shape {form}, got {tuple(t.shape)} (qk_layout={qk_layout!r})")
        if num_heads is not None:
            _check_heads(t, name, num_heads, qk_layout, queries=name == "q" and k is not None)


def _check_heads(t: torch.Tensor, name: str, num_heads: int, qk_layout: str, queries: bool) -> None:
    """The head axis of ``t`` (dim 1 for ``"bhsd"``, dim 2 for ``"bshd"``) holds ``num_heads``
    (queries) or a divisor of it (keys, grouped-query attention); otherwise the tensor is most
    likely laid out the other way, which positions alone cannot reveal."""
    axis = 1 if qk_layout == "bhsd" else 2
    n = t.shape[axis]
    ok = n == num_heads if queries else n >= 1 and num_heads % n == 0
    if ok:
        return
    form = "[b, h, s, d_h]" if qk_layout == "bhsd" else "[b, s, h, d_h]"
    other = "bshd" if qk_layout == "bhsd" else "bhsd"
    want = f"{num_heads}" if queries else f"{num_heads} or a divisor of it (grouped-query keys)"
    hint = ""
    if t.shape[3 - axis] == num_heads or (not queries and num_heads % max(t.shape[3 - axis], 1) == 0):
        hint = f"; if {name} is laid out the other way, pass qk_layout={other!r}"
    raise ValueError(
        f"{name} {tuple(t.shape)} has {n} along its head axis (dim {axis}: qk_layout={qk_layout!r} "
        f"reads {name} as {form}) but this module has num_heads={num_heads}, so it needs {want}{hint}"
    )


def one_call(k, q_positions, k_positions, position_ids):
    """``(k, q_positions, k_positions)`` of a call as written: ``position_ids`` (Hugging Face's
    name) is ``q_positions``; an integer tensor in ``k``'s place is the positions of a tensor
    rotated alone (``rope(x, positions)``, as torchtune's ``rope(x, input_pos=...)``)."""
    if position_ids is not None:
        if q_positions is not None:
            raise ValueError(
                "pass the positions once: q_positions or position_ids (the same argument under its "
                "Hugging Face name), not both"
            )
        q_positions = position_ids
    if isinstance(k, torch.Tensor) and is_integer_dtype(k):
        if q_positions is not None:
            raise ValueError(
                f"k is an integer tensor {tuple(k.shape)}, read as the positions of a tensor rotated "
                "alone (rope(x, positions)), but q_positions/position_ids is given too; pass keys as a "
                "floating-point tensor, or the positions once"
            )
        k, q_positions = None, k
    if k is None and k_positions is not None:
        raise ValueError("k_positions needs keys: pass k, or rotate one tensor alone with rope(x, positions)")
    return k, q_positions, k_positions


def _check_seq(positions: torch.Tensor | None, x: torch.Tensor, qk_layout: str, name: str, xname: str):
    """A clear error when ``positions`` ``[s]``/``[b, s]`` cannot match ``x``'s sequence axis."""
    if not isinstance(positions, torch.Tensor) or positions.dim() not in (1, 2):
        return  # the type and rank are checked by resolve_positions
    if positions.shape[-1] != x.shape[seq_axis(qk_layout)]:
        raise ValueError(
            f"{name} must have shape [s] or [b, s] with s = {x.shape[seq_axis(qk_layout)]}, got "
            f"{tuple(positions.shape)}: " + _seq_mismatch(positions.shape[-1], x, qk_layout, xname)
        )


def for_heads(t: torch.Tensor, positions: torch.Tensor, qk_layout: str = "bhsd") -> torch.Tensor:
    """Tables for positions ``[b, s]`` are ``[b, s, r/2]``: add the head axis -> ``[b, 1, s, r/2]``
    (``"bshd"``: ``[b, s, 1, r/2]``). Tables for ``[s]`` stay ``[s, r/2]``."""
    if positions.dim() != 2:
        return t
    return t.unsqueeze(-3) if qk_layout == "bhsd" else t.unsqueeze(-2)


def _same_positions(qp: torch.Tensor, kp: torch.Tensor, q_positions, k_positions) -> bool:
    """Whether the resolved query and key positions are the same (default ``arange`` for both, the
    same tensor, or equal values: a KV-cache step passes the new keys' positions as a slice)."""
    if q_positions is None and k_positions is None:
        return qp.shape == kp.shape
    if qp is kp:
        return True
    if (
        qp.shape != kp.shape
        or qp.device.type != "cpu"
        or kp.device.type != "cpu"
        or torch.compiler.is_compiling()
    ):
        return False
    return qp.numel() <= 1 << 16 and bool(torch.equal(qp, kp))  # one cheap pass, CPU sync is fine


class RotaryTables(NamedTuple):
    """cos/sin tables of one set of query and key positions (:meth:`RotaryEmbedding.rotary_tables`):
    ``[s, r/2]`` or ``[b, 1, s, r/2]`` each (keys may share the queries' tensors)."""

    q_cos: torch.Tensor
    q_sin: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor
    qk_layout: str


#: The settings a RoPE evaluation variant takes besides the factor and the trained length: Llama
#: 3.1's released values for ``llama3`` (its config.json's ``rope_scaling``).
VARIANT_DEFAULTS: dict[str, dict[str, float]] = {"llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0}}


class RotaryEmbedding(PositionalScheme):
    """Rotary position embedding (Su et al. 2021) with any scaling rule from :data:`ROPE_SCALINGS`.

    Args:
        head_dim: ``d_h``.
        base: ``rope_theta``.
        rotary_dim / partial_rotary_factor: rotate only the first ``r`` dims (GPT-NeoX 0.25, Phi-2 0.4,
            GPT-J ``rotary_dim=64``); the rest pass through bit-identical.
        layout: ``"half"`` (HF Llama/NeoX/Mistral/Qwen) or ``"interleaved"`` (GPT-J, Meta, RoFormer).
        scaling: ``None`` or ``{"rope_type": ..., ...}`` as in :func:`rope_frequencies`.
        qk_layout: axis order of q and k: ``"bhsd"`` (default) or ``"bshd"`` (flash-attention,
            torchtune); each call may override it.
        compute_dtype: ``torch.float32`` (default; also ``"float32"`` or ``None``): bf16/fp16 q
            and k are rotated with float32 tables in float32 arithmetic and rounded once, as
            torchtune, Meta's reference code and flash-attention do; ``"input"``: in q's and k's own
            dtype with PyTorch's rounding after every operation, Hugging Face transformers' bits
            (see :func:`apply_rotary`).
        precompute: ``n > 0`` computes the cos/sin rows of positions ``0..n-1`` when the module is
            built and whenever it moves or is cast (float32; float64 in a float64 module; never
            saved); calls whose positions all lie in ``0..n-1`` read them (the default positions of
            up to ``n`` tokens; explicit ones on CPU in eager mode, gathered), bit for bit the
            tables eager mode builds in a call, for ``n * r`` floats of memory. Default 0: tables
            are built in each call (a model builds them once per forward for all its layers). Only
            for scalings whose frequencies do not depend on the length.
        num_heads: ``h``, when known (a model passes it): q's head axis must hold ``h`` and k's a
            divisor of it, so a tensor laid out the other way (``[b, s, h, d_h]`` under ``"bhsd"``)
            is refused naming ``qk_layout``. Default None: no head check; such a tensor is then
            caught only where positions are given (their length must match the sequence axis).

    Shapes: ``rotate(q [b, h, s_q, d_h], k [b, h_kv, s_k, d_h], q_positions [s_q] | [b, s_q],
    k_positions [s_k] | [b, s_k]) -> (q, k)`` of the same shapes and dtypes; with ``"bshd"``
    ``q [b, s_q, h, d_h]``, ``k [b, s_k, h_kv, d_h]``. ``rope(q, k)`` is ``rope.rotate(q, k)``.
    One positions tensor rotates q and k at the same positions (as Hugging Face's
    ``apply_rotary_pos_emb(q, k, cos, sin)`` and torchtune's ``input_pos``): ``rope(q, k, pos)``
    or ``rope(q, k, position_ids=pos)``; ``k_positions`` is for keys elsewhere (a KV-cache step
    with the whole key cache, cross attention). One tensor alone: ``rope(x, pos)`` or
    ``rope.rotate_one(x, pos)`` -> ``x`` rotated.

    For length-dependent rules (``dynamic``, ``longrope``) the current length is
    ``max(q_positions, k_positions) + 1`` and ``needs_unrotated_cache`` is ``True`` on the instance:
    a model must cache raw keys and rotate the whole key cache every step, so old and new keys share
    one base (HF #25104). Other rules rotate each key once.
    """

    name = "rope"
    hooks = ("rotate",)
    summary = "rotary (Su 2021): half/interleaved, partial, scalings linear/ntk/dynamic/yarn/llama3/longrope"
    variant_defaults: ClassVar[dict[str, dict[str, float]]] = VARIANT_DEFAULTS
    #: the scalings that need nothing but the factor, the trained length and those settings
    eval_variants = tuple(
        rule
        for rule, spec in ROPE_SCALINGS.items()
        if rule != "default"
        and set(spec.required) <= {"factor", ORIGINAL_LENGTH, *VARIANT_DEFAULTS.get(rule, {})}
    )

    @classmethod
    def variant_options(cls, variant: str, factor: float, trained_len: int) -> dict[str, Any]:
        """``{"scaling": {"rope_type": variant, "factor": factor, ...}}``, with
        ``original_max_position_embeddings = trained_len`` for the rules that need it (YaRN,
        dynamic, llama3) and :attr:`variant_defaults`."""
        if variant not in cls.eval_variants:
            return super().variant_options(variant, factor, trained_len)
        scaling: dict[str, Any] = {"rope_type": variant, "factor": float(factor)}
        scaling.update(cls.variant_defaults.get(variant, {}))
        if ORIGINAL_LENGTH in ROPE_SCALINGS[variant].required:
            scaling[ORIGINAL_LENGTH] = trained_len
        return {"scaling": scaling}

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        layout: str = "half",
        scaling: Mapping[str, Any] | str | None = None,
        qk_layout: str = "bhsd",
        compute_dtype: torch.dtype | str | None = None,
        precompute: int = 0,
        num_heads: int | None = None,
    ) -> None:
        super().__init__()
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        self.num_heads = None if num_heads is None else check_int(num_heads, "num_heads")
        self.compute_dtype = check_compute_dtype(compute_dtype)
        self.head_dim = check_int(head_dim, "head_dim", minimum=2)
        self.rotary_dim = resolve_rotary_dim(head_dim, rotary_dim, partial_rotary_factor)
        self.base = check_positive_float(base, "base")
        self.layout = check_choice(layout, "layout", ROTARY_LAYOUTS)
        self.scaling_rule, self.scaling_params = check_scaling(scaling, self.rotary_dim)
        # An instance attribute: only length-dependent rules need the model to cache raw keys.
        self.needs_unrotated_cache = ROPE_SCALINGS[self.scaling_rule].length_dependent
        # A rule that does not depend on the length has fixed frequencies: computed here and again
        # whenever the module moves or is cast (_apply), in float64 (float32 on MPS), never in the
        # module's dtype; read in forward, never written there.
        self.register_buffer(
            "inv_freq", self._fixed_frequencies(torch.get_default_device()), persistent=False
        )
        self.precompute = check_int(precompute, "precompute", minimum=0)
        if self.precompute and self.needs_unrotated_cache:
            raise ValueError(
                f"precompute={precompute} needs frequencies that do not depend on the length, but "
                f"scaling {self.scaling_rule!r} does; pass precompute=0"
            )
        rows = self._precomputed(torch.get_default_device(), torch.float32)  # [2, n, r/2] or None
        self.register_buffer("rows", rows, persistent=False)  # read in forward, never written there

    def _fixed_frequencies(self, device: torch.device) -> torch.Tensor | None:
        """``inv_freq [r/2]`` of a rule that does not depend on the length (None for one that does);
        sets ``_attention_scale``."""
        if self.needs_unrotated_cache:
            return None
        rule = ROPE_SCALINGS[self.scaling_rule]
        inv, self._attention_scale = rule.compute(
            self.rotary_dim, self.base, self.scaling_params, None, device
        )
        return inv

    def _precomputed(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """cos and sin ``[2, n, r/2]`` of positions ``0..n-1`` at a table's precision for ``dtype``
        (float32, or float64), or None."""
        if not self.precompute:
            return None
        fix = "pass a smaller precompute (0 builds the tables in each call)"
        shape = (2, self.precompute, self.rotary_dim // 2)
        dtype = angle_dtype(dtype)
        check_allocation(shape, dtype, "precomputed rows", fix, device=device)
        inv, scale = self.frequencies(device=device)
        positions = torch.arange(self.precompute, device=device)  # [n]
        cos, sin = rope_cos_sin(positions, inv, attention_scale=scale, dtype=dtype)  # [n, r/2] each
        return torch.stack((cos, sin))  # 2 x [n, r/2] -> [2, n, r/2]

    def _kept(self, given: torch.Tensor | None, positions: torch.Tensor, x: torch.Tensor):
        """(cos, sin) for x's ``positions`` ``[s]`` or ``[b, s]`` (-> ``[s, r/2]`` or
        ``[b, s, r/2]``) from the precomputed rows, or None where they do not serve: no rows,
        another device or precision, positions outside ``0..n-1``. Explicit positions (``given``)
        are gathered: CPU eager only (:func:`~posenc._precision.gather_kept`)."""
        rows, dtype = self.rows, self._table_dtype(x)
        if rows is None or rows.device != x.device or rows.dtype != angle_dtype(dtype):
            return None
        if given is None:  # the default arange(s)
            s = positions.shape[0]
            # a copy: the caller's tables never share the buffer's storage
            both = rows[:, :s].to(dtype, copy=True) if s <= rows.shape[1] else None  # [2, s, r/2]
        else:
            both = gather_kept(rows, positions, dim=1)  # [2, n, r/2] -> [2, ..., r/2], or None
        return None if both is None else tuple(both.to(dtype))  # (cos, sin)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        """Move or cast as usual, then recompute the fixed frequencies where they now are (a cast
        would round them to the module's dtype), and the rows at a table's precision (float32 in a
        bf16 module, float64 in a float64 one)."""
        super()._apply(fn, recurse)
        if self.inv_freq is not None:
            self.inv_freq = self._fixed_frequencies(self.inv_freq.device)
        if self.rows is not None:
            self.rows = self._precomputed(self.rows.device, self.rows.dtype)
        return self

    def frequencies(
        self, seq_len: int | torch.Tensor | None = None, *, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, float]:
        """``(inv_freq [r/2] float64 (float32 on MPS), attention_scale)`` from the configuration."""
        kept = self.inv_freq
        if kept is not None and device is not None and torch.device(device) == kept.device:
            return kept, self._attention_scale  # fixed frequencies, computed when the module was built
        rule = ROPE_SCALINGS[self.scaling_rule]
        return rule.compute(self.rotary_dim, self.base, self.scaling_params, seq_len, device)

    def cos_sin(
        self,
        positions: torch.Tensor,
        *,
        dtype: torch.dtype = torch.float32,
        seq_len: int | torch.Tensor | None = None,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for integer ``positions`` ``[s]`` -> ``[s, r/2]``, ``[b, s]`` -> ``[b, 1, s, r/2]``
        (``"bshd"``: ``[b, s, 1, r/2]``), ready for :func:`apply_rotary` with the same ``qk_layout``."""
        qk_layout = self._qk_layout(qk_layout)
        inv, scale = self.frequencies(seq_len, device=positions.device)
        cos, sin = rope_cos_sin(positions, inv, attention_scale=scale, dtype=dtype)
        return for_heads(cos, positions, qk_layout), for_heads(sin, positions, qk_layout)

    def _qk_layout(self, qk_layout: str | None) -> str:
        return self.qk_layout if qk_layout is None else check_choice(qk_layout, "qk_layout", QK_LAYOUTS)

    def _positions(self, q, k, q_positions, k_positions, qk_layout: str = "bhsd"):
        """Resolved ``(q_positions, k_positions)``: each given one checked against its tensor's
        sequence axis; one positions tensor (``q_positions`` alone) places q and k both there."""
        axis = seq_axis(qk_layout)
        if q_positions is None and k_positions is not None:
            raise ValueError(
                "k_positions is given without q_positions: pass q_positions too (e.g. "
                f"torch.arange({q.shape[axis]}) for queries at 0..s_q-1), or pass the one positions "
                "tensor of q and k as q_positions (position_ids)"
            )
        _check_seq(q_positions, q, qk_layout, "q_positions", "q")
        if q_positions is not None and k_positions is None:
            if isinstance(q_positions, torch.Tensor) and k.shape[axis] != q.shape[axis]:
                raise ValueError(
                    f"one positions tensor rotates q and k at the same positions, but q has "
                    f"s_q = {q.shape[axis]} and k has s_k = {k.shape[axis]}: pass the keys' positions "
                    f"as k_positions (e.g. a KV-cache step with every cached key: k_positions="
                    f"torch.arange({k.shape[axis]}), q_positions=torch.arange({k.shape[axis] - q.shape[axis]}"
                    f", {k.shape[axis]}))"
                )
            qp = resolve_positions(q_positions, q.shape[axis], q.device, name="q_positions")
            return qp, qp
        _check_seq(k_positions, k, qk_layout, "k_positions", "k")
        qp = resolve_positions(q_positions, q.shape[axis], q.device, name="q_positions")
        kp = resolve_positions(k_positions, k.shape[axis], k.device, name="k_positions")
        return qp, kp

    def _lengths(self, qp: torch.Tensor, kp: torch.Tensor):
        """The lengths queries and keys are rotated for under a length-dependent rule
        (``[..., s, 1]`` or ``[b, 1, 1]``, :func:`document_lengths`; each side from its own
        positions: in every model path the queries are the last keys, so both agree), or
        ``None, None`` for rules whose frequencies do not depend on the length."""
        if not self.needs_unrotated_cache or (qp.numel() == 0 and kp.numel() == 0):
            return None, None
        return (
            None if qp.numel() == 0 else document_lengths(qp)[..., None],
            None if kp.numel() == 0 else document_lengths(kp)[..., None],
        )

    def _tables(self, q, k, q_positions, k_positions, qk_layout: str = "bhsd"):
        """cos/sin for q and for k (frequencies per document under a length-dependent rule)."""
        qp, kp = self._positions(q, k, q_positions, k_positions, qk_layout)
        len_q, len_k = self._lengths(qp, kp)
        inv, scale = self.frequencies(len_q, device=q.device)  # [r/2], or [..., s_q, r/2] per document
        kept = self._kept(q_positions, qp, q)
        cq, sq = kept or rope_cos_sin(qp, inv, attention_scale=scale, dtype=self._table_dtype(q))
        q_tables = for_heads(cq, qp, qk_layout), for_heads(sq, qp, qk_layout)
        if k.dtype == q.dtype and _same_positions(qp, kp, q_positions, k_positions):
            return q_tables, q_tables, (qp, kp)  # the same positions: one table
        if self.needs_unrotated_cache:  # the keys' own lengths
            inv, scale = self.frequencies(len_k, device=q.device)  # [..., s_k, r/2]
        kept = self._kept(k_positions, kp, k)
        ck, sk = kept or rope_cos_sin(kp, inv, attention_scale=scale, dtype=self._table_dtype(k))
        return q_tables, (for_heads(ck, kp, qk_layout), for_heads(sk, kp, qk_layout)), (qp, kp)

    def _table_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype ``x``'s tables are built in: x's, or float32 where ``compute_dtype`` widens x."""
        return torch.float32 if _wide(x, self.compute_dtype) else x.dtype

    def rotary_tables(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        qk_layout: str | None = None,
    ) -> RotaryTables:
        """The cos/sin tables :meth:`rotate` needs for these positions, built once: a model builds
        them once per forward pass and passes them to every layer (``rotate(..., tables=...)``).

        Shapes: q, k and positions as for :meth:`rotate`; the tables are ``[s, r/2]`` (positions
        ``[s]``) or ``[b, 1, s, r/2]`` (``[b, s]``; ``"bshd"``: ``[b, s, 1, r/2]``), in q's and k's dtypes
        (float32 where ``compute_dtype`` widens them).
        """
        qk_layout = self._qk_layout(qk_layout)
        if k is None or (isinstance(k, torch.Tensor) and is_integer_dtype(k)):
            raise TypeError("rotary_tables needs q and k (floating-point tensors); positions come after them")
        _, q_positions, k_positions = one_call(k, q_positions, k_positions, position_ids)
        check_qk(q, k, self.head_dim, qk_layout, self.num_heads)
        (cq, sq), (ck, sk), _ = self._tables(q, k, q_positions, k_positions, qk_layout)
        return RotaryTables(cq, sq, ck, sk, qk_layout)

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        qk_layout: str | None = None,
        tables: RotaryTables | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """Rotate ``q [b, h, s_q, d_h]`` and ``k [b, h_kv, s_k, d_h]`` by their positions.

        Positions: none -> q at ``arange(s_q)``, k at ``arange(s_k)``; one tensor (``q_positions``,
        or ``position_ids`` as Hugging Face names it) -> q and k both at those positions (``s_q``
        must equal ``s_k``); ``q_positions`` and ``k_positions`` -> each at its own (a KV-cache
        step that rotates the whole key cache, cross attention). Positions are ``[s]`` or
        ``[b, s]`` (packing, left padding). With ``qk_layout="bshd"`` (default: the module's) q and
        k are ``[b, s, h, d_h]``.

        One tensor alone: ``rotate(x)``, ``rotate(x, positions)`` (an integer tensor in ``k``'s
        place) or ``rotate(x, position_ids=positions)`` returns ``x`` rotated (:meth:`rotate_one`).

        ``tables``: from :meth:`rotary_tables` for the same positions (and layout), to skip building
        them again; without it they are built here. q and k are rotated in one kernel call
        (:func:`apply_rotary_qk`).

        Returns:
            ``(q, k)`` of the same shapes and dtypes; one tensor when ``k`` is not given.
        """
        qk_layout = self._qk_layout(qk_layout)
        k, q_positions, k_positions = one_call(k, q_positions, k_positions, position_ids)
        if k is None:
            if tables is not None:
                raise TypeError("tables apply to q and k rotated together; rotate one tensor without them")
            return self.rotate_one(q, q_positions, qk_layout=qk_layout)
        check_qk(q, k, self.head_dim, qk_layout, self.num_heads)
        if tables is None:
            (cq, sq), (ck, sk), _ = self._tables(q, k, q_positions, k_positions, qk_layout)
        else:
            if not isinstance(tables, RotaryTables) or tables.qk_layout != qk_layout:
                raise TypeError(
                    f"tables must come from rotary_tables(...) with qk_layout={qk_layout!r}, got "
                    f"{type(tables).__name__}"
                    + (f" for {tables.qk_layout!r}" if isinstance(tables, RotaryTables) else "")
                )
            cq, sq, ck, sk = tables.q_cos, tables.q_sin, tables.k_cos, tables.k_sin
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim, "qk_layout": qk_layout}
        return apply_rotary_qk(q, k, cq, sq, ck, sk, compute_dtype=self.compute_dtype, **kw)

    def rotate_one(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, *, qk_layout: str | None = None
    ) -> torch.Tensor:
        """Rotate one tensor, queries or keys, by its positions (torchtune's and
        rotary-embedding-torch's habit): the same numbers as the matching half of :meth:`rotate`.

        Shapes: ``x [b, h, s, d_h]`` (``"bshd"``: ``[b, s, h, d_h]``), ``positions [s]`` or
        ``[b, s]`` (default ``arange(s)``) -> ``[b, h, s, d_h]``, x's dtype."""
        qk_layout = self._qk_layout(qk_layout)
        check_qk(x, None, self.head_dim, qk_layout, self.num_heads)
        (cos, sin), _, _ = self._tables(x, x, positions, None, qk_layout)
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim, "qk_layout": qk_layout}
        return apply_rotary(x, cos, sin, compute_dtype=self.compute_dtype, **kw)

    def extra_repr(self) -> str:
        scaling = "" if self.scaling_rule == "default" else f", scaling={self.scaling_rule!r}"
        qk = "" if self.qk_layout == "bhsd" else f", qk_layout={self.qk_layout!r}"
        wide = "" if self.compute_dtype == "float32" else f", compute_dtype={self.compute_dtype!r}"
        kept = f", precompute={self.precompute}" if self.precompute else ""
        heads = "" if self.num_heads is None else f", num_heads={self.num_heads}"
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"layout={self.layout!r}{scaling}{qk}{wide}{kept}{heads}"
        )
