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
from .model import (
    Decoder,
    Encoder,
    EncoderDecoder,
    KVCache,
    LMOutput,
    Memory,
    ModelConfig,
    MultiHeadAttention,
    TransformerLM,
    load_model,
    save_model,
)
from .positions import arange_positions, positions_from_cu_seqlens, positions_from_mask
from .registry import build, build_with_context, describe, register, schemes

__version__ = "0.1.0"

__all__ = [
    "HOOKS",
    "TIE_STRATEGIES",
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "InputEmbedding",
    "KVCache",
    "LMOutput",
    "LearnedPE",
    "Memory",
    "ModelConfig",
    "MultiHeadAttention",
    "NoPE",
    "PositionalScheme",
    "ScaledSinusoidalPE",
    "Sinusoidal2D",
    "Sinusoidal3D",
    "SinusoidalND",
    "SinusoidalPE",
    "TokenEmbedding",
    "TransformerLM",
    "__version__",
    "apply_tying",
    "arange_positions",
    "build",
    "build_with_context",
    "describe",
    "load_model",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "register",
    "save_model",
    "schemes",
    "sinusoidal_frequencies",
    "sinusoidal_nd_table",
    "sinusoidal_table",
    "tie_weights",
]
