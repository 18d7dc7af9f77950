"""The one switch for posenc's fast paths and the one check that a call may take them.

``POSENC_C_KERNELS=0`` (or ``false``/``no``/``off``) in the environment runs every reference
PyTorch path instead of a C or Triton kernel. The variable is read once, at the first fast-path
decision of the process; :func:`set_enabled` changes the switch at run time for every kernel at
once (it takes effect at the next call; a graph already compiled by ``torch.compile`` keeps what it
traced).
"""

from __future__ import annotations

import os

import torch

__all__ = ["eager", "enabled", "set_enabled"]

_OFF = ("0", "false", "no", "off")
_state: dict[str, bool | None] = {"enabled": None}
_functorch = getattr(torch._C, "_functorch", None)


def enabled() -> bool:
    """Whether fast paths may run (``POSENC_C_KERNELS``, read on first use, or :func:`set_enabled`)."""
    on = _state["enabled"]
    if on is None:
        on = _state["enabled"] = os.environ.get("POSENC_C_KERNELS", "1").strip().lower() not in _OFF
    return on


def set_enabled(on: bool | None) -> None:
    """Switch every fast path on (``True``) or off (``False``) for this process; ``None`` reads
    ``POSENC_C_KERNELS`` again at the next decision.

    Raises:
        TypeError: ``on`` is not a bool or None.
    """
    if on is not None and not isinstance(on, bool):
        raise TypeError(f"on must be True, False or None (read POSENC_C_KERNELS again), got {on!r}")
    _state["enabled"] = on


def eager(*tensors: torch.Tensor, parameters: bool = False) -> bool:
    """True when every tensor is a plain eager ``torch.Tensor`` (also an ``nn.Parameter`` with
    ``parameters``): not a subclass such as FakeTensor or DTensor, not being traced or scripted,
    not inside a ``torch.func`` transform. Kernels read raw memory; anything else takes the
    reference path."""
    if torch.jit.is_tracing() or torch.jit.is_scripting():
        return False
    allowed = (torch.Tensor, torch.nn.Parameter) if parameters else (torch.Tensor,)
    for t in tensors:
        if type(t) not in allowed:
            return False
        if _functorch is not None and _functorch.is_functorch_wrapped_tensor(t):
            return False
    return True
