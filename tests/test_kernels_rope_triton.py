"""The Triton RoPE kernel == posenc's PyTorch reference path, bit for bit.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set
by a module-scoped fixture before the kernel module is first imported, and removed after this
module's tests); with one, on CUDA. The reference is
:func:`posenc.apply_rotary` with fast paths off (``POSENC_C_KERNELS=0``): the PyTorch expression.
"""

import pytest
import torch

import posenc
from posenc.kernels import rope_triton, set_enabled

pytest.importorskip("triton", reason="Triton is not installed (pip install 'posenc[gpu]')")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    """Triton's interpreter on CPU for this module only. The variable is read when the @triton.jit
    functions are defined (posenc imports them on first use, here); posenc checks it again at every
    call, so CPU tensors take the kernel only inside this module."""
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def reference_path(monkeypatch):
    monkeypatch.setenv("POSENC_C_KERNELS", "0")  # apply_rotary on CPU = the PyTorch expression


def reference(x, cos, sin, layout):
    # the kernel computes in x's own dtype: the reference rounded after every operation
    return posenc.apply_rotary(x.cpu(), cos.cpu(), sin.cpu(), layout=layout, compute_dtype="input").to(
        x.device
    )


def tables(angles: torch.Tensor, dtype: torch.dtype):
    return angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)


def test_self_check_passes_here():
    assert rope_triton.available(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("d", "r"), [(16, 16), (20, 8), (6, 6)])
@pytest.mark.parametrize("mode", ["new", "inplace"])
def test_equals_the_reference(dtype, layout, d, r, mode):
    gen = torch.Generator().manual_seed(d + r)
    x = torch.randn(2, 3, 19, d, generator=gen).to(DEVICE, dtype)
    cos, sin = tables(torch.rand(19, r // 2, generator=gen, dtype=torch.float64) * 300, dtype)
    want = reference(x, cos, sin, layout)
    got = rope_triton.rotate(x.clone(), cos, sin, layout) if mode == "new" else None
    if mode == "inplace":
        got = x.clone()
        assert rope_triton.rotate(got, cos, sin, layout, out=got) is got
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("d", "r"), [(16, 16), (20, 8)])
def test_float32_tables_round_once_like_the_default(dtype, layout, d, r):
    """Float32 tables with a bf16/fp16 x: float32 arithmetic, each output rounded once, bit for bit
    apply_rotary's default on the CPU reference path, so a CUDA model keeps the kernel by default."""
    gen = torch.Generator().manual_seed(d * r)
    x = torch.randn(2, 3, 19, d, generator=gen).to(DEVICE, dtype)
    cos, sin = tables(torch.rand(19, r // 2, generator=gen, dtype=torch.float64) * 300, torch.float32)
    want = posenc.apply_rotary(x.cpu(), cos.cpu(), sin.cpu(), layout=layout).to(x.device)  # default
    assert torch.equal(rope_triton.rotate(x, cos, sin, layout), want)
    per_op = reference(x, cos, sin, layout)  # the tables cast to x's dtype, every operation rounded
    assert not torch.equal(want, per_op)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_are_carried_as_the_reference_carries_them(dtype):
    """A NaN must stay NaN through the bfloat16 rounding (NVIDIA's canonical NaN 0x7FFFFFFF would
    otherwise round to -0.0); infinities give what the reference gives."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 4, 8, generator=gen)
    x[0, 0, 0, 0], x[0, 1, 2, 5], x[0, 0, 3, 1] = float("nan"), float("inf"), -float("inf")
    x = x.to(DEVICE, dtype)
    cos, sin = tables(torch.rand(4, 4, generator=gen, dtype=torch.float64) * 10, dtype)
    for layout in ("half", "interleaved"):
        got, want = rope_triton.rotate(x, cos, sin, layout), reference(x, cos, sin, layout)
        assert got.isnan().any() and rope_triton.same_values(got, want)


def test_per_token_tables_strided_x_and_varlen():
    gen = torch.Generator().manual_seed(0)
    b, s, h, d = 2, 9, 4, 8
    x_bshd = torch.randn(b, s, h, d, generator=gen).to(DEVICE)
    x = x_bshd.transpose(1, 2)  # [b, h, s, d] view of a [b, s, h, d] projection
    cos, sin = tables(torch.rand(b, 1, s, d // 2, generator=gen, dtype=torch.float64) * 50, torch.float32)
    assert torch.equal(rope_triton.rotate(x, cos, sin, "half"), reference(x, cos, sin, "half"))
    # packed documents: x [total, h, d] seen as [1, h, total, d], one table row per token
    total = 11
    packed = torch.randn(total, h, d, generator=gen).to(DEVICE)
    pc, ps = tables(torch.rand(total, d // 2, generator=gen, dtype=torch.float64) * 50, torch.float32)
    view = packed.transpose(0, 1)[None]  # [1, h, total, d]
    got = rope_triton.rotate(view, pc, ps, "interleaved")
    assert torch.equal(got, reference(view, pc, ps, "interleaved"))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_is_the_reference_gradient(layout):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 7, 12, generator=gen).to(DEVICE).requires_grad_()
    cos, sin = tables(torch.rand(7, 4, generator=gen, dtype=torch.float64) * 20, torch.float32)
    g = torch.randn(1, 2, 7, 12, generator=gen).to(DEVICE)
    (grad,) = torch.autograd.grad(rope_triton.rotate(x, cos, sin, layout), x, g)
    x_ref = x.detach().cpu().requires_grad_()
    y_ref = posenc.apply_rotary(x_ref, cos.cpu(), sin.cpu(), layout=layout)
    (want,) = torch.autograd.grad(y_ref, x_ref, g.cpu())
    assert torch.equal(grad.cpu(), want)


@pytest.mark.parametrize("inplace", [False, True])
def test_pair_rotates_q_and_k_in_one_launch(inplace, monkeypatch):
    """GQA shapes and a cache offset: q [1, 4, 3, 8] at positions 10..12, k [1, 2, 13, 8] at 0..12."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 3, 8, generator=gen).to(DEVICE, torch.bfloat16)
    k = torch.randn(1, 2, 13, 8, generator=gen).to(DEVICE, torch.bfloat16)
    inv_freq = torch.rand(4, generator=gen, dtype=torch.float64)
    angles = torch.arange(13, dtype=torch.float64)[:, None] * inv_freq  # [13, 4]
    cos, sin = tables(angles, torch.bfloat16)
    want_q, want_k = reference(q, cos[10:], sin[10:], "half"), reference(k, cos, sin, "half")
    assert rope_triton.available(DEVICE)  # the first-use self-check launches too: run it before counting
    launches = []
    original = rope_triton._launch
    monkeypatch.setattr(rope_triton, "_launch", lambda *a: launches.append(1) or original(*a))
    with torch.no_grad():
        got_q, got_k = rope_triton.rotate_pair(q, k, cos[10:], sin[10:], cos, sin, "half", inplace=inplace)
    assert len(launches) == 1
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert (got_q is q) == inplace and (got_k is k) == inplace


def test_pair_errors():
    q = torch.randn(1, 2, 3, 8, device=DEVICE, requires_grad=True)
    cos, sin = tables(torch.rand(3, 4, dtype=torch.float64), torch.float32)
    with pytest.raises(ValueError, match="rotate_pair is for inference"):
        rope_triton.rotate_pair(q, q, cos, sin, cos, sin)
    k = torch.randn(1, 2, 3, 6, device=DEVICE)
    c6, s6 = tables(torch.rand(3, 3, dtype=torch.float64), torch.float32)
    with torch.no_grad(), pytest.raises(ValueError, match="must share d_h, r and dtype"):
        rope_triton.rotate_pair(q, k, cos, sin, c6, s6)
    with torch.no_grad(), pytest.raises(ValueError, match="rotate_pair needs CUDA"):
        rope_triton.rotate_pair(q.double(), q.double(), cos, sin, cos, sin)


def test_not_used_for_what_it_cannot_take(monkeypatch):
    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    x = torch.randn(2, 3, 4, 5, 8, device=DEVICE)  # 5 dims
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64), torch.float32)
    assert not rope_triton.usable(x, cos, sin)
    assert not rope_triton.usable(x[0].double(), cos.double(), sin.double())
    assert rope_triton.usable(x[0], cos, sin)
    set_enabled(False)  # fast paths off: the reference everywhere
    assert not rope_triton.usable(x[0], cos, sin)
