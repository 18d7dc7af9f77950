"""The KV cache: keys and values of past tokens in growing buffers, one entry per layer.

Legend: ``b`` batch, ``h_kv`` key/value heads, ``s_k`` cached tokens, ``d_h`` head width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # for annotations only: the plan module does not need the cache at run time
    from .plan import AttentionPlan


# ----------------------------------------------------------------------------------------------
# The KV cache: an explicit object the caller owns
# ----------------------------------------------------------------------------------------------
class KVCache:
    """Keys and values of past tokens for incremental decoding, per layer, with their positions.

    The caller creates it and passes it to every forward call; modules keep no hidden state::

        cache = KVCache(config.num_layers)
        logits = model(prompt, attention_mask=mask, cache=cache)   # prefill
        logits = model(next_ids, cache=cache)                      # one step, positions continue

    Attributes:
        keys, values: per layer ``[b, h_kv, s_p, d_h]`` (keys rotated, unless the scheme sets
            ``needs_unrotated_cache``), ``None`` before the first call.
        positions: ``[s_p]`` or ``[b, s_p]`` positions of the cached tokens.
        valid: ``[b, s_p]`` bool, False for padding slots; ``None`` while there is no padding.

    Under ``torch.no_grad()``/``torch.inference_mode()`` (as in ``generate``) keys and values live in
    per-layer buffers that grow by a quarter (at least 256 slots) when full, and ``keys[layer]`` /
    ``values[layer]`` are views of their first ``s_p`` slots: appending a token writes only its own
    slot (amortised O(1); concatenation copied the whole cache at every step), for at most ~25% more
    memory than the tokens need (a prefill is allocated exactly). Views handed out earlier are never
    written; keys assigned from outside (e.g. ``keys[layer] = keys[layer][:, :, :n]`` to roll back)
    are copied into new buffers. With gradients enabled the cache concatenates, so autograd, which
    may keep any of these tensors, never sees an in-place write.
    """

    def __init__(self, num_layers: int) -> None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.positions: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        # per layer: [b, h_kv, capacity, d_h] storage behind keys/values (None: not allocated), and
        # the views of it last handed out as keys[layer]/values[layer]
        self._buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self._views: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    def __len__(self) -> int:
        """``s_p``, the number of cached slots (padding included)."""
        return 0 if self.positions is None else self.positions.shape[-1]

    def offset(self) -> int | torch.Tensor:
        """Position of the next token: the number of real tokens so far, an int or ``[b]`` per row."""
        if self.valid is not None:
            return self.valid.long().sum(-1)  # [b]
        if self.positions is None:
            return 0
        return int(self.positions[..., -1].max()) + 1  # one past the last cached position

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys/values ``[b, h_kv, s, d_h]`` to ``layer``.

        Returns all of the layer's keys/values ``[b, h_kv, s_k, d_h]``.
        """
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is not None and (past_k.shape[:2] != k.shape[:2] or past_k.shape[3] != k.shape[3]):
            raise ValueError(
                f"cache layer {layer} holds keys [b, h_kv, s_p, d_h] = {list(past_k.shape)}; new keys "
                f"{list(k.shape)} must agree in b, h_kv and d_h (use a new KVCache for a new batch)"
            )
        if torch.is_grad_enabled():  # autograd may keep the keys: never write into them
            self._buffers[layer] = self._views[layer] = None
            if past_k is not None:
                k, v = torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)  # [b, h_kv, s_p + s, d_h]
            self.keys[layer], self.values[layer] = k, v
            return k, v
        s_p = 0 if past_k is None else past_k.shape[2]
        s_k = s_p + k.shape[2]
        bufs = self._buffers[layer]
        # the buffers' first s_p slots hold the past only if keys/values are still the views this
        # cache handed out; anything assigned from outside (a rollback, a window) goes to new buffers
        # so that no view someone holds is ever written
        ours = past_k is None or (
            self._views[layer] is not None
            and self._views[layer][0] is past_k
            and self._views[layer][1] is past_v
        )
        if not ours or not _fits(bufs, k, v, s_k):  # grow by a quarter (>= 256 slots), copy the past once
            old = 0 if bufs is None else bufs[0].shape[2]
            capacity = s_k if old == 0 else max(s_k, old + max(old // 4, _MIN_GROWTH))
            bufs = (_grown(k, capacity), _grown(v, capacity))  # [b, h_kv, capacity, d_h]
            if s_p:
                bufs[0][:, :, :s_p].copy_(past_k)
                bufs[1][:, :, :s_p].copy_(past_v)
            self._buffers[layer] = bufs
        bufs[0][:, :, s_p:s_k].copy_(k)  # the new tokens' slots only
        bufs[1][:, :, s_p:s_k].copy_(v)
        self.keys[layer], self.values[layer] = bufs[0][:, :, :s_k], bufs[1][:, :, :s_k]  # views
        self._views[layer] = (self.keys[layer], self.values[layer])
        return self.keys[layer], self.values[layer]

    def advance(self, plan: AttentionPlan, new_valid: torch.Tensor | None) -> None:
        """Record the new tokens' positions (and padding) once every layer has been updated."""
        batch = None if self.keys[0] is None else self.keys[0].shape[0]
        self.positions = plan.k_positions
        if new_valid is None and self.valid is None:
            return
        s_p = self.positions.shape[-1] - (plan.q_positions.shape[-1])
        old = (
            self.valid
            if self.valid is not None
            else torch.ones(batch, s_p, dtype=torch.bool, device=self.positions.device)
        )
        new = (
            new_valid.bool()
            if new_valid is not None
            else torch.ones(batch, plan.q_positions.shape[-1], dtype=torch.bool, device=self.positions.device)
        )
        self.valid = torch.cat((old, new), dim=-1)  # [b, s_k]

    def past(self) -> dict:
        """Keyword arguments for :func:`plan_attention` describing the cached tokens."""
        return {"past_positions": self.positions, "past_valid": self.valid, "offset": self.offset()}


#: slots a full KV-cache buffer grows by at least (a quarter of its size otherwise)
_MIN_GROWTH = 256


def _fits(bufs, k: torch.Tensor, v: torch.Tensor, s_k: int) -> bool:
    """Whether a layer's buffers can hold ``s_k`` slots of keys/values like ``k``/``v``."""
    if bufs is None:
        return False
    kb, vb = bufs
    if kb.is_inference() and not torch.is_inference_mode_enabled():
        return False  # filled under inference_mode, written outside it: a normal tensor is needed
    return (
        kb.shape[2] >= s_k
        and (kb.shape[:2], kb.shape[3], kb.dtype, kb.device) == (k.shape[:2], k.shape[3], k.dtype, k.device)
        and (vb.shape[:2], vb.shape[3], vb.dtype, vb.device) == (v.shape[:2], v.shape[3], v.dtype, v.device)
    )


def _grown(x: torch.Tensor, capacity: int) -> torch.Tensor:
    """An empty ``[b, h_kv, capacity, d_h]`` buffer like ``x``."""
    b, h, _, d = x.shape
    return x.new_empty(b, h, capacity, d)
