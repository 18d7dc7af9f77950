"""The counter-based dropout kernel: a correct dropout (rate, scale, independence), bit-identical to
PyTorch's arithmetic for a given mask, reproducible from torch's seed, mask recomputed in backward."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.kernels import dropout_cpu

# skip only where the kernel cannot exist (no compiler, or turned off); a kernel that was built but
# failed its self-check is a bug, and its tests must fail rather than skip
pytestmark = pytest.mark.skipif(
    dropout_cpu.status() in ("no compiler", "disabled"),
    reason=f"C kernel {dropout_cpu.status()}: reference path only",
)


def test_kernel_is_in_use_where_it_can_be():
    assert dropout_cpu.status() == "ok"


def torch_dropout_with_mask(x, keep, p):
    """PyTorch's CPU dropout arithmetic (aten _dropout): noise = keep / (1 - p) in x's dtype, x * noise."""
    noise = keep.to(x.dtype)
    noise.div_(1 - p)
    return x * noise


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_output_is_pytorch_dropout_of_its_own_mask(dtype, p):
    x = torch.randn(4, 33, 17).to(dtype)
    x[0, 0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
    seed = 2**63 + 12345
    keep = dropout_cpu.keep_mask(x.shape, p, seed)
    y = dropout_cpu.dropout(x, p, seed=seed)
    want = torch_dropout_with_mask(x, keep, p)
    torch.testing.assert_close(y, want, rtol=0, atol=0, equal_nan=True)
    real = ~want.isnan()  # NaN payloads differ even inside PyTorch (vectorized bf16 NaN is 0xFFFF)
    assert torch.equal(torch.signbit(y[real]), torch.signbit(want[real]))  # signed zeros kept


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5])
def test_drop_rate_within_statistical_tolerance(p):
    n = 1 << 22
    rate = 1.0 - dropout_cpu.keep_mask((n,), p, 7).double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(rate - p) < 5 * sigma, (rate, p, sigma)


def test_threshold_quantizes_p_to_2_pow_minus_32():
    for p in (1e-9, 0.1, 0.5, 0.999):
        assert abs(dropout_cpu.threshold(p) / 2**32 - p) <= 2**-33


def test_neighbours_and_calls_are_independent():
    """Keep decisions of adjacent elements (same 64-bit draw) and of two seeds are uncorrelated."""
    n, p = 1 << 21, 0.5
    a = dropout_cpu.keep_mask((n,), p, 1).double()
    b = dropout_cpu.keep_mask((n,), p, 2).double()
    sigma = 1 / math.sqrt(n)  # std of a correlation estimate between independent +-1 sequences
    for u, v in ((a[0::2], a[1::2]), (a[:-1], a[1:]), (a, b)):
        corr = torch.corrcoef(torch.stack((u, v)))[0, 1].item()
        assert abs(corr) < 6 * sigma * math.sqrt(2), corr


@settings(deadline=None, max_examples=25)
@given(n=st.integers(1, 5000), p=st.floats(0.01, 0.99), seed=st.integers(0, 2**64 - 1))
def test_mask_depends_only_on_seed_and_index(n, p, seed):
    """Any length (odd ends included), any seed: the prefix of a longer mask is the shorter mask."""
    short = dropout_cpu.keep_mask((n,), p, seed)
    long = dropout_cpu.keep_mask((n + 3,), p, seed)
    assert torch.equal(short, long[:n])


def test_threads_do_not_change_the_mask():
    x = torch.randn(3, 1 << 19)  # above the serial threshold: split over threads at pair boundaries
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        y2 = dropout_cpu.dropout(x, 0.3, seed=99)
        torch.set_num_threads(1)
        y1 = dropout_cpu.dropout(x, 0.3, seed=99)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(y1, y2)


def test_seed_comes_from_torch_generator():
    x = torch.randn(1000)
    torch.manual_seed(5)
    a = dropout_cpu.dropout(x, 0.2)
    torch.manual_seed(5)
    b = dropout_cpu.dropout(x, 0.2)
    c = dropout_cpu.dropout(x, 0.2)
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_in_place_and_backward_recomputes_the_mask():
    x = torch.randn(6, 50, requires_grad=True)
    h = x * 2.0  # a fresh intermediate that dropout may overwrite
    y = dropout_cpu.dropout(h, 0.4, inplace=True, seed=11)
    assert y is h
    g = torch.randn(6, 50)
    y.backward(g)
    keep = dropout_cpu.keep_mask(x.shape, 0.4, 11)
    torch.testing.assert_close(x.grad, 2.0 * torch_dropout_with_mask(g, keep, 0.4), rtol=0, atol=0)


def test_gradcheck_and_noncontiguous_grad():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: dropout_cpu.dropout(t, 0.3, seed=4), (x,))
    assert torch.autograd.gradgradcheck(lambda t: dropout_cpu.dropout(t, 0.3, seed=4), (x,))
    dropout_cpu.dropout(x, 0.3, seed=4).sum().backward()  # grad of sum: an expanded (stride 0) tensor
    keep = dropout_cpu.keep_mask(x.shape, 0.3, 4)
    torch.testing.assert_close(x.grad, torch_dropout_with_mask(torch.ones_like(x), keep, 0.3))


def test_usable_rejects_what_the_op_cannot_take():
    assert dropout_cpu.usable(torch.randn(4, 4))
    x = torch.randn(4, 4).t()  # non-contiguous: the mask follows the logical (contiguous) order
    assert dropout_cpu.usable(x)
    assert torch.equal(dropout_cpu.dropout(x, 0.5, seed=3), dropout_cpu.dropout(x.contiguous(), 0.5, seed=3))
    assert not dropout_cpu.usable(torch.randn(4, 4, dtype=torch.float16))
    assert not dropout_cpu.usable(torch.empty(4, 4, device="meta"))
    assert not dropout_cpu.usable(torch.empty(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_reference_draws_the_kernels_mask_bit_for_bit(dtype, p):
    """Without the kernel (no compiler, POSENC_C_KERNELS=0) the same seed gives the same output."""
    x = torch.randn(3, 1001, dtype=torch.float64).to(dtype)  # odd element count: a half pair at the end
    x[0, :4] = torch.tensor([float("nan"), -0.0, float("inf"), 1e-30]).to(dtype)
    for seed in (0, 1, 2**63 + 5, 2**64 - 1, 123456789):
        got = dropout_cpu.reference_dropout(x, p, seed)
        want = dropout_cpu.dropout(x, p, seed=seed)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
        number = ~torch.isnan(got)  # a NaN's sign bit means nothing (the bf16 kernel writes 0x7FC0)
        assert torch.equal(got.signbit()[number], want.signbit()[number])  # signed zeros agree
        keep = dropout_cpu.reference_keep_mask(x.numel(), p, seed).view(x.shape)
        assert torch.equal(keep, dropout_cpu.keep_mask(x.shape, p, seed))
    frac = dropout_cpu.reference_keep_mask(200_000, p, 7).float().mean().item()
    assert abs(frac - (1 - p)) < 0.01


@pytest.mark.parametrize("without", ["no kernel", "no op"])
def test_dropout_module_gives_one_mask_with_or_without_the_kernel(monkeypatch, without):
    """Without the kernel (as on a machine without a compiler) the op draws the same mask in
    PyTorch; where the op is not taken (tracing, torch.func) the module draws it itself."""
    from posenc.embedding import Dropout

    drop = Dropout(0.3)
    x = torch.randn(4, 33)
    torch.manual_seed(5)
    with_kernel = drop(x)
    if without == "no kernel":
        monkeypatch.setitem(dropout_cpu._state, "fn", None)
        monkeypatch.setattr(dropout_cpu, "_launch", None)  # would fail if called
    else:
        monkeypatch.setattr(dropout_cpu, "usable", lambda t: False)
    torch.manual_seed(5)
    assert torch.equal(drop(x), with_kernel)
    xg = x.clone().requires_grad_()
    torch.manual_seed(5)
    drop(xg).sum().backward()
    assert torch.equal(xg.grad, (with_kernel != 0).float() / (1 - 0.3))


def test_eager_dropout_is_the_registered_op():
    """Eager forward and backward both reach posenc::dropout_cpu, as a compiled graph does."""
    from _op_calls import OpCalls

    x = torch.randn(4, 33, requires_grad=True)
    with OpCalls() as ops:
        dropout_cpu.dropout(x * 1.0, 0.3, inplace=True, seed=9).sum().backward()
    assert ops.names == ["posenc.dropout_cpu.default", "posenc.dropout_cpu.default"]


# ---------------------------------------------------------------------------------------------- compiled
def test_the_op_passes_torch_library_opcheck():
    x = torch.randn(4, 33, dtype=torch.float64, requires_grad=True)
    seed = torch.tensor(-5, dtype=torch.int64)  # an unsigned seed >= 2^63, as int64
    torch.library.opcheck(dropout_cpu.dropout_op, (x, 0.25, seed))
    assert torch.equal(dropout_cpu.dropout_op(x, 0.25, seed), dropout_cpu.dropout(x, 0.25, seed=2**64 - 5))


def test_a_compiled_input_layer_runs_the_kernel_with_the_eager_numbers(monkeypatch):
    """torch.compile(fullgraph=True) keeps the dropout kernel (the registered op) in forward and
    backward, with the same seed drawn from PyTorch's generator: the eager mask and gradients
    (eager on the composed path: gather, LayerNorm, then this kernel)."""
    from posenc.embedding import InputEmbedding
    from posenc.kernels import input_cpu

    monkeypatch.setattr(input_cpu, "usable", lambda *a: False)

    torch.manual_seed(0)
    layer = InputEmbedding(100, 32, "sinusoidal", dropout=0.1).train()
    ids = torch.randint(0, 100, (2, 16))
    torch.manual_seed(1)
    want = layer(ids)
    want.square().sum().backward()
    grad = layer.token.weight.grad.clone()
    layer.zero_grad()
    calls = {"n": 0}
    launch = dropout_cpu._launch

    def counted(*args):
        calls["n"] += 1
        return launch(*args)

    monkeypatch.setattr(dropout_cpu, "_launch", counted)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.manual_seed(1)
    got = compiled(ids)
    assert calls["n"] == 1
    got.square().sum().backward()
    assert calls["n"] == 2
    assert torch.equal(got, want) and torch.equal(layer.token.weight.grad, grad)


def test_compiled_functorch_transforms_take_the_reference_path(monkeypatch):
    """Under torch.compile, a torch.func transform has no rule for the op: the reference dropout
    runs (same mask for the same seed as every other path) and nothing fails."""
    from posenc.embedding import Dropout

    layer = Dropout(0.25).train()
    x = torch.randn(4, 33)
    calls = {"n": 0}
    launch = dropout_cpu._launch

    def counted(*args):
        calls["n"] += 1
        return launch(*args)

    monkeypatch.setattr(dropout_cpu, "_launch", counted)
    grad = torch.compile(torch.func.grad(lambda t: layer(t).sum()), fullgraph=True)(x)
    assert calls["n"] == 0
    kept = grad != 0  # d(sum)/dx is 1/(1-p) where kept, 0 where dropped
    assert torch.allclose(grad[kept], torch.tensor(1 / 0.75)) and 0 < kept.float().mean() < 1
