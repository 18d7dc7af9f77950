"""Optional fast paths behind posenc's pure functions (users never call a different API).

* :mod:`posenc.kernels.rope_cpu` -- one-pass CPU rotation for :func:`posenc.apply_rotary`
  (in place or out of place, bit-identical to the reference);
* :mod:`posenc.kernels.dropout_cpu` -- counter-based dropout for :class:`posenc.InputEmbedding`;
* :mod:`posenc.kernels.attention_cpu` -- causal attention with a bias built per query block;
* :mod:`posenc.kernels.rope_triton` -- RoPE on GPUs, q and k in one launch (Triton).

C kernels are built on first use (:mod:`posenc.kernels._cbuild`); where that is impossible, or
with ``POSENC_C_KERNELS=0`` (read once; :func:`set_enabled` switches at run time), every caller runs
its reference PyTorch path. On GPUs,
:mod:`posenc.kernels.rope_triton` (Triton, self-checked on first use) rotates for
:func:`posenc.apply_rotary`; everything else runs its reference path.
"""

from ._settings import enabled, set_enabled

__all__ = ["enabled", "set_enabled"]
