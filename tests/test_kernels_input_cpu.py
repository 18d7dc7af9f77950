"""Tests of posenc.kernels.input_cpu: the input layer in one pass gives the composition's numbers
(outputs, the dropout mask for a seed, gradients) and is used where it applies."""

from __future__ import annotations

import pytest
import torch

import posenc
from _op_calls import OpCalls
from posenc.kernels import dropout_cpu, input_cpu

pytestmark = pytest.mark.skipif(not input_cpu.available(), reason="no C compiler: the composition runs")


def _composition(module, ids, seed, *, op=False):
    """The module's output with every fast path off: the composition of its modules, or with
    ``op`` the op ``posenc::input_layer_cpu`` without its kernel (its PyTorch ops)."""
    posenc.kernels.set_enabled(False)
    real = input_cpu.usable
    if not op:
        input_cpu.usable = lambda *a: False
    try:
        torch.manual_seed(seed)
        return module(ids)
    finally:
        posenc.kernels.set_enabled(None)
        input_cpu.usable = real


@pytest.mark.parametrize("kernel", [True, False])
def test_eager_input_layer_is_the_registered_op(kernel):
    """In eager mode the fused input layer's forward and backward reach posenc::input_layer_cpu and
    its backward op, with the kernel and without it (its PyTorch ops), as a compiled graph does."""
    layer = posenc.InputEmbedding(40, 8, "sinusoidal", dropout=0.25).train()
    ids = torch.randint(0, 40, (2, 5))
    posenc.kernels.set_enabled(kernel)
    try:
        with OpCalls() as ops:
            layer(ids).square().sum().backward()
    finally:
        posenc.kernels.set_enabled(None)
    assert ops.names == ["posenc.input_layer_cpu.default", "posenc.input_layer_cpu_backward.default"]


@pytest.mark.parametrize("layer_norm", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_the_op_without_its_kernel_gives_the_composition(layer_norm, training):
    """Where the kernel does not run, the op's PyTorch ops give the modules' outputs and gradients
    (the same dropout mask for the seed)."""
    torch.manual_seed(0)
    module = posenc.InputEmbedding(300, 24, "sinusoidal", layer_norm=layer_norm, dropout=0.25, padding_idx=3)
    if layer_norm:
        torch.nn.init.normal_(module.norm.weight)
        torch.nn.init.normal_(module.norm.bias)
    module.train(training)
    ids = torch.randint(0, 300, (3, 17))
    ids[0, :4] = 3
    params = [p for p in module.parameters() if p.requires_grad]
    grad = torch.randn(3, 17, 24)
    posenc.kernels.set_enabled(False)
    try:
        with OpCalls() as ops:
            got = _composition(module, ids, 7, op=True)
            g_got = torch.autograd.grad(got, params, grad)
    finally:
        posenc.kernels.set_enabled(None)
    assert ops.names == ["posenc.input_layer_cpu.default", "posenc.input_layer_cpu_backward.default"]
    want = _composition(module, ids, 7)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    for g, w in zip(g_got, torch.autograd.grad(want, params, grad)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("scheme", ["sinusoidal", "nope"])
@pytest.mark.parametrize("layer_norm", [True, False])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("d", [48, 22])  # 22: a row of one 16-lane block and a remainder, rows unaligned
def test_outputs_and_gradients_match_the_composition(scheme, layer_norm, training, d):
    torch.manual_seed(0)
    module = posenc.InputEmbedding(300, d, scheme, layer_norm=layer_norm, dropout=0.25, padding_idx=3)
    if layer_norm:  # not the identity initialisation, so gamma and beta matter
        torch.nn.init.normal_(module.norm.weight)
        torch.nn.init.normal_(module.norm.bias)
    module.train(training)
    ids = torch.randint(0, 300, (3, 17))
    ids[0, :4] = 3  # padding rows get no gradient
    params = [p for p in module.parameters() if p.requires_grad]
    grad = torch.randn(3, 17, d)
    torch.manual_seed(7)
    got = module(ids)
    want = _composition(module, ids, 7)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    for g, w in zip(torch.autograd.grad(got, params, grad), torch.autograd.grad(want, params, grad)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=2e-5)
    assert torch.equal(torch.autograd.grad(module(ids), module.token.weight, grad)[0][3], torch.zeros(d))


def test_dropout_mask_is_the_dropout_kernels_for_the_seed():
    w, ids = torch.randn(50, 16), torch.randint(0, 50, (4, 9))
    kw = {"scale": 2.0, "table": None, "norm_weight": None, "norm_bias": None, "eps": 0.0}
    kw["padding_idx"] = None
    plain = input_cpu.input_layer(w, ids, p=0.0, **kw)
    dropped = input_cpu.input_layer(w, ids, p=0.4, seed=12345, **kw)
    keep = dropout_cpu.reference_keep_mask(plain.numel(), 0.4, 12345).view(plain.shape)
    assert torch.equal(dropped, plain * torch.where(keep, dropout_cpu.keep_scale(0.4, torch.float32), 0.0))


def test_used_where_it_applies_and_not_elsewhere(monkeypatch):
    calls = []
    real = input_cpu.input_layer
    monkeypatch.setattr(input_cpu, "input_layer", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.randint(0, 40, (2, 5))
    posenc.InputEmbedding(40, 8, "sinusoidal")(ids)
    assert calls == [1]
    posenc.InputEmbedding(40, 8, "learned", scheme_options={"max_len": 5})(ids)  # a trained table
    posenc.InputEmbedding(40, 8, "sinusoidal", dtype=torch.float64)(ids)  # float64 computes in float64
    posenc.InputEmbedding(40, 8, "sinusoidal")(ids, torch.arange(5).expand(2, 5))  # positions per row
    assert calls == [1]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        posenc.InputEmbedding(40, 8, "sinusoidal")(ids + 40)  # checked on the fast path too


def test_the_ops_pass_torch_library_opcheck():
    w, ids = torch.randn(30, 8, requires_grad=True), torch.randint(0, 30, (2, 5))
    table, g, b = torch.randn(5, 8), torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    seed = torch.tensor(99)
    for args in (
        (w, ids, table, g, b, 2.0, 1e-5, 0.3, seed, 4),
        (w, ids, None, None, None, 1.0, 0.0, 0.0, seed, -1),
    ):
        torch.library.opcheck(input_cpu.input_layer_op, args)


def test_a_compiled_input_layer_keeps_the_kernel_and_the_eager_numbers(monkeypatch):
    """torch.compile(fullgraph=True) puts posenc::input_layer_cpu in the graph (forward and
    backward): the eager outputs and gradients, for the same seed."""
    calls = []
    real = input_cpu._fns

    def counted():
        fns = real()
        return tuple((lambda *a, f=f: calls.append(1) or f(*a)) for f in fns)

    torch.manual_seed(0)
    layer = posenc.InputEmbedding(64, 16, "sinusoidal", dropout=0.25).train()
    ids = torch.randint(0, 64, (2, 8))
    torch.manual_seed(5)
    eager = layer(ids)
    (eager_grad,) = torch.autograd.grad(eager.square().sum(), layer.token.weight)
    monkeypatch.setattr(input_cpu, "_fns", counted)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.manual_seed(5)
    out = compiled(ids)
    (grad,) = torch.autograd.grad(out.square().sum(), layer.token.weight)
    assert len(calls) == 2  # the forward and the backward kernel
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)


def test_the_compiled_graph_holds_the_op():
    """torch.compile(fullgraph=True) puts posenc::input_layer_cpu itself in the graph (the eager
    path's operator), with the eager output for the same seed."""
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    layer = posenc.InputEmbedding(64, 16, "sinusoidal", dropout=0.25).train()
    ids = torch.randint(0, 64, (2, 8))
    torch.manual_seed(3)
    eager = layer(ids)
    torch.manual_seed(3)
    got = torch.compile(layer, fullgraph=True, backend=backend)(ids)
    assert "posenc.input_layer_cpu.default" in targets
    assert torch.equal(got, eager)


def test_buffers_are_float32_whatever_the_default_dtype():
    """The kernel writes float32 statistics and scratch rows: a bf16 default dtype changes nothing."""
    w, ids = torch.randn(20, 8), torch.randint(0, 20, (2, 3))
    g, b = torch.ones(8), torch.zeros(8)
    want, _, _ = input_cpu.input_layer_op(w, ids, None, g, b, 1.0, 1e-5, 0.0, torch.tensor(0), -1)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        out, mean, rstd = input_cpu.input_layer_op(w, ids, None, g, b, 1.0, 1e-5, 0.0, torch.tensor(0), -1)
    finally:
        torch.set_default_dtype(old)
    assert mean.dtype == rstd.dtype == torch.float32 and torch.equal(out, want)


def test_the_op_checks_ids_itself_and_dropout_one_takes_the_composition():
    """A compiled graph reaches the op without InputEmbedding's id check: the op refuses ids
    outside the vocabulary itself. p = 1 (dropping everything) is left to the composition."""
    w = torch.randn(20, 8)
    for bad in (20, -1):
        ids = torch.tensor([[0, bad]])
        with pytest.raises(ValueError, match=f"token id {bad} is outside the vocabulary"):
            input_cpu.input_layer_op(w, ids, None, None, None, 1.0, 0.0, 0.0, torch.tensor(0), -1)
    layer = posenc.InputEmbedding(20, 8, "sinusoidal", dropout=0.5).train()
    layer.dropout.p = 1.0
    assert torch.equal(layer(torch.randint(0, 20, (2, 4))), torch.zeros(2, 4, 8))


@pytest.mark.parametrize("training", [True, False])
def test_an_output_past_the_caches_is_streamed_with_the_same_numbers(training):
    """[4, 1024] ids at d = 256 make a 4 MiB output, where the kernel writes with streaming stores
    (AVX, AVX-512): the same numbers as the composition, and as the cached stores of a small call."""
    torch.manual_seed(1)
    module = posenc.InputEmbedding(500, 256, "sinusoidal", layer_norm=True, dropout=0.25).train(training)
    torch.nn.init.normal_(module.norm.weight)
    ids = torch.randint(0, 500, (4, 1024))
    torch.manual_seed(7)
    got = module(ids)
    torch.testing.assert_close(got, _composition(module, ids, 7), rtol=1e-5, atol=2e-6)
    if not training:  # the first 8 positions alone: a 32 KB output, plain stores, the same bits
        assert torch.equal(module(ids[:, :8]), got[:, :8])
