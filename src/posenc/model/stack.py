"""The layers a Transformer is made of: the block (attention + MLP with residuals), and
the two stacks, :class:`Encoder` and :class:`Decoder`, that take any positional scheme by name.

The scheme is built with :func:`posenc.build_with_context` from ``config.position``: one instance
shared by all layers (``share_position=True``) or one per layer; with ``config.layer_positions``
each layer's attention takes its entry of the pattern (:mod:`posenc.model.layers`). A scheme's
``embed`` hook runs in the input layer, its ``rotate``/``score_bias``/``relative_values`` inside
every attention layer.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``m`` memory length, ``L`` layers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .._alloc import factory_kwargs
from ..base import PositionalScheme
from ..embedding import InputEmbedding
from ..registry import build_with_context, scheme_class
from .attention import MultiHeadAttention
from .cache import KVCache
from .classes import register_model
from .config import ModelConfig
from .layers import build_layer_schemes
from .mlp import MLP
from .norms import make_norm
from .plan import AttentionPlan, plan_attention, plan_cross_attention
from .pretrained import Pretrained

__all__ = ["MLP", "Block", "Decoder", "Encoder", "Memory"]


_ATTENTION_HOOKS = ("rotate", "queries", "score_bias")


class Block(nn.Module):
    """One Transformer layer: self-attention, optional cross-attention, MLP; pre- or post-norm.

    ``pre``: ``x = x + Drop(Attn(N(x)))``; ``post``: ``x = N(x + Drop(Attn(x)))``, and the same
    for cross-attention and the MLP. ``N`` is ``config.norm_type`` (LayerNorm or RMSNorm). With
    ``config.residual="parallel"``: ``x = x + Drop(Attn(N1(x))) + Drop(MLP(N2(x)))`` (GPT-NeoX);
    ``"parallel_shared_norm"``: one norm feeds both (GPT-J). Shapes: ``[b, s, d] -> [b, s, d]``.
    """

    def __init__(self, config: ModelConfig, *, cross_attention: bool = False) -> None:
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.parallel = config.residual != "sequential"
        if self.parallel and cross_attention:
            raise ValueError(
                f"residual={config.residual!r} is a decoder-only block; a block with cross-attention "
                "takes residual='sequential'"
            )
        self.norm1 = make_norm(config)
        self.attn = MultiHeadAttention(config)
        self.norm_cross = make_norm(config) if cross_attention else None
        self.cross = MultiHeadAttention(config) if cross_attention else None
        self.norm2 = None if config.residual == "parallel_shared_norm" else make_norm(config)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)
        # GPT-2 initialisation: N(0, init_std = 0.02), residual projections scaled by 1/sqrt(2 L).
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = config.init_std
                std = std / math.sqrt(2 * config.num_layers) if name.endswith(("o_proj", "down")) else std
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(
        self,
        x: torch.Tensor,
        plan: AttentionPlan,
        scheme: PositionalScheme | None,
        *,
        cache: KVCache | None = None,
        layer: int = 0,
        memory: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_plan: AttentionPlan | None = None,
    ) -> torch.Tensor:
        """``x`` ``[b, s, d]``; ``memory`` ``[b, m, d]`` earlier hidden states this layer also attends
        to (Transformer-XL); ``context`` ``[b, s_src, d]`` encoder output for cross-attention."""
        if self.pre_norm:
            h = self.norm1(x)
            kv = None if memory is None else torch.cat((self.norm1(memory), h), dim=1)  # [b, m + s, d]
            if self.parallel:  # both branches read the block's input
                a = self.attn(h, plan, scheme, kv=kv, cache=cache, layer=layer)
                m = self.mlp(h if self.norm2 is None else self.norm2(x))
                return x + self.drop(a) + self.drop(m)
            x = x + self.drop(self.attn(h, plan, scheme, kv=kv, cache=cache, layer=layer))
            if self.cross is not None:
                x = x + self.drop(self.cross(self.norm_cross(x), context_plan, None, kv=context))
            return x + self.drop(self.mlp(self.norm2(x)))
        kv = None if memory is None else torch.cat((memory, x), dim=1)  # [b, m + s, d]
        x = self.norm1(x + self.drop(self.attn(x, plan, scheme, kv=kv, cache=cache, layer=layer)))
        if self.cross is not None:
            x = self.norm_cross(x + self.drop(self.cross(x, context_plan, None, kv=context)))
        return self.norm2(x + self.drop(self.mlp(x)))


@dataclass
class Memory:
    """Transformer-XL memory (Dai et al. 2019): what the next segment attends to besides itself.

    Attributes:
        states: per layer ``[b, m, d]``, the inputs of that layer for the last ``m`` tokens,
            detached (no gradient flows into earlier segments).
        next_position: the position of the next segment's first token.
    """

    states: list[torch.Tensor]
    next_position: int

    def __len__(self) -> int:
        return self.states[0].shape[1] if self.states else 0


# A pytree node (its tensors the children, the position the context), so torch.export and
# torch.compile can return it: what Hugging Face does for its model outputs.
torch.utils._pytree.register_pytree_node(
    Memory,
    lambda m: (m.states, m.next_position),
    lambda states, next_position: Memory(list(states), next_position),
    serialized_type_name="posenc.model.Memory",
)


@contextlib.contextmanager
def placed(device: torch.device | str | None, dtype: torch.dtype | None) -> Iterator[None]:
    """Build a model's parameters on ``device`` (as ``nn.Linear``'s factory kwargs); the caller casts
    to ``dtype`` after (one ``module.to(dtype)``, which keeps tied weights tied)."""
    factory = factory_kwargs(device, dtype)
    with torch.device(factory["device"]) if factory["device"] is not None else contextlib.nullcontext():
        yield


def check_ids(ids: object, name: str = "ids") -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(
            f"{name} must be an integer tensor [b, s], got {shape}; add a batch dim: {name}[None]"
        )


class _Stack(nn.Module):
    """Input layer, the scheme(s), ``L`` blocks and the final LayerNorm: shared by every model."""

    def __init__(self, config: ModelConfig, *, causal: bool, cross_attention: bool, vocab_size: int) -> None:
        super().__init__()
        if causal:
            config.check_causal()
        elif not scheme_class(config.position).bidirectional_ok:
            raise ValueError(
                f"position={config.position!r} is defined for causal attention only, so it cannot run in an "
                "encoder; use it in a decoder (TransformerLM), or pick another scheme for the encoder"
            )
        self.config, self.causal = config, causal
        first = self._build_scheme()
        if first.position_dims != 1:
            raise ValueError(
                f"position={config.position!r} encodes {first.position_dims}-D grids, not token sequences; "
                "use a 1-D scheme (posenc list) for a sequence model"
            )
        acts_in_attention = bool(set(first.hooks) & set(_ATTENTION_HOOKS)) or first.has_relative_values
        per_layer = not config.share_position and acts_in_attention
        # Schemes acting in attention live here (one, one per layer, or a pattern's); an embed-only scheme
        # lives in the input layer alone, so its parameters are not listed twice.
        schemes = (
            [first] + [self._build_scheme() for _ in range(config.num_layers - 1)] if per_layer else [first]
        )
        #: per layer, the index of its scheme in self.schemes (None: one scheme, or one per layer)
        self._layer_index: list[int] | None = None
        if config.layer_positions is not None:
            schemes, self._layer_index = build_layer_schemes(config, causal)
            acts_in_attention = True
        self.schemes = nn.ModuleList(schemes if acts_in_attention else [])
        self.embed = InputEmbedding(
            vocab_size,
            config.d_model,
            first,
            layer_norm=config.embed_norm,
            dropout=config.dropout,
            scale=config.embed_scale,
            init_std=config.embed_init_std or 1.0 / math.sqrt(config.d_model),
        )
        self.blocks = nn.ModuleList(
            Block(config, cross_attention=cross_attention) for _ in range(config.num_layers)
        )
        if config.embed_norm:  # the input layer's LayerNorm takes the model's epsilon
            self.embed.norm.eps = config.norm_eps
        self.norm = make_norm(config) if config.norm == "pre" else nn.Identity()

    def _build_scheme(self) -> PositionalScheme:
        cfg = self.config
        return build_with_context(cfg.position, cfg.scheme_context(self.causal), cfg.position_options)

    def scheme(self, layer: int) -> PositionalScheme | None:
        """The scheme acting in layer ``layer``'s attention (None for embed-only schemes)."""
        if len(self.schemes) == 0:
            return None
        if self._layer_index is not None:
            return self.schemes[self._layer_index[layer]]
        return self.schemes[layer if len(self.schemes) > 1 else 0]

    def check_length(self, plan: AttentionPlan) -> None:
        """A scheme with a finite table (learned positions) refuses positions past it, naming the lengths."""
        for scheme in (self.embed.position, *self.schemes):
            limit = getattr(scheme, "max_len", None) if scheme is not None else None
            if limit is None:
                continue
            pos = plan.q_positions
            # A compiled graph and a meta tensor have no values to check: the length only.
            if torch.compiler.is_compiling() or pos.is_meta:
                needed = pos.shape[-1]
            else:
                needed = int(pos.max()) + 1 if pos.numel() else 0
            if needed <= limit:
                continue
            raise ValueError(
                f"this input needs positions up to {needed - 1} (length {needed}), longer than "
                f"max_len={limit} of position={self.config.position!r}: learned positions cannot run past "
                "their table. Use inputs of at most max_len tokens, a larger max_len, or a scheme that "
                "runs at any length (sinusoidal, rope, alibi, t5)."
            )

    def run(
        self,
        ids: torch.Tensor,
        plan: AttentionPlan,
        *,
        cache: KVCache | None = None,
        memory: Memory | None = None,
        context: torch.Tensor | None = None,
        context_plan: AttentionPlan | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids ``[b, s]`` -> hidden states ``[b, s, d]`` and each layer's input ``L x [b, s, d]``."""
        self.check_length(plan)
        x = self.embed(ids, plan.q_positions)  # [b, s] -> [b, s, d]
        inputs = []
        for i, block in enumerate(self.blocks):
            inputs.append(x)
            x = block(
                x,
                plan,
                self.scheme(i),
                cache=cache,
                layer=i,
                memory=None if memory is None else memory.states[i],
                context=context,
                context_plan=context_plan,
            )
        return self.norm(x), inputs


@register_model
class Encoder(Pretrained, _Stack):
    """Bidirectional Transformer encoder (the scheme is built with ``causal=False``).

    Args:
        config: a :class:`ModelConfig`; the vocabulary is ``src_vocab_size`` (or ``vocab_size``).

    Shapes: ``forward(ids [b, s], positions [s] | [b, s] | None, attention_mask [b, s] | None) -> [b, s, d]``.
    """

    def __init__(self, config: ModelConfig) -> None:
        if config.memory_len:
            raise ValueError(f"memory_len={config.memory_len} applies to decoder-only models (TransformerLM)")
        if config.sliding_window is not None:
            raise ValueError(
                f"sliding_window={config.sliding_window} applies to decoders (a window over the tokens "
                "before each one); an encoder sees every token: drop it"
            )
        super().__init__(
            config, causal=False, cross_attention=False, vocab_size=config.src_vocab_size or config.vocab_size
        )

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_ids(ids)
        plan = plan_attention(
            ids.shape[0],
            ids.shape[1],
            ids.device,
            causal=False,
            positions=positions,
            attention_mask=attention_mask,
        )
        return self.run(ids, plan)[0]


@register_model
class Decoder(Pretrained, _Stack):
    """Causal Transformer decoder, with cross-attention to an encoder (``cross_attention=True``) or
    without (the body of :class:`TransformerLM`).

    Shapes: ``forward(ids [b, s], context [b, s_src, d] | None, ...) -> (hidden [b, s, d], Memory | None)``.
    See :meth:`TransformerLM.forward` for the other arguments.
    """

    def __init__(self, config: ModelConfig, *, cross_attention: bool = True) -> None:
        super().__init__(config, causal=True, cross_attention=cross_attention, vocab_size=config.vocab_size)
        self.cross_attention = cross_attention

    def forward(
        self,
        ids: torch.Tensor,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        cache: KVCache | None = None,
        memory: Memory | None = None,
    ) -> tuple[torch.Tensor, Memory | None]:
        check_ids(ids)
        b, s = ids.shape[0], ids.shape[-1]
        if self.cross_attention and context is None:
            raise ValueError("this Decoder has cross-attention: pass context=encoder_output [b, s_src, d]")
        if cache is not None and cache.num_layers != len(self.blocks):
            raise ValueError(
                f"cache has {cache.num_layers} layers, the model {len(self.blocks)}: use "
                f"KVCache({len(self.blocks)}) or model.new_cache()"
            )
        past = self._past(memory, cache, attention_mask, cu_seqlens, positions)
        plan = plan_attention(
            b,
            s,
            ids.device,
            causal=True,
            positions=positions,
            attention_mask=attention_mask,
            cu_seqlens=cu_seqlens,
            sliding_window=self.config.sliding_window,
            **past,
        )
        context_plan = None
        if context is not None:
            context_plan = plan_cross_attention(b, s, context.shape[1], ids.device, context_mask)
        x, inputs = self.run(
            ids, plan, cache=cache, memory=memory, context=context, context_plan=context_plan
        )
        if cache is not None:
            cache.advance(plan, attention_mask)
        return x, self._next_memory(memory, inputs, s)

    def _past(self, memory, cache, attention_mask, cu_seqlens, positions) -> dict:
        if memory is None:
            return cache.past() if cache is not None else {}
        if not self.config.memory_len:
            raise ValueError("memory was passed but config.memory_len is 0; set memory_len > 0 to use it")
        if cache is not None or attention_mask is not None or cu_seqlens is not None or positions is not None:
            raise ValueError(
                "a Transformer-XL memory cannot be combined with cache, attention_mask, cu_seqlens "
                "or explicit positions: segments are consecutive chunks of one stream"
            )
        start, m = memory.next_position, len(memory)
        past = torch.arange(start - m, start, device=memory.states[0].device)  # [m]: just before the segment
        return {"past_positions": past, "offset": start}

    def _next_memory(self, memory: Memory | None, inputs: list[torch.Tensor], s: int) -> Memory | None:
        m = self.config.memory_len
        if not m:
            return None
        if memory is None:
            states, start = inputs, 0
        else:
            states = [
                torch.cat((old, new), dim=1) for old, new in zip(memory.states, inputs)
            ]  # [b, m + s, d]
            start = memory.next_position
        return Memory([h[:, -m:].detach() for h in states], start + s)  # keep the last m, no gradient
