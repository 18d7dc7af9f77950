"""Models that take any positional scheme by name: attention, KV cache, Transformers, save/load.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``V`` vocabulary. See docs/model.md.
"""

from .attention import MultiHeadAttention, attend
from .cache import KVCache
from .classes import MODEL_CLASSES
from .config import NORMS, ModelConfig
from .hf import from_transformers, save_transformers, to_transformers
from .plan import AttentionPlan, causal_mask, plan_attention, plan_cross_attention
from .pretrained import Pretrained, from_pretrained, save_pretrained
from .saving import load_model, save_model
from .stack import MLP, Block, Decoder, Encoder, Memory
from .surgery import with_position
from .transformer import EncoderDecoder, LMOutput, TransformerLM, sample_next

__all__ = [
    "MLP",
    "MODEL_CLASSES",
    "NORMS",
    "AttentionPlan",
    "Block",
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "KVCache",
    "LMOutput",
    "Memory",
    "ModelConfig",
    "MultiHeadAttention",
    "Pretrained",
    "TransformerLM",
    "attend",
    "causal_mask",
    "from_pretrained",
    "from_transformers",
    "load_model",
    "plan_attention",
    "plan_cross_attention",
    "sample_next",
    "save_model",
    "save_pretrained",
    "save_transformers",
    "to_transformers",
    "with_position",
]
