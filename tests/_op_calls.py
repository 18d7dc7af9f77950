"""A dispatch mode that records which posenc ops a call reaches (shared by the kernel tests)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpCalls(TorchDispatchMode):
    """Records the posenc ops that reach the dispatcher in ``names`` (aten ops are left out)."""

    def __enter__(self):
        self.names = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "posenc":
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))
