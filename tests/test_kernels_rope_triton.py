"""The Triton RoPE kernel behind the op posenc::rope_triton == posenc's PyTorch reference, bit for
bit; the op is the one way in (eager, autograd, torch.compile) and decides alone whether the
kernel runs.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set
by a module-scoped fixture before the kernel module first imports Triton, and removed after this
module's tests); with one, on CUDA. On CPU, float32/bfloat16 tensors that reach
:func:`posenc.apply_rotary` are the C kernel's (``posenc::rope_cpu``), so tests that go through
``apply_rotary`` switch that kernel's decision off (:func:`no_c_kernel`) to see this one.
"""

import pytest
import torch

import posenc
from _op_calls import OpCalls
from posenc.kernels import rope_cpu, rope_triton, set_enabled
from posenc.rotary import reference as rope_reference

pytest.importorskip("triton", reason="Triton is not installed (pip install 'posenc[gpu]')")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
OP, OUT_OP = "posenc.rope_triton.default", "posenc.rope_triton_out.default"


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    """Triton's interpreter on CPU for this module only. The variable is read when the @triton.jit
    functions are defined (posenc imports them on first use, here); posenc checks it again at every
    call, so CPU tensors take the kernel only inside this module."""
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield


@pytest.fixture
def launches(monkeypatch):
    """Counts the kernel's launches (one per tensor, or per q-and-k pair), not its self-checks'."""
    calls, checking = [], []
    launch, self_check = rope_triton._launch, rope_triton._self_check

    def counted(jobs, *args):
        if not checking:
            calls.append(len(jobs))
        return launch(jobs, *args)

    def checked(*args):
        checking.append(1)
        try:
            return self_check(*args)
        finally:
            checking.pop()

    monkeypatch.setattr(rope_triton, "_launch", counted)
    monkeypatch.setattr(rope_triton, "_self_check", checked)
    return calls


@pytest.fixture
def no_c_kernel(monkeypatch):
    """apply_rotary without the C kernel's op, as on a CUDA device (no-op for CUDA tensors)."""
    monkeypatch.setattr(rope_cpu, "takes", lambda *a: False)


def reference(x, cos, sin, layout):
    """posenc's reference rotation (PyTorch ops), in the tables' arithmetic, never a kernel."""
    return rope_reference.rotate(x, cos, sin, layout)


def tables(angles: torch.Tensor, dtype: torch.dtype):
    return angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)


def test_self_check_passes_here():
    assert rope_triton.status(DEVICE) == "ok"
    assert rope_triton.available(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("d", "r"), [(16, 16), (20, 8), (6, 6)])
@pytest.mark.parametrize("mode", ["new", "inplace"])
def test_equals_the_reference(dtype, layout, d, r, mode, launches):
    gen = torch.Generator().manual_seed(d + r)
    x = torch.randn(2, 3, 19, d, generator=gen).to(DEVICE, dtype)
    cos, sin = tables(torch.rand(19, r // 2, generator=gen, dtype=torch.float64) * 300, dtype)
    want = reference(x, cos, sin, layout)
    if mode == "new":
        got = rope_triton.rotate(x, cos, sin, layout)
    else:
        got = x.clone()
        assert rope_triton.rotate(got, cos, sin, layout, out=got) is got
    assert torch.equal(got, want)
    assert launches == [1]


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_out_receives_the_rotation_and_the_pass_through_dims(layout, launches):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 19, 20, generator=gen).to(DEVICE, torch.bfloat16)
    cos, sin = tables(torch.rand(19, 4, generator=gen, dtype=torch.float64) * 300, torch.float32)
    out = torch.full_like(x, 7.0)
    assert rope_triton.rotate(x, cos, sin, layout, out=out) is out
    assert torch.equal(out, reference(x, cos, sin, layout)) and launches == [1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("d", "r"), [(16, 16), (20, 8)])
def test_float32_tables_round_once_like_the_default(dtype, layout, d, r, no_c_kernel, launches):
    """Float32 tables with a bf16/fp16 x: float32 arithmetic, each output rounded once, bit for bit
    apply_rotary's default, so a CUDA model keeps the kernel by default."""
    gen = torch.Generator().manual_seed(d * r)
    x = torch.randn(2, 3, 19, d, generator=gen).to(DEVICE, dtype)
    cos, sin = tables(torch.rand(19, r // 2, generator=gen, dtype=torch.float64) * 300, torch.float32)
    want = (reference(x.float(), cos, sin, layout)).to(dtype)  # the float32 expression, rounded once
    assert torch.equal(posenc.apply_rotary(x, cos, sin, layout=layout), want)
    per_op = reference(x, cos.to(dtype), sin.to(dtype), layout)  # every operation rounded
    assert torch.equal(posenc.apply_rotary(x, cos, sin, layout=layout, compute_dtype="input"), per_op)
    assert not torch.equal(want, per_op)
    assert launches == [1, 1]


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


def test_per_token_tables_strided_x_and_varlen(launches):
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
    assert launches == [1, 1]


# ----------------------------------------------------------------------------------- the one way in
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_eager_rotation_is_the_registered_op(dtype, no_c_kernel, launches):
    """In eager mode RotaryEmbedding.rotate (q and k in one launch), its backward and apply_rotary
    (out of place, in place) all go through posenc::rope_triton / posenc::rope_triton_out, as a
    compiled graph does."""
    rope = posenc.RotaryEmbedding(16).to(DEVICE)
    q = torch.randn(2, 4, 6, 16).to(DEVICE, dtype).requires_grad_()
    k = torch.randn(2, 2, 6, 16).to(DEVICE, dtype).requires_grad_()
    with OpCalls() as ops:
        rq, rk = rope.rotate(q, k)
        (rq.float().square().sum() + rk.float().square().sum()).backward()
    assert ops.names == [OP, OP]  # forward, backward
    assert launches == [2, 2]  # q and k together, both ways
    cos, sin = rope.cos_sin(torch.arange(6, device=DEVICE))
    assert torch.equal(rq, reference(q.detach(), cos, sin, "half"))
    with OpCalls() as ops, torch.no_grad():
        y = q.detach().clone()
        posenc.apply_rotary(y, cos, sin, out=y)
        posenc.apply_rotary(q.detach(), cos, sin)
    assert ops.names == [OUT_OP, OP]
    assert torch.equal(y, rq.detach())


def test_ordinary_cpu_tensors_keep_the_c_kernel(monkeypatch):
    """Without Triton's interpreter a CPU tensor is never the Triton op's: float32 stays with
    posenc::rope_cpu, float16 (which no CPU kernel takes) with the reference expression."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 2, 5, 8)
    cos, sin = torch.rand(5, 4).cos(), torch.rand(5, 4).sin()
    assert not rope_triton.takes(x, cos, sin) and not rope_triton.takes(x.half(), cos, sin)
    with OpCalls() as ops:
        posenc.apply_rotary(x, cos, sin)
        posenc.apply_rotary(x.half(), cos, sin)
    assert ops.names == (["posenc.rope_cpu.default"] if rope_cpu.takes(x, cos, sin) else [])


def test_deciding_on_a_cpu_tensor_keeps_a_full_graph(monkeypatch):
    """takes() reads TRITON_INTERPRET for a CPU tensor no CPU kernel takes (float16): under
    torch.compile(fullgraph=True) that read is traced, not a graph break."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 2, 5, 8, dtype=torch.float16)
    cos, sin = torch.rand(5, 4).cos(), torch.rand(5, 4).sin()
    compiled = torch.compile(lambda t: posenc.apply_rotary(t, cos, sin), fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), reference(x, cos, sin, "half"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_and_double_backward_are_the_reference_ones(dtype, layout, no_c_kernel, launches):
    """The op's one autograd rule (the rotation by the opposite angle) gives the reference
    expression's gradient bit for bit, and differentiates again (the gradient with respect to the
    incoming gradient is the rotation itself)."""
    gen = torch.Generator().manual_seed(1)
    angles = torch.rand(7, 4, generator=gen, dtype=torch.float64) * 20
    cos, sin = tables(angles, torch.float32)
    results = []
    for fast in (True, False):
        x = torch.randn(1, 2, 7, 12, generator=gen.manual_seed(5)).to(DEVICE, dtype).requires_grad_()
        g = torch.randn(1, 2, 7, 12, generator=gen).to(DEVICE, dtype).requires_grad_()
        w = torch.randn(1, 2, 7, 12, generator=gen).to(DEVICE, dtype)
        rotate = posenc.apply_rotary if fast else reference
        y = rotate(x, cos, sin, layout=layout) if fast else rotate(x, cos, sin, layout)
        (dx,) = torch.autograd.grad(y, x, g, create_graph=True)
        (dg,) = torch.autograd.grad(dx, g, w)
        results.append((y.detach(), dx.detach(), dg))
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert launches == [1, 1, 1]  # forward, backward, double backward


@pytest.mark.filterwarnings("ignore:Input #. requires gradient and is not a double:UserWarning")
def test_gradcheck_in_float32():
    """torch.autograd.gradcheck of the op's rule in float32 (the kernel has no float64; gradcheck
    warns about that, hence the filter): the rotation is linear, so central differences with a
    large step are exact up to float32 rounding."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 1, 3, 6, generator=gen).to(DEVICE).requires_grad_()
    cos, sin = tables(torch.rand(3, 2, generator=gen, dtype=torch.float64) * 7, torch.float32)

    def f(t):
        return rope_triton.rotate(t, cos, sin, "interleaved")

    assert torch.autograd.gradcheck(f, (x,), eps=1e-2, atol=1e-4, rtol=1e-3, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, (x,), eps=1e-2, atol=1e-4, rtol=1e-3, fast_mode=True)


def test_the_op_passes_torch_library_opcheck():
    """Schema, fake implementation and autograd registration, one and two tensors (GQA k)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 16, generator=gen).to(DEVICE).requires_grad_()
    k = torch.randn(2, 1, 4, 16, generator=gen).to(DEVICE).requires_grad_()
    c, s = tables(torch.rand(8, 8, generator=gen, dtype=torch.float64) * 10, torch.float32)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    for layout in ("half", "interleaved"):
        torch.library.opcheck(rope_triton.rope_op, ([x], [c], [s], layout, 1.0), test_utils=tests)
        torch.library.opcheck(
            rope_triton.rope_op, ([x, k], [c, c[:4]], [s, s[:4]], layout, -1.0), test_utils=tests
        )
        with torch.no_grad():
            out = torch.empty_like(x)
            torch.library.opcheck(
                rope_triton.rope_out_op, ([x.detach()], [c], [s], [out], layout), test_utils=tests
            )


def test_compiled_rotation_holds_the_op_and_gives_the_eager_numbers(no_c_kernel, launches):
    """torch.compile(fullgraph=True) puts posenc::rope_triton in the graph, forward and backward,
    and gives the eager numbers bit for bit."""
    rope = posenc.RotaryEmbedding(16).to(DEVICE)
    q = torch.randn(2, 4, 6, 16).to(DEVICE).requires_grad_()
    k = torch.randn(2, 2, 6, 16).to(DEVICE).requires_grad_()
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    got = torch.compile(lambda a, b: rope.rotate(a, b), fullgraph=True, backend=backend)(q, k)
    want = rope.rotate(q, k)
    assert OP in targets
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    aot = torch.compile(lambda a, b: rope.rotate(a, b), fullgraph=True, backend="aot_eager")
    ga = torch.autograd.grad(sum(t.square().sum() for t in aot(q, k)), (q, k))
    gw = torch.autograd.grad(sum(t.square().sum() for t in want), (q, k))
    assert all(torch.equal(a, b) for a, b in zip(ga, gw))
    # q and k together in each: the two compiled forwards, the compiled backward, eager both ways
    assert launches == [2] * 5


# ------------------------------------------------------------------------------- q and k together
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_q_and_k_rotate_in_one_launch(dtype, no_c_kernel, launches):
    """GQA shapes and a cache offset: q [1, 4, 3, 8] at positions 10..12, k [1, 2, 13, 8] at 0..12."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 3, 8, generator=gen).to(DEVICE, dtype)
    k = torch.randn(1, 2, 13, 8, generator=gen).to(DEVICE, dtype)
    inv_freq = torch.rand(4, generator=gen, dtype=torch.float64)
    cos, sin = tables(torch.arange(13, dtype=torch.float64)[:, None] * inv_freq, torch.float32)
    got_q, got_k = posenc.apply_rotary_qk(q, k, cos[10:], sin[10:], cos, sin)
    assert launches == [2]
    want_q, want_k = reference(q.float(), cos[10:], sin[10:], "half"), reference(k.float(), cos, sin, "half")
    assert torch.equal(got_q, want_q.to(dtype)) and torch.equal(got_k, want_k.to(dtype))


def test_q_and_k_that_differ_launch_apart(no_c_kernel, launches):
    """q and k of different dtypes or widths cannot share one launch: two launches, same numbers."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 5, 8, generator=gen).to(DEVICE, torch.float16)
    k = torch.randn(1, 2, 5, 12, generator=gen).to(DEVICE, torch.bfloat16)
    cos, sin = tables(torch.rand(5, 4, generator=gen, dtype=torch.float64) * 9, torch.float32)
    got_q, got_k = posenc.apply_rotary_qk(q, k, cos, sin)
    assert launches == [1, 1]
    assert torch.equal(got_q, reference(q.float(), cos, sin, "half").to(q.dtype))
    assert torch.equal(got_k, reference(k.float(), cos, sin, "half").to(k.dtype))


# ------------------------------------------------------------------------- where the kernel does not run
def test_switched_off_the_op_runs_the_reference(no_c_kernel, launches):
    """Fast paths off: apply_rotary still calls the op (one way in), which runs the reference."""
    x = torch.randn(1, 2, 5, 8).to(DEVICE, torch.float16)
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64) * 9, torch.float32)
    set_enabled(False)
    with OpCalls() as ops:
        got = posenc.apply_rotary(x, cos, sin)
    assert ops.names == [OP] and launches == []
    assert torch.equal(got, reference(x, cos, sin, "half"))
    assert not rope_triton.available(DEVICE) and rope_triton.status(DEVICE) == "disabled"


def test_a_failed_self_check_warns_once_and_the_op_runs_the_reference(monkeypatch):
    monkeypatch.setattr(rope_triton, "_state", {})
    monkeypatch.setattr(rope_triton, "_self_check", lambda *variant: False)
    calls = []
    monkeypatch.setattr(rope_triton, "_launch", lambda *a: calls.append(1))
    x = torch.randn(1, 2, 5, 8).to(DEVICE, torch.float16)
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64) * 9, torch.float32)
    with pytest.warns(RuntimeWarning, match="does not reproduce the reference"):
        got = rope_triton.rotate(x, cos, sin, "half")
    assert torch.equal(got, reference(x, cos, sin, "half")) and calls == []
    with pytest.warns(RuntimeWarning, match="does not reproduce"):  # the variants status() checks
        assert rope_triton.status(DEVICE) == "self-check failed"


def test_the_self_check_catches_a_wrong_kernel(monkeypatch):
    """A kernel launched with the pairings swapped gives other numbers: its self-check says so and
    the op keeps the reference's numbers."""
    monkeypatch.setattr(rope_triton, "_state", {})
    monkeypatch.setattr(rope_triton, "_LAYOUTS", {"half": 1, "interleaved": 0})
    x = torch.randn(1, 2, 5, 8).to(DEVICE, torch.bfloat16)
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64) * 9, torch.float32)
    with pytest.warns(RuntimeWarning, match="does not reproduce the reference"):
        got = rope_triton.rotate(x, cos, sin, "half")
    assert torch.equal(got, reference(x, cos, sin, "half"))


def test_each_variant_is_checked_once_on_first_use_and_alone(monkeypatch, launches):
    """A call checks only the variant it compiles (dtype, arithmetic, pairing, widths), once; a
    variant that fails its check leaves the others on the kernel."""
    monkeypatch.setattr(rope_triton, "_state", {})
    checked = []
    real = rope_triton._self_check

    def only_float16_fails(device, dtype, *rest):
        checked.append((dtype, *rest))
        return dtype != torch.float16 and real(device, dtype, *rest)

    monkeypatch.setattr(rope_triton, "_self_check", only_float16_fails)
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64) * 9, torch.float32)
    x = torch.randn(1, 2, 5, 12).to(DEVICE, torch.bfloat16)
    for _ in range(2):
        assert torch.equal(rope_triton.rotate(x, cos, sin, "half"), reference(x, cos, sin, "half"))
    assert checked == [(torch.bfloat16, True, "half", 12, 4)] and launches == [1, 1]
    with pytest.warns(RuntimeWarning, match="does not reproduce the reference"):
        got = rope_triton.rotate(x.half(), cos, sin, "half")
    assert torch.equal(got, reference(x.half(), cos, sin, "half")) and launches == [1, 1]


def test_a_kernel_that_raises_is_reported_and_not_used(monkeypatch):
    monkeypatch.setattr(rope_triton, "_state", {})

    def broken(*variant):
        raise RuntimeError("no kernel image")

    monkeypatch.setattr(rope_triton, "_self_check", broken)
    x = torch.randn(1, 2, 5, 8).to(DEVICE)
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64), torch.float32)
    with pytest.warns(RuntimeWarning, match="failed on"):
        got = rope_triton.rotate(x, cos, sin, "half")
    assert torch.equal(got, reference(x, cos, sin, "half"))
    with pytest.warns(RuntimeWarning, match="failed on"):
        assert rope_triton.status(DEVICE) == "failed: RuntimeError: no kernel image"


def test_not_taken_where_it_cannot_run():
    x = torch.randn(2, 3, 4, 5, 8, device=DEVICE)  # 5 dims
    cos, sin = tables(torch.rand(5, 4, dtype=torch.float64), torch.float32)
    assert not rope_triton.takes(x, cos, sin)
    assert not rope_triton.takes(x[0].double(), cos.double(), sin.double())
    assert not rope_triton.takes(x[0, ..., ::2], cos[:, :2], sin[:, :2])  # strided last dim
    angles = torch.rand(5, 4, device=DEVICE, requires_grad=True)
    assert not rope_triton.takes(x[0], angles.cos(), angles.sin())  # tables need a gradient
    with torch.no_grad():
        assert rope_triton.takes(x[0], angles.cos(), angles.sin())
    assert rope_triton.takes(x[0], cos, sin)
    assert not rope_triton.takes(x[0], cos.to("meta"), sin.to("meta"))  # tables elsewhere


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a torch without CUDA")
def test_status_and_available_answer_on_a_torch_without_cuda():
    """Asked about "cuda" where torch has no CUDA, the kernel says so instead of raising."""
    assert rope_triton.status("cuda") in ("CUDA not available", "disabled", "not installed")
    assert rope_triton.available("cuda") is False and rope_triton.available("cuda:0") is False
