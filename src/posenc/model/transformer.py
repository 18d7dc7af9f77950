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

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..embedding import TokenEmbedding, apply_tying
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

    Indexable as Hugging Face's ``ModelOutput``: ``out["logits"]`` by name, ``out[0]`` by position
    over the fields that are set in the order ``loss, logits, memory`` (so ``out[0]`` is the loss
    when labels were given, else the logits); ``keys()``, ``values()``, ``items()``, ``to_tuple()``.
    """

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    memory: Memory | None = None

    #: the order of ``to_tuple()`` and positional indexing (Hugging Face's: the loss first)
    _ORDER: ClassVar[tuple[str, ...]] = ("loss", "logits", "memory")

    def keys(self) -> list[str]:
        """The names of the fields that are set (not None), loss first."""
        return [name for name in self._ORDER if getattr(self, name) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, name) for name in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(name, getattr(self, name)) for name in self.keys()]

    def to_tuple(self) -> tuple[Any, ...]:
        """The fields that are set, in the order ``loss, logits, memory``."""
        return tuple(self.values())

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(f"{key!r}: this output holds {self.keys()}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        """The names of the fields that are set, as iterating Hugging Face's ``ModelOutput`` gives."""
        return iter(self.keys())


# a pytree node, so torch.export and torch.compile can return it (as Hugging Face registers its outputs)
torch.utils._pytree.register_dataclass(LMOutput, serialized_type_name="posenc.model.LMOutput")


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``[b, s, V]`` against ``targets`` ``[b, s]``, in float32 or better."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return F.cross_entropy(logits.flatten(0, 1).to(dtype), targets.flatten(), ignore_index=ignore_index)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_sampling(
    max_new_tokens: object,
    do_sample: object,
    temperature: object,
    top_k: object,
    top_p: object = None,
    eos_token_id: object = None,
    vocab_size: int | None = None,
) -> tuple[float, list[int]]:
    """Validate :meth:`TransformerLM.generate`'s options; return the temperature to use (0 =
    greedy) and the end-of-sequence ids."""
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be a bool, got {do_sample!r}")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
    ):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    if not do_sample:
        given = [
            f"{k}={v!r}" for k, v in sampling.items() if v is not None and not (k == "temperature" and v == 0)
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} applies only when sampling, and generate is greedy by default (as "
                "Hugging Face's): pass do_sample=True to sample, or drop it"
            )
        temperature = 0.0
    elif temperature == 0:
        raise ValueError(
            "temperature=0 with do_sample=True: sampling needs temperature > 0; greedy is do_sample=False"
        )
    eos = (
        []
        if eos_token_id is None
        else eos_token_id
        if isinstance(eos_token_id, (list, tuple))
        else [eos_token_id]
    )
    for i in eos:
        if not _is_int(i) or i < 0 or (vocab_size is not None and i >= vocab_size):
            raise ValueError(
                f"eos_token_id must be a token id in [0, {vocab_size}) or a list of them, "
                f"got {eos_token_id!r}"
            )
    return (1.0 if temperature is None else float(temperature)), list(eos)


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Pick next tokens from logits ``[b, V]``: argmax when ``temperature == 0``, otherwise sample
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely and to the
    smallest set whose probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020;
    the most likely token always stays). Returns ``[b, 1]``."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [b, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)  # [b, V] each
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # [b, V]: mass of the likelier tokens
        drop = before >= top_p  # the set already reached top_p without them (never the first)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def _decode_loop(step, ids, max_new_tokens, temperature, top_k, top_p, generator, eos, pad_token_id):
    """Append up to ``max_new_tokens`` tokens to ``ids`` ``[b, s]`` with ``step(step_ids, first) ->
    logits [b, s', V]``; rows that produced an end-of-sequence id continue with ``pad_token_id``
    (default: the first end id), and the loop stops once every row has. Returns ``[b, s + n]``."""
    out, step_ids = [ids], ids
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)  # [b]
    pad = eos[0] if pad_token_id is None and eos else pad_token_id
    stops = torch.tensor(eos, dtype=torch.long, device=ids.device)  # [n_eos]
    for i in range(max_new_tokens):
        logits = step(step_ids, i == 0)  # [b, s', V]
        step_ids = sample_next(logits[:, -1], temperature, top_k, generator, top_p)  # [b, 1]
        if eos:
            step_ids = step_ids.masked_fill(done[:, None], pad)
            done = done | torch.isin(step_ids[:, 0], stops)
        out.append(step_ids)
        if eos and bool(done.all()):
            break
    return torch.cat(out, dim=1)


class _ModelHabits:
    """What Hugging Face's ``PreTrainedModel`` offers and scripts written for it call."""

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's floating-point parameters."""
        return next(p for p in self.parameters() if p.is_floating_point()).dtype

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters counted once each (a tied matrix once), as Hugging Face's ``num_parameters``:
        ``only_trainable`` counts those with ``requires_grad``; ``exclude_embeddings`` leaves out
        the token tables (and an output layer tied to them)."""
        skip = set()
        if exclude_embeddings:
            skip = {id(m.weight) for m in self.modules() if isinstance(m, (TokenEmbedding, nn.Embedding))}
        return sum(
            p.numel()
            for p in self.parameters()
            if id(p) not in skip and (p.requires_grad or not only_trainable)
        )

    def get_output_embeddings(self) -> nn.Linear:
        """The output layer (``[V, d]`` weight, tied to the token table with ``tie="output"``)."""
        return self.lm_head

    def init_weights(self) -> None:
        """Give every parameter and buffer the values a new model of this configuration starts
        with (the configuration's initialisation: ``init_std``, ``embed_init_std``, the scheme's
        own), in place, keeping tied weights tied: for a model built on ``device="meta"`` and
        materialised with ``to_empty(device=...)``. Under the same random state the values are
        those ``type(model)(config)`` would have. Builds one new model on the same device while it
        runs (twice the memory for a moment)."""
        self.tie_weights()  # to_empty gives tied modules their own copies
        with torch.no_grad():
            fresh = type(self)(self.config, device=self.device, dtype=self.dtype)
            self.load_state_dict(fresh.state_dict())
            for name, buf in fresh.named_buffers():  # non-persistent ones too (tables, frequencies)
                mine = self.get_buffer(name)
                if isinstance(mine, torch.Tensor) and mine.shape == buf.shape and not mine.is_meta:
                    mine.copy_(buf)


@register_model
class TransformerLM(_ModelHabits, Pretrained, nn.Module):
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
        tokens = model.generate(prompt, max_new_tokens=50)             # greedy, as Hugging Face
        tokens = model.generate(prompt, max_new_tokens=50, do_sample=True, top_p=0.9)
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
        self.tie_weights()
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

    def get_input_embeddings(self) -> TokenEmbedding:
        """The token embedding (``[V, d]`` table), as Hugging Face's ``get_input_embeddings``."""
        return self.decoder.embed.token

    def tie_weights(self) -> None:
        """Tie the output layer to the token table as ``config.tie`` says (again, e.g. after
        ``to_empty``, which gives each module its own copy)."""
        apply_tying(self.config.tie, decoder_embedding=self.decoder.embed.token, output=self.lm_head)

    @torch.no_grad()
    def generate(
        self,
        ids: torch.Tensor,
        max_new_tokens: int = 20,
        *,
        attention_mask: torch.Tensor | None = None,
        do_sample: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``ids`` ``[b, s]`` by up to ``max_new_tokens`` tokens using a KV cache; returns
        ``[b, s + n]``. Greedy by default, as Hugging Face's ``generate``.

        Args:
            ids: ``[b, s]`` prompts (left-padded when their lengths differ).
            max_new_tokens: tokens to add (default 20).
            attention_mask: ``[b, s]`` for left-padded prompts of different lengths.
            do_sample: False (default): the most likely token each step. True: sample from
                ``softmax(logits / temperature)``, restricted by ``top_k``/``top_p``.
            temperature, top_k, top_p: sampling only (``ValueError`` without ``do_sample=True``;
                ``temperature=0`` alone also means greedy). Default temperature 1.0.
            eos_token_id: an id or a list of ids that end a sequence: a row that produced one
                continues with ``pad_token_id`` (default: the first end id), and generation stops
                once every row has ended (so ``n`` may be below ``max_new_tokens``).
            generator: a ``torch.Generator`` for reproducible sampling.
        """
        temperature, eos = _check_sampling(
            max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, self.config.vocab_size
        )
        cache = self.new_cache()

        def step(step_ids, first):  # the new tokens are real; the cache remembers the prompt's padding
            return self(step_ids, attention_mask=attention_mask if first else None, cache=cache).logits

        return _decode_loop(
            step, ids, max_new_tokens, temperature, top_k, top_p, generator, eos, pad_token_id
        )


@register_model
class EncoderDecoder(_ModelHabits, Pretrained, nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017) with any scheme.

    The encoder builds the scheme with ``causal=False`` (e.g. T5 buckets for both directions), the
    decoder with ``causal=True``; cross-attention carries no positional term.
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
        self.tie_weights()
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

    def get_input_embeddings(self) -> TokenEmbedding:
        """The encoder's token embedding (shared with the decoder's under ``tie="encoder_decoder"``
        or ``"three_way"``)."""
        return self.encoder.embed.token

    def tie_weights(self) -> None:
        """Tie embeddings and output layer as ``config.tie`` says (again after ``to_empty``)."""
        apply_tying(
            self.config.tie,
            encoder_embedding=self.encoder.embed.token,
            decoder_embedding=self.decoder.embed.token,
            output=self.lm_head,
        )

    @torch.no_grad()
    def generate(
        self,
        src: torch.Tensor,
        bos_id: int,
        max_new_tokens: int = 20,
        *,
        src_mask: torch.Tensor | None = None,
        do_sample: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Translate ``src`` ``[b, s_src]``: start from ``bos_id`` and add up to ``max_new_tokens``
        tokens (encoder run once, decoder with a KV cache). Returns ``[b, 1 + n]``; greedy by
        default, the options as :meth:`TransformerLM.generate`."""
        temperature, eos = _check_sampling(
            max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, self.config.vocab_size
        )
        context, cache = self.encode(src, src_mask), self.new_cache()
        start = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)  # [b, 1]

        def step(step_ids, first):
            return self.decode(step_ids, context, src_mask, cache=cache)  # [b, 1, V]

        return _decode_loop(
            step, start, max_new_tokens, temperature, top_k, top_p, generator, eos, pad_token_id
        )
