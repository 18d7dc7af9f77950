import math

import pytest
import torch
from torch import nn

import posenc
from posenc.absolute import LearnedPE, SinusoidalPE, sinusoidal_table
from posenc.base import PositionalScheme
from posenc.embedding import TIE_STRATEGIES, InputEmbedding, TokenEmbedding, apply_tying, tie_weights


def test_token_embedding_scales_by_sqrt_d_model():
    emb = TokenEmbedding(100, 64)
    ids = torch.tensor([[1, 2, 3], [4, 5, 99]])
    torch.testing.assert_close(emb(ids), emb.weight[ids] * 8.0)


def test_scale_options_and_unit_variance_init():
    assert TokenEmbedding(10, 16, scale=None).scale == 1.0
    assert TokenEmbedding(10, 16, scale=2.5).scale == 2.5
    emb = TokenEmbedding(5000, 256)
    # init std 1/sqrt(d) so that the scaled output has unit variance (what the sqrt(d) factor is for)
    out = emb(torch.arange(5000))
    assert abs(out.std().item() - 1.0) < 0.02
    assert TokenEmbedding(10, 16, init_std=0.02).init_std == 0.02


def test_lookup_equals_one_hot_matmul():
    """Seed 003: an embedding lookup is a one-hot vector times the weight matrix."""
    emb = TokenEmbedding(10, 4, scale=None).double()
    ids = torch.tensor([1, 3, 5])
    one_hot = nn.functional.one_hot(ids, 10).double()  # [3, 10]
    torch.testing.assert_close(one_hot @ emb.weight, emb(ids), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_any_integer_ids_dtype(dtype):
    """Byte corpora are uint8 tensors: every integer dtype gives what int64 ids give."""
    emb = TokenEmbedding(100, 8)
    ids = torch.tensor([[1, 2, 99], [0, 5, 7]])
    torch.testing.assert_close(emb(ids.to(dtype)), emb(ids), rtol=0, atol=0)


def test_padding_idx_is_zero_and_untrained():
    emb = TokenEmbedding(10, 8, padding_idx=0)
    assert torch.count_nonzero(emb.weight[0]) == 0
    emb(torch.tensor([[0, 1]])).sum().backward()
    assert torch.count_nonzero(emb.weight.grad[0]) == 0 and torch.count_nonzero(emb.weight.grad[1]) > 0


@pytest.mark.parametrize(
    ("ids", "err", "match"),
    [
        (
            torch.tensor([[1, 10]]),
            ValueError,
            r"token id 10 at index \(0, 1\) is outside the vocabulary \[0, 10\)",
        ),
        (torch.tensor([[-1, 2]]), ValueError, r"token id -1 at index \(0, 0\)"),
        (torch.tensor([[1.0, 2.0]]), TypeError, "ids must be an integer tensor, got dtype torch.float32"),
        ([[1, 2]], TypeError, "ids must be an integer tensor"),
    ],
)
def test_bad_ids(ids, err, match):
    with pytest.raises(err, match=match):
        TokenEmbedding(10, 8)(ids)


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"vocab_size": 0, "d_model": 8}, ValueError, "vocab_size must be >= 1"),
        ({"vocab_size": 10, "d_model": 8, "scale": "sqrt"}, ValueError, "unknown scale 'sqrt'"),
        ({"vocab_size": 10, "d_model": 8, "scale": -1.0}, ValueError, "scale must be a finite number > 0"),
        (
            {"vocab_size": 10, "d_model": 8, "padding_idx": 10},
            ValueError,
            "padding_idx must be < vocab_size=10",
        ),
    ],
)
def test_bad_config(kwargs, err, match):
    with pytest.raises(err, match=match):
        TokenEmbedding(**kwargs)


def _count(*modules):
    params = {id(p): p for m in modules for p in m.parameters()}
    return sum(p.numel() for p in params.values())


def test_output_tying_halves_parameters_and_shares_storage():
    V, d = 1000, 32
    emb, out = TokenEmbedding(V, d), nn.Linear(d, V, bias=False)
    assert _count(emb, out) == 2 * V * d
    tie_weights(emb, out)
    assert _count(emb, out) == V * d
    assert out.weight.data_ptr() == emb.weight.data_ptr()
    with torch.no_grad():
        emb.weight[3, 0] = 42.0
    assert out.weight[3, 0].item() == 42.0


@pytest.mark.parametrize("strategy", list(TIE_STRATEGIES))
def test_tying_strategies(strategy):
    V, d = 50, 8
    enc, dec, out = TokenEmbedding(V, d), TokenEmbedding(V, d), nn.Linear(d, V, bias=False)
    apply_tying(strategy, encoder_embedding=enc, decoder_embedding=dec, output=out)
    expected = {"none": 3, "encoder_decoder": 2, "output": 2, "three_way": 1}[strategy]
    assert _count(enc, dec, out) == expected * V * d
    if strategy in ("encoder_decoder", "three_way"):
        assert dec.weight is enc.weight
    if strategy in ("output", "three_way"):
        assert out.weight is dec.weight


def test_tying_errors():
    with pytest.raises(ValueError, match=r"cannot tie targets\[0\] with weight \(10, 9\)"):
        tie_weights(TokenEmbedding(10, 8), nn.Linear(9, 10))
    with pytest.raises(ValueError, match="unknown tying strategy 'all'; valid: none"):
        apply_tying("all")
    with pytest.raises(ValueError, match="needs encoder_embedding"):
        apply_tying("three_way", decoder_embedding=TokenEmbedding(10, 8), output=nn.Linear(8, 10))
    with pytest.raises(TypeError, match="has no weight to tie"):
        tie_weights(TokenEmbedding(10, 8), nn.ReLU())


def test_input_embedding_is_the_seed_pipeline():
    """ids -> E[ids] * sqrt(d) -> + PE -> LayerNorm -> dropout (eval: identity)."""
    layer = InputEmbedding(100, 16, "sinusoidal", layer_norm=True, dropout=0.1).eval()
    ids = torch.randint(0, 100, (2, 6))
    expected = layer.token.weight[ids] * 4.0 + sinusoidal_table(6, 16)
    expected = nn.functional.layer_norm(expected, (16,), layer.norm.weight, layer.norm.bias)
    torch.testing.assert_close(layer(ids), expected)
    out = layer(ids)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 6), atol=1e-3, rtol=0)


def test_input_embedding_dropout_in_train_only():
    layer = InputEmbedding(100, 256, dropout=0.5, layer_norm=False)
    ids = torch.randint(0, 100, (4, 64))
    zeros = (layer.train()(ids) == 0).float().mean().item()
    assert 0.45 < zeros < 0.55
    assert (layer.eval()(ids) == 0).float().mean().item() < 0.01


def test_input_embedding_positions_and_schemes():
    layer = InputEmbedding(50, 8, "learned", layer_norm=False, dropout=0.0, scheme_options={"max_len": 20})
    assert isinstance(layer.position, LearnedPE) and layer.position.max_len == 20
    ids = torch.randint(0, 50, (1, 4))
    pos = torch.tensor([10, 11, 12, 13])
    torch.testing.assert_close(layer(ids, pos), layer.token(ids) + layer.position.weight[pos])
    built = SinusoidalPE(8)
    assert InputEmbedding(50, 8, built).position is built
    # a scheme without an embed hook acts in attention: nothing is added here
    nope = InputEmbedding(50, 8, "nope", layer_norm=False, dropout=0.0)
    assert nope.position is None
    torch.testing.assert_close(nope(ids), nope.token(ids))


def test_input_embedding_errors():
    with pytest.raises(ValueError, match="unknown scheme 'sinusoid'"):
        InputEmbedding(10, 8, "sinusoid")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['max_length'\] for scheme 'learned'"):
        InputEmbedding(10, 8, "learned", scheme_options={"max_length": 5})
    with pytest.raises(ValueError, match="dropout must be in"):
        InputEmbedding(10, 8, dropout=1.5)
    with pytest.raises(ValueError, match=r"ids must have shape \[b, s\]"):
        InputEmbedding(10, 8)(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="scheme_options only apply"):
        InputEmbedding(10, 8, SinusoidalPE(8), scheme_options={"base": 10.0})


def test_input_embedding_compile_and_meta():
    layer = InputEmbedding(64, 32, "sinusoidal", dropout=0.0).eval()
    ids = torch.randint(0, 64, (2, 12))
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(ids), layer(ids), rtol=1e-5, atol=1e-5)
    with torch.device("meta"):
        meta = InputEmbedding(64, 32, "learned", scheme_options={"max_len": 16})
    assert all(p.is_meta for p in meta.parameters())


def test_bf16_input_embedding_keeps_positions_distinct():
    layer = InputEmbedding(8, 64, "sinusoidal", layer_norm=False, dropout=0.0).to(torch.bfloat16)
    ids = torch.zeros(1, 4096, dtype=torch.long)
    out = layer(ids)[0]
    assert out.dtype == torch.bfloat16
    assert torch.unique(out, dim=0).shape[0] == 4096


def test_embed_hooks_identity_for_base_scheme():
    scheme = posenc.build("nope")
    assert isinstance(scheme, PositionalScheme) and scheme.hooks == ()
    x, q, k = torch.randn(1, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    assert scheme.embed(x) is x
    assert scheme.rotate(q, k) == (q, k)
    assert scheme.score_bias(torch.arange(3), torch.arange(3)) is None
    assert math.isclose(TokenEmbedding(3, 49).scale, 7.0)


# ---------------------------------------------------------------------------------------------------
# Fast path (CPU, train mode): dropout by posenc.kernels.dropout_cpu; same numbers as the reference
# composition for the same mask, eval mode unchanged. These tests keep the layer on its composed
# path (the one-pass kernel of kernels.input_cpu, whose LayerNorm rounds differently, has its own
# tests in test_kernels_input_cpu.py).
# ---------------------------------------------------------------------------------------------------
from posenc.kernels import dropout_cpu  # noqa: E402

needs_kernel = pytest.mark.skipif(not dropout_cpu.available(), reason="no C compiler: reference path only")


@pytest.fixture(autouse=False)
def composed(monkeypatch):
    """InputEmbedding on its composed path: gather, add, LayerNorm, then the dropout kernel."""
    from posenc.kernels import input_cpu

    monkeypatch.setattr(input_cpu, "usable", lambda *a: False)


def _reference(layer, ids, keep=None):
    """The pipeline written out with PyTorch ops; ``keep`` applies dropout with that mask."""
    d = layer.token.d_model
    x = nn.functional.embedding(ids, layer.token.weight) * layer.token.scale
    x = x + sinusoidal_table(ids.shape[1], d)
    x = nn.functional.layer_norm(x, (d,), layer.norm.weight, layer.norm.bias)
    if keep is None:
        return x
    noise = keep.float()
    noise.div_(1 - layer.dropout.p)  # aten's dropout: x * (keep / (1 - p))
    return x * noise


@needs_kernel
@pytest.mark.usefixtures("composed")
def test_fast_train_forward_equals_reference_for_its_mask():
    layer = InputEmbedding(100, 48, "sinusoidal", layer_norm=True, dropout=0.2).train()
    ids = torch.randint(0, 100, (3, 11))
    torch.manual_seed(42)
    out = layer(ids)
    torch.manual_seed(42)
    keep = dropout_cpu.keep_mask(out.shape, 0.2, dropout_cpu.draw_seed())  # the seed forward drew
    assert torch.equal(out, _reference(layer, ids, keep))
    assert 0.1 < 1 - keep.float().mean().item() < 0.3


@needs_kernel
@pytest.mark.usefixtures("composed")
def test_fast_train_gradients_equal_reference():
    layer = InputEmbedding(50, 16, "sinusoidal", layer_norm=True, dropout=0.3).train()
    ids = torch.randint(0, 50, (2, 9))
    g = torch.randn(2, 9, 16)
    torch.manual_seed(1)
    layer(ids).backward(g)
    fast = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    torch.manual_seed(1)
    keep = dropout_cpu.keep_mask((2, 9, 16), 0.3, dropout_cpu.draw_seed())
    _reference(layer, ids, keep).backward(g)
    for a, (name, p) in zip(fast, layer.named_parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.usefixtures("composed")
def test_eval_mode_is_exactly_the_reference():
    layer = InputEmbedding(100, 32, "sinusoidal", layer_norm=True, dropout=0.5).eval()
    ids = torch.randint(0, 100, (2, 7))
    assert torch.equal(layer(ids), _reference(layer, ids))


@pytest.mark.usefixtures("composed")
def test_train_mode_without_the_kernel_draws_the_kernels_mask(monkeypatch):
    """A machine without a compiler (or POSENC_C_KERNELS=0) gives the same dropout for a seed."""
    layer = InputEmbedding(100, 64, layer_norm=True, dropout=0.5).train()
    ids = torch.randint(0, 100, (4, 32))
    torch.manual_seed(3)
    with_kernel = layer(ids)
    monkeypatch.setitem(dropout_cpu._state, "fn", None)
    torch.manual_seed(3)
    out = layer(ids)
    torch.manual_seed(3)
    ref = dropout_cpu.reference_dropout(_reference(layer, ids), 0.5)
    assert torch.equal(out, ref) and torch.equal(out, with_kernel)


def test_train_mode_compiles():
    layer = InputEmbedding(64, 16, "sinusoidal", layer_norm=True, dropout=0.25).train()
    out = torch.compile(layer, fullgraph=True)(torch.randint(0, 64, (2, 8)))
    assert out.shape == (2, 8, 16) and 0 < (out == 0).sum() < out.numel()


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_huge_page_gather_equals_nn_embedding(monkeypatch, padding_idx):
    """kernels.embedding_cpu (used for large outputs): same rows, same weight gradient."""
    from posenc.kernels import _memory, embedding_cpu

    monkeypatch.setattr(embedding_cpu, "_MIN_BYTES", 0)
    monkeypatch.setattr(_memory, "hugepages_enabled", lambda: True)
    emb = TokenEmbedding(40, 8, padding_idx=padding_idx)
    ids = torch.tensor([[3, 1, 3, 39], [0, 3, 7, 7]])
    assert embedding_cpu.usable(emb.weight, ids)
    g = torch.randn(2, 4, 8)
    out = emb(ids)
    out.backward(g)
    ref_weight = emb.weight.detach().clone().requires_grad_()
    ref = nn.functional.embedding(ids, ref_weight, padding_idx) * emb.scale
    ref.backward(g)
    assert torch.equal(out, ref)
    assert torch.equal(emb.weight.grad, ref_weight.grad)


def test_shared_positions_added_in_place_match_embed():
    """Sinusoidal/learned tables for positions shared by the batch are added in place: same numbers
    as scheme.embed(x, positions); per-row positions [b, s] take embed itself."""
    for scheme, opts in (("sinusoidal", None), ("learned", {"max_len": 40}), ("scaled_sinusoidal", None)):
        layer = InputEmbedding(30, 16, scheme, layer_norm=False, dropout=0.0, scheme_options=opts)
        ids = torch.randint(0, 30, (3, 9))
        for pos in (None, torch.arange(5, 14), torch.arange(27).view(3, 9)):
            want = layer.position.embed(layer.token(ids), pos)
            assert torch.equal(layer(ids, pos), want), (scheme, pos)


def test_dropout_module_is_nn_dropout_with_the_fast_path():
    from posenc.embedding import Dropout

    drop = Dropout(0.25)
    assert isinstance(drop, nn.Dropout)
    x = torch.randn(4, 64)
    before = x.clone()
    torch.manual_seed(0)
    y = drop(x)
    assert torch.equal(x, before)  # not in place unless asked
    if dropout_cpu.available():
        torch.manual_seed(0)
        keep = dropout_cpu.keep_mask(x.shape, 0.25, dropout_cpu.draw_seed())
        assert torch.equal(y, x * (keep.float() / 0.75))
    assert drop(x, inplace=True) is x  # the caller owns x
    drop.eval()
    assert torch.equal(drop(before), before)
    assert torch.equal(Dropout(0.0).train()(before), before)


def test_token_and_input_embedding_take_factory_kwargs():
    tok = TokenEmbedding(10, 4, device="meta", dtype=torch.float16)
    assert tok.weight.is_meta and tok.weight.dtype == torch.float16
    layer = InputEmbedding(10, 4, "learned", scheme_options={"max_len": 8}, dtype=torch.float64)
    assert {p.dtype for p in layer.parameters()} == {torch.float64}
    assert layer(torch.tensor([[1, 2, 3]])).dtype == torch.float64


@pytest.mark.parametrize("name", ["sinusoidal", "scaled_sinusoidal", "learned"])
@pytest.mark.parametrize("positions", [None, torch.tensor([3, 1, 4, 1, 5, 9, 2])])
def test_additive_rows_are_what_embed_adds(name, positions):
    """additive_rows [s, d] is embed of zeros, bit for bit (the table the input layer adds once)."""
    scheme = posenc.build(name, d_model=8, **({"max_len": 16} if name == "learned" else {}))
    like = torch.randn(3, 7, 8)
    rows = scheme.additive_rows(like, positions)
    assert rows.shape == (7, 8)
    assert torch.equal(rows, scheme.embed(torch.zeros(1, 7, 8), positions)[0])
    assert torch.equal(like + rows, scheme.embed(like, positions))


def test_input_embedding_asks_additive_rows_only_of_the_class_that_defines_embed():
    """A subclass that overrides embed alone (or an instance with embed replaced) keeps its own
    numbers: the layer then adds embed of zeros, never the parent's table."""

    def doubled(scheme, x, positions=None):
        return x + 2 * scheme.table(torch.arange(x.shape[1]), x.dtype)

    class Doubled(SinusoidalPE):
        embed = doubled

    ids = torch.randint(0, 50, (2, 6))
    for scheme in (Doubled(8), SinusoidalPE(8)):
        if type(scheme) is SinusoidalPE:
            scheme.embed = lambda x, positions=None, s=scheme: doubled(s, x, positions)
        layer = InputEmbedding(50, 8, scheme, layer_norm=False, dropout=0.0)
        want = layer.token(ids) + 2 * sinusoidal_table(6, 8)
        torch.testing.assert_close(layer(ids), want, rtol=0, atol=1e-6)


def test_input_layer_defaults_are_the_models():
    """InputEmbedding built alone used LayerNorm and dropout 0.1 while ModelConfig's input layer has
    neither: one set of defaults now (sqrt(d) scale, 1/sqrt(d) init, no LayerNorm, no dropout)."""
    from posenc.model import ModelConfig, TransformerLM

    alone = InputEmbedding(64, 32, "sinusoidal")
    model = TransformerLM(
        ModelConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2, position="sinusoidal")
    )
    inside = model.decoder.embed
    assert isinstance(alone.norm, torch.nn.Identity) and isinstance(inside.norm, torch.nn.Identity)
    assert alone.dropout.p == inside.dropout.p == 0.0
    assert alone.token.scale == inside.token.scale == 32**0.5
    assert alone.token.init_std == inside.token.init_std == pytest.approx(32**-0.5)
    unscaled = TransformerLM(
        ModelConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2, embed_scale=None)
    )
    assert InputEmbedding(64, 32, scale=None).token.init_std == unscaled.decoder.embed.token.init_std
    ids = torch.randint(0, 64, (2, 7))
    inside.token.weight.data.copy_(alone.token.weight)
    assert torch.equal(alone.train()(ids), inside.train()(ids))  # the same layer, in training too


def test_input_embedding_takes_a_token_embedding():
    """A pretrained TokenEmbedding goes into the input layer as it is (not copied, still frozen)."""
    weights = torch.randn(20, 8, dtype=torch.float64)
    token = TokenEmbedding.from_pretrained(weights, freeze=True, padding_idx=0)
    layer = InputEmbedding.from_token_embedding(
        token, "learned", layer_norm=True, scheme_options={"max_len": 6}
    )
    assert layer.token is token and not layer.token.weight.requires_grad
    assert layer.norm.weight.dtype == torch.float64 and layer.position.weight.dtype == torch.float64
    ids = torch.tensor([[0, 3, 19]])
    with torch.no_grad():
        want = layer.norm(layer.position.embed(weights[ids]))
    torch.testing.assert_close(layer.eval()(ids), want)
    assert {n for n, _ in layer.named_parameters()} >= {"token.weight", "position.weight", "norm.weight"}
    with pytest.raises(TypeError, match=r"TokenEmbedding\.from_pretrained"):
        InputEmbedding.from_token_embedding(weights)
