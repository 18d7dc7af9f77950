"""One training step of the lab's language model against an x-transformers model of the same size
and positional scheme.

The lab's model (docs/lab.md): byte-level (V = 256), ``d = 128``, 4 layers, 4 heads
(``d_h = 32``), MLP ``4d`` with GELU, pre-LayerNorm, output layer tied to the token embedding, no
dropout, sequences of ``L = 128``, batch 32. x-transformers' ``TransformerWrapper(Decoder(...))``
is configured to match: ``attn_dim_head=32``, ``tie_embedding=True``, ``ff_no_bias=True``, no
absolute positions. Its LayerNorms have no bias, so it has ``3 d`` fewer parameters (0.05% at the
lab's size; both counts are in ``params``). It is timed twice: with its default attention (explicit
einsum softmax) and with ``attn_flash=True`` (PyTorch's SDPA, as posenc uses). For RoPE it is
given ``rotary_emb_dim = attn_dim_head`` (its default rotates half of each head), so both rotate
every dimension.

Checks: each posenc implementation's first-step loss (from a copy of the initial model) must equal
the loss of the same model computed on the reference path (fast paths off) within 1e-5; the
x-transformers models are initialised on their own, so they are labelled "same work, different
numbers" (their parameter counts are in ``params``).

The ``train_step_long_<scheme>`` cases take the same model to ``L = 1024`` (batch 4), where
posenc's attention applies a bias one query block at a time
(:mod:`posenc.model.blocked`); ``posenc_<scheme>_full_table`` is the same posenc model
forced onto the full-table path (``blocked.usable`` patched to False for its step), so the
case also shows what the blocked path is worth inside a training step.

One step: forward, mean next-token cross-entropy, backward, global-norm gradient clipping at 1.0,
AdamW (lr 3e-3, weight decay 0.1), ``zero_grad``. Bytes are not meaningful here (no copy
baseline): compare the times.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .harness import Case, Impl
from .rope import optional_import

__all__ = ["cases"]

#: posenc scheme -> x-transformers Decoder keyword arguments for the same scheme, given ``d_h``
XT_SCHEMES: dict[str, Callable[[int], dict[str, object]]] = {
    "rope": lambda d_h: {"rotary_pos_emb": True, "rotary_emb_dim": d_h},  # the full head, as posenc
    "alibi": lambda d_h: {"alibi_pos_bias": True},
    "t5": lambda d_h: {"rel_pos_bias": True},
}


def _step(
    model: nn.Module, ids: torch.Tensor, targets: torch.Tensor, *, peer: bool = False
) -> Callable[[], object]:
    """One AdamW step; a posenc LM returns an ``LMOutput``, a ``peer`` model the logits themselves."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step() -> float:
        out = model(ids)
        logits = out if peer else out.logits  # [b, s, V]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _full_table(step: Callable[[], object]) -> Callable[[], object]:
    """``step`` with posenc's attention kept on its full-table bias path."""
    from unittest import mock

    from posenc.model import blocked

    def run() -> object:
        with mock.patch.object(blocked, "usable", lambda q: False):
            return step()

    return run


def _first_loss(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The loss of a copy of ``model`` as it is now (for the output check: the steps change it)."""
    import copy

    frozen = copy.deepcopy(model)

    def loss() -> torch.Tensor:
        with torch.no_grad():
            logits = frozen(ids).logits  # [b, s, V]
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return loss


def _reference_loss(loss: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``loss`` computed with posenc's fast paths switched off (the reference paths)."""
    from posenc import kernels

    def run() -> torch.Tensor:
        before = kernels._settings._state["enabled"]  # restored as it was (None: the environment's)
        kernels.set_enabled(False)
        try:
            return loss()
        finally:
            kernels.set_enabled(before)

    return run


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _case(name: str, scheme: str, b: int, s: int, d: int, layers: int, heads: int) -> Case:
    from posenc.model import ModelConfig, TransformerLM
    from posenc.registry import scheme_class

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (b, s + 1), generator=gen)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    mine = TransformerLM(
        ModelConfig(vocab_size=256, d_model=d, num_layers=layers, num_heads=heads, position=scheme, max_len=s)
    ).train()
    first = _first_loss(mine, ids, targets)
    impls = [
        Impl(
            f"posenc_{scheme}",
            _step(mine, ids, targets),
            "posenc",
            None,
            "model.TransformerLM",
            form="training",
            output=first,
        ),
    ]
    if s > 256 and "score_bias" in scheme_class(scheme).hooks:  # more than one query block: blocked bias
        impls.append(
            Impl(
                f"posenc_{scheme}_full_table",
                _full_table(_step(mine, ids, targets)),
                "posenc",
                None,
                "the same model on the full-table bias path",
                form="training",
                output=_full_table(first),
            )
        )
    params: dict[str, object] = {
        "b": b,
        "L": s,
        "d_model": d,
        "layers": layers,
        "heads": heads,
        "scheme": scheme,
        "params_posenc": _count(mine),
    }
    skipped: dict[str, str] = {}
    xt, why = optional_import("x_transformers")
    if xt is None:
        skipped[f"x_transformers_{scheme}"] = why
    else:
        for suffix, flash in (("", False), ("_flash", True)):
            torch.manual_seed(0)
            try:
                decoder = xt.Decoder(  # type: ignore[attr-defined]
                    dim=d,
                    depth=layers,
                    heads=heads,
                    attn_dim_head=d // heads,
                    ff_no_bias=True,
                    attn_flash=flash,
                    **XT_SCHEMES[scheme](d // heads),
                )
            except AssertionError as err:  # x-transformers refuses some combinations (T5 bias + flash)
                skipped[f"x_transformers_{scheme}{suffix}"] = f"x-transformers: {err}"
                continue
            other = xt.TransformerWrapper(  # type: ignore[attr-defined]
                num_tokens=256,
                max_seq_len=s,
                tie_embedding=True,
                use_abs_pos_emb=False,
                attn_layers=decoder,
            ).train()
            params["params_x_transformers"] = _count(other)
            kwargs = ", ".join(XT_SCHEMES[scheme](d // heads))
            note = f"TransformerWrapper(Decoder({kwargs}, attn_flash={flash}))"
            step = _step(other, ids, targets, peer=True)
            other_init = "same work, different numbers: a separately initialised model of the same size"
            impls.append(
                Impl(
                    f"x_transformers_{scheme}{suffix}",
                    step,
                    "peer",
                    None,
                    note,
                    form="training",
                    agrees=other_init,
                )
            )
    reference = _reference_loss(first)
    return Case(
        name,
        f"one training step, {scheme}, batch {b} x L={s}",
        0,
        impls,
        params,
        skipped,
        baselines=False,
        reference=reference,
        atol=1e-5,
        rtol=1e-5,
    )


def cases(quick: bool) -> dict[str, Callable[[], Case]]:
    """The training-step cases (``quick``: a 1-layer d=16 model on 2 x 8 (long: 1 x 300) tokens)."""
    b, s, d, layers, heads = (2, 8, 16, 1, 2) if quick else (32, 128, 128, 4, 4)
    long_b, long_s = (1, 300) if quick else (4, 1024)
    out = {
        f"train_step_{sch}": (lambda sch=sch: _case(f"train_step_{sch}", sch, b, s, d, layers, heads))
        for sch in XT_SCHEMES
    }
    for sch in ("alibi", "t5"):
        name = f"train_step_long_{sch}"
        out[name] = lambda sch=sch, name=name: _case(name, sch, long_b, long_s, d, layers, heads)
    return out
