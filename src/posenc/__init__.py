"""posenc: token embeddings and every major positional-encoding scheme for Transformers.

Public names only; the maths lives in the scheme files (``absolute``, ...), the glue in
``registry`` and ``embedding``. See README.md and docs/.
"""

from .absolute import (
    LearnedPE,
    NoPE,
    ScaledSinusoidalPE,
    Sinusoidal2D,
    Sinusoidal3D,
    SinusoidalND,
    SinusoidalPE,
    sinusoidal_frequencies,
    sinusoidal_nd_table,
    sinusoidal_table,
)
from .base import HOOKS, PositionalScheme
from .embedding import TIE_STRATEGIES, InputEmbedding, TokenEmbedding, apply_tying, tie_weights
from .positions import arange_positions, positions_from_cu_seqlens, positions_from_mask
from .registry import build, build_with_context, describe, register, schemes
from .rotary import (
    ROPE_SCALINGS,
    ROTARY_LAYOUTS,
    Rope2D,
    RotaryEmbedding,
    XPos,
    apply_rotary,
    hf_rope_config,
    permute_qk_weights,
    rope_cos_sin,
    rope_frequencies,
    rope_from_hf,
)

__version__ = "0.1.0"

__all__ = [
    "HOOKS",
    "ROPE_SCALINGS",
    "ROTARY_LAYOUTS",
    "TIE_STRATEGIES",
    "InputEmbedding",
    "LearnedPE",
    "NoPE",
    "PositionalScheme",
    "Rope2D",
    "RotaryEmbedding",
    "ScaledSinusoidalPE",
    "Sinusoidal2D",
    "Sinusoidal3D",
    "SinusoidalND",
    "SinusoidalPE",
    "TokenEmbedding",
    "XPos",
    "__version__",
    "apply_rotary",
    "apply_tying",
    "arange_positions",
    "build",
    "build_with_context",
    "describe",
    "hf_rope_config",
    "permute_qk_weights",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "register",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_from_hf",
    "schemes",
    "sinusoidal_frequencies",
    "sinusoidal_nd_table",
    "sinusoidal_table",
    "tie_weights",
]
