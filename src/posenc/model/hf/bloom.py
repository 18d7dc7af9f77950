"""The Bloom Hugging Face family: ALiBi, an embedding LayerNorm, per-head fused q/k/v, the tanh
GELU.
"""

from __future__ import annotations

from ..config import ModelConfig
from .fields import (
    build_config,
    check_heads,
    read_tie,
)
from .files import HFConfig, HFWeights
from .links import OLD_BUFFERS, TOKEN_TABLE, Family, Link, no_export, norm_links

__all__ = ["BLOOM"]


def _bloom_in(c: HFConfig, w: HFWeights) -> ModelConfig:
    d, h = c.int("hidden_size", "n_embed"), c.int("n_head", "num_attention_heads")
    check_heads(c, d, h)
    if c.bool("apply_residual_connection_post_layernorm", default=False):
        raise ValueError(f"{c.source}: apply_residual_connection_post_layernorm=true is not supported")
    return build_config(
        c,
        vocab_size=c.int("vocab_size"),
        d_model=d,
        num_layers=c.int("n_layer", "num_hidden_layers"),
        num_heads=h,
        position="alibi",
        norm_eps=c.float("layer_norm_epsilon", default=1e-5),
        activation="gelu_tanh",  # Bloom's own tanh-approximated GELU
        embed_scale=None,
        embed_norm=True,
        tie=read_tie(c, default=True),
        bias=True,
    )


def _bloom_links(cfg: ModelConfig) -> list[Link]:
    b, m = "decoder.blocks.{i}.", "transformer.h.{i}."
    qkv = tuple(b + f"attn.{n}_proj" for n in "qkv")
    links = [
        Link("transformer.word_embeddings.weight", (TOKEN_TABLE,)),
        *norm_links("transformer.word_embeddings_layernorm", "decoder.embed.norm"),
        *norm_links("transformer.ln_f", "decoder.norm"),
        *norm_links(m + "input_layernorm", b + "norm1"),
        *norm_links(m + "post_attention_layernorm", b + "norm2"),
    ]
    for s in ("weight", "bias"):
        links += [
            Link(
                m + f"self_attention.query_key_value.{s}",
                tuple(f"{p}.{s}" for p in qkv),
                "heads",
                cfg.num_heads,
            ),
            Link(m + f"self_attention.dense.{s}", (b + f"attn.o_proj.{s}",)),
            Link(m + f"mlp.dense_h_to_4h.{s}", (b + f"mlp.up.{s}",)),
            Link(m + f"mlp.dense_4h_to_h.{s}", (b + f"mlp.down.{s}",)),
        ]
    if cfg.tie == "none":
        links.append(Link("lm_head.weight", ("lm_head.weight",)))
    return links


BLOOM = Family(
    "bloom",
    ("bloom",),
    _bloom_in,
    _bloom_links,
    no_export("bloom"),
    lambda c: c,
    "BloomForCausalLM",
    OLD_BUFFERS,
)
