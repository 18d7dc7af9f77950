"""The one-pass CPU RoPE kernel behind posenc.apply_rotary: bit-identical to the reference path,
in place and out=, autograd, fallbacks and errors."""

import functools
import platform

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _op_calls import OpCalls
from posenc.kernels import _cbuild, rope_cpu
from posenc.rotary import ROTARY_LAYOUTS

# The kernel is held to the reference expression in x's own dtype: for bf16 that is the arithmetic
# rounded after every operation (compute_dtype="input"); its rounded-once default has its own tests.
rotate = functools.partial(posenc.apply_rotary, compute_dtype="input")

# skip only where the kernel cannot exist (no compiler, or turned off); a kernel that was built but
# failed its self-check is a bug, and its tests must fail rather than skip
pytestmark = pytest.mark.skipif(
    rope_cpu.status() in ("no compiler", "disabled"),
    reason=f"C kernel {rope_cpu.status()}: reference path only",
)


def test_kernel_is_in_use_where_it_can_be():
    assert rope_cpu.status() == "ok"


DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def reference(x, cos, sin, layout):
    """posenc's reference expression (rotary.ROTARY_LAYOUTS), never the kernel."""
    r = 2 * cos.shape[-1]
    y = ROTARY_LAYOUTS[layout](x, cos.to(x.dtype), sin.to(x.dtype), r)
    return torch.cat((y, x[..., r:]), dim=-1) if r < x.shape[-1] else y


def rotation64(x, angles, layout):
    """Independent float64 reference from the definition: rotate each pair by its angle."""
    x = x.double()
    r = 2 * angles.shape[-1]
    if layout == "half":
        a, b = x[..., : r // 2], x[..., r // 2 : r]
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
    c, s = angles.cos(), angles.sin()
    ya, yb = a * c - b * s, a * s + b * c
    y = x.clone()
    if layout == "half":
        y[..., : r // 2], y[..., r // 2 : r] = ya, yb
    else:
        y[..., 0:r:2], y[..., 1:r:2] = ya, yb
    return y


def tables(angles, dtype):
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("r", [64, 16])
def test_kernel_is_bit_identical_to_reference(dtype, layout, r):
    x = torch.randn(2, 3, 37, 64, dtype=torch.float64).to(dtype)
    angles = torch.rand(37, r // 2, dtype=torch.float64) * 100
    cos, sin = tables(angles, dtype)
    assert rope_cpu.takes(x, cos, sin)
    out = rotate(x, cos, sin, layout=layout)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, reference(x, cos, sin, layout))
    # and the maths: float64 from the definition (bf16: within its rounding of the inputs' tables)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 6e-2}[dtype]
    torch.testing.assert_close(out.double(), rotation64(x, angles, layout), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_in_place_and_out(dtype, layout):
    x = torch.randn(2, 4, 9, 32).to(dtype)
    cos, sin = tables(torch.rand(9, 16, dtype=torch.float64) * 9, dtype)
    expected = reference(x, cos, sin, layout)
    y = x.clone()
    assert rotate(y, cos, sin, layout=layout, out=y) is y
    assert torch.equal(y, expected)
    buf = torch.full_like(x, float("nan"))
    assert rotate(x, cos, sin, layout=layout, out=buf) is buf
    assert torch.equal(buf, expected)


def test_partial_rotary_out_copies_the_pass_through_dims():
    x = torch.randn(2, 3, 5, 32)
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64), torch.float32)
    buf = torch.full_like(x, float("nan"))
    rotate(x, cos, sin, out=buf)
    assert torch.equal(buf[..., 8:], x[..., 8:])
    assert torch.equal(buf, reference(x, cos, sin, "half"))


@settings(deadline=None, max_examples=30)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    s=st.integers(1, 19),
    pairs=st.integers(1, 70),
    extra=st.integers(0, 5),
    per_token=st.booleans(),
    transposed=st.booleans(),
    layout=st.sampled_from(["half", "interleaved"]),
    dtype=st.sampled_from(DTYPES),
)
def test_any_shape_stride_and_broadcast(b, h, s, pairs, extra, per_token, transposed, layout, dtype):
    """Shapes that cross the kernel's 64-pair staging blocks, per-token tables [b, 1, s, r/2],
    and q as a transposed view of a [b, s, h, d_h] projection (non-contiguous rows)."""
    d = 2 * pairs + extra
    x = torch.randn(b, s, h, d).to(dtype).transpose(1, 2) if transposed else torch.randn(b, h, s, d).to(dtype)
    angles = torch.rand((b, 1, s, pairs) if per_token else (s, pairs), dtype=torch.float64) * 50
    cos, sin = tables(angles, dtype)
    assert torch.equal(rotate(x, cos, sin, layout=layout), reference(x, cos, sin, layout))
    y = x.clone()
    rotate(y, cos, sin, layout=layout, out=y)
    assert torch.equal(y, reference(x, cos, sin, layout))


def test_float32_tables_with_bf16_x_are_cast_first_like_the_reference():
    x = torch.randn(1, 2, 7, 16, dtype=torch.bfloat16)
    cos, sin = tables(torch.rand(7, 8, dtype=torch.float64) * 30, torch.float32)
    assert torch.equal(rotate(x, cos, sin), reference(x, cos, sin, "half"))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_gradients_match_the_reference(layout):
    x = torch.randn(2, 3, 11, 24, requires_grad=True)
    cos, sin = tables(torch.rand(11, 8, dtype=torch.float64) * 9, torch.float32)
    g = torch.randn(2, 3, 11, 24)
    (gx,) = torch.autograd.grad(rotate(x, cos, sin, layout=layout), x, g)
    (gr,) = torch.autograd.grad(reference(x, cos, sin, layout), x, g)
    assert torch.equal(gx, gr)


def _bf16_edge_cases(gen, per_batch):
    """bf16 x [2, 6, 9, 2 * 69 + 3] and tables [9, 69] (or per batch [2, 1, 9, 69]) whose products
    or sums are subnormal floats in some 32-pair blocks (the kernel's fast bf16 blocks must hand
    those to the exact path): a row of x near 2^-125, a row of subnormal x, a table row of 2^-70
    meeting x rows of 2^-58 (x alone passes the block's check there), and a row of raw bit
    patterns (overflow, inf, NaN)."""
    x = torch.randn(2, 6, 9, 141, generator=gen).to(torch.bfloat16)
    x[0, 1, 3] *= 2.0**-125
    x[1, 2, 4] = (torch.rand(141, generator=gen) * 2.0**-127).to(torch.bfloat16)  # subnormal
    x[:, :, 5] = 2.0**-58
    x[0, 4, 7] = torch.randint(-(2**15), 2**15, (141,), generator=gen, dtype=torch.int16).view(torch.bfloat16)
    angles = torch.rand((2, 1, 9, 69) if per_batch else (9, 69), generator=gen, dtype=torch.float64) * 40
    cos, sin = tables(angles, torch.bfloat16)
    cos[..., 5, :] = 2.0**-70
    sin[..., 5, :] = -(2.0**-70)
    return x, cos, sin


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("per_batch", [False, True])
def test_bf16_blocks_keep_the_exact_bits_at_the_edges(layout, per_batch):
    """Every bf16 output equals the reference's (NaN where it is NaN), in place and out of place,
    with tables shared by every head (checked once per call) or per batch (checked per block), and
    rotated back by the opposite angle as backward does; clean blocks stay exact too."""
    x, cos, sin = _bf16_edge_cases(torch.Generator().manual_seed(5), per_batch)
    want = reference(x, cos, sin, layout)
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(rotate(x, cos, sin, layout=layout), want, **exact)
    y = x.clone()
    rotate(y, cos, sin, layout=layout, out=y)
    torch.testing.assert_close(y, want, **exact)
    xg = x.clone().requires_grad_(True)
    (back,) = torch.autograd.grad(rotate(xg, cos, sin, layout=layout), xg, x)
    torch.testing.assert_close(back, reference(x, cos, -sin, layout), **exact)
    # clean shared tables (checked once per call, then trusted): x alone must send its tiny and
    # subnormal blocks to the exact path; huge x overflows to inf and NaN inside the fast blocks
    c, s = tables(torch.rand(9, 64, dtype=torch.float64) * 40, torch.bfloat16)
    y = torch.randn(2, 6, 9, 128, dtype=torch.bfloat16)
    y[0, 1, 3] *= 2.0**-125
    y[1, 2, 4] = (torch.rand(128) * 2.0**-127).to(torch.bfloat16)
    y[1, 3] *= 2.0**126
    for z in (y, y.clone()):
        want = reference(z, c, s, layout)
        torch.testing.assert_close(rotate(z, c, s, layout=layout), want, **exact)
        rotate(z, c, s, layout=layout, out=z)
        torch.testing.assert_close(z, want, **exact)


def test_gradcheck_and_double_backward():
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = tables(torch.rand(5, 3, dtype=torch.float64) * 7, torch.float64)

    def f(t):
        return rotate(t, cos, sin, layout="interleaved")

    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


def test_tables_requiring_grad_take_the_reference_path():
    x = torch.randn(1, 1, 4, 8)
    angles = torch.rand(4, 4, requires_grad=True)
    cos, sin = angles.cos(), angles.sin()
    assert not rope_cpu.takes(x, cos, sin)
    rotate(x, cos, sin).sum().backward()
    assert angles.grad is not None and angles.grad.abs().sum() > 0


@pytest.mark.parametrize("shape", [(4, 8, 64, 64), (1, 2, 512, 64)])
def test_two_threads_give_the_same_bits(shape):
    """> 32768 elements: the kernel splits the work over threads (head groups for [4, 8, ...];
    rows for [1, 2, ...], whose one group of heads could not keep two threads busy)."""
    x = torch.randn(shape)
    cos, sin = tables(torch.rand(shape[2], 32, dtype=torch.float64) * 60, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out = rotate(x, cos, sin)
        y = x.clone()
        rotate(y, cos, sin, out=y)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out, reference(x, cos, sin, "half")) and torch.equal(y, out)


@pytest.mark.parametrize(
    ("out", "grad", "err", "match"),
    [
        ([1.0], False, TypeError, "out must be a tensor like x"),
        (torch.empty(1, 2, 3, 7), False, ValueError, r"out must match x: shape \(1, 2, 3, 8\)"),
        (torch.empty(1, 2, 3, 8, dtype=torch.float64), False, ValueError, "dtype torch.float32"),
        (torch.empty(1, 2, 8, 3).transpose(-1, -2), False, ValueError, "out must have a contiguous last dim"),
        (None, True, ValueError, "out= is for inference"),
    ],
)
def test_out_errors(out, grad, err, match):
    x = torch.randn(1, 2, 3, 8, requires_grad=grad)
    cos, sin = tables(torch.rand(3, 4, dtype=torch.float64), torch.float32)
    with pytest.raises(err, match=match):
        rotate(x, cos, sin, out=x if out is None else out)


def test_in_place_on_a_strided_last_dim_takes_the_reference_path():
    """out=x skips out's own checks (it is x); a last dim the kernel cannot walk still works."""
    x = torch.randn(2, 3, 8, 6).transpose(-1, -2)  # [2, 3, 6, 8], last-dim stride 6
    cos, sin = tables(torch.rand(6, 4, dtype=torch.float64), torch.float32)
    want = reference(x.contiguous(), cos, sin, "half")
    with torch.no_grad():
        got = rotate(x, cos, sin, out=x)
    assert got is x and torch.equal(x, want)


def test_out_overlapping_x_is_refused():
    x = torch.randn(1, 2, 4, 8)
    cos, sin = tables(torch.rand(3, 4, dtype=torch.float64), torch.float32)
    with pytest.raises(ValueError, match="out shares memory with x without being x"):
        rotate(x[:, :, :3], cos, sin, out=x[:, :, 1:])


def test_reference_path_serves_other_dtypes_and_out():
    x = torch.randn(1, 2, 3, 8, dtype=torch.float16)
    cos, sin = tables(torch.rand(3, 4, dtype=torch.float64), torch.float16)
    assert not rope_cpu.takes(x, cos, sin)
    y = x.clone()
    rotate(y, cos, sin, out=y)
    assert torch.equal(y, reference(x, cos, sin, "half"))


def test_without_the_kernel_the_op_runs_the_reference(monkeypatch):
    """Where the kernel cannot run (here: as if it failed to build) the op still takes the call and
    rotates by the reference, out of place, into out=, backward included."""
    x = torch.randn(1, 2, 3, 8, requires_grad=True)
    cos, sin = tables(torch.rand(3, 4, dtype=torch.float64), torch.float32)
    want = reference(x.detach(), cos, sin, "half")
    grad = torch.randn(1, 2, 3, 8)
    want_grad = reference(grad, cos, -sin, "half")
    calls = _counting(monkeypatch)
    monkeypatch.setitem(rope_cpu._state, "fn", None)
    assert rope_cpu.takes(x, cos, sin)
    with OpCalls() as ops:
        got = rotate(x, cos, sin)
        got.backward(grad)
        with torch.no_grad():
            y = x.detach().clone()
            rotate(y, cos, sin, out=y)
    assert ops.names == ["posenc.rope_cpu.default", "posenc.rope_cpu.default", "posenc.rope_cpu_out.default"]
    assert torch.equal(got, want) and torch.equal(y, want) and torch.equal(x.grad, want_grad)
    assert calls["n"] == 0
    from posenc.kernels import set_enabled

    set_enabled(False)  # as POSENC_C_KERNELS=0 at start-up
    assert not _cbuild.enabled() and _cbuild.load("posenc_test_disabled", "int f(void){return 1;}") is None


def test_cbuild_caches_and_survives_a_missing_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_KERNEL_CACHE", str(tmp_path))
    lib = _cbuild.load("posenc_test_seven", "int seven(void) { return 7; }")
    assert lib is not None and lib.seven() == 7
    assert len(list(tmp_path.glob("posenc_test_seven-*.so"))) == 1
    monkeypatch.setattr(_cbuild, "_compiler", lambda: None)
    assert _cbuild._build("posenc_test_nocc", "int f(void){return 1;}") is None


def test_compile_with_inductor_matches_eager():
    x = torch.randn(1, 2, 6, 16)
    cos, sin = tables(torch.rand(6, 8, dtype=torch.float64) * 5, torch.float32)
    compiled = torch.compile(lambda t: rotate(t, cos, sin), fullgraph=True)
    torch.testing.assert_close(compiled(x), rotate(x, cos, sin), rtol=1e-6, atol=1e-6)


def test_export_and_compiled_functorch_take_the_reference_path(monkeypatch):
    """torch.export keeps its program portable (aten ops only) and a torch.func transform under
    compile has no rule for the op: both take the reference path and give the eager numbers."""
    from posenc.model import ModelConfig, TransformerLM

    x = torch.randn(1, 2, 6, 16)
    cos, sin = tables(torch.rand(6, 8, dtype=torch.float64) * 5, torch.float32)

    def loss(t):
        return rotate(t, cos, sin).square().sum()

    lm = TransformerLM(
        ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2, position="rope")
    ).eval()
    ids = torch.randint(0, 32, (1, 8))
    want_grad, want_rot, want_logits = (
        torch.func.grad(loss)(x),
        rotate(x, cos, sin),
        lm(ids).logits,
    )
    calls = _counting(monkeypatch)  # from here on, nothing may run the kernel
    torch.testing.assert_close(torch.compile(torch.func.grad(loss), fullgraph=True)(x), want_grad)
    vmapped = torch.compile(torch.vmap(lambda t: rotate(t, cos, sin)), fullgraph=True)
    torch.testing.assert_close(vmapped(x[None]), want_rot[None])
    program = torch.export.export(lm, (ids,), strict=False)
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not any("posenc" in op for op in ops)
    torch.testing.assert_close(program.module()(ids).logits, want_logits)
    assert calls["n"] == 0


def test_meta_tensors_use_the_reference_path():
    x = torch.empty(2, 3, 5, 8, device="meta")
    cos = torch.empty(5, 4, device="meta")
    assert not rope_cpu.takes(x, cos, cos)
    assert rotate(x, cos, cos).shape == (2, 3, 5, 8)


# ---------------------------------------------------------------------------------------------- compiled
def test_the_op_passes_torch_library_opcheck():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(8, 8, generator=gen, dtype=torch.float64) * 10
    k = torch.randn(2, 1, 4, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    c, s = angles.cos(), angles.sin()
    for layout in ("half", "interleaved"):  # schema, fake implementation, autograd registration
        torch.library.opcheck(rope_cpu.rope_op, ([x], [c], [s], layout, 1.0))
        torch.library.opcheck(rope_cpu.rope_op, ([x, k], [c, c[:4]], [s, s[:4]], layout, -1.0))
        with torch.no_grad():
            out = torch.empty_like(x)
            torch.library.opcheck(rope_cpu.rope_out_op, ([x.detach()], [c], [s], [out], layout))


def _counting(monkeypatch):
    """Counts the tensors the C kernel rotates (one per single call, two per q-and-k call)."""
    calls = {"n": 0}
    launch, pair = rope_cpu._launch, rope_cpu._launch_pair

    def counted(*args):
        calls["n"] += 1
        return launch(*args)

    def counted_pair(*args):
        calls["n"] += 2
        return pair(*args)

    monkeypatch.setattr(rope_cpu, "_launch", counted)
    monkeypatch.setattr(rope_cpu, "_launch_pair", counted_pair)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_rotation_is_the_registered_op(dtype):
    """In eager mode RotaryEmbedding.rotate, apply_rotary (out of place, in place) and its
    backward all go through posenc::rope_cpu / posenc::rope_cpu_out, as a compiled graph does."""
    rope = posenc.RotaryEmbedding(16)
    q = torch.randn(2, 4, 6, 16, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 6, 16, dtype=dtype, requires_grad=True)
    with OpCalls() as ops:
        rq, rk = rope.rotate(q, k)
        (rq.float().square().sum() + rk.float().square().sum()).backward()
    assert ops.names == ["posenc.rope_cpu.default", "posenc.rope_cpu.default"]  # forward, backward
    cos, sin = rope.cos_sin(torch.arange(6))
    with OpCalls() as ops, torch.no_grad():
        y = q.detach().clone()
        posenc.apply_rotary(y, cos, sin, out=y)
        posenc.apply_rotary(q.detach(), cos, sin)
    assert ops.names == ["posenc.rope_cpu_out.default", "posenc.rope_cpu.default"]
    assert torch.equal(y, rq.detach())


def test_compiled_rotation_holds_the_op_and_gives_the_eager_numbers():
    """torch.compile(fullgraph=True) puts posenc::rope_cpu in the graph, forward and backward."""
    rope = posenc.RotaryEmbedding(16)
    q = torch.randn(2, 4, 6, 16, requires_grad=True)
    k = torch.randn(2, 2, 6, 16, requires_grad=True)
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    compiled = torch.compile(lambda a, b: rope.rotate(a, b), fullgraph=True, backend=backend)
    got = compiled(q, k)
    want = rope.rotate(q, k)
    assert "posenc.rope_cpu.default" in targets
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    aot = torch.compile(lambda a, b: rope.rotate(a, b), fullgraph=True, backend="aot_eager")
    ga = torch.autograd.grad(sum(t.square().sum() for t in aot(q, k)), (q, k))
    gw = torch.autograd.grad(sum(t.square().sum() for t in want), (q, k))
    assert all(torch.equal(a, b) for a, b in zip(ga, gw))


def test_compiled_in_place_rotation_holds_the_out_op():
    """out= under torch.compile(fullgraph=True): posenc::rope_cpu_out in the graph, eager's bits."""
    x = torch.randn(1, 2, 6, 16)
    cos, sin = tables(torch.rand(6, 8, dtype=torch.float64) * 5, torch.float32)
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    def f(t):
        y = t.clone()
        rotate(y, cos, sin, out=y)
        return y

    with torch.no_grad():
        got = torch.compile(f, fullgraph=True, backend=backend)(x)
    assert "posenc.rope_cpu_out.default" in targets
    assert torch.equal(got, f(x))


def test_a_compiled_model_runs_the_kernel_with_the_eager_numbers(monkeypatch):
    """torch.compile(fullgraph=True) keeps the one-pass rotation (the registered op), forward and
    backward, and gives the eager model's numbers bit for bit (aot_eager: no other fusion)."""
    from posenc.model import ModelConfig, TransformerLM

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, position="rope", max_len=64)
    model = TransformerLM(cfg)
    ids = torch.randint(0, 64, (2, 16))

    def logits(m):
        return m(ids).logits

    want = logits(model)
    want.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    calls = _counting(monkeypatch)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = logits(compiled)
    assert calls["n"] == 2 * cfg.num_layers  # q and k of every layer, in the graph
    got.square().sum().backward()
    assert calls["n"] == 4 * cfg.num_layers  # and their gradients
    assert torch.equal(got, want)
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g)


def test_a_kernel_checked_while_switched_off_builds_when_switched_on(monkeypatch):
    from posenc import kernels

    monkeypatch.delitem(rope_cpu._state, "fn", raising=False)  # as in a fresh process
    kernels.set_enabled(False)
    assert rope_cpu.status() == "disabled" and not rope_cpu.available()
    kernels.set_enabled(True)
    assert rope_cpu.available() and rope_cpu.status() == "ok"


def test_the_switch_is_read_once_and_changes_at_run_time(monkeypatch):
    """POSENC_C_KERNELS is read at the first decision; posenc.kernels.set_enabled switches every
    fast path at once, also after the library was loaded (it used to stay on)."""
    from posenc import kernels

    x = torch.randn(2, 3, 8, 16)
    angles = torch.rand(8, 8)
    cos, sin = angles.cos(), angles.sin()
    calls = _counting(monkeypatch)
    try:
        kernels.set_enabled(None)
        monkeypatch.setenv("POSENC_C_KERNELS", "1")
        want = rotate(x, cos, sin)
        assert calls["n"] == 1 and kernels.enabled()
        monkeypatch.setenv("POSENC_C_KERNELS", "0")  # read once: no effect until asked to re-read
        rotate(x, cos, sin)
        assert calls["n"] == 2
        kernels.set_enabled(False)
        got = rotate(x, cos, sin)
        assert calls["n"] == 2 and torch.equal(got, want)  # the reference path, same numbers
        kernels.set_enabled(None)  # re-read the environment: still off
        rotate(x, cos, sin)
        assert calls["n"] == 2 and not kernels.enabled()
        with pytest.raises(TypeError, match="on must be True, False or None"):
            kernels.set_enabled("no")
    finally:
        kernels.set_enabled(None)
        monkeypatch.delenv("POSENC_C_KERNELS")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_pair_call_rotates_q_and_k_like_two_calls(dtype, layout):
    """rotate_pair: one kernel call for q and k (own tables, GQA shapes), the bits of two calls."""
    q = torch.randn(2, 4, 9, 16).to(dtype)
    k = torch.randn(2, 2, 13, 16).to(dtype)
    q_tab = tables(torch.rand(9, 8, dtype=torch.float64) * 50, dtype)
    k_tab = tables(torch.rand(13, 8, dtype=torch.float64) * 50, dtype)
    assert rope_cpu.takes(q, *q_tab) and rope_cpu.takes(k, *k_tab)
    got_q, got_k = rope_cpu.rotate_pair(q, k, q_tab, k_tab, layout)
    assert torch.equal(got_q, reference(q, *q_tab, layout))
    assert torch.equal(got_k, reference(k, *k_tab, layout))


def test_pair_call_backward_and_double_backward():
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 7, 8, dtype=torch.float64, requires_grad=True)
    q_tab = tables(torch.rand(5, 4, dtype=torch.float64) * 7, torch.float64)
    k_tab = tables(torch.rand(7, 4, dtype=torch.float64) * 7, torch.float64)

    def f(a, b):
        return rope_cpu.rotate_pair(a, b, q_tab, k_tab, "half")

    assert torch.autograd.gradcheck(f, (q, k))
    assert torch.autograd.gradgradcheck(f, (q, k))


def test_pair_call_uses_one_kernel_call(monkeypatch):
    """apply_rotary_qk on the fast path calls the two-job entry point once and the one-job one never."""
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    cos, sin = tables(torch.rand(6, 4, dtype=torch.float64), torch.float32)
    rope_cpu.available()
    calls = {"pair": 0, "fn": 0}
    for name in calls:
        real = rope_cpu._state[name]

        def counted(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)

        monkeypatch.setitem(rope_cpu._state, name, counted)
    posenc.apply_rotary_qk(q, k, cos, sin)
    assert calls == {"pair": 1, "fn": 0}


def test_threads_follow_atens_grain():
    """Up to 32768 elements one thread (as ATen's elementwise ops), above it ceil(n / 32768) at most."""
    cos, sin = tables(torch.rand(1, 64, dtype=torch.float64), torch.float32)
    for numel, want in ((32768, 1), (32769, 2), (1 << 22, torch.get_num_threads())):
        x = torch.empty(numel // 128, 128)
        args, _ = rope_cpu._args(x, cos, sin, x, "half", 1.0)
        assert args[7] == min(want, torch.get_num_threads())


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction-set variants")
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")], ids=["avx2", "generic"])
def test_every_instruction_set_branch_gives_the_reference_bits(flags, monkeypatch, tmp_path):
    """The kernel built without AVX-512 (its AVX2 bodies, where the CPU has AVX2) and without AVX2
    (the compiler's own vectorization) reproduces the reference bit for bit: random shapes with
    head groups and tails, every dtype and layout, in place, out of place and the opposite angle,
    and the bf16 edge cases. The machine's own build is tested by the rest of this file."""
    monkeypatch.setenv("POSENC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(_cbuild, "_BASE_FLAGS", _cbuild._BASE_FLAGS + flags)
    monkeypatch.setattr(_cbuild, "_loaded", {})
    monkeypatch.setattr(rope_cpu, "_state", {})
    assert rope_cpu.status() == "ok"  # built with these flags, and its self-check passed
    exact = dict(rtol=0, atol=0, equal_nan=True)
    gen = torch.Generator().manual_seed(11)
    for dtype in DTYPES:
        for layout in ("half", "interleaved"):
            for heads, pairs, extra in ((5, 67, 3), (4, 16, 0), (2, 40, 0), (3, 5, 1)):
                x = torch.randn(2, heads, 7, 2 * pairs + extra, generator=gen).to(dtype)
                angles = torch.rand(7, pairs, generator=gen, dtype=torch.float64) * 80
                cos, sin = tables(angles, dtype)
                for c, s in ((cos, sin), (cos, -sin)):
                    want = reference(x, c, s, layout)
                    assert torch.equal(rotate(x, c, s, layout=layout), want)
                    y = x.clone()
                    rotate(y, c, s, layout=layout, out=y)
                    assert torch.equal(y, want)
            for heads, pairs, extra in ((5, 67, 3), (4, 16, 0)):  # bf16 rounded once: float32 tables
                x = torch.randn(2, heads, 7, 2 * pairs + extra, generator=gen).bfloat16()
                cos, sin = tables(
                    torch.rand(7, pairs, generator=gen, dtype=torch.float64) * 80, torch.float32
                )
                want = reference(x.float(), cos, sin, layout).bfloat16()
                assert torch.equal(rotate(x, cos, sin, layout=layout, compute_dtype=torch.float32), want)
            for per_batch in (False, True):
                x, cos, sin = _bf16_edge_cases(gen, per_batch)
                torch.testing.assert_close(
                    rotate(x, cos, sin, layout=layout), reference(x, cos, sin, layout), **exact
                )
