"""``posenc plot embeddings --checkpoint PATH``: a trained model's token space in 2D.

It reads a lab checkpoint or a model file (:func:`posenc.lab.checkpoint.load_trained_model`) and
projects the token embedding with :mod:`posenc.text.projection`, so it sits above both.
"""

from __future__ import annotations

import argparse

__all__ = ["byte_label", "plot_embeddings_run"]


def byte_label(i: int) -> str:
    """A readable label for byte ``i``: the character, ``␣`` for a space, an escape otherwise."""
    ch = chr(i)
    if ch == " ":
        return "␣"
    return ch if ch.isprintable() and i < 128 else repr(bytes([i]))[2:-1]  # e.g. \\n, \\xe2


def plot_embeddings_run(args: argparse.Namespace) -> int:
    """``posenc plot embeddings --checkpoint PATH``: a trained model's token space in 2D.

    Labels come from ``--tokenizer`` or, for a 256-token (byte-level) model, from the bytes; token
    frequencies (which tokens to show and label) from the stdlib corpus for byte-level models.
    """
    import torch

    from ..embedding import TokenEmbedding
    from ..lab.checkpoint import load_trained_model
    from ..text.commands import resolve_tokenizer
    from ..text.projection import plot_embedding_space

    if not args.checkpoint:
        raise ValueError("posenc plot embeddings needs --checkpoint PATH (a lab checkpoint or model file)")
    model = load_trained_model(args.checkpoint)
    tokens = [m for m in model.modules() if isinstance(m, TokenEmbedding)]
    if not tokens:
        raise ValueError(f"{args.checkpoint!r} holds no posenc TokenEmbedding to project")
    weight = tokens[-1].weight.detach().float()  # [V, d] (the decoder's, for encoder-decoders)
    V = weight.shape[0]
    counts = None
    if args.tokenizer:
        tok, _ = resolve_tokenizer(args.tokenizer)
        if tok.vocab_size != V:
            raise ValueError(
                f"--tokenizer has {tok.vocab_size} tokens but the model has {V}; use the model's tokenizer"
            )
        labels = [tok.id_to_token(i) or f"<{i}>" for i in range(V)]
    elif V == 256:
        labels = [byte_label(i) for i in range(V)]
        from ..text.corpus import load_corpus

        counts = torch.bincount(load_corpus("stdlib", max_chars=2_000_000).train_bytes.long(), minlength=256)
    else:
        raise ValueError(f"the model has {V} tokens: pass --tokenizer PATH (its tokenizer.json) for labels")
    out = plot_embedding_space(
        weight, labels, args.output, method=args.method, top_k=min(args.top_k, V), counts=counts
    )
    print(f"wrote {out} ({args.method}, {min(args.top_k, V)} of {V} tokens)")
    return 0
