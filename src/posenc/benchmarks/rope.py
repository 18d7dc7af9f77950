"""RoPE on queries and keys: posenc vs HF transformers, rotary-embedding-torch, x-transformers and
Meta's complex-number form, in one run, compared only like for like.

Three forms of call (speed-ups are read only within a form and a pairing layout):

* **module** (the headline: what a model calls): ``RotaryEmbedding(d_h).rotate(q, k)`` with the
  default positions, tables built inside the call; HF's ``LlamaRotaryEmbedding(x, position_ids)``
  followed by ``apply_rotary_pos_emb``; rotary-embedding-torch's ``rotate_queries_or_keys`` on q
  and k (it caches its frequencies after the first call); x-transformers' ``RotaryEmbedding``
  (``forward(positions)`` then ``apply_rotary_pos_emb``, full rotary width).
* **out of place**, tables prepared once outside the timing in the format each API takes:
  :func:`posenc.apply_rotary` (``posenc_half``/``posenc_interleaved``), HF's
  ``apply_rotary_pos_emb`` eager and compiled, rotary-embedding-torch's ``apply_rotary_emb``,
  x-transformers' ``apply_rotary_pos_emb``, Meta's ``view_as_complex(x) * freqs_cis``.
* **in place**: :func:`posenc.apply_rotary` with ``out=x``. Its limit is an in-place pass of
  PyTorch itself over the same bytes (``x.mul_(1)``), not a copy (which reads a second buffer).

HF rotates pairs ``(i, i + r/2)`` ("half"); the others pair ``(2i, 2i+1)`` ("interleaved").

Every implementation is checked first against posenc's reference expression
(:mod:`posenc.rotary.reference` on the same float32 tables): float32 within 1e-6
(absolute and relative; the complex form rounds differently), bfloat16 within 2 bf16 ulps (HF
rounds each product to bfloat16, the complex form computes in float32 and rounds once).

Bytes per call: ``q`` and ``k`` read and written, plus the half-width tables read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .harness import Case, Impl, tensor_bytes

__all__ = ["cases"]

#: out-of-place peers that take angles (float32 products, as their libraries make them), not
#: posenc's cos/sin tables
_OWN_ANGLES = ("meta_complex", "rotary_embedding_torch", "x_transformers")


def optional_import(module: str) -> tuple[object | None, str]:
    try:
        return importlib.import_module(module), ""
    except Exception as err:  # ImportError, or a broken install of an optional peer
        return None, f"{module} not importable ({type(err).__name__}: {err})"


def meta_complex_rotary(x: torch.Tensor, freqs_cis: torch.Tensor, r: int) -> torch.Tensor:
    """Meta's Llama ``apply_rotary_emb`` for one tensor: pairs ``(2i, 2i+1)`` as complex numbers.

    Args:
        x: ``[b, h, s, d_h]``.
        freqs_cis: complex64 ``[s, r/2]`` or ``[b, 1, s, r/2]``, ``exp(i * angle)``.
        r: rotary width; dims ``r..d_h`` pass through (Meta's code has no partial rotary: the
            slice and cat are added here for that case).
    """
    xr = x[..., :r].float().reshape(*x.shape[:-1], r // 2, 2)  # [b, h, s, r] -> [b, h, s, r/2, 2]
    y = torch.view_as_real(torch.view_as_complex(xr) * freqs_cis).flatten(-2)  # -> [b, h, s, r]
    y = y.type_as(x)
    return y if r == x.shape[-1] else torch.cat((y, x[..., r:]), dim=-1)


def _reference(q, k, cos, sin, layout: str, r: int):
    """posenc's reference expression (:mod:`posenc.rotary.reference`) on q and k."""
    from ..rotary.reference import ROTARY_LAYOUTS

    def one(x: torch.Tensor) -> torch.Tensor:
        y = ROTARY_LAYOUTS[layout](x, cos.to(x.dtype), sin.to(x.dtype), r)  # [..., s, r]
        return y if r == x.shape[-1] else torch.cat((y, x[..., r:]), dim=-1)  # ++ pass-through dims

    return one(q), one(k)


def _tolerance(dtype: torch.dtype, top: int, scale: float) -> tuple[float, float]:
    """``(atol, rtol)``: float32 1e-6; bfloat16 two bf16 ulps of the largest |x| (``scale``: a
    product rounded to bfloat16 before a near-cancelling subtraction is off by that much, absolute);
    with ``top`` (the largest position, module form only: each library builds its own float32
    angles, whose rounding grows with the position) ``+ 2 * top * 2^-24 * scale``."""
    base = 1e-6 if dtype == torch.float32 else 2.0**-7
    atol = base * (1.0 if dtype == torch.float32 else 2 * scale)
    return atol + 2 * top * 2.0**-24 * scale, base


def _inplace_impls(q, k, cos, sin, layout: str) -> list[Impl]:
    """posenc in place (``out=x``) on copies rotated over and over; checked on fresh copies."""
    import posenc

    q_ip, k_ip = q.clone(), k.clone()

    def run(a, b):
        return (
            posenc.apply_rotary(a, cos, sin, layout=layout, out=a),
            posenc.apply_rotary(b, cos, sin, layout=layout, out=b),
        )

    return [
        Impl(
            f"posenc_{layout}_inplace",
            lambda: run(q_ip, k_ip),
            "posenc",
            layout,
            "apply_rotary(x, cos, sin, out=x)",
            form="in place",
            output=lambda: run(q.clone(), k.clone()),
        )
    ]


#: the layout tag of the implementations that round after every operation in bf16
#: (``compute_dtype="input"``, Hugging Face's bits; checked against the "half" reference)
_INPUT_MATH = "half, bf16 per operation"
#: the layout tag of the module with precomputed rows (an option: kept out of the speed-ups against
#: peers, which compare the module as built)
_KEPT_ROWS = "half, precomputed rows"


def _input_math_impls(q, k, positions, inv_freq, r: int) -> list[Impl]:
    """bf16 only: posenc with ``compute_dtype="input"`` (bf16 tables, every product and sum rounded
    to bf16, HF's bits; the default rounds once, within the case's tolerance of them): in place, and
    the module timed next to the default module in every round. Their own layout tag keeps them out
    of the speed-ups against peers, which compare the default."""
    import posenc

    if q.dtype != torch.bfloat16:
        return []
    cos, sin = posenc.rope_cos_sin(positions, inv_freq)  # float32 [s, r/2] or [b, s, r/2]
    if positions.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]  # [b, s, r/2] -> [b, 1, s, r/2]
    # the tables rounded to bf16 outside the timing, as the default's float32 tables are made outside it
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    q_ip, k_ip = q.clone(), k.clone()

    def run(a, b):
        kw = {"out": a, "compute_dtype": "input"}
        return posenc.apply_rotary(a, cos, sin, **kw), posenc.apply_rotary(b, cos, sin, **{**kw, "out": b})

    rope = posenc.RotaryEmbedding(q.shape[-1], rotary_dim=r, compute_dtype="input")
    pos = None if positions.dim() == 1 and int(positions[0]) == 0 else positions
    return [
        Impl(
            "posenc_half_inplace_input",
            lambda: run(q_ip, k_ip),
            "posenc",
            _INPUT_MATH,
            'apply_rotary(x, cos16, sin16, out=x, compute_dtype="input")',
            form="in place",
            output=lambda: run(q.clone(), k.clone()),
        ),
        Impl(
            "posenc_module_input",
            lambda: rope.rotate(q, k, pos, pos),
            "posenc",
            _INPUT_MATH,
            'RotaryEmbedding(compute_dtype="input").rotate(q, k)',
            form="module",
            versus="posenc_module",
        ),
    ]


def _hf_module(q, k, positions, r: int, skipped: dict[str, str]) -> list[Impl]:
    """HF's Llama rotary module and ``apply_rotary_pos_emb``, or nothing (with the reason in
    ``skipped``) where transformers is missing or the rotary is partial."""
    d = q.shape[-1]
    hf, why = optional_import("transformers.models.llama.modeling_llama")
    if hf is None or r < d:
        skipped["hf_module"] = (
            why or "partial rotary: HF's module is the model's own (GPT-NeoX), not set up here"
        )
        return []
    cfg = hf.LlamaConfig(  # type: ignore[attr-defined]
        hidden_size=q.shape[1] * d,
        num_attention_heads=q.shape[1],
        head_dim=d,
        partial_rotary_factor=r / d,
        max_position_embeddings=int(positions.max()) + 1,
    )
    hf_rope = hf.LlamaRotaryEmbedding(cfg)  # type: ignore[attr-defined]
    ids = positions[None] if positions.dim() == 1 else positions  # [1 | b, s]

    def hf_module():
        cos, sin = hf_rope(q, ids)  # [1 | b, s, r]
        return hf.apply_rotary_pos_emb(q, k, cos, sin)  # type: ignore[attr-defined]

    doc = "LlamaRotaryEmbedding + apply_rotary_pos_emb"
    return [Impl("hf_module", hf_module, "peer", "half", doc, form="module")]


def _module_impls(q, k, positions, r: int, skipped: dict[str, str]) -> list[Impl]:
    """What a model calls: each library's module, its tables built inside the call."""
    import posenc

    d = q.shape[-1]
    shared = positions.dim() == 1
    rope = posenc.RotaryEmbedding(d, rotary_dim=r)
    pos = None if shared and int(positions[0]) == 0 else positions
    doc = "RotaryEmbedding.rotate(q, k)"
    impls = [
        Impl(
            "posenc_module",
            lambda: rope.rotate(q, k, pos, pos),
            "posenc",
            "half",
            doc,
            form="module",
            versus="posenc_half",
        )  # timed next to the function it wraps, on tables made beforehand
    ]
    # rows made at build time for every position of the case (a slice, or gathered for explicit ones)
    kept = posenc.RotaryEmbedding(d, rotary_dim=r, precompute=int(positions.max()) + 1)
    doc_kept = "RotaryEmbedding(precompute=n).rotate(q, k)"
    impls.append(
        Impl(
            "posenc_module_precompute",
            lambda: kept.rotate(q, k, pos, pos),
            "posenc",
            _KEPT_ROWS,
            doc_kept,
            form="module",
            versus="posenc_half",
        )
    )
    impls += _hf_module(q, k, positions, r, skipped)
    ret, why = optional_import("rotary_embedding_torch")
    if ret is None or not shared:
        skipped["rotary_embedding_torch_module"] = (
            why or "its module takes an offset, not per-token positions"
        )
    else:
        mod = ret.RotaryEmbedding(dim=r)  # type: ignore[attr-defined]
        off = int(positions[0])
        impls.append(
            Impl(
                "rotary_embedding_torch_module",
                lambda: (
                    mod.rotate_queries_or_keys(q, offset=off),
                    mod.rotate_queries_or_keys(k, offset=off),
                ),
                "peer",
                "interleaved",
                "rotate_queries_or_keys (caches its freqs)",
                form="module",
                agrees=None
                if q.dtype == torch.float32
                else "same work, different numbers: it builds the "
                "positions in the input dtype, and bfloat16 rounds positions past 256",
            )
        )
    xt, why = optional_import("x_transformers.x_transformers")
    if xt is None:
        skipped["x_transformers_module"] = why
    else:
        xrot = xt.RotaryEmbedding(r)  # type: ignore[attr-defined]

        def xt_module():
            freqs, _ = xrot(positions)  # [1 | b, s, r]
            return xt.apply_rotary_pos_emb(q, freqs), xt.apply_rotary_pos_emb(k, freqs)  # type: ignore[attr-defined]

        doc = "RotaryEmbedding(dim) + apply_rotary_pos_emb, full rotary"
        impls.append(Impl("x_transformers_module", xt_module, "peer", "interleaved", doc, form="module"))
    return impls


def _case(
    name: str,
    description: str,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    *,
    rotary_dim: int | None = None,
    offset: int = 0,
    per_token: bool = False,
    compile_peers: bool = True,
) -> Case:
    import posenc

    b, _, s, d = shape
    r = rotary_dim or d
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=gen).to(dtype)
    k = torch.randn(shape, generator=gen).to(dtype)
    if per_token:  # every row starts elsewhere (left padding, packing): positions [b, s]
        starts = torch.randint(0, 4096, (b, 1), generator=gen)
        positions = offset + starts + torch.arange(s)  # [b, 1] + [s] -> [b, s]
    else:
        positions = torch.arange(offset, offset + s)  # [s]
    inv_freq, _ = posenc.rope_frequencies(d, rotary_dim=r)  # [r/2]
    # float32 [s, r/2] or [b, s, r/2]: posenc's tables in every dtype (a bf16 x is rotated in float32)
    cos, sin = posenc.rope_cos_sin(positions, inv_freq)
    angles = positions.float()[..., None] * inv_freq.float()  # [..., s, r/2], float32 as the peers keep it
    if per_token:
        cos, sin = cos[:, None], sin[:, None]  # [b, s, r/2] -> [b, 1, s, r/2]
    # [1 | b, s, r]: HF's full-width tables, in x's dtype as HF's rotary module returns them
    hf_cos = torch.cat((cos, cos), -1).reshape(-1, s, r).to(dtype)
    hf_sin = torch.cat((sin, sin), -1).reshape(-1, s, r).to(dtype)
    freqs = angles.repeat_interleave(2, dim=-1)  # [..., s, r]: (2i, 2i+1) share angle i
    freqs_4d = freqs[:, None] if per_token else freqs  # rotary-embedding-torch: [s, r] or [b, 1, s, r]
    freqs_3d = freqs if per_token else freqs[None]  # x-transformers: [1 | b, s, r]
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # complex64 [..., s, r/2]
    if per_token:
        freqs_cis = freqs_cis[:, None]

    def pair(fn: Callable[[torch.Tensor], object]) -> Callable[[], object]:
        return lambda: (fn(q), fn(k))

    impls = [
        Impl(
            "posenc_half",
            pair(lambda t: posenc.apply_rotary(t, cos, sin)),
            "posenc",
            "half",
            "apply_rotary(x, cos, sin)",
        ),
        Impl(
            "posenc_interleaved",
            pair(lambda t: posenc.apply_rotary(t, cos, sin, layout="interleaved")),
            "posenc",
            "interleaved",
        ),
        Impl(
            "meta_complex",
            pair(lambda t: meta_complex_rotary(t, freqs_cis, r)),
            "peer",
            "interleaved",
            "Llama reference code, written in the benchmark",
        ),
    ]
    impls += _inplace_impls(q, k, cos, sin, "half") + _inplace_impls(q, k, cos, sin, "interleaved")
    skipped: dict[str, str] = {}
    impls += _peer_impls(q, k, (hf_cos, hf_sin, freqs_4d, freqs_3d), r, d, compile_peers, skipped)
    impls += _module_impls(q, k, positions, r, skipped) + _input_math_impls(q, k, positions, inv_freq, r)
    scale = float(torch.maximum(q.abs().max(), k.abs().max()))
    atol, rtol = _tolerance(dtype, 0, scale)  # one set of float32 tables for every function
    for (
        impl
    ) in impls:  # own float32 angles (modules, peers' frequency tables): rounding grows with the position
        if impl.form == "module" or impl.name in _OWN_ANGLES:
            impl.tolerance = _tolerance(dtype, int(positions.max()), scale)
    nbytes = 2 * tensor_bytes(q, k) + tensor_bytes(cos, sin)
    params = {
        "shape": list(shape),
        "dtype": str(dtype).replace("torch.", ""),
        "rotary_dim": r,
        "offset": offset,
        "positions": "[b, s]" if per_token else "[s]",
    }
    refs = {layout: _reference(q, k, cos, sin, layout, r) for layout in ("half", "interleaved")}
    refs[_INPUT_MATH] = refs[_KEPT_ROWS] = refs["half"]
    return Case(
        name,
        description,
        nbytes,
        impls,
        params,
        skipped,
        reference=lambda: refs,
        atol=atol,
        rtol=rtol,
        dtype=dtype,
    )


def _peer_impls(q, k, tables, r: int, d: int, compile_peers: bool, skipped: dict[str, str]) -> list[Impl]:
    """The peers' out-of-place functions on tables prepared in their formats."""
    hf_cos, hf_sin, freqs_4d, freqs_3d = tables
    impls: list[Impl] = []

    def pair(fn: Callable[[torch.Tensor], object]) -> Callable[[], object]:
        return lambda: (fn(q), fn(k))

    hf_module = "gpt_neox.modeling_gpt_neox" if r < d else "llama.modeling_llama"
    hf, why = optional_import(f"transformers.models.{hf_module}")
    if hf is None:
        skipped["hf_eager"] = why
    else:
        hf_apply = hf.apply_rotary_pos_emb  # type: ignore[attr-defined]
        impls.append(
            Impl(
                "hf_eager",
                lambda: hf_apply(q, k, hf_cos, hf_sin),
                "peer",
                "half",
                f"transformers {hf_module}.apply_rotary_pos_emb",
            )
        )
        if compile_peers:
            hf_compiled = torch.compile(hf_apply, dynamic=False)
            impls.append(
                Impl(
                    "hf_compiled",
                    lambda: hf_compiled(q, k, hf_cos, hf_sin),
                    "peer",
                    "half",
                    "torch.compile of HF's function (compile time not counted)",
                )
            )
        else:
            skipped["hf_compiled"] = "--quick: no torch.compile"
    return impls + _interleaved_peers(pair, freqs_4d, freqs_3d, skipped)


def _interleaved_peers(pair, freqs_4d, freqs_3d, skipped: dict[str, str]) -> list[Impl]:
    """rotary-embedding-torch's and x-transformers' functions on their frequency tables."""
    impls: list[Impl] = []
    ret, why = optional_import("rotary_embedding_torch.rotary_embedding_torch")
    if ret is None:
        skipped["rotary_embedding_torch"] = why
    else:
        impls.append(
            Impl(
                "rotary_embedding_torch",
                pair(lambda t: ret.apply_rotary_emb(freqs_4d, t)),  # type: ignore[attr-defined]
                "peer",
                "interleaved",
                "apply_rotary_emb(freqs, t)",
            )
        )
    xt, why = optional_import("x_transformers.x_transformers")
    if xt is None:
        skipped["x_transformers"] = why
    else:
        impls.append(
            Impl(
                "x_transformers",
                pair(lambda t: xt.apply_rotary_pos_emb(t, freqs_3d)),  # type: ignore[attr-defined]
                "peer",
                "interleaved",
                "apply_rotary_pos_emb(t, freqs)",
            )
        )
    return impls


def cases(quick: bool) -> dict[str, Callable[[], Case]]:
    """The RoPE cases (``quick``: tiny shapes, no torch.compile)."""
    big = (1, 2, 16, 32) if quick else (4, 32, 2048, 128)
    long = (1, 2, 64, 32) if quick else (1, 32, 16384, 128)
    decode = (2, 2, 1, 32) if quick else (8, 32, 1, 128)
    cp = not quick
    return {
        "rope_prefill_fp32": lambda: _case(
            "rope_prefill_fp32", "q,k prefill, float32", big, torch.float32, compile_peers=cp
        ),
        "rope_prefill_bf16": lambda: _case(
            "rope_prefill_bf16", "q,k prefill, bfloat16", big, torch.bfloat16, compile_peers=cp
        ),
        "rope_decode": lambda: _case(
            "rope_decode",
            "one decode step at cache offset 32767, float32",
            decode,
            torch.float32,
            offset=32767,
            compile_peers=cp,
        ),
        "rope_decode_bf16": lambda: _case(
            "rope_decode_bf16",
            "one decode step at offset 32767, bfloat16",
            decode,
            torch.bfloat16,
            offset=32767,
            compile_peers=cp,
        ),
        "rope_long_prefill": lambda: _case(
            "rope_long_prefill", "long prefill, bfloat16", long, torch.bfloat16, compile_peers=cp
        ),
        "rope_partial": lambda: _case(
            "rope_partial",
            "partial rotary r = d_h/4 (GPT-NeoX), float32",
            big,
            torch.float32,
            rotary_dim=big[-1] // 4,
            compile_peers=cp,
        ),
        "rope_per_token": lambda: _case(
            "rope_per_token",
            "per-token positions [b, s] (left padding), fp32",
            big,
            torch.float32,
            per_token=True,
            compile_peers=cp,
        ),
    }
