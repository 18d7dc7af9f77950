"""posenc: token embeddings and every major positional-encoding scheme for Transformers.

Public names only; the maths lives in the scheme files (``absolute``, ...), the glue in
``registry`` and ``embedding``. See README.md and docs/.

Names load on first use (PEP 562), so ``import posenc`` and ``posenc --help`` do not import
torch; ``from posenc import build`` or ``posenc.build`` imports what it needs.
"""

from __future__ import annotations

from ._lazy import lazy_attributes

__version__ = "0.1.0"

#: public name -> the module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # absolute
    "LearnedPE": "absolute",
    "NoPE": "absolute",
    "ScaledSinusoidalPE": "absolute",
    "Sinusoidal2D": "absolute_nd",
    "Sinusoidal3D": "absolute_nd",
    "SinusoidalND": "absolute_nd",
    "SinusoidalPE": "absolute",
    "sinusoidal_frequencies": "absolute",
    "sinusoidal_nd_table": "absolute_nd",
    "sinusoidal_table": "absolute",
    # base
    "HOOKS": "base",
    "PositionalScheme": "base",
    # bias
    "ALiBi": "bias",
    "T5RelativeBias": "bias",
    "alibi_bias": "bias",
    "alibi_slopes": "bias",
    "relative_positions": "bias",
    "t5_relative_bucket": "bias",
    # embedding
    "InputEmbedding": "embedding",
    "TIE_STRATEGIES": "embedding",
    "TokenEmbedding": "embedding",
    "apply_tying": "embedding",
    "tie_weights": "embedding",
    # model
    "Decoder": "model",
    "Encoder": "model",
    "EncoderDecoder": "model",
    "KVCache": "model",
    "LMOutput": "model",
    "Memory": "model",
    "ModelConfig": "model",
    "MultiHeadAttention": "model",
    "TransformerLM": "model",
    "load_model": "model",
    "save_model": "model",
    # positions
    "arange_positions": "positions",
    "positions_from_cu_seqlens": "positions",
    "positions_from_mask": "positions",
    "randomized_positions": "positions",
    # registry
    "build": "registry",
    "build_with_context": "registry",
    "describe": "registry",
    "register": "registry",
    "schemes": "registry",
    # contextual, functional and kernelized biases
    "CoPE": "cope",
    "FIRE": "fire",
    "KerpleLog": "kerple",
    "KerplePower": "kerple",
    "QueryTemperature": "temperature",
    # relative
    "ShawRelative": "relative",
    "TransformerXLRelative": "relative",
    # rotary
    "QK_LAYOUTS": "rotary",
    "ROPE_SCALINGS": "rotary",
    "ROTARY_LAYOUTS": "rotary",
    "Rope2D": "rotary",
    "RotaryEmbedding": "rotary",
    "XPos": "rotary",
    "apply_rotary": "rotary",
    "apply_rotary_qk": "rotary",
    "half_width_tables": "rotary",
    "hf_rope_config": "rotary",
    "MultimodalRope": "rotary",
    "mrope_from_hf": "rotary",
    "mrope_positions_from_hf": "rotary",
    "permute_qk_weights": "rotary",
    "rope_cos_sin": "rotary",
    "rope_frequencies": "rotary",
    "rope_from_hf": "rotary",
    # vectors
    "VectorCoverage": "vectors",
    "align_vectors": "vectors",
    "pretrained_embedding": "vectors",
    "read_safetensors_vectors": "vectors",
    "read_word_vectors": "vectors",
}

#: subpackages and modules reachable as attributes (``posenc.registry.SCHEMES``, ``posenc.text``)
_SUBMODULES = (
    "absolute", "analysis", "base", "bias", "benchmarks", "cli", "cope", "embedding", "fire", "kernels",
    "kerple", "lab", "model", "positions", "registry", "relative", "rotary", "temperature", "text",
    "vectors",
)  # fmt: skip


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, _SUBMODULES)


__all__ = [
    "FIRE",
    "HOOKS",
    "QK_LAYOUTS",
    "ROPE_SCALINGS",
    "ROTARY_LAYOUTS",
    "TIE_STRATEGIES",
    "ALiBi",
    "CoPE",
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "InputEmbedding",
    "KVCache",
    "KerpleLog",
    "KerplePower",
    "LMOutput",
    "LearnedPE",
    "Memory",
    "ModelConfig",
    "MultiHeadAttention",
    "MultimodalRope",
    "NoPE",
    "PositionalScheme",
    "QueryTemperature",
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
    "VectorCoverage",
    "XPos",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "align_vectors",
    "apply_rotary",
    "apply_rotary_qk",
    "apply_tying",
    "arange_positions",
    "build",
    "build_with_context",
    "describe",
    "half_width_tables",
    "hf_rope_config",
    "load_model",
    "mrope_from_hf",
    "mrope_positions_from_hf",
    "permute_qk_weights",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "pretrained_embedding",
    "randomized_positions",
    "read_safetensors_vectors",
    "read_word_vectors",
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
