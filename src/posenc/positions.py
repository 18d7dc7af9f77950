"""Position ids: the one place where posenc decides which position every token has.

Every hook of every scheme takes explicit integer positions. This module makes them:

* :func:`arange_positions` -- the default ``0, 1, ..., s-1``, optionally shifted by an offset
  (an int, or one offset per batch row for a KV cache whose rows have different lengths);
* :func:`positions_from_mask` -- positions of a left-padded batch, from its attention mask;
* :func:`positions_from_cu_seqlens` -- positions of packed documents, restarting at 0 for each;
* :func:`randomized_positions` -- sorted positions drawn without replacement from a larger range
  (training with randomized positional encodings, Ruoss et al. 2023).

and :func:`check_positions` validates positions handed in by a user.

Legend for shapes in this module: ``b`` batch, ``s`` sequence length, ``n`` documents.
Positions are always an integer tensor (int64 by default); they are never held in a float dtype,
so a bf16 or fp16 model cannot collapse neighbouring positions.
"""

from __future__ import annotations

import torch

__all__ = [
    "arange_positions",
    "check_positions",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "randomized_positions",
    "resolve_positions",
]


def _is_compiling() -> bool:
    return torch.compiler.is_compiling()


def arange_positions(
    seq_len: int,
    *,
    offset: int | torch.Tensor = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Default positions ``offset, offset + 1, ..., offset + seq_len - 1``.

    Args:
        seq_len: ``s``, the number of positions.
        offset: where counting starts: an int (e.g. the KV-cache length when decoding), or an
            integer tensor ``[b]`` with one offset per batch row.
        device: device of the result.

    Returns:
        int64 tensor ``[s]`` for an int offset, ``[b, s]`` for a tensor offset.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int):
        raise TypeError(f"seq_len must be an int, got {type(seq_len).__name__} ({seq_len!r})")
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")
    if isinstance(offset, torch.Tensor):
        if offset.is_floating_point() or offset.is_complex() or offset.dtype == torch.bool:
            raise TypeError(
                f"offset must be an integer tensor, got dtype {offset.dtype}; pass e.g. offset.long()"
            )
        if offset.dim() != 1:
            raise ValueError(
                f"a tensor offset must have shape [b] (one offset per batch row), got {tuple(offset.shape)}"
            )
        base = torch.arange(seq_len, device=offset.device if device is None else device)
        return offset.to(base.device, torch.long)[:, None] + base[None, :]  # [b, 1] + [1, s] -> [b, s]
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int or an integer tensor [b], got {type(offset).__name__}")
    return torch.arange(offset, offset + seq_len, device=device)


def randomized_positions(
    batch: int,
    seq_len: int,
    max_position: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Per row, ``s`` distinct positions drawn uniformly from ``[0, max_position)`` and sorted
    (Ruoss et al. 2023): a model trained on short windows sees the position values of long ones.

    Args:
        batch: ``b``, rows (each gets its own draw).
        seq_len: ``s``, positions per row; ``s <= max_position``.
        max_position: the range's end (exclusive), e.g. several times the training length.
        generator: a ``torch.Generator`` (CPU) for reproducible draws.
        device: device of the result.

    Returns:
        int64 ``[b, s]``, strictly increasing along each row.
    """
    for name, value in (("batch", batch), ("seq_len", seq_len), ("max_position", max_position)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if seq_len > max_position:
        raise ValueError(
            f"seq_len={seq_len} distinct positions cannot be drawn from [0, max_position={max_position}); "
            f"use max_position >= {seq_len}"
        )
    keys = torch.rand(batch, max_position, generator=generator)  # [b, max_position] uniform keys
    chosen = keys.topk(seq_len, dim=-1).indices  # [b, s]: a uniform subset without replacement
    return chosen.sort(dim=-1).values.to(device)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions for a (left- or right-) padded batch: real tokens count from 0, padding gets 0.

    Args:
        attention_mask: ``[b, s]``, 1/True for real tokens and 0/False for padding.

    Returns:
        int64 tensor ``[b, s]``. For the left-padded row ``[0, 0, 1, 1, 1]`` this is
        ``[0, 0, 0, 1, 2]``, so a left-padded sequence sees the same positions as unpadded.
    """
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor [b, s], got {type(attention_mask).__name__}")
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape [b, s], got {tuple(attention_mask.shape)}")
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(
            f"attention_mask must be bool or integer (1 = token, 0 = padding), got {attention_mask.dtype}"
        )
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).clamp_min(0) * mask


def positions_from_cu_seqlens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Positions for packed documents (varlen layout): each document restarts at 0.

    Args:
        cu_seqlens: int tensor ``[n + 1]`` of cumulative document lengths starting at 0,
            as flash-attention's varlen functions take it, e.g. ``[0, 3, 5]``.

    Returns:
        int64 tensor ``[total]`` with ``total = cu_seqlens[-1]``, e.g. ``[0, 1, 2, 0, 1]``.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a tensor [n + 1], got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens must have shape [n + 1] with n >= 0, got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.is_floating_point() or cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
    cu = cu_seqlens.long()
    if not _is_compiling():
        if int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens must start at 0, got {int(cu[0])}")
        if bool((cu[1:] < cu[:-1]).any()):
            raise ValueError(f"cu_seqlens must be non-decreasing, got {cu.tolist()}")
    lengths = cu[1:] - cu[:-1]  # [n]
    total = int(cu[-1])
    starts = torch.repeat_interleave(
        cu[:-1], lengths, output_size=total
    )  # [total]: start of each token's doc
    return torch.arange(total, device=cu.device) - starts


def check_positions(positions: torch.Tensor, seq_len: int, *, name: str = "positions") -> torch.Tensor:
    """Validate user positions for a sequence of length ``s`` and return them as int64.

    Args:
        positions: integer tensor ``[s]`` or ``[b, s]``.
        seq_len: ``s``, the length the positions must match.
        name: the argument's name, used in error messages.

    Raises:
        TypeError: positions are not an integer tensor (float positions would lose precision).
        ValueError: the shape does not end in ``s`` or has more than two dims.
    """
    if not isinstance(positions, torch.Tensor):
        raise TypeError(
            f"{name} must be an integer tensor [s] or [b, s], got {type(positions).__name__}; "
            "use torch.arange(s) or posenc.positions.arange_positions(s)"
        )
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(
            f"{name} must be an integer tensor, got dtype {positions.dtype}: positions are never held in "
            "float dtypes (bf16 cannot tell 257 from 256); pass e.g. positions.long()"
        )
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq_len:
        raise ValueError(
            f"{name} must have shape [s] or [b, s] with s = {seq_len}, got {tuple(positions.shape)}"
        )
    return positions.long()


def resolve_positions(
    positions: torch.Tensor | None,
    seq_len: int,
    device: torch.device,
    *,
    name: str = "positions",
    batch: int | None = None,
) -> torch.Tensor:
    """``positions`` validated, or the default ``arange(s)`` on ``device`` when None.

    ``batch``: the batch size of the input the positions go with; ``[b, s]`` positions must have
    ``b`` equal to it (or 1).

    Returns int64 ``[s]`` or ``[b, s]``.
    """
    if positions is None:
        return torch.arange(seq_len, device=device)
    positions = check_positions(positions, seq_len, name=name)
    if batch is not None and positions.dim() == 2 and positions.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} has batch size {positions.shape[0]} but the input has {batch}; pass [s] positions "
            f"(shared by the batch) or [{batch}, {seq_len}]"
        )
    return positions
