"""Transformers that take any positional scheme by name: decoder-only LM, encoder, decoder, encoder-decoder.

Read :class:`TransformerLM` top to bottom to follow ids to logits::

    ids [b, s]
      -> plan positions and masks once (KV cache offsets, left padding, packed documents)
      -> InputEmbedding: token * sqrt(d) (+ the scheme's ``embed`` for absolute schemes)   [b, s, d]
      -> num_layers x Block: x + Attention(LN(x)) (rotate / score_bias inside), x + MLP(LN(x))
      -> final LayerNorm -> output layer (tied to the token embedding by default)           [b, s, V]

The layers and the encoder/decoder stacks are in :mod:`posenc.model.stack`.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``V`` vocabulary, ``m`` memory
length, ``L`` layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..embedding import apply_tying
from .cache import KVCache
from .classes import register_model
from .config import ModelConfig
from .pretrained import Pretrained
from .stack import Decoder, Encoder, Memory, placed

__all__ = ["EncoderDecoder", "LMOutput", "TransformerLM", "sample_next"]


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


# a pytree node, so torch.export and torch.compile can return it (as Hugging Face registers its outputs)
torch.utils._pytree.register_dataclass(LMOutput, serialized_type_name="posenc.model.LMOutput")


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``[b, s, V]`` against ``targets`` ``[b, s]``, in float32 or better."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return F.cross_entropy(logits.flatten(0, 1).to(dtype), targets.flatten(), ignore_index=ignore_index)


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
        with placed(device, dtype):
            self.decoder = Decoder(config, cross_attention=False)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.output_bias)
        nn.init.normal_(self.lm_head.weight, std=config.init_std)
        if self.lm_head.bias is not None:
            nn.init.zeros_(self.lm_head.bias)
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
        with placed(device, dtype):
            self.encoder = Encoder(config)
            self.decoder = Decoder(config, cross_attention=True)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=config.init_std)
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
