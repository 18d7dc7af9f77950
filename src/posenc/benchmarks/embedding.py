"""The input layer: token gather, ``* sqrt(d)``, ``+ PE``, LayerNorm, dropout.

posenc's :class:`posenc.InputEmbedding` against the eager composition a user would write::

    drop(norm(emb(ids) * sqrt(d) + pe[:s]))      # nn.Embedding, nn.LayerNorm, nn.Dropout

with ``pe`` a precomputed sinusoidal buffer. posenc runs twice: as built by default (its table
computed from the positions in each call: more work than the composition) and with
``scheme_options={"precompute": s}`` (rows kept like the composition's buffer: like for like).
All hold the same weights.

* ``embedding_forward``: train mode (dropout on), grad enabled, forward only;
* ``embedding_forward_backward``: train mode, forward and backward of ``(out * g).sum()``;
* ``embedding_eval``: eval mode under ``torch.no_grad()`` (dropout off).

Bytes: forward reads the ids, the gathered rows ``[b, s, d]`` and the table ``[s, d]`` and writes
``[b, s, d]``; backward adds reading the incoming gradient and the saved LayerNorm input and
writing the rows' gradients (3 more ``[b, s, d]``).

Checks: both implementations are compared in eval mode (the dropout masks of train mode come from
different random streams), within 1e-5: same weights, same table, same LayerNorm.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .harness import Case, Impl

__all__ = ["cases"]


class EagerInput(nn.Module):
    """The eager composition: ``nn.Embedding``, scale, ``+ pe[:s]`` (precomputed), LayerNorm, Dropout."""

    def __init__(self, vocab_size: int, d_model: int, max_len: int, dropout: float) -> None:
        import posenc

        super().__init__()
        self.emb = nn.Embedding(vocab_size, d_model)
        self.scale = math.sqrt(d_model)
        self.register_buffer("pe", posenc.sinusoidal_table(max_len, d_model), persistent=False)
        self.norm = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.emb(ids) * self.scale + self.pe[: ids.shape[1]]))


def _case(name: str, description: str, b: int, s: int, d: int, vocab: int, mode: str) -> Case:
    import posenc

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (b, s), generator=gen)
    mine = posenc.InputEmbedding(vocab, d, "sinusoidal", layer_norm=True, dropout=0.1)
    kept = posenc.InputEmbedding(
        vocab, d, "sinusoidal", layer_norm=True, dropout=0.1, scheme_options={"precompute": s}
    )
    eager = EagerInput(vocab, d, s, 0.1)
    with torch.no_grad():
        eager.emb.weight.copy_(mine.token.weight)
        kept.token.weight.copy_(mine.token.weight)
    grad = torch.randn(b, s, d, generator=gen)
    if mode == "eval":
        mine.eval(), kept.eval(), eager.eval()

    def step(model: nn.Module) -> Callable[[], object]:
        if mode == "eval":

            def run_eval() -> object:
                with torch.no_grad():
                    return model(ids)

            return run_eval
        if mode == "forward":
            return lambda: model(ids)

        def run_backward() -> object:
            out = model(ids)
            out.backward(grad)
            model.zero_grad(set_to_none=True)
            return out

        return run_backward

    def evaluated(model: nn.Module) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            was = model.training
            model.eval()
            try:
                with torch.no_grad():
                    return model(ids)
            finally:
                model.train(was)

        return run

    impls = [
        Impl(
            "posenc_input_embedding",
            step(mine),
            "posenc",
            None,
            "posenc.InputEmbedding('sinusoidal')",
            form="module",
            output=evaluated(mine),
        ),
        Impl(
            "posenc_input_embedding_precomputed",
            step(kept),
            "posenc",
            None,
            "posenc.InputEmbedding('sinusoidal', scheme_options={'precompute': s})",
            form="module",
            output=evaluated(kept),
        ),
        Impl(
            "eager_composition",
            step(eager),
            "peer",
            None,
            "nn.Embedding * sqrt(d) + pe[:s], nn.LayerNorm, nn.Dropout",
            form="module",
            output=evaluated(eager),
        ),
    ]
    bsd = b * s * d * 4
    nbytes = ids.numel() * 8 + 2 * bsd + s * d * 4 + (3 * bsd if mode == "backward" else 0)
    params = {"b": b, "s": s, "d": d, "vocab": vocab, "dropout": 0.1, "mode": mode}
    return Case(name, description, nbytes, impls, params, reference=evaluated(eager), atol=1e-5, rtol=1e-5)


def cases(quick: bool) -> dict[str, Callable[[], Case]]:
    """The input-embedding cases (``quick``: tiny shapes)."""
    b, s, d, v = (2, 16, 32, 100) if quick else (8, 2048, 768, 32000)
    return {
        "embedding_forward": lambda: _case(
            "embedding_forward", "train-mode forward with dropout 0.1", b, s, d, v, "forward"
        ),
        "embedding_forward_backward": lambda: _case(
            "embedding_forward_backward", "train-mode forward + backward", b, s, d, v, "backward"
        ),
        "embedding_eval": lambda: _case("embedding_eval", "eval-mode forward, no grad", b, s, d, v, "eval"),
    }
