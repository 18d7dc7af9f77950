"""Optional fast paths behind posenc's pure functions (users never call a different API).

Each fast path is one registered ``torch.library`` operator per device (a fake implementation, one
autograd rule), called the same way in eager mode and under ``torch.compile``:

* :mod:`posenc.kernels.rope_cpu` -- ``posenc::rope_cpu`` (and ``posenc::rope_cpu_out``, in place or
  into ``out``): one-pass rotation for :func:`posenc.apply_rotary`, bit-identical to the reference
  rotation of :mod:`posenc.rotary.reference`;
* :mod:`posenc.kernels.dropout_cpu` -- ``posenc::dropout_cpu``: counter-based dropout for
  :class:`posenc.Dropout`;
* :mod:`posenc.kernels.input_cpu` -- ``posenc::input_layer_cpu``: the whole input layer of
  :class:`posenc.InputEmbedding` in one pass;
* :mod:`posenc.kernels.rope_triton` -- ``posenc::rope_triton`` (and ``posenc::rope_triton_out``):
  the same rotation on CUDA in a Triton kernel, q and k in one launch, bit-identical likewise.

C kernels are built on first use (:mod:`posenc.kernels._cbuild`), Triton kernels compiled and
self-checked on first use. Whether a kernel runs is decided inside its operator: where it cannot be
built, or with ``POSENC_C_KERNELS=0`` (read once; :func:`set_enabled` switches at run time; it
covers the Triton kernel too), the operator computes the same numbers with PyTorch ops: the
reference rotation, which the package that owns its maths hands down at import
(:func:`register_reference_rotation`), so no kernel imports from a package above it.
Code written in PyTorch above these kernels asks the same switch (:func:`enabled`), whether
tensors are plain eager ones (:func:`eager`), and allocates large outputs with :func:`empty`.
"""

from ._memory import empty
from ._rotation import register_reference_rotation
from ._settings import eager, enabled, set_enabled

__all__ = ["eager", "empty", "enabled", "register_reference_rotation", "set_enabled"]
