"""Tests of posenc._precision.position_angles: angles exact for any int64 position."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc._precision import ANGLE_SPLIT, position_angles
from posenc.absolute import sinusoidal_table
from posenc.rotary import rope_cos_sin

INV = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)  # [32], the usual frequencies


def _wrapped_error(angles: torch.Tensor, positions: torch.Tensor) -> float:
    """Largest distance, modulo 2 pi, from the exact angle (computed with Python integers)."""
    worst = 0.0
    for p, row in zip(positions.tolist(), angles.double()):
        for f, a in zip(INV.tolist(), row.tolist()):
            exact = math.fmod(p * f, 2 * math.pi)  # p * f in float64: exact enough below 2^40
            d = math.remainder(a - exact, 2 * math.pi)
            worst = max(worst, abs(d))
    return worst


@pytest.mark.parametrize("p", [2**20 + 3, 2**24, 2**24 + 1, 2**31 - 1, 2**31, 2**31 + 7, 2**40 + 5, -(2**31)])
def test_large_positions_keep_their_angle(p):
    positions = torch.tensor([p, p + 1])
    angles = position_angles(positions, INV, torch.float32)  # [2, 32]
    assert _wrapped_error(angles, positions) < 1e-3
    cos, sin = rope_cos_sin(positions, INV)  # float64 frequencies (as the RoPE module keeps them)
    cos64, sin64 = rope_cos_sin(positions, INV, dtype=torch.float64)
    assert float((cos.double() - cos64).abs().max()) < 1e-3
    assert float((sin.double() - sin64).abs().max()) < 1e-3


def test_neighbours_past_2_24_stay_distinct():
    """A float32 product gave positions 2^24 and 2^24 + 1 the same sinusoidal vector."""
    a, b = sinusoidal_table(torch.tensor([2**24, 2**24 + 1]), 64)
    assert float((a - b).abs().max()) > 0.5  # the fastest pair turns by one radian per position
    ref = sinusoidal_table(torch.tensor([2**24, 2**24 + 1]), 64, dtype=torch.float64)
    torch.testing.assert_close(torch.stack((a, b)).double(), ref, rtol=0, atol=1e-3)


@given(st.lists(st.integers(0, ANGLE_SPLIT - 1), min_size=1, max_size=20))
def test_small_positions_give_the_plain_float32_product(ps):
    positions = torch.tensor(ps)
    want = positions.float()[..., None] * INV.float()  # what other libraries compute
    assert torch.equal(position_angles(positions, INV, torch.float32), want)


@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=8))
def test_split_form_agrees_with_float64(ps):
    positions = torch.tensor(ps)
    assert _wrapped_error(position_angles(positions, INV, torch.float32), positions) < 1e-3


def test_only_the_frequencies_that_need_it_are_split_in_any_order():
    positions = torch.tensor([3, 70_000, 2**20 + 5])
    order = torch.randperm(INV.numel(), generator=torch.Generator().manual_seed(0))
    sorted_angles = position_angles(positions, INV, torch.float32)  # a range of columns
    shuffled = position_angles(positions, INV[order], torch.float32)  # scattered columns
    assert torch.equal(shuffled, sorted_angles[:, order])
    assert _wrapped_error(sorted_angles, positions) < 1e-3
    slow = INV < 4096 / (2**20 + 5)  # these never reach 4096 rad: the plain product, bit for bit
    plain = positions.float()[..., None] * INV.float()
    assert slow.any() and torch.equal(sorted_angles[:, slow], plain[:, slow])


@given(
    reach=st.integers(0, 2**50),
    scale=st.floats(1e-6, 1e3),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_split_columns_are_chosen_on_the_host_as_by_the_tensor_rule(reach, scale, dtype):
    """[r] frequencies are compared on the host: the same columns as the float64 tensor rule
    (|f| * reach >= 4096 (1 - 2^-20), a margin for float32's rounding of the product), and per-row
    [..., r] frequencies take any row's."""
    from posenc._precision import _COLUMN_SPLIT, _reaching

    inv = (INV * scale).to(dtype)
    want = (inv.abs().double() * reach >= _COLUMN_SPLIT).nonzero().flatten().tolist()
    assert _reaching(inv, reach) == want
    assert _reaching(-inv, reach) == want  # by magnitude
    rows = torch.stack([inv, -inv.flip(0) / 3])  # [2, r]
    want_rows = (rows.abs().double() * reach >= _COLUMN_SPLIT).any(0).nonzero().flatten().tolist()
    assert _reaching(rows, reach) == want_rows


@given(st.integers(-(2**44), 2**44), st.integers(-(2**44), 2**44))
def test_one_position_gives_the_bits_it_has_among_others(p, other):
    """A decode step (one position, read on the host) gets the angles that position gets in a batch,
    whatever the batch's other positions (each angle picks its own form)."""
    from posenc._precision import _reach

    alone = position_angles(torch.tensor([p]), INV, torch.float32)  # [1, r]
    among = position_angles(torch.tensor([other, p]), INV, torch.float32)  # [2, r]
    assert torch.equal(alone[0], among[1])
    assert _reach(torch.tensor([p])) == abs(p) and _reach(torch.tensor([], dtype=torch.long)) == 0
    assert _reach(torch.tensor([other, p])) == max(abs(other), abs(p))


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
@pytest.mark.parametrize("freqs", ["float64", "float32", "unordered"])
def test_one_position_keeps_its_shape_and_the_general_bits(shape, freqs):
    """The single-position path (host integers, a few ops) against the general path run on the same
    position twice: every shape a decode step uses, float32 frequencies, frequencies whose split
    columns are not a range, positions of both signs up to the limit 2^44."""
    inv = {
        "float64": INV,
        "float32": INV.float(),
        "unordered": INV[torch.randperm(32, generator=torch.Generator().manual_seed(0))],
    }[freqs]
    for p in (0, 5, -4097, 32767, 2**31 + 7, -(2**40) - 3, 2**44, -(2**44)):
        alone = position_angles(torch.full(shape, p), inv, torch.float32)
        twice = position_angles(torch.tensor([p, p]), inv, torch.float32)[0]
        assert alone.shape == (*shape, 32) and torch.equal(alone.reshape(32), twice)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [2**44 + 1, -(2**44) - 1, 2**50, 2**62])
def test_positions_past_two_to_the_44_are_refused(p, dtype):
    """Past 2^44 the float64 product hi * f and float64's 2 pi round (0.04 rad at 2^50, 3 rad at
    2^62 were returned silently): one position (a decode step), several, and float64 angles all
    refuse them, naming the limit; 2^44 itself is served."""
    from posenc._precision import MAX_POSITION

    assert MAX_POSITION == 2**44
    for positions in (torch.tensor([p]), torch.tensor([0, 7, p]), torch.tensor(p)):
        with pytest.raises(ValueError, match=r"2\^44 = 17,592,186,044,416"):
            position_angles(positions, INV, dtype)
    ok = position_angles(torch.tensor([0, 2**44, -(2**44)]), INV, dtype)
    assert bool(torch.isfinite(ok).all())


def test_per_block_table_gives_the_direct_numbers():
    """Dense positions take ``hi f mod 2 pi`` from a per-block table: the very same float64 numbers."""
    from posenc._precision import _split_angles

    positions = torch.arange(-5000, 20_000, 7)  # many positions, few blocks of 4096
    got = _split_angles(positions, INV, torch.float32)
    lo = torch.remainder(positions, ANGLE_SPLIT)
    far = torch.remainder((positions - lo).double()[:, None] * INV, 2 * math.pi).float()
    assert torch.equal(got, far + lo.float()[:, None] * INV.float())


def test_compiled_tables_take_the_split_form_and_agree():
    positions = torch.tensor([0, 5, 4095, 4096, 2**24 + 1, 2**31])
    eager = position_angles(positions, INV, torch.float32)
    compiled = torch.compile(lambda p: position_angles(p, INV, torch.float32), fullgraph=True)(positions)
    diff = torch.remainder(compiled.double() - eager.double() + math.pi, 2 * math.pi) - math.pi
    assert float(diff.abs().max()) < 1e-3
    rope = posenc.build("rope", head_dim=64)
    q = torch.randn(1, 2, positions.numel(), 64)
    want = rope.rotate(q, q, positions, positions)[0]
    got = torch.compile(lambda x: rope.rotate(x, x, positions, positions)[0], fullgraph=True)(q)
    torch.testing.assert_close(got, want, rtol=0, atol=5e-3)


def test_split_columns_start_at_4096_rad():
    from posenc._precision import _reaching

    inv = torch.tensor([1.0, 0.5], dtype=torch.float64)
    assert _reaching(inv, 4096) == [0] and _reaching(inv, 4095) == [] and _reaching(inv, 8192) == [0, 1]


@given(st.integers(0, 2**31), st.integers(1, 5000), st.integers(-(2**40), 2**40))
def test_each_angle_picks_its_form_by_its_own_product(start, count, far):
    """Angles whose plain float32 product stays below 4096 rad are that product, bit for bit, also
    when other positions of the call (a far one, a long range) make the column split; the rest take
    the split form. A row of a range equals the same position computed alone or among others."""
    positions = torch.arange(start, start + count)  # [s]
    angles = position_angles(positions, INV, torch.float32)  # [s, r]
    with_far = position_angles(torch.cat((positions, torch.tensor([far]))), INV, torch.float32)[:-1]
    plain = positions.float()[:, None] * INV.float()
    small = plain.abs() < ANGLE_SPLIT
    assert torch.equal(angles[small], plain[small]) and torch.equal(with_far, angles)
    for i in (0, count // 2, count - 1):
        assert torch.equal(position_angles(positions[i : i + 1], INV, torch.float32)[0], angles[i])
    assert _wrapped_error(angles[::97], positions[::97]) < 1e-3


def test_compiled_angles_pick_the_same_forms_as_eager():
    """Compiled graphs compute both forms for every frequency and pick per angle as eager does."""
    positions = torch.tensor([0, 5, 4095, 4096, 70_000, 2**24 + 1, 2**31])
    eager = position_angles(positions, INV, torch.float32)
    compiled = torch.compile(lambda p: position_angles(p, INV, torch.float32), fullgraph=True)(positions)
    small = (positions.float()[:, None] * INV.float()).abs() < ANGLE_SPLIT
    assert torch.equal(compiled[small], eager[small])
    # the split ones: Inductor's own float64 code may move them by a few float32 ulps
    assert _wrapped_error(compiled, positions) < 1e-3


@pytest.mark.parametrize("sign", [1, -1])
def test_a_product_rounding_up_to_4096_is_split_in_every_path(sign):
    """p f = 4096 - 2^-13 exactly (p = 18631, f = 1801 * 2^-13: 2^25 - 1 = 31 * 601 * 1801) rounds
    to 4096 in float32 (a tie, to even): the decode path's host decision, the batch path and the
    compiled graph all split it; one float32 ulp of f less stays the plain product everywhere."""
    f_tie = 1801 * 2.0**-13
    for f, split in ((f_tie, True), (f_tie - 2.0**-26, False)):  # 2^-26: one float32 ulp of f
        inv = torch.tensor([f, 1e-3], dtype=torch.float64)
        p = sign * 18631
        alone = position_angles(torch.tensor([p]), inv, torch.float32)[0]
        among = position_angles(torch.tensor([3, p, 5]), inv, torch.float32)[1]
        plain = torch.tensor([float(p)]) * inv.float()
        assert (abs(float(plain[0])) == 4096.0) if split else (abs(float(plain[0])) < 4096.0)
        assert torch.equal(alone, among) and torch.equal(alone[1:], plain[1:])
        assert bool(alone[0] != plain[0]) == split  # the split form is reduced modulo 2 pi


@pytest.mark.parametrize("freqs", ["float32", "per_row"])
def test_each_angle_picks_its_form_with_float32_and_per_row_frequencies(freqs):
    """float32 inv_freq and per-position [s, r] frequencies (length-dependent scalings) follow the
    same rule: plain products below 4096 rad, bit for bit, and a row alone equals the row among others."""
    positions = torch.tensor([0, 7, 4095, 5000, 70_000, 2**24 + 3, 2**31 + 1])
    if freqs == "float32":
        inv = INV.float()
    else:
        inv = (
            INV[None, :] * torch.linspace(0.5, 2.0, positions.numel(), dtype=torch.float64)[:, None]
        )  # [s, r]
    angles = position_angles(positions, inv, torch.float32)
    plain = positions.float()[:, None] * inv.float()
    small = plain.abs() < ANGLE_SPLIT
    assert torch.equal(angles[small], plain[small]) and not small.all()
    for i in range(positions.numel()):
        row = inv[i : i + 1] if freqs == "per_row" else inv
        assert torch.equal(position_angles(positions[i : i + 1], row, torch.float32)[0], angles[i])


# torch.jit.trace is deprecated, but posenc still guards its fast paths against it: the call is the test
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_gather_kept_serves_only_what_it_can_check():
    """Kept rows gathered for positions inside 0..n-1 (any shape, 0-d too, any integer dtype, along any
    dim); None for positions outside, none at all, off the CPU, or while tracing a graph."""
    from posenc._precision import gather_kept

    rows = torch.arange(2 * 10 * 3, dtype=torch.float32).reshape(2, 10, 3)  # [2, n, r]
    pos = torch.tensor([[4, 0], [9, 9]], dtype=torch.int32)
    got = gather_kept(rows, pos, dim=1)
    assert got.shape == (2, 2, 2, 3) and torch.equal(got, rows[:, pos.long()])
    assert torch.equal(gather_kept(rows[0], torch.tensor([7])), rows[0, [7]])
    assert torch.equal(gather_kept(rows, torch.tensor(7), dim=-2), rows[:, 7])  # 0-d: the dim goes
    for bad in (torch.tensor([10]), torch.tensor([-1, 3]), torch.tensor([], dtype=torch.long)):
        assert gather_kept(rows[0], bad) is None
    assert gather_kept(rows[0], torch.tensor([1, 2], device="meta")) is None

    def kept_or_first(p):
        picked = gather_kept(rows[0], p)
        return rows[0, :1] if picked is None else picked

    # check_trace off: the traced graph differs from eager on purpose (no gather baked in)
    traced = torch.jit.trace(kept_or_first, torch.tensor([1, 2]), check_trace=False)
    assert torch.equal(traced(torch.tensor([5, 6])), rows[0, :1])  # tracing never baked in a gather


@pytest.mark.parametrize("position", ["sinusoidal", "rope", "alibi"])
def test_tables_compile_where_dynamo_cannot_trace_the_autocast_check(monkeypatch, position):
    """TorchDynamo before torch 2.13 cannot trace ``torch.amp.is_autocast_available`` (seen with
    torch 2.11 on CUDA: every scheme building a table under autocast_off failed
    ``fullgraph=True``); made untraceable here, the model still compiles in one graph, under
    autocast too, and gives the eager numbers."""
    from posenc.model import ModelConfig, TransformerLM

    monkeypatch.setattr(
        torch.amp, "is_autocast_available", torch._dynamo.disable(torch.amp.is_autocast_available)
    )
    torch._dynamo.reset()
    config = ModelConfig(vocab_size=11, d_model=16, num_layers=1, num_heads=2, position=position, max_len=32)
    model = TransformerLM(config).eval()
    ids = torch.randint(0, 11, (2, 9))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = compiled(ids).logits, model(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch._dynamo.reset()
