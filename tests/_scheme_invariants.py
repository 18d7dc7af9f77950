"""The model invariants a scheme's own tests check with its parameters moved off their initial values
(a zero-initialised table would pass them trivially): a KV cache equals the full forward, packed
documents equal separate runs, a left-padded batch equals each row alone, a float64 model computes
in float64, and the model runs under ``torch.compile(fullgraph=True)`` with the eager numbers.

Legend: ``b`` batch, ``s`` sequence length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posenc.model import ModelConfig, TransformerLM

V = 29


def tiny_lm(
    position: str, perturb: Callable[[torch.nn.Module], None], dtype=torch.float32, **kw
) -> TransformerLM:
    """An eval-mode 2-layer LM (d=32, 4 heads over 2 kv heads) whose scheme(s) ``perturb`` changed."""
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, position=position, max_len=16
    )
    cfg.update(kw)
    model = TransformerLM(ModelConfig(**cfg), dtype=dtype).eval()
    with torch.no_grad():
        for scheme in model.decoder.schemes:
            perturb(scheme)
    return model


def ids_(b: int, s: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def check_cache(model: TransformerLM) -> None:
    """Prefill, single steps and a chunk through a KV cache equal the full forward of each prefix."""
    ids, cache = ids_(2, 9, 1), model.new_cache()
    for start, stop in [(0, 4), (4, 5), (5, 6), (6, 9)]:
        got = model(ids[:, start:stop], cache=cache).logits
        torch.testing.assert_close(got, model(ids[:, :stop]).logits[:, start:])


@torch.no_grad()
def check_packing(model: TransformerLM) -> None:
    docs = [ids_(1, 5, 2), ids_(1, 3, 3), ids_(1, 6, 4)]
    got = model(torch.cat(docs, dim=1), cu_seqlens=torch.tensor([0, 5, 8, 14])).logits
    torch.testing.assert_close(got, torch.cat([model(d).logits for d in docs], dim=1))


@torch.no_grad()
def check_left_padding(model: TransformerLM) -> None:
    rows = [ids_(1, 6, 5)[0], ids_(1, 3, 6)[0]]
    ids, mask = torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, 6 - len(r) :], mask[i, 6 - len(r) :] = r, 1
    got = model(ids, attention_mask=mask).logits
    for i, r in enumerate(rows):
        torch.testing.assert_close(got[i, 6 - len(r) :], model(r[None]).logits[0])
    out = model.generate(ids, 3, attention_mask=mask, temperature=0)
    for i, r in enumerate(rows):
        assert torch.equal(out[i, 6 - len(r) :], model.generate(r[None], 3, temperature=0)[0])


@torch.no_grad()
def check_compiled(model: TransformerLM) -> None:
    """The whole model traces into one graph (``fullgraph=True``; the ``aot_eager`` backend, so the
    test pays for tracing, not for code generation) with the eager logits, and the scheme's own
    hook compiles with the default backend to the eager numbers."""
    ids = ids_(2, 8, 7)
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="aot_eager")
    torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
    scheme = model.decoder.schemes[0]
    if "score_bias" not in scheme.hooks:
        return
    pos = torch.arange(8)
    q = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(9))
    kw = {"k": q[:, ::2]} if scheme.score_bias_uses_keys else {}
    hook = torch.compile(scheme.score_bias, fullgraph=True, dynamic=False)
    torch.testing.assert_close(hook(pos, pos, q, **kw), scheme.score_bias(pos, pos, q, **kw))


def check_all(position: str, perturb: Callable[[torch.nn.Module], None], **kw) -> None:
    """Every invariant above, and a float64 model whose logits are float64 and agree with float32."""
    model = tiny_lm(position, perturb, **kw)
    check_cache(model)
    check_packing(model)
    check_left_padding(model)
    wide = tiny_lm(position, perturb, dtype=torch.float64, **kw)
    ids = ids_(2, 7, 8)
    with torch.no_grad():
        out = wide(ids).logits
        assert out.dtype == torch.float64
        torch.testing.assert_close(out.float(), model(ids).logits, rtol=1e-4, atol=1e-4)
    check_cache(wide)
