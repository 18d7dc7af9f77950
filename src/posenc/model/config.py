"""The one configuration every posenc model is built from.

A model takes its positional scheme *by name* (``position="alibi"``) plus the scheme's options,
so the lab and the benchmarks can train every scheme the same way. Everything is validated at
construction, with errors that name the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

from .._validate import check_choice, check_fields, check_int, check_positive_float, check_probability
from ..embedding import TIE_STRATEGIES
from ..registry import config_keys, scheme_class, schemes
from .layers import check_layer_positions

__all__ = ["ACTIVATION_NAMES", "NORMS", "NORM_TYPES", "RESIDUALS", "ModelConfig"]

#: Where each block's LayerNorm sits: before each sub-layer (GPT-2, stable) or after the residual
#: sum (Vaswani et al. 2017, BERT).
NORMS: dict[str, str] = {
    "pre": "x + f(LayerNorm(x)), and a final LayerNorm before the output layer (GPT-2)",
    "post": "LayerNorm(x + f(x)) (Vaswani et al. 2017, BERT)",
}


#: The normalisation layer of every block and the final norm (``norm_type``).
NORM_TYPES: dict[str, str] = {
    "layernorm": "LayerNorm: (x - mean) / std * weight + bias (GPT-2, GPT-NeoX, Bloom)",
    "rmsnorm": "RMSNorm: x / rms(x) * weight, computed in float32 at least (Llama, Mistral, Qwen, Phi-3)",
}

#: The MLP's activation (``activation``); with ``gated_mlp`` it multiplies the up projection.
ACTIVATION_NAMES: dict[str, str] = {
    "gelu": "GELU, exact (erf) form",
    "gelu_tanh": "GELU, tanh approximation (GPT-2's gelu_new, Gemma's gelu_pytorch_tanh)",
    "silu": "SiLU / swish (with gated_mlp: SwiGLU, Llama)",
    "relu": "ReLU",
}

#: How a block combines attention and MLP (``residual``).
RESIDUALS: dict[str, str] = {
    "sequential": "x = x + Attn(N1(x)); x = x + MLP(N2(x)) (GPT-2, Llama)",
    "parallel": "x = x + Attn(N1(x)) + MLP(N2(x)) (GPT-NeoX)",
    "parallel_shared_norm": "x = x + Attn(N(x)) + MLP(N(x)), one norm (GPT-J, Phi-2)",
}


@dataclass
class ModelConfig:
    """Configuration of a posenc Transformer (:class:`~posenc.model.TransformerLM`, encoders, decoders).

    Args:
        vocab_size: ``V``, the (target) vocabulary size.
        d_model: ``d``, the model width.
        num_layers: blocks in the stack (in each of encoder and decoder for an encoder-decoder).
        num_heads: ``h``, query heads; must divide ``d_model``.
        num_kv_heads: key/value heads for grouped-query attention (GQA); must divide ``num_heads``.
            ``None`` = ``num_heads`` (plain multi-head attention), 1 = multi-query attention.
        d_ff: hidden width of the MLP; ``None`` = ``4 * d_model``.
        position: a scheme name from :func:`posenc.schemes` (``"rope"``, ``"alibi"``, ``"learned"``...).
        position_options: the scheme's own options (see ``posenc.describe(name)``); the model
            supplies ``d_model``, ``num_heads``, ``head_dim``, ``max_len`` and ``causal``
            when the scheme takes them and the options do not set them.
        max_len: the nominal (trained) length. Learned positions need it and cannot run past it;
            schemes with long-context scalings read it as their original length.
        dropout: dropout rate on embeddings, attention probabilities and residual branches.
        norm: ``"pre"`` or ``"post"`` (:data:`NORMS`).
        tie: weight tying, a key of :data:`posenc.TIE_STRATEGIES`. A decoder-only LM takes
            ``"none"`` or ``"output"``; an encoder-decoder any of the four.
        share_position: one scheme instance shared by all layers (T5 shares its bias table);
            ``False`` builds one per layer (each with its own parameters, if it has any).
        embed_norm: LayerNorm right after token + position embedding (BERT-style).
        embed_scale: the token embedding's multiplier: ``"sqrt_d_model"`` (Vaswani et al. 2017,
            default), ``None`` (no scaling) or a positive number.
        embed_init_std: std of the token table's normal initialisation; ``None`` = ``1 /
            sqrt(d_model)`` whatever ``embed_scale`` (so with the default scale the scaled
            embedding starts with unit variance, and without it at ``1 / sqrt(d_model)``).
        init_std: std of the normal initialisation of every linear layer (GPT-2's 0.02; the
            residual output projections get ``init_std / sqrt(2 num_layers)``).
        memory_len: Transformer-XL segment recurrence: each layer also attends to up to this
            many hidden states of the previous segments (detached). 0 = off.
        bias: biases in the linear layers (attention projections and MLP).
        src_vocab_size: source vocabulary of an encoder-decoder; ``None`` = ``vocab_size``.
        qk_layout: the axis order queries and keys are rotated in: ``"bhsd"`` (``[b, h, s, d_h]``,
            default) or ``"bshd"`` (``[b, s, h, d_h]``); the same numbers either way.
        layer_positions: the scheme of each layer's attention, a pattern of names repeated over the
            layers (a list, or a string such as ``"rope*3,nope_temperature"``: Llama 4's three RoPE
            layers and one without positions); ``None`` = ``position`` in every layer. ``position``
            stays the input layer's scheme (its ``embed`` hook); pattern entries act in attention
            only, so an ``embed`` scheme there is refused. See :mod:`posenc.model.layers`.
        layer_position_options: options per pattern name (``{"rope": {"base": 5e5}}``); a name
            without an entry takes ``position_options`` when it is ``position``, else its defaults.

    The block (defaults: the GPT-2-style block above; a Llama block is ``norm_type="rmsnorm",
    activation="silu", gated_mlp=True``):

    Args:
        norm_type: ``"layernorm"`` or ``"rmsnorm"`` (:data:`NORM_TYPES`), in every block and at the end.
        norm_eps: the norms' epsilon (LayerNorm's 1e-5 by default; Llama uses 1e-6 or 1e-5).
        activation: the MLP's activation, a key of :data:`ACTIVATION_NAMES`.
        gated_mlp: ``down(act(gate(x)) * up(x))`` (SwiGLU with ``"silu"``, GeGLU with a GELU) instead
            of ``down(act(up(x)))``.
        qkv_bias, out_bias, mlp_bias: biases on the query/key/value projections, the attention
            output projection and the MLP's layers; ``None`` = ``bias`` (Qwen2: ``qkv_bias=True``
            alone).
        residual: ``"sequential"``, ``"parallel"`` or ``"parallel_shared_norm"`` (:data:`RESIDUALS`);
            the parallel forms need ``norm="pre"`` and a decoder-only model.
        qk_norm: RMSNorm over each head's ``d_h`` dims of queries and keys, before the positional
            scheme (Qwen3, Gemma 3).
        output_bias: a bias on the output layer (GPT-J).
        d_head: ``d_h`` when it is not ``d_model / num_heads`` (Qwen3-0.6B: 1024 wide, 16 heads of
            128): queries, keys and values are ``num_heads * d_head`` wide and the output projection
            maps that back to ``d_model``. ``None`` = ``d_model / num_heads``.
        sliding_window: ``W``, sliding-window attention in every layer of a decoder (Mistral,
            Phi-3, Qwen2 with every layer windowed): the token in cache slot ``i`` attends to the
            slots ``i - W + 1 .. i`` only, itself and the ``W - 1`` before it (HF's
            ``sliding_window``). The KV cache keeps every key; the mask hides the older ones.
            ``None`` = every earlier token.
    """

    vocab_size: int
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    d_ff: int | None = None
    position: str = "rope"
    position_options: dict[str, Any] = field(default_factory=dict)
    max_len: int | None = None
    dropout: float = 0.0
    norm: str = "pre"
    tie: str = "output"
    share_position: bool = True
    embed_norm: bool = False
    embed_scale: str | float | None = "sqrt_d_model"
    embed_init_std: float | None = None
    init_std: float = 0.02
    memory_len: int = 0
    bias: bool = False
    src_vocab_size: int | None = None
    qk_layout: str = "bhsd"
    # the block; the defaults are the GPT-2-style block, bit for bit
    norm_type: str = "layernorm"
    norm_eps: float = 1e-5
    activation: str = "gelu"
    gated_mlp: bool = False
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    mlp_bias: bool | None = None
    residual: str = "sequential"
    qk_norm: bool = False
    output_bias: bool = False
    d_head: int | None = None
    sliding_window: int | None = None
    layer_positions: list[str] | str | None = None
    layer_position_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_int(self.vocab_size, "vocab_size")
        check_int(self.d_model, "d_model")
        check_int(self.num_layers, "num_layers")
        check_int(self.num_heads, "num_heads")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} does not divide d_model={self.d_model}: each head gets "
                f"d_model / num_heads dims; choose num_heads among {_divisors(self.d_model)}"
            )
        if self.num_kv_heads is not None:
            check_int(self.num_kv_heads, "num_kv_heads")
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}: each "
                    f"key/value head serves a whole group of query heads; choose among "
                    f"{_divisors(self.num_heads)}"
                )
        if self.d_ff is not None:
            check_int(self.d_ff, "d_ff")
        if self.max_len is not None:
            check_int(self.max_len, "max_len")
        check_probability(self.dropout, "dropout")
        check_choice(self.norm, "norm", NORMS)
        check_choice(self.tie, "tie", TIE_STRATEGIES)
        check_choice(self.qk_layout, "qk_layout", ("bhsd", "bshd"))
        for name in ("share_position", "embed_norm", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_int(self.memory_len, "memory_len", minimum=0)
        if self.embed_scale is not None and self.embed_scale != "sqrt_d_model":
            if isinstance(self.embed_scale, str):
                raise ValueError(
                    f"embed_scale must be 'sqrt_d_model', None or a positive number, got {self.embed_scale!r}"
                )
            check_positive_float(self.embed_scale, "embed_scale")
        if self.embed_init_std is not None:
            check_positive_float(self.embed_init_std, "embed_init_std")
        check_positive_float(self.init_std, "init_std")
        if self.src_vocab_size is not None:
            check_int(self.src_vocab_size, "src_vocab_size")
        if not isinstance(self.position_options, dict):
            raise TypeError(
                "position_options must be a dict of the scheme's options, got "
                f"{type(self.position_options).__name__}"
            )
        keys = config_keys(self.position)  # unknown name -> the registry's ValueError listing the valid ones
        unknown = sorted(set(self.position_options) - set(keys))
        if unknown:
            raise ValueError(
                f"unknown position_options {unknown} for position={self.position!r}; "
                f"valid keys: {', '.join(keys) or '(none)'}"
            )
        offered = {"d_model": self.d_model, "num_heads": self.num_heads, "head_dim": self.head_dim}
        clash = {k: v for k, v in self.position_options.items() if k in offered and v != offered[k]}
        if clash:
            shown = ", ".join(f"{k}={v!r} (the model has {offered[k]})" for k, v in clash.items())
            raise ValueError(
                f"position_options {shown} disagree with the model; drop them: the model "
                "gives the scheme its own sizes"
            )
        self.layer_positions = check_layer_positions(self, self.layer_positions, self.layer_position_options)
        if (
            keys.get("max_len", None) is inspect.Parameter.empty
            and self.max_len is None
            and "max_len" not in self.position_options
        ):
            raise ValueError(
                f"position={self.position!r} needs max_len (the length of its table); "
                f"e.g. ModelConfig(..., position={self.position!r}, max_len=512)"
            )
        self._check_block()

    def _check_block(self) -> None:
        """The block's fields: names from their tables, bools as bools, a parallel residual pre-norm."""
        check_choice(self.norm_type, "norm_type", NORM_TYPES)
        check_positive_float(self.norm_eps, "norm_eps")
        check_choice(self.activation, "activation", ACTIVATION_NAMES)
        check_choice(self.residual, "residual", RESIDUALS)
        if self.d_head is not None:
            check_int(self.d_head, "d_head")
        for name in ("gated_mlp", "qk_norm", "output_bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("qkv_bias", "out_bias", "mlp_bias"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool or None (= bias), got {getattr(self, name)!r}")
        if self.sliding_window is not None:
            check_int(self.sliding_window, "sliding_window")
            if self.memory_len:
                raise ValueError(
                    f"sliding_window={self.sliding_window} with memory_len={self.memory_len}: a window over "
                    "Transformer-XL's memory is not defined here; use one of them"
                )
        if self.residual != "sequential" and self.norm != "pre":
            raise ValueError(
                f"residual={self.residual!r} adds both branches to the block's input, which needs "
                "norm='pre'; use residual='sequential' with norm='post'"
            )

    # ------------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """``d_h``: ``d_head``, or ``d_model / num_heads`` when it is None."""
        return self.d_model // self.num_heads if self.d_head is None else self.d_head

    @property
    def kv_heads(self) -> int:
        """``h_kv``: ``num_kv_heads``, or ``num_heads`` when it is None."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def ffn_dim(self) -> int:
        """The MLP hidden width: ``d_ff``, or ``4 * d_model`` when it is None."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    def projection_bias(self, part: str) -> bool:
        """Whether the ``"qkv"``, ``"out"`` (attention output) or ``"mlp"`` projections have biases:
        the part's own field, or ``bias`` when it is None."""
        own = {"qkv": self.qkv_bias, "out": self.out_bias, "mlp": self.mlp_bias}[part]
        return self.bias if own is None else own

    def approx_num_params(self) -> int:
        """About how many parameters a decoder-only model of this config has (token table, per
        layer ``4 d^2`` attention and ``2 d d_ff`` MLP weights (``3 d d_ff`` gated), norms), before
        building it."""
        d, f = self.d_model, self.ffn_dim
        mlp = (3 if self.gated_mlp else 2) * d * f
        return self.vocab_size * d + self.num_layers * (4 * d * d + mlp + 4 * d) + 2 * d

    def check_fits(self) -> None:
        """Refuse (``InsufficientMemoryError``, a ``ValueError``) a model whose weights would not fit
        in free memory, before any of it is allocated."""
        from .._alloc import check_allocation

        check_allocation(
            [self.approx_num_params()],
            None,
            f"a model with d_model={self.d_model}, num_layers={self.num_layers}, "
            f"vocab_size={self.vocab_size}",
            "use a smaller d_model, num_layers or vocab_size",
        )

    def scheme_context(self, causal: bool) -> dict[str, Any]:
        """What a model offers the scheme's constructor (see :func:`posenc.build_with_context`).

        ``max_len`` is offered only when set, so a scheme's own default applies otherwise."""
        context = {
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "causal": causal,  # T5: a decoder uses one-directional buckets, as T5 does
        }
        if self.max_len is not None:
            context["max_len"] = self.max_len
        return context

    def check_causal(self) -> None:
        """Raise if the position scheme has no causal form (a decoder needs one)."""
        cls = scheme_class(self.position)
        if not cls.causal_ok:
            raise ValueError(
                f"position={self.position!r} has no causal form, so it cannot run in a decoder "
                "(or decode with a KV cache); use it in an Encoder, or pick a causal scheme: "
                + ", ".join(n for n in _causal_schemes())
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (saved next to the weights by :func:`~posenc.model.save_model`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` listing the valid ones."""
        check_fields(cls, data)
        return cls(**data)


#: The largest number whose divisors an error message lists: the search takes ``sqrt(n)`` steps, and
#: ``n`` may come from a file, so a crafted size must not make a message take unbounded time.
_DIVISORS_UP_TO = 1 << 24


def _divisors(n: int) -> list[int] | str:
    """The divisors of ``n`` (``sqrt(n)`` steps), or a description of them past :data:`_DIVISORS_UP_TO`."""
    if n > _DIVISORS_UP_TO:
        return f"the divisors of {n}"
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted({*small, *(n // k for k in small)})


def _causal_schemes() -> list[str]:
    return [n for n in schemes() if scheme_class(n).causal_ok]
