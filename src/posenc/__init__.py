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

__version__ = "0.1.0"


def __getattr__(name: str):  # `posenc.text` loads lazily: it needs the optional `tokenizers`
    if name == "text":
        import importlib

        return importlib.import_module(".text", __name__)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")

__all__ = [
    "HOOKS",
    "TIE_STRATEGIES",
    "InputEmbedding",
    "LearnedPE",
    "NoPE",
    "PositionalScheme",
    "ScaledSinusoidalPE",
    "Sinusoidal2D",
    "Sinusoidal3D",
    "SinusoidalND",
    "SinusoidalPE",
    "TokenEmbedding",
    "__version__",
    "apply_tying",
    "arange_positions",
    "build",
    "build_with_context",
    "describe",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "register",
    "schemes",
    "sinusoidal_frequencies",
    "sinusoidal_nd_table",
    "sinusoidal_table",
    "tie_weights",
]
