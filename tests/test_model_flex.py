"""FlexAttention for positional biases == the SDPA path with the full bias.

On CUDA a model takes FlexAttention (compiled); here the tests force the decision onto the CPU,
where PyTorch runs FlexAttention eagerly (its reference implementation, the whole score matrix):
the same ``score_mod`` and block mask, so the numbers posenc builds are checked. PyTorch refuses a
backward pass through FlexAttention on a CPU (its CPU kernel has none) by one input check; the
backward tests lift that check to run its eager reference backward, which checks that the
gradients reach q, k, v and the scheme's parameters through posenc's ``score_mod``. The compiled
CUDA kernel is checked by benchmarks/device/flex_check.py.

Tolerance (float32): both sides compute softmax(q k^T / sqrt(d_h) + bias) in float32 and differ only
in the order of the sums: outputs (sums over <= 200 keys) within 1e-5. A gradient of a scheme's
parameter is a sum over every (batch, query, key) pair, ~3e4 terms that largely cancel, so an
element can be small against the terms it sums: gradients are compared within 1e-5 of their
tensor's largest magnitude (at least 1). Measured against a float64 run of the SDPA path, both
sides' errors are ~2e-6 of that scale (KERPLE's power kernel: 2.5e-5 flex, 3.5e-5 SDPA on a gradient
of magnitude 16).
"""

from __future__ import annotations

import pytest
import torch

import posenc
from _model_helpers import config, count_calls, ids_
from posenc.kernels import enabled, set_enabled
from posenc.model import TransformerLM, flex
from posenc.model.attention import attend
from posenc.model.biased import BiasedAttention
from posenc.model.plan import plan_attention

# PyTorch warns that eager FlexAttention materialises the scores: here that is the point (the
# reference implementation on a CPU; the compiled kernel is checked on a GPU)
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")

SCHEMES = {  # name -> build kwargs: three distance tables, a learned function (FIRE), one reading q
    "alibi": {},
    "t5": {"causal": True},
    "kerple_log": {},
    "kerple_power": {},
    "fire": {"init_threshold": 8.0},
    "shaw": {"head_dim": 16, "values": False},
}


@pytest.fixture
def flex_on_cpu(monkeypatch):
    """Let the plan choose FlexAttention for CPU tensors (as it does on CUDA), fast paths permitting."""
    monkeypatch.setattr(flex, "usable", lambda q: enabled())
    yield
    set_enabled(None)


@pytest.fixture
def cpu_backward(monkeypatch):
    """Lift PyTorch's refusal of FlexAttention's backward on CPU (see the module docstring)."""
    import torch.nn.attention.flex_attention as torch_flex

    if not hasattr(torch_flex, "_validate_device"):
        pytest.skip("this torch refuses a CPU backward elsewhere: checked on a GPU only")
    monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)


def _plan(kind: str, b: int, s: int, past: int = 0):
    """An attention plan: ``causal`` (SDPA's causal flag), ``cache`` (after ``past`` keys),
    ``padded`` (left padding, positions ``[b, s]``), ``packed`` (three documents, b = 1)."""
    if kind == "causal":
        return plan_attention(b, s, torch.device("cpu"), causal=True)
    if kind == "cache":
        return plan_attention(
            b, s, torch.device("cpu"), causal=True, past_positions=torch.arange(past), offset=past
        )
    if kind == "padded":
        mask = torch.ones(b, s, dtype=torch.bool)
        mask[0, :7] = False  # left padding of 7 in row 0, none in row 1
        return plan_attention(b, s, torch.device("cpu"), causal=True, attention_mask=mask)
    if kind == "packed":
        return plan_attention(1, s, torch.device("cpu"), causal=True, cu_seqlens=torch.tensor([0, 50, 51, s]))
    raise AssertionError(kind)


def _scheme(name: str, h: int):
    torch.manual_seed(1)
    scheme = posenc.build(name, num_heads=h, **SCHEMES[name])
    with torch.no_grad():  # away from the initial values, so every parameter matters
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return scheme


def _inputs(b, h, h_kv, s, s_k, d=16, grad=False):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(b, h, s, d, generator=gen)
    k, v = (torch.randn(b, h_kv, s_k, d, generator=gen) for _ in range(2))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _case(name, kind, heads):
    return pytest.param(name, kind, heads, id=f"{name}-{kind}-{'gqa' if heads[1] < heads[0] else 'mha'}")


MHA, GQA = (4, 4), (4, 2)
CASES = [  # every scheme causal and padded, MHA and GQA; after a cache and packed with GQA
    *(_case(n, kind, heads) for n in SCHEMES for kind in ("causal", "padded") for heads in (MHA, GQA)),
    *(_case(n, kind, GQA) for n in SCHEMES for kind in ("cache", "packed")),
]
GRAD_CASES = [  # every scheme with a gradient to give (ALiBi has no parameters: q, k, v)
    *(_case(n, "causal", GQA) for n in SCHEMES),
    *(_case(n, "padded", MHA) for n in SCHEMES),
]


def _both_paths(name, kind, heads, grad):
    """(flex output, SDPA full-bias output, inputs, scheme) for one case."""
    h, h_kv = heads
    b, s, past = (1 if kind == "packed" else 2), 130, (60 if kind == "cache" else 0)
    plan = _plan(kind, b, s, past)
    scheme = _scheme(name, h)
    q, k, v = _inputs(b, h, h_kv, s, s + past, grad=grad)
    attention = plan.bias_blocks(scheme, q)
    assert isinstance(attention, flex.FlexBiasedAttention)
    out = attention(q, k, v)
    want = attend(q, k, v, plan=plan, bias=plan.score_bias(scheme, q))
    return out, want, (q, k, v), scheme


@pytest.mark.parametrize(("name", "kind", "heads"), CASES)
def test_flex_forward_equals_sdpa_with_the_full_bias(name, kind, heads, flex_on_cpu):
    with torch.no_grad():
        out, want, _, _ = _both_paths(name, kind, heads, grad=False)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("name", "kind", "heads"), GRAD_CASES)
def test_flex_backward_equals_sdpa_with_the_full_bias(name, kind, heads, flex_on_cpu, cpu_backward):
    out, want, inputs, scheme = _both_paths(name, kind, heads, grad=True)
    params = [p for p in scheme.parameters() if p.requires_grad]
    wrt = [*inputs, *params]
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, wrt, g, allow_unused=True)
    ref = torch.autograd.grad(want, wrt, g, allow_unused=True)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for a, r in zip(got, ref):
        assert (a is None) == (r is None)
        if r is not None:
            scale = max(r.abs().max().item(), 1.0)
            torch.testing.assert_close(a, r, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("position", ["t5", "kerple_log"])
def test_the_model_takes_flex_and_matches_the_full_bias_path(
    position, monkeypatch, flex_on_cpu, cpu_backward
):
    """A model on the FlexAttention path: one flex call per layer, the logits and gradients of the
    full-bias path (fast paths off), also for a prefill after a KV cache."""
    calls = count_calls(monkeypatch, flex, "flex_attention_function")
    torch.manual_seed(0)
    model = TransformerLM(config(position, d_model=64, max_len=512)).eval()
    ids = ids_(2, 150)

    def run(fast: str):
        monkeypatch.setenv("POSENC_C_KERNELS", fast)
        set_enabled(None)
        calls.clear()
        model.zero_grad()
        logits = model(ids).logits
        logits.square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        with torch.no_grad():
            cache = model.new_cache()
            model(ids[:, :10], cache=cache)  # 10 queries: below FLEX_MIN_QUERIES on a GPU, forced here
            chunk = model(ids[:, 10:], cache=cache).logits  # 140 queries after 10 cached keys
        assert len(calls) == (3 * model.config.num_layers if fast == "1" else 0)
        return logits.detach(), grads, chunk

    fast, slow = run("1"), run("0")
    torch.testing.assert_close(fast[0], slow[0], rtol=1e-5, atol=1e-5)
    assert len(fast[1]) == len(slow[1]) > 0
    for a, b in zip(fast[1], slow[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fast[2], slow[0][:, 10:], rtol=1e-4, atol=1e-4)


def test_training_with_dropout_takes_sdpa_with_the_full_bias(monkeypatch, flex_on_cpu):
    """FlexAttention has no dropout: a model in training with attention dropout gets SDPA with the
    full bias, the same numbers (same random stream) as with fast paths off."""
    calls = count_calls(monkeypatch, flex, "flex_attention_function")
    torch.manual_seed(0)
    model = TransformerLM(config("alibi", d_model=64, max_len=512, dropout=0.1)).train()
    ids = ids_(1, 140)
    outs = []
    for fast in ("1", "0"):
        monkeypatch.setenv("POSENC_C_KERNELS", fast)
        set_enabled(None)
        torch.manual_seed(5)
        outs.append(model(ids).logits)
    assert not calls
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_flex_attention_refuses_dropout():
    attention = flex.FlexBiasedAttention(lambda s, b, h, i, j: s, None, lambda: None)
    assert isinstance(attention, BiasedAttention)
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(ValueError, match=r"dropout_p=0\.1"):
        attention(q, q, q, dropout_p=0.1)


def test_usable_only_for_eager_cuda_tensors_of_enough_queries():
    assert not flex.usable(torch.randn(1, 2, 512, 64))  # a CPU keeps the blocked path
    meta = torch.empty(1, 2, 512, 64, device="meta")
    assert not flex.usable(meta)


def test_widely_spread_positions_take_the_materialised_bias():
    """Positions spread far apart (a distance table would be larger than the bias itself) never
    build a table per distance: the bias is looked up, with the same numbers."""
    h, s = 2, 20
    scheme = posenc.build("alibi", num_heads=h)
    pos = torch.arange(s)[None].repeat(2, 1)
    pos[1] *= 2**40  # row 1: positions 0, 2^40, 2 * 2^40, ...
    seen = []
    original = scheme.distance_bias
    scheme.distance_bias = lambda d: seen.append(d.numel()) or original(d)
    mod = flex.score_mod(scheme, pos, pos)
    assert not seen
    q, k, v = _inputs(2, h, h, s, s)
    out = flex.flex_attention_function(q.device)(q, k, v, score_mod=mod)
    want = attend(q, k, v, bias=scheme.score_bias(pos, pos))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
