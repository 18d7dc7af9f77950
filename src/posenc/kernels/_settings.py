"""The one switch for posenc's fast paths and the one check that a call may take them.

``POSENC_C_KERNELS=0`` (or ``false``/``no``/``off``) in the environment runs every reference
PyTorch path instead of a C or Triton kernel. The variable is read once, at the first fast-path
decision of the process; :func:`set_enabled` changes the switch at run time for every kernel at
once (it takes effect at the next call; a graph already compiled by ``torch.compile`` keeps what it
traced).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

__all__ = ["compiled_graph", "eager", "enabled", "outside_traces", "records_nothing", "set_enabled"]

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
    """True when every tensor is a plain eager ``torch.Tensor`` (also an ``nn.Parameter``, or a
    subclass of it, with ``parameters``): not a subclass such as FakeTensor or DTensor, not being
    traced or scripted, not inside a ``torch.func`` transform. Kernels read raw memory; anything
    else takes the reference path."""
    if torch.jit.is_tracing() or torch.jit.is_scripting():
        return False
    for t in tensors:
        parameter = parameters and isinstance(t, torch.nn.Parameter)
        if type(t) is not torch.Tensor and not parameter:
            return False
        if _functorch is not None and _functorch.is_functorch_wrapped_tensor(t):
            return False
    return True


def compiled_graph() -> bool:
    """True while ``torch.compile`` (dynamo) traces a graph that may hold posenc's registered ops:
    not under ``torch.export`` (an exported program stays portable: the reference path's aten ops)
    and not inside a ``torch.func`` transform (the ops have no functorch rules: the reference path)."""
    return (
        torch.compiler.is_dynamo_compiling()
        and not _exporting()
        and not torch._C._are_functorch_transforms_active()
    )


def _exporting() -> bool:
    """``torch.export`` is tracing. ``torch.compiler.is_exporting()`` returns the module flag
    ``_is_exporting_flag``, but TorchDynamo before torch 2.13 folds that call to True under every
    ``torch.compile`` (seen with torch 2.11: compiled graphs lost every posenc op), so the flag is
    read where torch has it."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


@contextlib.contextmanager
def outside_traces() -> Iterator[None]:
    """Run real tensor code (building and self-checking a kernel) even when called while a graph is
    traced: fake-tensor and other dispatch modes and functorch transforms are suspended."""
    # private torch APIs, the ones torch's own compile stack uses for the same purpose
    with torch.utils._python_dispatch._disable_current_modes(), torch._C._DisableFuncTorch():
        yield


def records_nothing(*tensors: torch.Tensor) -> contextlib.AbstractContextManager | None:
    """In eager mode, where autograd has nothing to record for an op on ``tensors`` (grad mode off,
    or none of them requires grad): a context that dispatches the op below autograd, as the op's
    autograd wrapper would after finding the same (it runs in Python on every call: ~15 us on a
    2-core host under load). The op still reaches its fake, Python-mode (``TorchDispatchMode``)
    and device kernels. None while ``torch.compile`` traces or where a gradient is needed."""
    if torch.compiler.is_compiling():
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return torch._C._AutoDispatchBelowAutograd()  # private torch API, what the wrapper itself uses
