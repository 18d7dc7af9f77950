"""Token embeddings, weight tying, and the input layer of a Transformer.

The classic input pipeline, after tokenization::

    ids [b, s] -> E[ids] * sqrt(d) -> + positional part -> LayerNorm -> dropout -> [b, s, d]

An embedding lookup is a one-hot vector times the weight matrix:
``E[ids] == one_hot(ids, V) @ E``, computed as a gather.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``V`` vocabulary size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ._alloc import check_allocation, factory_kwargs
from ._validate import check_int, check_positive_float, check_probability, defining_class
from .absolute import init_table_
from .base import PositionalScheme
from .kernels import dropout_cpu as _dropout_cpu
from .kernels import embedding_cpu as _embedding_cpu
from .kernels import input_cpu as _input_cpu
from .registry import build_with_context, scheme_class

__all__ = ["TIE_STRATEGIES", "Dropout", "InputEmbedding", "TokenEmbedding", "apply_tying", "tie_weights"]


def _scale_value(scale: str | float | None, d_model: int) -> float:
    if scale is None:
        return 1.0
    if scale == "sqrt_d_model":
        return math.sqrt(d_model)
    if isinstance(scale, str):
        raise ValueError(f"unknown scale {scale!r}; valid: 'sqrt_d_model', None, or a number")
    return check_positive_float(scale, "scale")


class TokenEmbedding(nn.Module):
    """Token id -> vector lookup, times a scale (``sqrt(d_model)`` by default, as in Vaswani 2017).

    Args:
        vocab_size: ``V``.
        d_model: ``d``.
        scale: ``"sqrt_d_model"`` (default), ``None`` (no scaling) or a positive number.
        padding_idx: id whose vector is zero and receives no gradient.
        init_std: std of the normal initialisation. Default ``1 / scale``, so that the scaled
            output starts with unit variance, which is what the sqrt(d) factor is for
            (tensor2tensor initialises with ``d ** -0.5``); ``nn.Embedding`` uses 1.0.
        device, dtype: where and in which floating dtype the table is made (as ``nn.Linear``'s).

    Shapes: ``forward(ids [b, s]) -> [b, s, d]`` (any leading shape ``[...]`` works).

    Ids must be integers in ``[0, V)``; others raise ``ValueError``/``TypeError`` naming the value.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        scale: str | float | None = "sqrt_d_model",
        padding_idx: int | None = None,
        init_std: float | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = factory_kwargs(device, dtype)
        self.vocab_size = check_int(vocab_size, "vocab_size")
        self.d_model = check_int(d_model, "d_model")
        self.scale = _scale_value(scale, d_model)
        if padding_idx is not None:
            check_int(padding_idx, "padding_idx", minimum=0)
            if padding_idx >= vocab_size:
                raise ValueError(f"padding_idx must be < vocab_size={vocab_size}, got {padding_idx}")
        self.padding_idx = padding_idx
        self.init_std = 1.0 / self.scale if init_std is None else check_positive_float(init_std, "init_std")
        check_allocation(
            (self.vocab_size, self.d_model),
            dtype,
            f"vocab_size={vocab_size}, d_model={d_model}",
            "use a smaller vocab_size or d_model",
            device=device,
        )
        self.weight = nn.Parameter(torch.empty(self.vocab_size, self.d_model, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_table_(self.weight, self.init_std, self.padding_idx)

    @classmethod
    def from_pretrained(
        cls,
        weights: torch.Tensor,
        freeze: bool = False,
        *,
        scale: str | float | None = None,
        padding_idx: int | None = None,
    ) -> TokenEmbedding:
        """An embedding holding ``weights`` ``[V, d]`` (copied), as ``nn.Embedding.from_pretrained``.

        Args:
            weights: a float ``[V, d]`` table, row ``i`` for token id ``i`` (see
                :func:`posenc.pretrained_embedding` to read one from a file and align it to a tokenizer).
            freeze: no gradient for the table (``weight.requires_grad = False``).
            scale: the output scale; default ``None``: the vectors come out as they are.
            padding_idx: the padding id (its row is kept as given and receives no gradient).
        """
        if not isinstance(weights, torch.Tensor) or weights.dim() != 2 or not weights.is_floating_point():
            shape = f"{tuple(weights.shape)} {weights.dtype}" if isinstance(weights, torch.Tensor) else ""
            raise ValueError(
                f"weights must be a float tensor [V, d], got {type(weights).__name__} {shape}".rstrip()
            )
        if not isinstance(freeze, bool):
            raise TypeError(f"freeze must be a bool, got {freeze!r}")
        V, d = weights.shape
        with torch.device("meta"):
            emb = cls(V, d, scale, padding_idx)
        emb.weight = nn.Parameter(weights.detach().clone(), requires_grad=not freeze)
        return emb

    def check_ids(self, ids: torch.Tensor) -> None:
        """Raise a clear error for non-integer ids or ids outside ``[0, V)`` (eager mode only)."""
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be an integer tensor [b, s], got {type(ids).__name__}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be an integer tensor, got dtype {ids.dtype}; pass e.g. ids.long()")
        if torch.compiler.is_compiling() or ids.numel() == 0 or ids.is_meta:
            return
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            where = tuple(int(i) for i in (ids == bad).nonzero()[0])
            raise ValueError(
                f"token id {bad} at index {where} is outside the vocabulary [0, {self.vocab_size}); "
                "check the tokenizer matches vocab_size"
            )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.check_ids(ids)
        if ids.dtype not in (torch.int64, torch.int32):  # uint8 bytes, int16, ...: what gathers take
            ids = ids.long()
        if _embedding_cpu.usable(self.weight, ids):  # same gather into huge pages (kernels.embedding_cpu)
            out = _embedding_cpu.gather(self.weight, ids, self.padding_idx)  # [..., d]
        else:
            out = nn.functional.embedding(ids, self.weight, self.padding_idx)  # [..., d], a fresh tensor
        # in place: the gather's backward does not need its output, and one [..., d] allocation fewer
        return out.mul_(self.scale) if self.scale != 1.0 else out

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.d_model}, scale={self.scale:.4g}, padding_idx={self.padding_idx}"


def tie_weights(source: nn.Module, *targets: nn.Module) -> None:
    """Make every target use ``source.weight`` (the same Parameter, so the same storage).

    ``source`` and targets are modules with a ``weight`` of shape ``[V, d]``: a
    :class:`TokenEmbedding`, an ``nn.Embedding``, or an output ``nn.Linear(d, V)`` (whose weight
    is ``[V, d]`` too). Tying an output layer to the embedding drops the count from 2Vd to Vd.
    """
    w = getattr(source, "weight", None)
    if not isinstance(w, nn.Parameter):
        raise TypeError(f"source must have a weight Parameter [V, d], got {type(source).__name__}")
    for i, target in enumerate(targets):
        tw = getattr(target, "weight", None)
        if not isinstance(tw, torch.Tensor):
            raise TypeError(f"targets[{i}] ({type(target).__name__}) has no weight to tie")
        if tw.shape != w.shape:
            raise ValueError(
                f"cannot tie targets[{i}] with weight {tuple(tw.shape)} to source weight {tuple(w.shape)}: "
                "both must be [vocab_size, d_model] (an output layer is nn.Linear(d_model, vocab_size))"
            )
        target.weight = w


#: The weight-tying strategies (Press & Wolf 2017; Vaswani et al. 2017).
TIE_STRATEGIES: dict[str, str] = {
    "none": "every embedding and the output layer have their own weights",
    "encoder_decoder": "encoder and decoder share one token embedding (a shared vocabulary)",
    "output": "the output projection uses the (decoder's) token embedding matrix",
    "three_way": "encoder embedding, decoder embedding and output projection are one matrix",
}


def apply_tying(
    strategy: str,
    *,
    encoder_embedding: nn.Module | None = None,
    decoder_embedding: nn.Module | None = None,
    output: nn.Module | None = None,
) -> None:
    """Tie weights by a strategy from :data:`TIE_STRATEGIES`.

    For a decoder-only LM pass ``decoder_embedding`` and ``output``; ``"encoder_decoder"`` and
    ``"three_way"`` need an encoder embedding as well.
    """
    if strategy not in TIE_STRATEGIES:
        raise ValueError(f"unknown tying strategy {strategy!r}; valid: {', '.join(TIE_STRATEGIES)}")
    needs = {
        "none": (),
        "encoder_decoder": ("encoder_embedding", "decoder_embedding"),
        "output": ("decoder_embedding", "output"),
        "three_way": ("encoder_embedding", "decoder_embedding", "output"),
    }[strategy]
    given = {"encoder_embedding": encoder_embedding, "decoder_embedding": decoder_embedding, "output": output}
    missing = [k for k in needs if given[k] is None]
    if missing:
        raise ValueError(f"tying strategy {strategy!r} needs {', '.join(missing)}")
    if strategy in ("encoder_decoder", "three_way"):
        tie_weights(encoder_embedding, decoder_embedding)  # type: ignore[arg-type]
    if strategy in ("output", "three_way"):
        tie_weights(decoder_embedding, output)  # type: ignore[arg-type]


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose CPU training path is one pass with a counter-based generator.

    Same arguments as ``nn.Dropout``. In training, on CPU tensors of dtype float32/float64/bfloat16
    (the registered op ``posenc::dropout_cpu``, in eager mode and under ``torch.compile``), ``0 < p < 1``:
    :mod:`posenc.kernels.dropout_cpu` (PyTorch's dropout arithmetic for the mask it draws, ``p``
    quantized to a multiple of ``2^-32``, the mask recomputed in backward instead of stored, seeded
    from PyTorch's generator). Where that kernel cannot be built (no C compiler,
    ``POSENC_C_KERNELS=0``) the same mask is computed with PyTorch ops, so a seed gives the same
    dropout on every CPU machine. Elsewhere (CUDA) ``nn.Dropout`` itself.

    Shapes: ``forward(x [...], inplace=None) -> [...]``; ``inplace`` overrides ``self.inplace`` for
    one call (a caller that owns a fresh ``x``).
    """

    def forward(self, x: torch.Tensor, inplace: bool | None = None) -> torch.Tensor:
        inplace = self.inplace if inplace is None else inplace
        if self.training and 0.0 < self.p < 1.0:
            if _dropout_cpu.usable(x):  # the op: the kernel, or the same mask in PyTorch without it
                return _dropout_cpu.dropout(x, self.p, inplace=inplace)
            if _reference_applies(x):  # traced or transformed: the same mask, drawn in PyTorch
                return _dropout_cpu.reference_dropout(x, self.p)
        return nn.functional.dropout(x, self.p, self.training, inplace)


def _reference_applies(x: torch.Tensor) -> bool:
    """Where the op is not taken but its mask can be drawn in PyTorch ops (tracing, ``torch.func``
    transforms, tensor subclasses): eager CPU tensors of the kernel's dtypes."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64, torch.bfloat16)
        and not torch.compiler.is_compiling()
        and x.numel() > 0
    )


class InputEmbedding(nn.Module):
    """The input layer: token embedding x scale, + absolute positions, (LayerNorm), (dropout).

    Its defaults are :class:`~posenc.model.ModelConfig`'s, so a layer built alone and the input
    layer of a posenc model are the same: the token embedding times ``sqrt(d_model)`` (Vaswani et
    al. 2017), initialised at ``1 / sqrt(d_model)`` whatever the scale (so the default scaled
    embedding starts at unit variance); no LayerNorm on the sum (Vaswani et al. 2017, GPT-2 and
    Llama normalise inside each block; BERT's LayerNorm is ``layer_norm=True``); no dropout (Llama,
    Touvron et al. 2023, and every model posenc trains; Vaswani et al.'s and GPT-2's 0.1 is
    ``dropout=0.1``).

    Args:
        vocab_size: ``V``.
        d_model: ``d``.
        scheme: a scheme name from :func:`posenc.schemes` or a built scheme. Schemes without an
            ``embed`` hook (rope, alibi, ...) act inside attention, so here they add nothing.
        layer_norm: apply LayerNorm after the sum (BERT-style; default False: models that
            normalise inside each block).
        dropout: dropout rate after the (normalised) sum; default 0.
        scale, padding_idx: passed to :class:`TokenEmbedding`.
        init_std: std of the token table's initialisation; default ``1 / sqrt(d_model)`` whatever
            the scale (as :class:`~posenc.model.ModelConfig`'s ``embed_init_std``; with the
            default scale that is ``1 / scale``, a unit-variance scaled embedding).
        scheme_options: extra options for a scheme given by name (e.g. ``{"max_len": 512}``).
        device, dtype: factory kwargs for every parameter (token table, positional table, LayerNorm).

    Shapes: ``forward(ids [b, s], positions [s] | [b, s] | None) -> [b, s, d]``.

    A pretrained table (:meth:`TokenEmbedding.from_pretrained`, :func:`posenc.pretrained_embedding`)
    goes in with :meth:`from_token_embedding`.

    Speed: in training on a CPU, dropout runs as one pass with a counter-based random generator
    (:mod:`posenc.kernels.dropout_cpu`): the same arithmetic as ``nn.Dropout`` for its mask, the
    mask recomputed in backward instead of stored, ``p`` quantized to a multiple of ``2^-32``; the
    masks differ from ``nn.Dropout``'s (another generator, seeded from PyTorch's). Eval mode, other
    devices and ``torch.compile`` use the plain modules.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        scheme: str | PositionalScheme = "sinusoidal",
        *,
        layer_norm: bool = False,
        dropout: float = 0.0,
        scale: str | float | None = "sqrt_d_model",
        padding_idx: int | None = None,
        init_std: float | None = None,
        scheme_options: dict[str, Any] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = factory_kwargs(device, dtype)
        if init_std is None and isinstance(d_model, int) and not isinstance(d_model, bool) and d_model > 0:
            init_std = 1.0 / math.sqrt(d_model)  # ModelConfig's rule, whatever the scale
        self.token = TokenEmbedding(vocab_size, d_model, scale, padding_idx, init_std, **factory)
        if isinstance(scheme, PositionalScheme):
            if scheme_options:
                raise ValueError("scheme_options only apply when scheme is given by name")
            self.position: PositionalScheme | None = scheme if "embed" in scheme.hooks else None
        elif "embed" in scheme_class(scheme).hooks:
            self.position = build_with_context(
                scheme, {"d_model": d_model}, {**(scheme_options or {}), **factory}
            )
        else:
            self.position = None
        self.scheme_name = scheme if isinstance(scheme, str) else scheme.name
        self.norm = nn.LayerNorm(d_model, **factory) if layer_norm else nn.Identity()
        self.dropout = Dropout(check_probability(dropout, "dropout"))

    @classmethod
    def from_token_embedding(
        cls,
        token: TokenEmbedding,
        scheme: str | PositionalScheme = "sinusoidal",
        *,
        layer_norm: bool = False,
        dropout: float = 0.0,
        scheme_options: dict[str, Any] | None = None,
    ) -> InputEmbedding:
        """An input layer around an existing :class:`TokenEmbedding` (e.g. pretrained vectors: the
        module itself, not a copy; its scale, padding row and freezing stay as they are). The
        positional scheme and LayerNorm are made on the table's device and in its dtype; the other
        arguments as for the constructor."""
        if not isinstance(token, TokenEmbedding):
            raise TypeError(
                f"token must be a posenc.TokenEmbedding, got {type(token).__name__}; wrap a [V, d] tensor "
                "with posenc.TokenEmbedding.from_pretrained(weights)"
            )
        weight = token.weight
        layer = cls(
            1,
            token.d_model,
            scheme,
            layer_norm=layer_norm,
            dropout=dropout,
            scheme_options=scheme_options,
            device=weight.device,
            dtype=weight.dtype,
        )
        layer.token = token  # in place of the one-row table the constructor made
        return layer

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        fused = self._fused(ids, positions)
        if fused is not None:  # the whole layer in one pass (kernels.input_cpu): the same maths
            return fused
        x = self.token(ids)  # [b, s] -> [b, s, d], scaled
        if x.dim() != 3:
            raise ValueError(f"ids must have shape [b, s], got {tuple(ids.shape)}")
        if self.position is not None:
            x = self._add_position(x, positions)  # [b, s, d] + positional part
        x = self.norm(x)
        return self.dropout(x, inplace=isinstance(self.norm, nn.LayerNorm))  # LayerNorm's output is fresh

    def _fused(self, ids: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor | None:
        """The layer by :func:`posenc.kernels.input_cpu.input_layer` where it applies (float32 CPU,
        ids ``[b, s]``, positions shared by the batch, an additive table without gradient,
        LayerNorm with weight and bias or none, dropout below 1, no hooks); None elsewhere."""
        norm = self._fusable_norm()
        p = self.dropout.p if self.dropout.training else 0.0
        if norm is False or not 0.0 <= p < 1.0:  # p = 1 drops everything: the composition
            return None
        if (
            not isinstance(ids, torch.Tensor)
            or ids.dim() != 2
            or (positions is not None and positions.dim() != 1)
        ):
            return None
        if self.position is not None and not self.position.additive_table:
            return None
        weight = self.token.weight
        gamma, beta = (None, None) if norm is None else (norm.weight, norm.bias)
        if not _input_cpu.usable(weight, ids, None, gamma, beta):
            return None
        self.token.check_ids(ids)
        table = None
        if self.position is not None:
            like = weight.new_empty(0, ids.shape[1], weight.shape[1])  # [0, s, d]: the shape, no data
            table = self._positional_rows(like, positions)  # [s, d]
            if not _input_cpu.usable(weight, ids, table, gamma, beta):
                return None  # a table with a gradient (learned): the composition
        return _input_cpu.input_layer(
            weight,
            ids,
            scale=self.token.scale,
            table=table,
            norm_weight=gamma,
            norm_bias=beta,
            eps=norm.eps if norm is not None else 0.0,
            p=p,
            padding_idx=self.token.padding_idx,
        )

    def _fusable_norm(self) -> nn.LayerNorm | bool | None:
        """The LayerNorm the one-pass kernel can apply, None for no normalisation, False when it
        cannot run the layer (another norm, LayerNorm without weight or bias, forward hooks)."""
        if any(m._forward_hooks or m._forward_pre_hooks for m in (self.token, self.norm, self.dropout)):
            return False  # hooks expect the composition's modules to run
        if isinstance(self.norm, nn.Identity):
            return None
        norm = self.norm
        if not isinstance(norm, nn.LayerNorm) or norm.weight is None or norm.bias is None:
            return False
        return norm if tuple(norm.normalized_shape) == (self.token.d_model,) else False

    def _add_position(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """``self.position.embed(x, positions)``; for a scheme that declares ``additive_table`` with
        positions shared by the batch, the positional part is made once (``embed`` of zeros
        ``[1, s, d]``, exactly the table) and added in place to the fresh token embeddings: one
        ``[b, s, d]`` tensor fewer."""
        if self.position.additive_table and (positions is None or positions.dim() == 1):
            return x.add_(self._positional_rows(x, positions))  # [b, s, d] + [s, d], in place
        return self.position.embed(x, positions)

    def _positional_rows(self, like: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """``[s, d]``: what ``self.position.embed`` adds to ``like`` ``[b, s, d]`` (an additive table).
        ``additive_rows`` answers when it comes from the class that defines ``embed`` (a subclass
        overriding ``embed`` alone, or an instance whose ``embed`` was replaced, gets ``embed`` of
        zeros: its own numbers)."""
        scheme, cls = self.position, type(self.position)
        same_class = defining_class(cls, "embed") is defining_class(cls, "additive_rows")
        if same_class and "embed" not in vars(scheme):
            return scheme.additive_rows(like, positions)
        return scheme.embed(like.new_zeros(1, *like.shape[1:]), positions)[0]
