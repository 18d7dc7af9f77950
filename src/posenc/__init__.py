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
from .bias import ALiBi, T5RelativeBias, alibi_bias, alibi_slopes, relative_positions, t5_relative_bucket
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
from .relative import ShawRelative, TransformerXLRelative
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


def __getattr__(name: str):  # `posenc.text` loads lazily: it needs the optional `tokenizers`
    if name == "text":
        import importlib

        return importlib.import_module(".text", __name__)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


__all__ = [
    "HOOKS",
    "ROPE_SCALINGS",
    "ROTARY_LAYOUTS",
    "TIE_STRATEGIES",
    "ALiBi",
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
    "Rope2D",
    "RotaryEmbedding",
    "ScaledSinusoidalPE",
    "ShawRelative",
    "Sinusoidal2D",
    "Sinusoidal3D",
    "SinusoidalND",
    "SinusoidalPE",
    "T5RelativeBias",
    "TokenEmbedding",
    "TransformerLM",
    "TransformerXLRelative",
    "XPos",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "apply_rotary",
    "apply_tying",
    "arange_positions",
    "build",
    "build_with_context",
    "describe",
    "hf_rope_config",
    "load_model",
    "permute_qk_weights",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "register",
    "relative_positions",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_from_hf",
    "save_model",
    "schemes",
    "sinusoidal_frequencies",
    "sinusoidal_nd_table",
    "sinusoidal_table",
    "t5_relative_bucket",
    "tie_weights",
]
