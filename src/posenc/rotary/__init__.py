"""Rotary position embeddings (RoPE) and their family: every long-context scaling, xPos, axial 2D RoPE.

RoPE (Su et al. 2021, "RoFormer") rotates each pair of query/key dimensions ``(x_{2i}, x_{2i+1})``
(or ``(x_i, x_{i + r/2})``, see layouts) by the angle ``m * w_i`` for a token at position ``m``::

    [y_a]   [cos(m w_i)  -sin(m w_i)] [x_a]        w_i = base^(-2i/r),  i = 0 .. r/2 - 1
    [y_b] = [sin(m w_i)   cos(m w_i)] [x_b]

so that ``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on positions only through ``n - m``.

The maths is in pure functions:

* :func:`rope_frequencies` -- ``(inv_freq [r/2], attention_scale)`` for a scaling rule from
  :data:`ROPE_SCALINGS` (``default``, ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``);
* :func:`rope_cos_sin` -- ``cos``/``sin`` of ``positions * inv_freq`` (float32 angles, autocast off);
* :func:`apply_rotary` -- the rotation itself, in the ``"half"`` (Llama/NeoX/HF) or ``"interleaved"``
  (GPT-J/Meta/RoFormer) layout, with partial rotary; :func:`apply_rotary_qk` rotates queries and
  keys in one call;
* :func:`permute_qk_weights` -- moves q/k projection weights between the two layouts.

The modules :class:`RotaryEmbedding` (``"rope"``), :class:`XPos` (``"xpos"``) and :class:`Rope2D`
(``"rope_2d"``) hold configuration only: no buffers, no cache. Frequencies are recomputed from the
configuration in every call (a few ops on ``r/2`` numbers), so ``module.to(torch.bfloat16)`` cannot
degrade them, a meta-device build materialises correctly, and forward never mutates state. A model
builds the tables once per forward pass (``RotaryEmbedding.rotary_tables``, through its attention
plan) and hands them to every layer's ``rotate``.

Convention for ``cos``/``sin``: **half width**, one value per rotated pair: ``[..., s, r/2]``,
broadcastable against ``x[..., s, :r/2]`` (Hugging Face's full-width tables, each value twice,
convert with :func:`half_width_tables`). Positions ``[s]`` give ``[s, r/2]`` (shared by the batch
and heads); positions ``[b, s]`` give ``[b, 1, s, r/2]`` for ``x`` of shape ``[b, h, s, d_h]``.
The attention scale of a rule (YaRN's ``0.1 ln s + 1``, LongRoPE's factor) multiplies both ``cos``
and ``sin`` exactly as Hugging Face transformers does, so q and k are each scaled by it and the
logits by its square.

Axis order of queries and keys (``qk_layout``): ``"bhsd"`` = ``[b, h, s, d_h]`` (the default: what
``scaled_dot_product_attention`` takes) or ``"bshd"`` = ``[b, s, h, d_h]`` (flash-attention,
torchtune, most fused kernels). It is always an explicit argument, never guessed from shapes.

Legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s`` sequence length
(``s_q``/``s_k`` for queries/keys), ``d_h`` head width, ``r`` rotary width (``r <= d_h``, even).
"""

from .apply import QK_LAYOUTS, apply_rotary, apply_rotary_qk, half_width_tables
from .hf import hf_rope_config, permute_qk_weights, rope_from_hf
from .modules import RotaryEmbedding
from .mrope import MultimodalRope, mrope_from_hf, mrope_positions_from_hf
from .reference import ROTARY_LAYOUTS
from .scalings import ROPE_SCALINGS, RopeScaling, document_lengths, rope_cos_sin, rope_frequencies
from .variants import Rope2D, XPos

__all__ = [
    "QK_LAYOUTS",
    "ROPE_SCALINGS",
    "ROTARY_LAYOUTS",
    "MultimodalRope",
    "Rope2D",
    "RopeScaling",
    "RotaryEmbedding",
    "XPos",
    "apply_rotary",
    "apply_rotary_qk",
    "document_lengths",
    "half_width_tables",
    "hf_rope_config",
    "mrope_from_hf",
    "mrope_positions_from_hf",
    "permute_qk_weights",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_from_hf",
]
