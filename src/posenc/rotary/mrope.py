"""Multimodal RoPE (Qwen2-VL, Qwen3-VL): one RoPE whose rotated pairs are shared out among three
position axes, time, height and width (``mrope``).

A token carries three coordinates ``(t, y, x)``: a text token has ``t = y = x = p`` (its index), an
image patch the frame and its grid row and column, each offset past the text before it. The
``r/2`` rotated pairs (half layout, pairs ``(i, i + r/2)``) are split by ``mrope_section = (n_t,
n_y, n_x)`` (``n_t + n_y + n_x = r/2``) and pair ``i`` turns by its own axis's coordinate::

    angle_i = coord[axis(i)] * w_i,   w_i = base^(-2i/r)
    axis(i) = t for the first n_t pairs, y for the next n_y, x for the last n_x      (Qwen2-VL)
    axis(i) = y if i % 3 == 1 and i < 3 n_y, x if i % 3 == 2 and i < 3 n_x, else t   (interleaved, Qwen3-VL)

For text (all three coordinates equal) every pair turns by ``p`` and this is plain RoPE; inside an
image, the logit of two patches depends on their row and column offsets, through different
frequencies. The interleaved split gives every axis both high and low frequencies.

Positions: integer ``[s]`` or ``[b, s]`` (text: all axes equal), or coordinates ``[s, 3]`` /
``[b, s, 3]`` (``(t, y, x)``); :func:`mrope_positions_from_hf` turns Hugging Face's
``position_ids [3, b, s]`` into ``[b, s, 3]``.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d_h`` head width, ``r = d_h``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._alloc import factory_kwargs
from .._validate import check_choice, check_int, check_positive_float
from ..base import PositionalScheme
from .apply import QK_LAYOUTS, apply_rotary_qk
from .scalings import rope_cos_sin, rope_frequencies

__all__ = ["MultimodalRope", "mrope_from_hf", "mrope_positions_from_hf"]

AXES = 3


def mrope_positions_from_hf(position_ids: torch.Tensor) -> torch.Tensor:
    """Hugging Face's multimodal ``position_ids`` ``[3, b, s]`` (``[3, s]``) -> ``[b, s, 3]`` (``[s, 3]``)."""
    if (
        not isinstance(position_ids, torch.Tensor)
        or position_ids.dim() not in (2, 3)
        or position_ids.shape[0] != 3
    ):
        shape = (
            tuple(position_ids.shape)
            if isinstance(position_ids, torch.Tensor)
            else type(position_ids).__name__
        )
        raise ValueError(f"position_ids must be [3, b, s] or [3, s] (Hugging Face's layout), got {shape}")
    return position_ids.movedim(0, -1)


def default_mrope_section(pairs: int) -> tuple[int, int, int]:
    """``(n_t, n_y, n_x)``, ``n_y = n_x = floor(3 pairs / 8)``: Qwen2-VL's ``(16, 24, 24)`` for 64 pairs."""
    side = 3 * pairs // 8
    return pairs - 2 * side, side, side


def pair_axes(mrope_section: Sequence[int], interleaved: bool) -> torch.Tensor:
    """The axis (0 = t, 1 = y, 2 = x) each rotated pair turns by: int64 ``[r/2]``."""
    n_t, n_y, n_x = mrope_section
    pairs = n_t + n_y + n_x
    if not interleaved:
        return torch.tensor([0] * n_t + [1] * n_y + [2] * n_x, dtype=torch.long, device="cpu")
    i = torch.arange(pairs, device="cpu")
    axes = torch.zeros(pairs, dtype=torch.long, device="cpu")
    axes[(i % 3 == 1) & (i < 3 * n_y)] = 1
    axes[(i % 3 == 2) & (i < 3 * n_x)] = 2
    return axes


class MultimodalRope(PositionalScheme):
    """Multimodal rotary embedding (Qwen2-VL's M-RoPE; Qwen3-VL's interleaved form).

    Args:
        head_dim: ``d_h`` (all of it rotates, half layout).
        base: ``rope_theta``.
        mrope_section: pairs per axis ``(n_t, n_y, n_x)``, summing to ``d_h / 2``; default
            :func:`default_mrope_section` (Qwen2-VL's ``(16, 24, 24)`` for ``d_h = 128``).
        interleaved: Qwen3-VL's split (``mrope_interleaved``): axes take turns pair by pair.
        qk_layout: ``"bhsd"`` (default) or ``"bshd"``.
        device, dtype: factory kwargs; the buffers (``inv_freq`` float64, ``axes``) go to ``device``,
            and there are no parameters for ``dtype``.

    Shapes: ``rotate(q [b, h, s_q, d_h], k [b, h_kv, s_k, d_h], q_positions, k_positions)
    -> (q, k)``; positions ``[s]``, ``[b, s]`` (text), ``[s, 3]`` or ``[b, s, 3]`` (coordinates
    ``(t, y, x)``), default ``arange``. A ``[3, 3]`` tensor (``b = s = 3`` text, or ``s = 3``
    coordinates) is refused as ambiguous: pass ``[b, s, 3]``.
    """

    name = "mrope"
    hooks = ("rotate",)
    position_dims = AXES
    sequence_positions = True  # [s] / [b, s] positions are text: every coordinate is the index
    axis_names = ("time", "height", "width")  # what each coordinate is (drawn by the analysis)
    summary = "multimodal RoPE: pairs shared out among time, height and width positions (Qwen2-VL)"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        mrope_section: Sequence[int] | None = None,
        interleaved: bool = False,
        qk_layout: str = "bhsd",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        device = factory_kwargs(device, dtype)["device"]  # no parameters: dtype is checked, not used
        if device is None:  # as nn.Linear: the default device (torch.device("meta") included)
            device = torch.get_default_device()
        self.head_dim = check_int(head_dim, "head_dim", minimum=2, even=True)
        self.base = check_positive_float(base, "base")
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be a bool, got {interleaved!r}")
        self.interleaved = interleaved
        pairs = self.head_dim // 2
        section = default_mrope_section(pairs) if mrope_section is None else mrope_section
        if (
            not isinstance(section, Sequence)
            or len(section) != AXES
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in section)
            or sum(section) != pairs
        ):
            raise ValueError(
                f"mrope_section must be 3 ints >= 0 (pairs for time, height, width) summing to head_dim / 2 "
                f"= {pairs}, got {section!r}; e.g. {list(default_mrope_section(pairs))}"
            )
        self.mrope_section = tuple(section)
        inv, _ = rope_frequencies(self.head_dim, base=self.base, dtype=torch.float64, device="cpu")
        self.register_buffer("inv_freq", inv.to(device), persistent=False)  # [r/2], float64
        axes = pair_axes(self.mrope_section, interleaved).to(device)  # [r/2]
        self.register_buffer("axes", axes, persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        """Move as usual, but keep the frequencies in float64 (a cast would round them)."""
        super()._apply(fn, recurse)
        inv, _ = rope_frequencies(
            self.head_dim, base=self.base, dtype=torch.float64, device=self.inv_freq.device
        )
        self.inv_freq = inv
        return self

    def coordinates(self, positions: torch.Tensor | None, seq_len: int, device: torch.device, name: str):
        """Positions as integer coordinates ``[s, 3]`` or ``[b, s, 3]``."""
        if positions is None:
            return torch.arange(seq_len, device=device)[:, None].expand(seq_len, AXES)
        if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.is_complex():
            raise TypeError(
                f"{name} must be an integer tensor [s], [b, s], [s, 3] or [b, s, 3], got {positions!r}"
            )
        shape = tuple(positions.shape)
        coords = positions.dim() == 3 or (positions.dim() == 2 and shape == (seq_len, AXES))
        text = positions.dim() == 1 or (positions.dim() == 2 and shape[-1] == seq_len)
        if positions.dim() == 2 and coords and text:
            raise ValueError(
                f"{name} of shape {shape} could be [b, s] text positions or [s, 3] coordinates; pass "
                f"coordinates as [b, s, 3] (e.g. {name}[None]) or text as [b, s, 3] with equal axes"
            )
        if text and shape[-1] == seq_len:
            return positions.long()[..., None].expand(*shape, AXES)
        if coords and shape[-2:] == (seq_len, AXES):
            return positions.long()
        raise ValueError(f"{name} must be [s], [b, s], [s, 3] or [b, s, 3] with s = {seq_len}, got {shape}")

    def cos_sin(self, coords: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Half-width tables of coordinates ``[..., s, 3]`` -> ``[..., s, r/2]`` each: pair ``i``
        from its axis's coordinate (:func:`rope_cos_sin` per axis, so float32 angles or better)."""
        per_axis = [rope_cos_sin(coords[..., a], self.inv_freq, dtype=dtype) for a in range(AXES)]
        axes = self.axes.to(coords.device)

        def pick(j: int) -> torch.Tensor:
            t, y, x = (tables[j] for tables in per_axis)
            return torch.where(axes == 0, t, torch.where(axes == 1, y, x))

        return pick(0), pick(1)

    def _heads(self, t: torch.Tensor, coords: torch.Tensor, qk_layout: str) -> torch.Tensor:
        if coords.dim() == 2:  # [s, r/2], shared by the batch
            return t
        return t.unsqueeze(1) if qk_layout == "bhsd" else t.unsqueeze(2)  # [b, 1, s, r/2] / [b, s, 1, r/2]

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        qk_layout = self.qk_layout if qk_layout is None else check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        for name, t in (("q", q), ("k", k)):
            if (
                not isinstance(t, torch.Tensor)
                or not t.is_floating_point()
                or t.dim() != 4
                or t.shape[-1] != self.head_dim
            ):
                what = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} must be a float tensor [b, h, s, {self.head_dim}] ({qk_layout}), got {what}"
                )
        axis = -2 if qk_layout == "bhsd" else -3
        qc = self.coordinates(q_positions, q.shape[axis], q.device, "q_positions")
        kc = self.coordinates(k_positions, k.shape[axis], k.device, "k_positions")
        cq, sq = (self._heads(t, qc, qk_layout) for t in self.cos_sin(qc, q.dtype))
        ck, sk = (self._heads(t, kc, qk_layout) for t in self.cos_sin(kc, k.dtype))
        return apply_rotary_qk(q, k, cq, sq, ck, sk, layout="half", qk_layout=qk_layout)

    def extra_repr(self) -> str:
        kind = ", interleaved=True" if self.interleaved else ""
        return f"head_dim={self.head_dim}, base={self.base}, mrope_section={list(self.mrope_section)}{kind}"


def mrope_from_hf(config: Any) -> MultimodalRope:
    """A :class:`MultimodalRope` that rotates as the Hugging Face Qwen2-VL / Qwen3-VL text model with
    this config (``head_dim`` or ``hidden_size / num_attention_heads``, ``rope_parameters`` or
    ``rope_scaling`` with ``rope_theta``, ``mrope_section``, ``mrope_interleaved``)."""

    def get(obj: Any, key: str, default: Any = None) -> Any:
        return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)

    params = dict(get(config, "rope_parameters") or get(config, "rope_scaling") or {})
    head_dim = get(config, "head_dim") or get(config, "hidden_size") // get(config, "num_attention_heads")
    rule = params.get("rope_type", params.get("type", "default"))
    if rule not in ("default", "mrope"):
        raise ValueError(f"mrope_from_hf supports the default frequencies, got rope_type {rule!r}")
    if "mrope_section" not in params:
        raise ValueError(
            "config has no mrope_section in rope_parameters (or rope_scaling): not a multimodal RoPE"
        )
    return MultimodalRope(
        head_dim,
        base=float(params.get("rope_theta", get(config, "rope_theta", 10000.0))),
        mrope_section=list(params["mrope_section"]),
        interleaved=bool(params.get("mrope_interleaved", False)),
    )
