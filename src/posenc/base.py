"""The one interface every positional scheme has: its hooks on attention.

A scheme acts in one or more of four places (docs/architecture.md):

============  ===========================================  =====================================
hook          acts on                                      schemes
============  ===========================================  =====================================
``embed``     input embeddings ``[b, s, d]`` (added)       sinusoidal, learned, scaled sinusoidal
``rotate``    queries and keys ``[b, h, s, d_h]``          RoPE and its scalings, xPos
``queries``   the queries alone ``[b, h, s_q, d_h]``       Transformer-XL's ``u``, Llama 4's
                                                           NoPE-layer temperature
``score_bias``attention logits ``[b | 1, h, s_q, s_k]``    ALiBi, T5, Shaw, Transformer-XL
============  ===========================================  =====================================

A hook means what its name says: ``rotate`` rotates queries and keys by their positions; a
transform of the queries that leaves the keys alone (a learned vector added to every query, a
factor that grows with the query's position) is ``queries``.

Contract between schemes and models (every model in posenc keeps it):

* ``score_bias`` returns the term *as added to the scaled logits*: attention computes
  ``softmax(q k^T / sqrt(d_h) + bias)`` (``scaled_dot_product_attention`` adds ``attn_mask``
  after scaling), so a content-dependent bias divides by ``sqrt(d_h)`` itself. It receives the
  projected queries *before* ``rotate`` and ``queries``. The model casts the bias to the attention
  dtype.
* ``queries(q, q_positions)`` runs *after* ``rotate``, on the queries attention scores with; keys
  never pass through it, so the KV cache holds the same keys with or without it. It is affine in
  ``q`` at each position (``q -> A_p q + c_p``: Transformer-XL adds ``u``, Llama 4 multiplies by a
  factor), which the analysis relies on to average over content.
* With a KV cache, the model rotates each key once, when it enters the cache, with its own
  position. A scheme whose rotation of a key depends on the current length (dynamic NTK) sets
  ``needs_unrotated_cache = True``: the model then caches raw keys and calls ``rotate`` on the
  whole key cache at every step, so all keys always share one rotation base.
* ``relative_values`` (Shaw et al.'s value embeddings) returns ``[s_q, s_k, d_h]`` vectors
  ``a^V_ij``; a model adds ``sum_j p_ij a^V_ij`` to each head's output (needs the attention
  probabilities, so an explicit-softmax path). ``None`` for every other scheme.

Every scheme is also callable: ``scheme(...)`` runs its one hook (:meth:`PositionalScheme.forward`),
so ``pe(x)`` adds the encoding, ``rope(q, k)`` rotates, ``temperature(q, q_pos)`` returns the
transformed queries and ``alibi(q_pos, k_pos)`` returns the bias.

Queries and keys are ``[b, h, s, d_h]`` by default; ``rotate(..., qk_layout="bshd")`` takes
``[b, s, h, d_h]`` (flash-attention, torchtune).

A hook a scheme does not use is the identity (``embed`` returns ``x``, ``rotate`` returns
``(q, k)``, ``queries`` returns ``q``, ``score_bias`` returns ``None``), so a model can call them
all unconditionally; ``scheme.hooks`` declares which ones do something (the capability a caller
asks about: ``"queries" in scheme.hooks``), so a model can also skip the rest.

Legend: ``b`` batch, ``s`` sequence length, ``d`` model width, ``h`` heads, ``d_h`` head width,
``s_q``/``s_k`` query/key lengths. Positions are integer tensors ``[s]`` or ``[b, s]``; ``None``
means ``arange(s)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

__all__ = ["HOOKS", "PositionalScheme"]

HOOKS = ("embed", "rotate", "queries", "score_bias")


class PositionalScheme(nn.Module):
    """Base class of every positional scheme.

    Class attributes a scheme sets:
        name: the registry name (``"sinusoidal"``).
        hooks: the hooks it uses, a subset of :data:`HOOKS` (``"embed"``, ``"rotate"``,
            ``"queries"``, ``"score_bias"``). A scheme that overrides :meth:`queries` must declare it
            here (checked when the class is defined), since callers read this, never the override.
        summary: one line for ``posenc list``.
        max_len: the longest input it can encode, or ``None`` when positions are unbounded.
        causal_ok: whether the scheme can run in a causal decoder (with a KV cache).
        bidirectional_ok: whether the scheme can run in a bidirectional encoder (CoPE counts the keys
            between a key and its query, so it cannot).
        needs_unrotated_cache: the model must cache un-rotated keys (see the contract above).
        score_bias_uses_query: ``score_bias`` reads ``q`` (Shaw, Transformer-XL). When False the bias
            depends on positions only, so a model computes it once per forward for all layers
            that share the scheme.
        score_bias_uses_keys: ``score_bias`` also reads the keys (CoPE's gates): it takes the keyword
            arguments ``k`` (every key attention uses, ``[b, h_kv, s_k, d_h]``, the KV cache's
            included) and ``keep`` (``[b | 1, 1 | h, s_q, s_k]`` bool, True where attention may look:
            the causal, padding and packing mask; ``None`` when nothing is masked), and a model
            computes the bias after the cache is updated, never one query block at a time.
        position_dims: coordinates per position: 1 for token sequences, 2 for image grids, 3 for
            volumes (whose positions are ``[..., s, 2]`` / grid coordinates). Sequence models take 1.
        eval_variants: variants a model trained with this scheme can be *evaluated* with, without
            retraining, on inputs longer than it was trained on (RoPE: its scalings); each is turned
            into ``position_options`` by :meth:`variant_options`.
        additive_table: ``embed(x, positions)`` is ``x + table(positions)`` with a table that does
            not depend on ``x`` (sinusoidal, learned), so a model may compute ``embed(zeros)`` once
            for a batch sharing positions and add it (the same numbers, one tensor fewer).
        promises: the analysis properties the scheme promises (``posenc verify`` fails when one
            breaks); ``None`` = the analysis's default rules from the scheme's hooks and parameters.
        sequence_positions: a grid scheme (``position_dims`` > 1) that also takes token positions
            ``[s]`` / ``[b, s]`` as they are (multimodal RoPE: a text token's coordinates all equal
            its index); a caller with 1-D positions then passes them unchanged instead of the
            coordinates ``(p, 0, ...)``. A scheme with ``position_dims`` 1 takes ``[s]`` either way.
    """

    name: ClassVar[str] = "base"
    hooks: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""
    causal_ok: ClassVar[bool] = True
    bidirectional_ok: ClassVar[bool] = True
    needs_unrotated_cache: bool = False  # an instance may set it (a RoPE whose scaling depends on length)
    score_bias_uses_query: ClassVar[bool] = False
    score_bias_uses_keys: ClassVar[bool] = False
    position_dims: ClassVar[int] = 1
    eval_variants: ClassVar[tuple[str, ...]] = ()
    additive_table: ClassVar[bool] = False
    promises: ClassVar[tuple[str, ...] | None] = None
    sequence_positions: ClassVar[bool] = False
    max_len: int | None = None

    @classmethod
    def variant_options(cls, variant: str, factor: float, trained_len: int) -> dict[str, Any]:
        """The ``position_options`` that make a model trained at ``trained_len`` tokens into
        ``variant`` (one of :attr:`eval_variants`) for inputs ``factor`` times longer."""
        raise ValueError(
            f"scheme {cls.name!r} has no evaluation variant {variant!r}; it offers {list(cls.eval_variants)}"
        )

    def embed(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Add the positional part to input embeddings.

        Args:
            x: ``[b, s, d]`` token embeddings.
            positions: ``[s]`` or ``[b, s]`` integer positions, default ``arange(s)``.

        Returns:
            ``[b, s, d]``, same dtype as ``x``. The identity for schemes without this hook.
        """
        return x

    def additive_rows(self, like: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The rows ``t`` that :meth:`embed` adds, for a scheme that declares :attr:`additive_table`:
        ``embed(x, positions) == x + t`` for every ``x`` shaped like ``like``.

        Args:
            like: ``[b, s, d]`` token embeddings (only their ``s``, ``d``, dtype and device are used).
            positions: ``[s]`` integer positions shared by the batch, default ``arange(s)``.

        Returns:
            ``[s, d]`` in ``like``'s dtype. Here: :meth:`embed` of zeros ``[1, s, d]``; a scheme that
            computes its table directly overrides this together with :meth:`embed`.
        """
        return self.embed(like.new_zeros(1, *like.shape[1:]), positions)[0]

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply the positional transform to queries and keys.

        Args:
            q: ``[b, h, s_q, d_h]`` queries (``[b, s_q, h, d_h]`` with ``qk_layout="bshd"``).
            k: ``[b, h_kv, s_k, d_h]`` keys (``[b, s_k, h_kv, d_h]`` with ``qk_layout="bshd"``).
            q_positions: ``[s_q]`` or ``[b, s_q]``, default ``arange(s_q)``.
            k_positions: ``[s_k]`` or ``[b, s_k]``, default ``arange(s_k)``.
            qk_layout: ``"bhsd"`` or ``"bshd"``; ``None`` = the scheme's own (``"bhsd"`` unless
                built with another). Schemes with this hook accept it.

        Returns:
            ``(q, k)`` with the same shapes and dtypes. The identity for schemes without this hook.

        Raises:
            TypeError: the scheme transforms the queries alone (it declares ``queries`` and not
                ``rotate``): calling ``rotate`` would silently skip that transform.
        """
        if "queries" in self.hooks and "rotate" not in self.hooks:
            raise TypeError(
                f"scheme {self.name!r} does not rotate q and k: it transforms the queries alone; call "
                f"scheme.queries(q, q_positions) (the keys are unchanged)"
            )
        return q, k

    def queries(
        self,
        q: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> torch.Tensor:
        """Transform the queries alone (the keys are untouched), after :meth:`rotate`.

        Args:
            q: ``[b, h, s_q, d_h]`` queries (``[b, s_q, h, d_h]`` with ``qk_layout="bshd"``).
            q_positions: ``[s_q]`` or ``[b, s_q]``, default ``arange(s_q)``.
            qk_layout: ``"bhsd"`` or ``"bshd"``; ``None`` = the scheme's own (``"bhsd"`` unless
                built with another). Schemes with this hook accept it.

        Returns:
            ``q``'s shape and dtype: ``A_p q + c_p`` per position ``p`` (affine in ``q``). The
            identity (``q`` itself) for schemes without this hook.
        """
        return q

    def distance_bias(self, distance: torch.Tensor) -> torch.Tensor | None:
        """The :meth:`score_bias` of a scheme whose bias depends only on ``k_pos - q_pos`` (and not
        on content), per distance: ``distance [n]`` int64 -> ``[h, n]`` float, the same values
        ``score_bias`` gives every pair at that distance. Attention can then build a bias for any
        block of pairs from ``h x (s_q + s_k - 1)`` values. ``None`` (the default): not a function of
        the distance alone (absolute, content-dependent or no bias)."""
        return None

    def rotary_tables(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        *,
        qk_layout: str | None = None,
    ) -> Any:
        """What :meth:`rotate` computes from the positions alone, built once so that several calls
        with the same positions (the layers of one forward pass) can share it: pass the result as
        ``rotate(..., tables=...)``. ``None`` (the default) = nothing to share: call :meth:`rotate`
        without ``tables``. Arguments as for :meth:`rotate` (``q``/``k`` give dtypes and lengths)."""
        return None

    def score_bias(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        q: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Additive bias on the attention logits.

        Args:
            q_positions: ``[s_q]`` or ``[b, s_q]`` integer positions.
            k_positions: ``[s_k]`` or ``[b, s_k]`` integer positions.
            q: ``[b, h, s_q, d_h]`` queries, for schemes whose bias depends on content
                (Shaw, Transformer-XL); ignored by the others.

        Returns:
            ``[b | 1, h, s_q, s_k]`` float bias, or ``None`` for schemes without this hook.
        """
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.queries is not PositionalScheme.queries and "queries" not in cls.hooks:
            raise TypeError(
                f"{cls.__name__} overrides queries but does not declare it in hooks, so a model would "
                'never call it: add "queries" to its hooks'
            )
        overrides = cls.relative_values is not PositionalScheme.relative_values
        declares = cls.has_relative_values is not PositionalScheme.has_relative_values
        if overrides and not declares:
            raise TypeError(
                f"{cls.__name__} overrides relative_values but does not declare has_relative_values, so a "
                "model would never call it: define has_relative_values (a property or a bool class "
                "attribute) saying when it returns value vectors"
            )
        # A call runs the scheme's one hook with that hook's own signature (help(), IDEs, type
        # checkers see rotate's or score_bias's arguments); a scheme may define forward itself.
        if "forward" not in vars(cls) and len(cls.hooks) <= 1:
            cls.forward = getattr(cls, cls.hooks[0] if cls.hooks else "embed")

    @property
    def has_relative_values(self) -> bool:
        """Whether :meth:`relative_values` gives value vectors the attention must add to each head's
        output (Shaw et al. with values); the model calls it only then."""
        return False

    def relative_values(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """Relative value vectors (Shaw et al. 2018), or ``None`` for schemes without them (a scheme
        that returns them declares :attr:`has_relative_values`).

        Args:
            q_positions: ``[s_q]`` integer positions.
            k_positions: ``[s_k]`` integer positions.

        Returns:
            ``[s_q, s_k, d_h]`` vectors ``a^V_ij`` (or ``[h, s_q, s_k, d_h]``), or ``None``.
        """
        return None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the scheme's hook, so a scheme is called like any module. A scheme with one hook (or
        none) has that hook as its ``forward``, with its own signature:

        * ``embed`` schemes: ``pe(x [b, s, d], positions=None) -> [b, s, d]`` (``x`` + the encoding);
        * ``rotate`` schemes: ``rope(q, k, q_positions=None, k_positions=None, qk_layout=None)
          -> (q, k)`` (shapes as :meth:`rotate`);
        * ``queries`` schemes: ``temperature(q, q_positions=None, qk_layout=None) -> q`` (shapes as
          :meth:`queries`);
        * ``score_bias`` schemes: ``alibi(q_positions [s_q], k_positions [s_k], q=None)
          -> [b | 1, h, s_q, s_k]``;
        * no hooks (NoPE): ``nope(x) -> x``.

        A scheme with several hooks (Transformer-XL: ``queries`` and ``score_bias``) has no single
        meaning for a call: ``TypeError`` naming the hooks to call instead.
        """
        if len(self.hooks) > 1:
            raise TypeError(
                f"scheme {self.name!r} has several hooks ({', '.join(self.hooks)}), so calling it is "
                f"ambiguous; call one: " + ", ".join(f"scheme.{h}(...)" for h in self.hooks)
            )
        return getattr(self, self.hooks[0] if self.hooks else "embed")(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"hooks={list(self.hooks)}"
