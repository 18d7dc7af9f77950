"""Tests of posenc.kernels._settings: the one switch (read once, changed at run time) and the one
check that a call may take a fast path."""

from __future__ import annotations

import pytest
import torch

from posenc.kernels import _settings, enabled, set_enabled


def test_the_environment_is_read_once_and_set_enabled_overrides_it(monkeypatch):
    monkeypatch.setenv("POSENC_C_KERNELS", "off")
    set_enabled(None)
    assert not enabled()
    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    assert not enabled()  # read once: the change is not seen ...
    set_enabled(None)
    assert enabled()  # ... until it is read again
    set_enabled(False)
    assert not enabled()
    set_enabled(True)
    monkeypatch.setenv("POSENC_C_KERNELS", "0")
    assert enabled()  # an explicit choice wins over the environment
    for bad in ("0", 1, "off"):
        with pytest.raises(TypeError, match="on must be True, False or None"):
            set_enabled(bad)


@pytest.mark.parametrize("value", ["0", "false", "No", " OFF "])
def test_every_spelling_of_off(monkeypatch, value):
    monkeypatch.setenv("POSENC_C_KERNELS", value)
    set_enabled(None)
    assert not enabled()


# torch.jit.trace is deprecated, but posenc still guards its fast paths against it: the call is the test
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_eager_accepts_plain_tensors_only():
    x = torch.ones(3)
    assert _settings.eager(x, torch.zeros(2))
    p = torch.nn.Parameter(torch.ones(3))
    assert not _settings.eager(p) and _settings.eager(p, parameters=True)

    class Sub(torch.Tensor):
        pass

    assert not _settings.eager(x.as_subclass(Sub))
    seen = []

    def f(t):
        seen.append(_settings.eager(t))
        return t.sin().sum()

    torch.func.grad(f)(x)  # inside a functorch transform: a wrapped tensor
    torch.jit.trace(lambda t: (seen.append(_settings.eager(t)), t * 2)[1], (x,), check_trace=False)
    assert seen == [False, False]


def test_parameter_subclasses_count_as_parameters():
    class Tagged(torch.nn.Parameter):
        pass

    w = Tagged(torch.ones(2, 2))
    assert _settings.eager(w, parameters=True) and not _settings.eager(w)


def test_records_nothing_only_where_autograd_has_nothing_to_record():
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    assert _settings.records_nothing(w) is None  # a gradient to record
    assert _settings.records_nothing(x) is not None
    with torch.no_grad():
        assert _settings.records_nothing(w) is not None
    with _settings.records_nothing(x):  # below autograd: nothing recorded, even for w
        y = w * 2
    assert y.grad_fn is None
    compiled = torch.compile(lambda t: (_settings.records_nothing(t) is None, t + 1), fullgraph=True)
    assert compiled(x)[0]  # while torch.compile traces: None


def test_a_compiled_graph_keeps_the_ops_where_dynamo_folds_is_exporting_to_true(monkeypatch):
    """TorchDynamo before torch 2.13 answers ``torch.compiler.is_exporting()`` with True under every
    ``torch.compile`` (seen with torch 2.11: compiled graphs held the reference's ops, not posenc's).
    With the call made to answer so here, a compiled RoPE still holds ``posenc::rope_cpu``, and
    ``torch.export`` still keeps the reference's aten ops."""
    import posenc

    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: torch.compiler.is_compiling())
    rope = posenc.RotaryEmbedding(16)
    cos, sin = rope.cos_sin(torch.arange(5))
    x = torch.randn(2, 3, 5, 16)
    targets = []

    def capture(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(lambda t: posenc.apply_rotary(t, cos, sin), fullgraph=True, backend=capture)(x)
    torch._dynamo.reset()
    assert "posenc.rope_cpu.default" in targets, sorted(set(targets))
    torch.testing.assert_close(got, posenc.apply_rotary(x, cos, sin), rtol=0, atol=0)

    class Rotate(torch.nn.Module):
        def forward(self, t):
            return posenc.apply_rotary(t, cos, sin)

    exported = torch.export.export(Rotate(), (x,))
    assert not any("posenc" in str(n.target) for n in exported.graph.nodes)
