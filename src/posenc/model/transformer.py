"""Transformers that take any positional scheme by name: decoder-only LM, encoder, decoder, encoder-decoder.

Read :class:`TransformerLM` top to bottom to follow ids to logits::

    ids [b, s]
      -> plan positions and masks once (KV cache offsets, left padding, packed documents)
      -> InputEmbedding: token * sqrt(d) (+ the scheme's ``embed`` for absolute schemes)   [b, s, d]
      -> num_layers x Block: x + Attention(LN(x)) (rotate / score_bias inside), x + MLP(LN(x))
      -> final LayerNorm -> output layer (tied to the token embedding by default)           [b, s, V]

The scheme is built with :func:`posenc.build_with_context` from ``config.position``: one instance
shared by all layers (``share_position=True``) or one per layer. A scheme's ``embed`` hook runs in
the input layer, its ``rotate``/``score_bias``/``relative_values`` inside every attention layer.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``V`` vocabulary, ``m`` memory
length, ``L`` layers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._alloc import factory_kwargs
from ..base import PositionalScheme
from ..embedding import InputEmbedding, apply_tying
from ..registry import build_with_context
from .attention import AttentionPlan, KVCache, MultiHeadAttention, plan_attention, plan_cross_attention
from .classes import register_model
from .config import ModelConfig
from .pretrained import Pretrained

__all__ = [
    "MLP",
    "Block",
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "LMOutput",
    "Memory",
    "TransformerLM",
    "sample_next",
]

_ATTENTION_HOOKS = ("rotate", "score_bias")


# ----------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------
class MLP(nn.Module):
    """Position-wise feed-forward ``Linear(d, d_ff) -> GELU -> Linear(d_ff, d)``: ``[b, s, d] -> [b, s, d]``.

    ``d_ff`` is ``config.ffn_dim``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.ffn_dim, bias=config.bias)
        self.down = nn.Linear(config.ffn_dim, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """One Transformer layer: self-attention, optional cross-attention, MLP; pre- or post-LayerNorm.

    ``pre``: ``x = x + Drop(Attn(LN(x)))``; ``post``: ``x = LN(x + Drop(Attn(x)))``, and the same
    for cross-attention and the MLP. Shapes: ``[b, s, d] -> [b, s, d]``.
    """

    def __init__(self, config: ModelConfig, *, cross_attention: bool = False) -> None:
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = MultiHeadAttention(config)
        self.norm_cross = nn.LayerNorm(config.d_model) if cross_attention else None
        self.cross = MultiHeadAttention(config) if cross_attention else None
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)
        # GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * config.num_layers) if name.endswith(("o_proj", "down")) else 0.02
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


@dataclass
class LMOutput:
    """What :class:`TransformerLM` returns, always (as Hugging Face's ``CausalLMOutput``).

    Attributes:
        logits: ``[b, s, V]`` next-token logits.
        loss: the mean cross-entropy, a 0-d float32 (or float64) tensor, when ``labels`` were given;
            else ``None``.
        memory: the Transformer-XL :class:`Memory` for the next segment when
            ``config.memory_len > 0``; else ``None``.
    """

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    memory: Memory | None = None


@contextlib.contextmanager
def _placed(device: torch.device | str | None, dtype: torch.dtype | None) -> Iterator[None]:
    """Build a model's parameters on ``device`` (as ``nn.Linear``'s factory kwargs); the caller casts
    to ``dtype`` after (one ``module.to(dtype)``, which keeps tied weights tied)."""
    factory = factory_kwargs(device, dtype)
    with torch.device(factory["device"]) if factory["device"] is not None else contextlib.nullcontext():
        yield


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``[b, s, V]`` against ``targets`` ``[b, s]``, in float32 or better."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return F.cross_entropy(logits.flatten(0, 1).to(dtype), targets.flatten(), ignore_index=ignore_index)


def _check_ids(ids: object, name: str = "ids") -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(
            f"{name} must be an integer tensor [b, s], got {shape}; add a batch dim: {name}[None]"
        )


def _overrides_relative_values(scheme: PositionalScheme) -> bool:
    return type(scheme).relative_values is not PositionalScheme.relative_values


class _Stack(nn.Module):
    """Input layer, the scheme(s), ``L`` blocks and the final LayerNorm: shared by every model."""

    def __init__(self, config: ModelConfig, *, causal: bool, cross_attention: bool, vocab_size: int) -> None:
        super().__init__()
        if causal:
            config.check_causal()
        self.config, self.causal = config, causal
        first = self._build_scheme()
        if first.position_dims != 1:
            raise ValueError(
                f"position={config.position!r} encodes {first.position_dims}-D grids, not token sequences; "
                "use a 1-D scheme (posenc list) for a sequence model"
            )
        acts_in_attention = bool(set(first.hooks) & set(_ATTENTION_HOOKS)) or _overrides_relative_values(
            first
        )
        per_layer = not config.share_position and acts_in_attention
        # Schemes acting in attention live here (one, or one per layer); an embed-only scheme lives in the
        # input layer alone, so its parameters are not listed twice.
        schemes = (
            [first] + [self._build_scheme() for _ in range(config.num_layers - 1)] if per_layer else [first]
        )
        self.schemes = nn.ModuleList(schemes if acts_in_attention else [])
        self.embed = InputEmbedding(
            vocab_size, config.d_model, first, layer_norm=config.embed_norm, dropout=config.dropout
        )
        self.blocks = nn.ModuleList(
            Block(config, cross_attention=cross_attention) for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    def _build_scheme(self) -> PositionalScheme:
        cfg = self.config
        return build_with_context(cfg.position, cfg.scheme_context(self.causal), cfg.position_options)

    def scheme(self, layer: int) -> PositionalScheme | None:
        """The scheme acting in layer ``layer``'s attention (None for embed-only schemes)."""
        if len(self.schemes) == 0:
            return None
        return self.schemes[layer if len(self.schemes) > 1 else 0]

    def check_length(self, plan: AttentionPlan) -> None:
        """A scheme with a finite table (learned positions) refuses positions past it, naming the lengths."""
        for scheme in (self.embed.position, *self.schemes):
            limit = getattr(scheme, "max_len", None) if scheme is not None else None
            if limit is None:
                continue
            pos = plan.q_positions
            if torch.compiler.is_compiling():  # no data-dependent checks in a graph: the length only
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


# ----------------------------------------------------------------------------------------------
# Encoder, decoder
# ----------------------------------------------------------------------------------------------
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
        super().__init__(
            config, causal=False, cross_attention=False, vocab_size=config.src_vocab_size or config.vocab_size
        )

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        _check_ids(ids)
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
        _check_ids(ids)
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


# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------
def _check_sampling(max_new_tokens: object, temperature: object, top_k: object) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick next tokens from logits ``[b, V]``: argmax when ``temperature == 0``, otherwise sample
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely. Returns ``[b, 1]``."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [b, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
@register_model
class TransformerLM(Pretrained, nn.Module):
    """Decoder-only language model (GPT-style) with any causal positional scheme.

    Args:
        config: a :class:`ModelConfig`; ``tie`` must be ``"none"`` or ``"output"``.
        device, dtype: factory kwargs (as ``nn.Linear``'s): where the parameters are made and their
            floating dtype.

    Example::

        config = ModelConfig(vocab_size=256, position="alibi", max_len=128)
        model = TransformerLM(config)
        out = model(ids)                           # LMOutput: out.logits [b, s, V]
        out = model(ids, labels=ids)               # out.loss: next-token cross-entropy
        tokens = model.generate(prompt, max_new_tokens=50, temperature=0.8)
        cache = model.new_cache()                  # a KV cache sized for this model
        model.save_pretrained("my-model")          # my-model/config.json + model.safetensors
        model = TransformerLM.from_pretrained("my-model")
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if config.tie not in ("none", "output"):
            raise ValueError(
                f"tie={config.tie!r} needs an encoder; a decoder-only LM takes tie='output' or 'none'"
            )
        config.check_fits()
        self.config = config
        with _placed(device, dtype):
            self.decoder = Decoder(config, cross_attention=False)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        apply_tying(config.tie, decoder_embedding=self.decoder.embed.token, output=self.lm_head)
        if dtype is not None:
            self.to(dtype)

    def new_cache(self) -> KVCache:
        """An empty :class:`KVCache` for this model."""
        return KVCache(self.config.num_layers)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        cache: KVCache | None = None,
        memory: Memory | None = None,
        labels: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> LMOutput:
        """Next-token logits, and the loss when ``labels`` are given.

        Args:
            ids: ``[b, s]`` token ids (the new tokens when a cache is passed).
            positions: ``[s]`` or ``[b, s]`` explicit positions; default ``arange(s)``, continued
                after the cache / memory, counted over real tokens only with ``attention_mask``,
                restarting per document with ``cu_seqlens``.
            attention_mask: ``[b, s]`` 1 = token, 0 = padding (left-pad prompts for generation).
                It covers the new tokens only; the cache remembers the padding it holds.
            cu_seqlens: ``[n + 1]`` cumulative lengths of documents packed into ``ids`` ``[1, total]``:
                attention is block-diagonal and positions restart at 0 in each document.
            cache: a :class:`KVCache` (``model.new_cache()``), filled in place.
            memory: Transformer-XL memory from the previous segment (``config.memory_len > 0``).
            labels: ``[b, s]`` token ids, usually ``ids`` itself. As in Hugging Face, they are shifted
                inside: position ``t`` is scored on ``labels[:, t + 1]``; ``ignore_index`` entries
                (-100) are skipped.

        Returns:
            an :class:`LMOutput`: ``.logits`` ``[b, s, V]``, ``.loss`` (with ``labels``), ``.memory``
            (with ``config.memory_len > 0``).
        """
        x, new_memory = self.decoder(
            ids,
            positions=positions,
            attention_mask=attention_mask,
            cu_seqlens=cu_seqlens,
            cache=cache,
            memory=memory,
        )
        logits = self.lm_head(x)  # [b, s, d] -> [b, s, V]
        loss = None
        if labels is not None:
            if not isinstance(labels, torch.Tensor) or labels.shape != ids.shape:
                shape = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
                raise ValueError(f"labels must have the shape of ids {tuple(ids.shape)}, got {shape}")
            loss = _cross_entropy(logits[:, :-1], labels[:, 1:], ignore_index)
        return LMOutput(logits, loss, new_memory)

    def loss(
        self, ids: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, **kwargs
    ) -> torch.Tensor:
        """Mean cross-entropy of ``targets`` ``[b, s]`` given ``ids`` ``[b, s]``, aligned (target
        ``t`` is scored at position ``t``; ``forward(ids, labels=...)`` shifts); skips ``ignore_index``."""
        return _cross_entropy(self(ids, **kwargs).logits, targets, ignore_index)

    @torch.no_grad()
    def generate(
        self,
        ids: torch.Tensor,
        max_new_tokens: int,
        *,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``ids`` ``[b, s]`` by ``max_new_tokens`` tokens using a KV cache; returns ``[b, s + n]``.

        Args:
            attention_mask: ``[b, s]`` for left-padded prompts of different lengths.
            temperature: 0 = greedy (argmax); otherwise sample from ``softmax(logits / temperature)``.
            top_k: sample only among the ``k`` most likely tokens.
            generator: a ``torch.Generator`` for reproducible sampling.
        """
        _check_sampling(max_new_tokens, temperature, top_k)
        cache, out, step_ids, mask = self.new_cache(), [ids], ids, attention_mask
        for _ in range(max_new_tokens):
            logits = self(step_ids, attention_mask=mask, cache=cache).logits  # [b, s, V]
            step_ids = sample_next(logits[:, -1], temperature, top_k, generator)  # [b, 1]
            out.append(step_ids)
            mask = None  # the new tokens are real; the cache remembers the prompt's padding
        return torch.cat(out, dim=1)


@register_model
class EncoderDecoder(Pretrained, nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017) with any scheme.

    The encoder builds the scheme with ``causal=False`` (e.g. symmetric ALiBi, bidirectional T5
    buckets), the decoder with ``causal=True``; cross-attention carries no positional term.
    ``config.tie``: ``"none"``, ``"output"``, ``"encoder_decoder"`` or ``"three_way"``
    (the last two need ``src_vocab_size`` equal to ``vocab_size``: one shared vocabulary).

    Shapes: ``forward(src [b, s_src], tgt [b, s_tgt], src_mask [b, s_src] | None,
    tgt_mask [b, s_tgt] | None) -> logits [b, s_tgt, V]``.

    ``device``/``dtype`` are factory kwargs as in :class:`TransformerLM`; ``save_pretrained`` and
    ``from_pretrained`` as there.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if config.memory_len:
            raise ValueError(f"memory_len={config.memory_len} applies to decoder-only models (TransformerLM)")
        config.check_fits()  # the decoder's share; the encoder's is about the same again
        shared_vocab = config.src_vocab_size in (None, config.vocab_size)
        if config.tie in ("encoder_decoder", "three_way") and not shared_vocab:
            raise ValueError(
                f"tie={config.tie!r} shares one embedding between encoder and decoder, but "
                f"src_vocab_size={config.src_vocab_size} != vocab_size={config.vocab_size}; "
                "use one vocabulary or tie='output'/'none'"
            )
        self.config = config
        with _placed(device, dtype):
            self.encoder = Encoder(config)
            self.decoder = Decoder(config, cross_attention=True)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        apply_tying(
            config.tie,
            encoder_embedding=self.encoder.embed.token,
            decoder_embedding=self.decoder.embed.token,
            output=self.lm_head,
        )
        if dtype is not None:
            self.to(dtype)

    def new_cache(self) -> KVCache:
        """An empty :class:`KVCache` for the decoder's self-attention."""
        return KVCache(self.config.num_layers)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src`` ``[b, s_src]`` -> encoder output ``[b, s_src, d]``."""
        return self.encoder(src, attention_mask=src_mask)

    def decode(
        self,
        tgt: torch.Tensor,
        context: torch.Tensor,
        context_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """``tgt`` ``[b, s_tgt]`` and encoder output ``[b, s_src, d]`` -> logits ``[b, s_tgt, V]``."""
        x, _ = self.decoder(tgt, context, context_mask, attention_mask=tgt_mask, cache=cache)
        return self.lm_head(x)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    @torch.no_grad()
    def generate(
        self,
        src: torch.Tensor,
        bos_id: int,
        max_new_tokens: int,
        *,
        src_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Translate ``src`` ``[b, s_src]``: start from ``bos_id`` and add ``max_new_tokens`` tokens
        (encoder run once, decoder with a KV cache). Returns ``[b, 1 + n]``; sampling as
        :meth:`TransformerLM.generate`."""
        _check_sampling(max_new_tokens, temperature, top_k)
        context, cache = self.encode(src, src_mask), self.new_cache()
        step_ids = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)  # [b, 1]
        out = [step_ids]
        for _ in range(max_new_tokens):
            logits = self.decode(step_ids, context, src_mask, cache=cache)  # [b, 1, V]
            step_ids = sample_next(logits[:, -1], temperature, top_k, generator)
            out.append(step_ids)
        return torch.cat(out, dim=1)
