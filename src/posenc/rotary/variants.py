"""Variants of RoPE built on :class:`RotaryEmbedding`: xPos (a per-pair decay with distance) and
axial 2D RoPE for image patches.

Legend: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d_h`` head width, ``r`` rotary width.
"""

from __future__ import annotations

import math

import torch

from .._precision import angle_dtype, autocast_off
from .._validate import check_int, check_positive_float
from .apply import apply_rotary, describe_value, is_integer_dtype, seq_axis
from .modules import RotaryEmbedding, check_qk, for_heads, one_call
from .scalings import default_inv_freq, rope_cos_sin

__all__ = ["Rope2D", "XPos"]


class XPos(RotaryEmbedding):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE times a per-pair decay.

    Pair ``i`` of a query at position ``n`` is scaled by ``zeta_i^(n/gamma)`` and of a key at ``m`` by
    ``zeta_i^(-m/gamma)``, ``zeta_i = (2i/r + 0.4) / 1.4``, ``gamma = scale_base`` (512), so the logit
    gains ``zeta_i^((n-m)/gamma)``: it decays with distance for causal attention (``n >= m``).
    Scales use absolute positions (no re-centring), so a key's scale never changes once cached and
    KV-cache offsets are exact. The price: ``zeta_0^(-m/gamma)`` overflows past
    ``m ~ gamma * ln(max) / |ln zeta_0|`` (about 36k positions in float32/bf16, 4.5k in fp16);
    longer positions raise ``ValueError`` rather than return inf.

    Args:
        head_dim, base, rotary_dim, partial_rotary_factor, layout: as :class:`RotaryEmbedding`.
        scale_base: ``gamma``.

    Shapes: as :class:`RotaryEmbedding`.
    """

    name = "xpos"
    eval_variants = ()  # no scaling argument: xPos's own decay is its answer to long inputs
    summary = "RoPE with an exponential per-pair decay (Sun et al. 2022), causal, KV-cache exact"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        layout: str = "half",
        scale_base: float = 512.0,
        qk_layout: str = "bhsd",
        num_heads: int | None = None,
    ) -> None:
        super().__init__(
            head_dim,
            base,
            rotary_dim,
            partial_rotary_factor,
            layout,
            qk_layout=qk_layout,
            num_heads=num_heads,
        )
        self.scale_base = check_positive_float(scale_base, "scale_base")

    def log_zeta(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``ln zeta_i`` for the ``r/2`` pairs, float64: ``zeta_i = (2i/r + 0.4) / 1.4``."""
        i2 = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64, device=device)  # [r/2]: 2i
        return torch.log((i2 / self.rotary_dim + 0.4) / 1.4)

    def max_position(self, dtype: torch.dtype) -> int:
        """Largest ``|position|`` whose scale neither overflows nor underflows ``dtype``."""
        info = torch.finfo(dtype)
        limit = min(math.log(info.max), -math.log(info.tiny))
        return int(self.scale_base * limit / abs(math.log(0.4 / 1.4)))

    def _check_range(self, positions: torch.Tensor, dtype: torch.dtype, name: str) -> None:
        if torch.compiler.is_compiling() or not positions.numel() or positions.device.type == "meta":
            return  # data-dependent: only in eager mode on real data
        top, limit = int(positions.abs().max()), self.max_position(dtype)
        if top > limit:
            raise ValueError(
                f"{name} reach {top} but xPos scales zeta^(+-m/{self.scale_base:g}) leave the range of "
                f"{dtype} past |m| = {limit}; use float32/bf16 (not fp16), a larger scale_base, or rope"
            )

    def _scale(
        self, positions: torch.Tensor, sign: float, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """``zeta^(sign * m / gamma)``: ``[..., s, r/2]`` in ``dtype`` (float32, or float64 for a
        float64 model, whose range reaches about 8x further)."""
        with autocast_off(positions.device):
            power = positions.to(dtype)[..., None] * (sign / self.scale_base)  # [..., s, 1]
            log_zeta = self.log_zeta(positions.device).to(dtype)  # [r/2]
            return torch.exp(power * log_zeta)  # [..., s, 1] * [r/2] -> [..., s, r/2]

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`RotaryEmbedding.rotate` (positions likewise: one tensor places q and k both),
        with the xPos scales on q (``zeta^(n/gamma)``) and k (``zeta^(-m/gamma)``). q and k are
        always rotated together: their scales differ, so one tensor alone is ambiguous."""
        qk_layout = self._qk_layout(qk_layout)
        k, q_positions, k_positions = one_call(k, q_positions, k_positions, position_ids)
        if k is None:
            self.rotate_one(q)  # raises: xPos needs q and k
        check_qk(q, k, self.head_dim, qk_layout, self.num_heads)
        qp, kp = self._positions(q, k, q_positions, k_positions, qk_layout)
        self._check_range(qp, q.dtype, "q_positions")
        self._check_range(kp, k.dtype, "k_positions")
        inv, _ = self.frequencies(device=q.device)
        out = []
        for x, pos, sign in ((q, qp, 1.0), (k, kp, -1.0)):
            dtype = angle_dtype(x.dtype)  # float32, float64 for a float64 x (its range reaches further)
            cos, sin = rope_cos_sin(pos, inv, dtype=dtype)  # [..., s, r/2]
            scale = self._scale(pos, sign, dtype)
            cos, sin = (cos * scale).to(x.dtype), (sin * scale).to(x.dtype)
            cos, sin = for_heads(cos, pos, qk_layout), for_heads(sin, pos, qk_layout)
            out.append(self._rotate_one(x, cos, sin, qk_layout))
        return out[0], out[1]

    def rotate_one(self, x, positions=None, *, qk_layout=None):
        """Refused: xPos scales queries by ``zeta^(n/gamma)`` and keys by ``zeta^(-m/gamma)``, so a
        tensor rotated alone has no single meaning; call ``rotate(q, k, ...)``."""
        raise TypeError(
            "xpos scales queries and keys differently (zeta^(+n/gamma) and zeta^(-m/gamma)), so it "
            "rotates q and k together: call rotate(q, k, positions)"
        )

    def rotary_tables(self, q, k, q_positions=None, k_positions=None, *, qk_layout=None) -> None:
        """None: xPos scales queries and keys apart, so :meth:`rotate` builds its own tables."""
        return None

    def _rotate_one(self, x, cos, sin, qk_layout):
        return apply_rotary(x, cos, sin, layout=self.layout, rotary_dim=self.rotary_dim, qk_layout=qk_layout)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", scale_base={self.scale_base}"


class Rope2D(RotaryEmbedding):
    """Axial 2D RoPE for image patches (Heo et al. 2024, "Rotary Position Embedding for Vision
    Transformer"; the axial form of EVA-02/FiT): half the rotated pairs turn with the row, half with
    the column, each with RoPE frequencies of width ``r/2``.

    Pairs ``0 .. r/4-1`` (in the chosen layout's pairing) use the row coordinate, pairs
    ``r/4 .. r/2-1`` the column, so ``<R_p q, R_p' k>`` depends only on ``p' - p`` per axis.

    Args:
        head_dim, base, rotary_dim, partial_rotary_factor, layout: as :class:`RotaryEmbedding`;
            ``r`` must be a multiple of 4.
        grid: ``(rows, cols)``; when given, positions default to the row-major patch coordinates
            (``s = rows * cols``). Otherwise positions are required.

    Shapes: ``rotate(q [b, h, s_q, d_h], k [b, h_kv, s_k, d_h], q_positions [s_q, 2] | [b, s_q, 2],
    k_positions [s_k, 2] | [b, s_k, 2])``; coordinates are integer ``(row, col)``.
    """

    name = "rope_2d"
    eval_variants = ()  # grids, not sequences
    position_dims = 2
    axis_names = ("row", "column")  # what each coordinate is (drawn by the analysis)
    summary = "axial 2D RoPE for image patches: half the rotary pairs per axis (row, column)"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        layout: str = "half",
        grid: tuple[int, int] | None = None,
        qk_layout: str = "bhsd",
        num_heads: int | None = None,
    ) -> None:
        super().__init__(
            head_dim,
            base,
            rotary_dim,
            partial_rotary_factor,
            layout,
            qk_layout=qk_layout,
            num_heads=num_heads,
        )
        if self.rotary_dim % 4:
            raise ValueError(
                f"rope_2d splits the rotary dims between two axes, so rotary_dim must be a multiple of 4, "
                f"got {self.rotary_dim}"
            )
        if grid is not None:
            if not isinstance(grid, (tuple, list)) or len(grid) != 2:
                raise TypeError(f"grid must be a (rows, cols) pair of ints, got {grid!r}")
            grid = (check_int(grid[0], "grid[0]"), check_int(grid[1], "grid[1]"))
        self.grid = grid

    def coords(
        self, positions: torch.Tensor | None, seq_len: int, device: torch.device, name: str
    ) -> torch.Tensor:
        """Validated integer coordinates ``[s, 2]`` or ``[b, s, 2]`` (default: the grid, row-major)."""
        if positions is None:
            if self.grid is None or self.grid[0] * self.grid[1] != seq_len:
                raise ValueError(
                    f"{name} is None and the sequence has {seq_len} patches, which does not match "
                    f"grid={self.grid}; pass {name} as integer (row, col) coordinates [s, 2] or build "
                    "rope_2d with grid=(rows, cols)"
                )
            rows, cols = torch.meshgrid(
                torch.arange(self.grid[0], device=device),
                torch.arange(self.grid[1], device=device),
                indexing="ij",
            )  # [rows, cols] each
            return torch.stack((rows, cols), dim=-1).reshape(seq_len, 2)  # [rows, cols, 2] -> [s, 2]
        if not isinstance(positions, torch.Tensor) or not is_integer_dtype(positions):
            raise TypeError(
                f"{name} must be an integer tensor [s, 2] or [b, s, 2], got {describe_value(positions)}"
            )
        if positions.dim() not in (2, 3) or positions.shape[-1] != 2 or positions.shape[-2] != seq_len:
            raise ValueError(
                f"{name} must have shape [s, 2] or [b, s, 2] with s = {seq_len}, got {tuple(positions.shape)}"
            )
        return positions.long()

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32, seq_len=None, qk_layout=None
    ):
        """Tables for coordinates ``[s, 2]`` -> ``[s, r/2]``, ``[b, s, 2]`` -> ``[b, 1, s, r/2]``
        (``"bshd"``: ``[b, s, 1, r/2]``)."""
        qk_layout = self._qk_layout(qk_layout)
        inv = default_inv_freq(self.rotary_dim // 2, self.base, positions.device)  # [r/4], per axis
        (cos_r, sin_r), (cos_c, sin_c) = (rope_cos_sin(positions[..., a], inv, dtype=dtype) for a in (0, 1))
        cos = torch.cat((cos_r, cos_c), dim=-1)  # row [..., s, r/4] ++ column [..., s, r/4] -> [..., s, r/2]
        sin = torch.cat((sin_r, sin_c), dim=-1)
        return for_heads(cos, positions[..., 0], qk_layout), for_heads(sin, positions[..., 0], qk_layout)

    def rotary_tables(self, q, k, q_positions=None, k_positions=None, *, qk_layout=None) -> None:
        """None: 2D coordinates are resolved per call by :meth:`rotate`."""
        return None

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """Rotate by 2D patch coordinates (see the class docstring for shapes; positions and
        ``qk_layout`` as :meth:`RotaryEmbedding.rotate`: one coordinates tensor places q and k
        both; one tensor alone, ``rope_2d(x, coords)``, returns ``x`` rotated)."""
        qk_layout = self._qk_layout(qk_layout)
        k, q_positions, k_positions = one_call(k, q_positions, k_positions, position_ids)
        if k is None:
            return self.rotate_one(q, q_positions, qk_layout=qk_layout)
        check_qk(q, k, self.head_dim, qk_layout, self.num_heads)
        if q_positions is None and k_positions is not None:
            raise ValueError("k_positions is given without q_positions: pass q_positions too")
        if q_positions is not None and k_positions is None:
            s_q, s_k = q.shape[seq_axis(qk_layout)], k.shape[seq_axis(qk_layout)]
            if s_q != s_k:
                raise ValueError(
                    f"one coordinates tensor rotates q and k at the same positions, but q has s_q = {s_q} "
                    f"and k has s_k = {s_k}: pass the keys' coordinates as k_positions"
                )
            k_positions = q_positions
        return self._rotate_at(q, q_positions, "q_positions", qk_layout), self._rotate_at(
            k, k_positions, "k_positions", qk_layout
        )

    def rotate_one(self, x, positions=None, *, qk_layout=None):
        """One tensor ``x [b, h, s, d_h]`` rotated by its coordinates ``[s, 2]`` or ``[b, s, 2]``
        (default: the grid) -> ``[b, h, s, d_h]``."""
        qk_layout = self._qk_layout(qk_layout)
        check_qk(x, None, self.head_dim, qk_layout, self.num_heads)
        return self._rotate_at(x, positions, "positions", qk_layout)

    def _rotate_at(self, x, positions, name, qk_layout):
        coords = self.coords(positions, x.shape[seq_axis(qk_layout)], x.device, name)
        cos, sin = self.cos_sin(coords, dtype=x.dtype, qk_layout=qk_layout)
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim, "qk_layout": qk_layout}
        return apply_rotary(x, cos, sin, **kw)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", grid={self.grid}"
