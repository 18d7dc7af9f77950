"""RoPE on queries and keys: posenc vs HF transformers, rotary-embedding-torch, x-transformers and
Meta's complex-number form, in one run.

Every implementation rotates ``q`` and ``k`` ``[b, h, s, d_h]`` by the same positions, starting from
tables prepared once outside the timing in the format its API takes (as a model prepares them once
per forward and reuses them in every layer):

* ``posenc_half`` / ``posenc_interleaved``: :func:`posenc.apply_rotary` with half-width
  ``cos``/``sin`` ``[s, r/2]`` in the input dtype; ``*_inplace``: the same with ``out=x``;
* ``hf_eager``: ``transformers``' ``apply_rotary_pos_emb`` (Llama; GPT-NeoX's for partial rotary)
  with full-width ``cos``/``sin`` ``[1, s, r]``; ``hf_compiled``: ``torch.compile`` of it;
* ``rotary_embedding_torch``: ``apply_rotary_emb(freqs, t)`` with ``freqs [s, r]`` (it takes the
  cos/sin of the angles inside);
* ``x_transformers``: ``apply_rotary_pos_emb(t, freqs)`` with ``freqs [1, s, r]`` (same);
* ``meta_complex``: Meta's Llama reference, ``view_as_complex(x) * freqs_cis``, written here.

HF rotates pairs ``(i, i + r/2)`` ("half" layout); the others pair ``(2i, 2i+1)`` ("interleaved").
Speed-ups are read against the posenc implementation of the same layout.

Bytes per call: ``q`` and ``k`` read and written, plus the half-width tables read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .harness import Case, Impl, tensor_bytes

__all__ = ["cases"]


def _optional(module: str) -> tuple[object | None, str]:
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
    q_ip, k_ip = q.clone(), k.clone()  # the in-place impls rotate these over and over
    if per_token:  # every row starts elsewhere (left padding, packing): positions [b, s]
        starts = torch.randint(0, 4096, (b, 1), generator=gen)
        positions = offset + starts + torch.arange(s)  # [b, 1] + [s] -> [b, s]
    else:
        positions = torch.arange(offset, offset + s)  # [s]
    inv_freq, _ = posenc.rope_frequencies(d, rotary_dim=r)  # [r/2]
    cos, sin = posenc.rope_cos_sin(positions, inv_freq, dtype=dtype)  # [s, r/2] or [b, s, r/2]
    angles = positions.float()[..., None] * inv_freq.float()  # [..., s, r/2], float32 as the peers keep it
    if per_token:
        cos, sin = cos[:, None], sin[:, None]  # [b, s, r/2] -> [b, 1, s, r/2]
    hf_cos = torch.cat((cos, cos), -1).reshape(-1, s, r)  # [1 | b, s, r], HF's full-width tables
    hf_sin = torch.cat((sin, sin), -1).reshape(-1, s, r)
    freqs = angles.repeat_interleave(2, dim=-1)  # [..., s, r]: (2i, 2i+1) share angle i
    freqs_4d = freqs[:, None] if per_token else freqs  # rotary-embedding-torch: [s, r] or [b, 1, s, r]
    freqs_3d = freqs if per_token else freqs[None]  # x-transformers: [1 | b, s, r]
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # complex64 [..., s, r/2]
    if per_token:
        freqs_cis = freqs_cis[:, None]

    def pair(fn: Callable[[torch.Tensor], object]) -> Callable[[], object]:
        return lambda: (fn(q), fn(k))

    impls = [
        Impl("posenc_half", pair(lambda t: posenc.apply_rotary(t, cos, sin)), "posenc", "half"),
        Impl(
            "posenc_half_inplace",
            lambda: (
                posenc.apply_rotary(q_ip, cos, sin, out=q_ip),
                posenc.apply_rotary(k_ip, cos, sin, out=k_ip),
            ),
            "posenc",
            "half",
            "out=x",
        ),
        Impl(
            "posenc_interleaved",
            pair(lambda t: posenc.apply_rotary(t, cos, sin, layout="interleaved")),
            "posenc",
            "interleaved",
        ),
        Impl(
            "posenc_interleaved_inplace",
            lambda: (
                posenc.apply_rotary(q_ip, cos, sin, layout="interleaved", out=q_ip),
                posenc.apply_rotary(k_ip, cos, sin, layout="interleaved", out=k_ip),
            ),
            "posenc",
            "interleaved",
            "out=x",
        ),
        Impl(
            "meta_complex",
            pair(lambda t: meta_complex_rotary(t, freqs_cis, r)),
            "peer",
            "interleaved",
            "Llama reference code, written in the benchmark",
        ),
    ]
    skipped: dict[str, str] = {}

    hf_module = "gpt_neox.modeling_gpt_neox" if r < d else "llama.modeling_llama"
    hf, why = _optional(f"transformers.models.{hf_module}")
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
    ret, why = _optional("rotary_embedding_torch.rotary_embedding_torch")
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
    xt, why = _optional("x_transformers.x_transformers")
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
    nbytes = 2 * tensor_bytes(q, k) + tensor_bytes(cos, sin)
    params = {
        "shape": list(shape),
        "dtype": str(dtype).replace("torch.", ""),
        "rotary_dim": r,
        "offset": offset,
        "positions": "[b, s]" if per_token else "[s]",
    }
    return Case(name, description, nbytes, impls, params, skipped)


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
