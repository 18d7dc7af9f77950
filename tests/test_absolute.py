import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc._precision import position_angles
from posenc.absolute import (
    LearnedPE,
    ScaledSinusoidalPE,
    SinusoidalPE,
    sinusoidal_frequencies,
    sinusoidal_table,
)

EPS32 = 2.0**-24  # float32 unit roundoff


# ---------------------------------------------------------------------------------------------
# float64 references written from the papers, element by element
# ---------------------------------------------------------------------------------------------
def vaswani_reference(positions, d, base=10000.0):
    """Vaswani et al. 2017, section 3.5: PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(...)."""
    out = np.zeros((len(positions), d))
    for r, p in enumerate(positions):
        for i in range(d // 2):
            out[r, 2 * i] = math.sin(p / base ** (2 * i / d))
            out[r, 2 * i + 1] = math.cos(p / base ** (2 * i / d))
    return out


def t2t_reference(positions, d, base=10000.0):
    """tensor2tensor get_timing_signal_1d: timescales from 1 to base, log-spaced over d/2 - 1 steps."""
    half = d // 2
    increment = math.log(base) / (half - 1)
    out = np.zeros((len(positions), d))
    for r, p in enumerate(positions):
        for i in range(half):
            angle = p * math.exp(-i * increment)
            out[r, i], out[r, half + i] = math.sin(angle), math.cos(angle)
    return out


def angle_tolerance(max_position: int) -> float:
    # float32 angles: |error| <= |p w| * (a few ulps); sin/cos are 1-Lipschitz.
    return 4 * max(max_position, 1) * EPS32 + 1e-6


@pytest.mark.parametrize("d", [2, 4, 16, 64, 130])
def test_vaswani_matches_float64_reference(d):
    positions = [0, 1, 2, 3, 17, 511, 4095, 100_000]
    ref = vaswani_reference(positions, d)
    got = sinusoidal_table(torch.tensor(positions), d).double().numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=angle_tolerance(max(positions)))
    got64 = sinusoidal_table(torch.tensor(positions), d, dtype=torch.float64).numpy()
    np.testing.assert_allclose(got64, ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("d", [4, 16, 64, 130])
def test_tensor2tensor_matches_float64_reference(d):
    positions = [0, 1, 5, 99, 2047]
    ref = t2t_reference(positions, d)
    got = sinusoidal_table(torch.tensor(positions), d, variant="tensor2tensor").double().numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=angle_tolerance(max(positions)))


@pytest.mark.parametrize("d", [4, 16, 512, 1024])
def test_tensor2tensor_matches_fairseq_via_hf(d):
    """HF's M2M100SinusoidalPositionalEmbedding.get_embedding is fairseq's code (the tensor2tensor layout)."""
    m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
    theirs = m2m.M2M100SinusoidalPositionalEmbedding.get_embedding(300, d)
    ours = sinusoidal_table(300, d, variant="tensor2tensor")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=angle_tolerance(300))


@pytest.mark.parametrize("d", [8, 64, 100])
def test_vaswani_matches_positional_encodings_package(d):
    pe_pkg = pytest.importorskip("positional_encodings.torch_encodings")
    theirs = pe_pkg.PositionalEncoding1D(d)(torch.zeros(1, 50, d))[0]
    torch.testing.assert_close(sinusoidal_table(50, d), theirs, rtol=0, atol=angle_tolerance(50))


def test_seed_004_printed_values():
    """Seed 004 section 4.1 prints positions 0-2, dims 0-7 of a d=16 table (to 4 decimals).

    Position 0 and dims 0-1 (frequency 1) of positions 1-2 are right and are checked here. The
    remaining printed values (e.g. 0.7295 at position 1, dim 2) cannot come from any sinusoidal
    table: the phases they imply at positions 1 and 2 need different frequencies (checked below),
    and the code printed beside them gives sin(10000^(-1/8)) = 0.3110. docs/absolute.md records it.
    """
    seed_rows = {
        0: [0.0000, 1.0000, 0.0000, 1.0000, 0.0000, 1.0000, 0.0000, 1.0000],
        1: [0.8415, 0.5403, 0.7295, 0.6840, 0.6325, 0.7746, 0.5481, 0.8364],
        2: [0.9093, -0.4161, 0.9364, -0.3509, 0.9533, -0.3020, 0.9640, -0.2659],
    }
    table = sinusoidal_table(3, 16)
    np.testing.assert_allclose(table[0, :8].numpy(), seed_rows[0], atol=5e-5)
    for p in (1, 2):
        np.testing.assert_allclose(table[p, :2].numpy(), seed_rows[p][:2], atol=5e-5)
    # The rest is inconsistent: a frequency w gives phase w at position 1 and 2w at position 2.
    for pair in (1, 2, 3):
        w1 = math.atan2(seed_rows[1][2 * pair], seed_rows[1][2 * pair + 1])
        w2 = math.atan2(seed_rows[2][2 * pair], seed_rows[2][2 * pair + 1]) / 2
        assert abs(w1 - w2) > 0.1, "seed values would be consistent with one frequency"
        assert abs(table[1, 2 * pair].item() - seed_rows[1][2 * pair]) > 0.1


def _rotation(k: int, freqs: torch.Tensor) -> torch.Tensor:
    """Block-diagonal M_k with PE(p + k) = M_k PE(p) for the interleaved layout (float64)."""
    blocks = []
    for w in freqs.tolist():
        c, s = math.cos(k * w), math.sin(k * w)
        # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
        blocks.append(torch.tensor([[c, s], [-s, c]], dtype=torch.float64))
    return torch.block_diag(*blocks)


@given(
    half=st.integers(1, 48),
    p=st.integers(0, 10_000),
    k=st.integers(-5_000, 5_000),
    base=st.sampled_from([100.0, 10000.0, 500000.0]),
)
def test_shift_is_a_fixed_rotation(half, p, k, base):
    """Seed 004 section 3.3: PE(p + k) = M_k PE(p), with M_k independent of p."""
    d = 2 * half
    freqs = sinusoidal_frequencies(d, base, dtype=torch.float64)
    pe = sinusoidal_table(torch.tensor([p, p + k]), d, base, dtype=torch.float64)
    m_k = _rotation(k, freqs)
    torch.testing.assert_close(m_k @ pe[0], pe[1], rtol=0, atol=1e-8)
    # orthogonal: the distance between neighbours is the same everywhere (corrects seed 002)
    torch.testing.assert_close(m_k @ m_k.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)


def test_neighbour_distance_is_constant():
    """Seed 002 claims positions 0 and 1 differ far more than 100 and 101; they differ equally."""
    pe = sinusoidal_table(torch.tensor([0, 1, 100, 101]), 64, dtype=torch.float64)
    d01 = (pe[1] - pe[0]).norm().item()
    d100 = (pe[3] - pe[2]).norm().item()
    assert abs(d01 - d100) < 1e-12


def test_range_and_uniqueness():
    table = sinusoidal_table(20_000, 64)
    assert table.min() >= -1 and table.max() <= 1
    assert torch.unique(table, dim=0).shape[0] == 20_000
    # each row has norm sqrt(d/2): d/2 (sin, cos) pairs of unit length
    torch.testing.assert_close(table.norm(dim=-1), torch.full((20_000,), math.sqrt(32.0)))


def test_wavelengths_run_from_short_to_long():
    """Seed 000 says the first dims have the longest wavelengths; they have the shortest (2 pi)."""
    wavelengths = 2 * math.pi / sinusoidal_frequencies(512, dtype=torch.float64)
    assert wavelengths[0].item() == pytest.approx(2 * math.pi)
    assert torch.all(wavelengths[1:] > wavelengths[:-1])
    assert wavelengths[-1].item() == pytest.approx(2 * math.pi * 10000 ** (510 / 512))
    t2t = 2 * math.pi / sinusoidal_frequencies(512, variant="tensor2tensor", dtype=torch.float64)
    assert t2t[-1].item() == pytest.approx(2 * math.pi * 10000)


def test_batched_positions_and_default_bit_identical():
    pe = SinusoidalPE(32)
    x = torch.randn(2, 7, 32)
    assert torch.equal(pe.embed(x), pe.embed(x, torch.arange(7)))
    per_row = torch.stack([torch.arange(7), torch.arange(7) + 100])
    out = pe.embed(x, per_row)
    assert torch.equal(out[1], pe.embed(x[1:], torch.arange(100, 107))[0])


def test_no_length_limit_and_nothing_cached():
    pe = SinusoidalPE(16)
    state_before = {k: v.clone() for k, v in pe.state_dict().items()}
    out = pe.embed(torch.zeros(1, 3, 16), torch.tensor([0, 1_000_000, 5]))
    assert out.shape == (1, 3, 16)
    assert pe.state_dict().keys() == state_before.keys() and not list(pe.buffers())


def test_bf16_model_keeps_positions_distinct():
    n, d = 65_536, 64
    pe = SinusoidalPE(d).to(torch.bfloat16)
    out = pe.embed(torch.zeros(1, n, d, dtype=torch.bfloat16))[0]
    assert out.dtype == torch.bfloat16
    assert torch.unique(out, dim=0).shape[0] == n
    ref = sinusoidal_table(n, d, dtype=torch.float64)
    # within bf16 rounding (2^-9 relative, values in [-1, 1]) of the float64 table + float32 angle error
    assert (out.double() - ref).abs().max().item() <= 2.0**-8 + angle_tolerance(n)
    # For contrast: positions held in bf16 (what x-transformers and rotary-embedding-torch do in a
    # bf16 model) collapse: bf16 has 8 significant bits, so only 256 integers per octave survive.
    naive = torch.arange(4096, dtype=torch.bfloat16)
    assert torch.unique(naive).numel() < 1000


def test_autocast_does_not_lower_table_precision():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        table = sinusoidal_table(torch.arange(1000), 32)
    assert table.dtype == torch.float32
    torch.testing.assert_close(table, sinusoidal_table(1000, 32), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("call", "err", "match"),
    [
        (lambda: sinusoidal_table(4, 15), ValueError, "dim must be even"),
        (lambda: sinusoidal_table(4, 2, variant="tensor2tensor"), ValueError, "dim must be >= 4"),
        (lambda: sinusoidal_table(4, 16, variant="bert"), ValueError, "valid values: 'vaswani'"),
        (lambda: sinusoidal_table(torch.tensor([0.5]), 16), TypeError, "integer tensor"),
        (lambda: sinusoidal_table(-1, 16), ValueError, "must be >= 0"),
        (lambda: sinusoidal_table(4, 16, base=0.0), ValueError, "base must be a finite number > 0"),
        (lambda: SinusoidalPE(15), ValueError, "d_model must be even"),
        (lambda: SinusoidalPE(16).embed(torch.zeros(1, 3, 8)), ValueError, r"shape \[b, s, 16\]"),
        (lambda: SinusoidalPE(16).embed(torch.zeros(1, 3, 16), torch.zeros(3)), TypeError, "integer"),
        (lambda: SinusoidalPE("16"), TypeError, "d_model must be an int"),
        (lambda: SinusoidalPE(16, precompute=-1), ValueError, "precompute must be >= 0"),
    ],
)
def test_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


# --------------------------------------------------------------------------------------- learned
def test_learned_lookup_and_init():
    pe = LearnedPE(64, max_len=512)
    assert pe.weight.shape == (512, 64)
    assert abs(pe.weight.std().item() - 0.02) < 0.002
    x = torch.randn(2, 10, 64)
    torch.testing.assert_close(pe.embed(x), x + pe.weight[:10])
    pos = torch.tensor([[3, 4, 5], [0, 1, 2]])
    torch.testing.assert_close(pe.embed(x[:, :3], pos), x[:, :3] + pe.weight[pos])


def test_learned_refuses_to_extrapolate():
    pe = LearnedPE(8, max_len=16)
    with pytest.raises(
        ValueError, match=r"sequence length 17 is past the learned position table \(max_len=16\)"
    ):
        pe.embed(torch.zeros(1, 17, 8))
    with pytest.raises(ValueError, match="position 16 is past"):
        pe.embed(torch.zeros(1, 2, 8), torch.tensor([3, 16]))
    with pytest.raises(ValueError, match="must be >= 0"):
        pe.embed(torch.zeros(1, 2, 8), torch.tensor([-1, 0]))


def test_learned_fairseq_padding_offset():
    """fairseq/RoBERTa: position p uses row p + padding_idx + 1; row padding_idx is zero."""
    pe = LearnedPE(8, max_len=10, padding_idx=1)
    assert pe.weight.shape == (12, 8)
    assert torch.count_nonzero(pe.weight[1]) == 0
    out = pe.embed(torch.zeros(1, 3, 8))
    torch.testing.assert_close(out[0], pe.weight[2:5])


def test_scaled_sinusoidal_gain_learns():
    pe = ScaledSinusoidalPE(16)
    assert pe.gain.item() == pytest.approx(16**-0.5)
    x = torch.zeros(1, 5, 16)
    torch.testing.assert_close(pe.embed(x), sinusoidal_table(5, 16)[None] * 16**-0.5)
    pe.embed(x).sum().backward()
    assert pe.gain.grad is not None and pe.gain.grad.abs() > 0
    pe64 = ScaledSinusoidalPE(8, init_gain=1.0).double()
    assert torch.autograd.gradcheck(
        lambda g: sinusoidal_table(4, 8, dtype=torch.float64) * g,
        (pe64.gain.detach().clone().requires_grad_(),),
    )


# ------------------------------------------------------------------------------- compile and meta
def test_compile_fullgraph_matches_eager():
    x = torch.randn(2, 9, 32)
    pos = torch.arange(9) + 3
    for pe in (
        SinusoidalPE(32),
        SinusoidalPE(32, variant="tensor2tensor"),
        LearnedPE(32, 64),
        ScaledSinusoidalPE(32),
    ):
        compiled = torch.compile(
            pe.embed, fullgraph=True, backend="eager" if isinstance(pe, LearnedPE) else "inductor"
        )
        torch.testing.assert_close(compiled(x, pos), pe.embed(x, pos), rtol=1e-6, atol=1e-6)


def test_build_on_meta_device():
    with torch.device("meta"):
        for name, cfg in [
            ("sinusoidal", {}),
            ("learned", {"max_len": 32}),
            ("scaled_sinusoidal", {}),
            ("sinusoidal_2d", {}),
            ("nope", None),
        ]:
            scheme = posenc.build(name, **({} if cfg is None else {"d_model": 16, **cfg}))
            for t in list(scheme.parameters()) + list(scheme.buffers()):
                assert t.is_meta
        out = SinusoidalPE(16).embed(torch.zeros(2, 4, 16))
        assert out.is_meta and out.shape == (2, 4, 16)


def test_float64_inputs_get_float64_tables_and_gain():
    """A float64 model computes in float64: the table at a large position matches float64 maths,
    and the scaled encoding's gain has derivative exactly the table (checked numerically)."""
    pe = posenc.build("sinusoidal", d_model=64)
    x = torch.zeros(1, 1, 64, dtype=torch.float64)
    got = pe.embed(x, torch.tensor([12_345]))[0, 0]
    i = torch.arange(32, dtype=torch.float64)
    angle = 12_345 / (10000.0 ** (2 * i / 64))
    ref = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten()  # interleaved sin, cos
    assert got.dtype == torch.float64 and float((got - ref).abs().max()) < 1e-9
    scaled = posenc.build("scaled_sinusoidal", d_model=8, init_gain=1.0).double()
    xs = torch.zeros(1, 5, 8, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda g: (scaled.table(torch.arange(5), torch.float64) * g).sum(),
        (scaled.gain.detach().clone().requires_grad_(),),
    )
    out = scaled.embed(xs).sum()
    out.backward()
    table_sum = float(scaled.table(torch.arange(5), torch.float64).sum())
    assert math.isclose(float(scaled.gain.grad), table_sum, rel_tol=1e-12)


def test_batched_positions_must_match_the_batch():
    pe = posenc.build("sinusoidal", d_model=8)
    with pytest.raises(ValueError, match=r"positions has batch size 3 but the input has 2; pass \[s\]"):
        pe.embed(torch.zeros(2, 5, 8), torch.arange(5).expand(3, 5))
    assert pe.embed(torch.zeros(2, 5, 8), torch.arange(5)[None]).shape == (2, 5, 8)  # [1, s] broadcasts


@pytest.mark.parametrize("cls", [SinusoidalPE, ScaledSinusoidalPE])
def test_precomputed_rows_give_the_same_numbers_and_follow_casts(cls):
    """precompute=n: inputs of up to n tokens read rows made at build time, bit for bit what each
    call computes; longer inputs and explicit positions compute; a cast recomputes the rows at the
    table's precision (float32 in a bf16 model, float64 in a float64 one), nothing in forward."""
    plain, kept = cls(16), cls(16, precompute=12)
    assert kept.rows.shape == (12, 16) and "rows" not in kept.state_dict()
    for s in (1, 7, 12, 13):
        x = torch.randn(2, s, 16)
        assert torch.equal(kept.embed(x), plain.embed(x))
        assert torch.equal(kept.additive_rows(x), plain.additive_rows(x))
    pos = torch.tensor([5, 2, 30])
    assert torch.equal(kept.embed(torch.zeros(1, 3, 16), pos), plain.embed(torch.zeros(1, 3, 16), pos))
    rows = kept.rows
    kept.embed(torch.zeros(1, 4, 16))
    assert kept.rows is rows and torch.equal(rows, sinusoidal_table(12, 16))  # forward never writes them
    kept.rows = rows + 1  # the rows are what inputs of up to 12 tokens read, and only those
    short, long = torch.zeros(1, 5, 16), torch.zeros(1, 13, 16)
    assert not torch.equal(kept.embed(short), plain.embed(short))
    assert torch.equal(kept.embed(long), plain.embed(long))
    kept.rows = rows
    kept.to(torch.bfloat16)
    assert kept.rows.dtype == torch.float32
    xb = torch.randn(1, 9, 16, dtype=torch.bfloat16)
    assert torch.equal(kept.embed(xb), plain.embed(xb))
    kept.double()
    assert kept.rows.dtype == torch.float64
    x64 = torch.randn(1, 9, 16, dtype=torch.float64)
    assert torch.equal(kept.rows[:9], sinusoidal_table(9, 16, dtype=torch.float64))
    assert torch.equal(kept.embed(x64), plain.double().embed(x64))


@pytest.mark.parametrize("cls", [SinusoidalPE, ScaledSinusoidalPE])
def test_precomputed_rows_serve_explicit_positions_and_models(cls):
    """Explicit positions inside the rows gather them (changing the rows changes the output), bit
    for bit what a call computes; positions past them compute; a model's input layer, which passes
    its positions, reads them too and gives the same logits."""
    from posenc.model import ModelConfig, TransformerLM

    plain, kept = cls(16), cls(16, precompute=5000)
    x = torch.randn(2, 6, 16)
    for pos in (torch.arange(6) + 4090, torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])):
        assert torch.equal(kept.embed(x, pos), plain.embed(x, pos))
    kept.rows = kept.rows + 1
    assert not torch.equal(kept.embed(x, torch.arange(6) + 4090), plain.embed(x, torch.arange(6) + 4090))
    assert torch.equal(kept.embed(x, torch.arange(6) + 4995), plain.embed(x, torch.arange(6) + 4995))

    def lm(options):
        torch.manual_seed(0)
        sizes = {"vocab_size": 50, "d_model": 32, "num_layers": 1, "num_heads": 4, "max_len": 64}
        return TransformerLM(ModelConfig(**sizes, position=cls.name, position_options=options)).eval()

    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    base, model = lm({}), lm({"precompute": 64})
    with torch.no_grad():
        want = base(ids).logits
        assert torch.equal(model(ids).logits, want)
        pe = next(m for m in model.modules() if isinstance(m, SinusoidalPE))
        pe.rows = pe.rows + 1
        assert not torch.equal(model(ids).logits, want)


def test_precomputed_rows_build_on_meta_and_materialize():
    """Built under torch.device("meta") (no memory), the rows are made for real by to_empty."""
    with torch.device("meta"):
        layer = posenc.InputEmbedding(50, 8, "sinusoidal", scheme_options={"precompute": 16})
        scaled = ScaledSinusoidalPE(8, precompute=4)
    assert layer.position.rows.is_meta and scaled.rows.is_meta
    layer.to_empty(device="cpu")
    assert torch.equal(layer.position.rows, sinusoidal_table(16, 8))
    assert ScaledSinusoidalPE(8, precompute=4, dtype=torch.float64).rows.dtype == torch.float64


@pytest.mark.parametrize("variant", ["vaswani", "tensor2tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7,), (2, 5), (), "transposed", "far"])
def test_table_columns_are_sin_and_cos_of_the_angles_bit_for_bit(variant, dtype, shape):
    """The eager table (sin/cos written contiguously, then laid out) holds exactly sin and cos of
    position_angles in the variant's columns, cast once, and is contiguous: the layout the compiled
    path stacks. Also for transposed positions and past 4096 (the split angles)."""
    if shape == "transposed":
        positions, shape = torch.arange(12).reshape(3, 4).t(), (4, 3)  # [4, 3], not contiguous
    elif shape == "far":
        positions, shape = torch.tensor([4095, 4096, 70_000, -(2**30)]), (4,)
    else:
        positions = torch.arange(math.prod(shape) or 1).reshape(shape) * 37 - 50  # negative ones too
    d = 12
    adt = torch.float64 if dtype == torch.float64 else torch.float32  # the angles' dtype
    angles = position_angles(positions, sinusoidal_frequencies(d, variant=variant, dtype=torch.float64), adt)
    sin, cos = torch.sin(angles).to(dtype), torch.cos(angles).to(dtype)  # [..., d/2]
    table = sinusoidal_table(positions, d, variant=variant, dtype=dtype)
    assert table.shape == (*shape, d) and table.dtype == dtype and table.is_contiguous()
    even, odd = (
        (table[..., 0::2], table[..., 1::2]) if variant == "vaswani" else (table[..., :6], table[..., 6:])
    )
    assert torch.equal(even, sin) and torch.equal(odd, cos)
