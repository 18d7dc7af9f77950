import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.positions import (
    arange_positions,
    check_positions,
    positions_from_cu_seqlens,
    positions_from_mask,
    randomized_positions,
    resolve_positions,
)


def test_arange_default_and_int_offset():
    assert arange_positions(4).tolist() == [0, 1, 2, 3]
    assert arange_positions(3, offset=7).tolist() == [7, 8, 9]
    assert arange_positions(0).numel() == 0
    assert arange_positions(4).dtype == torch.long


def test_arange_per_row_offsets():
    pos = arange_positions(3, offset=torch.tensor([0, 5]))
    assert pos.tolist() == [[0, 1, 2], [5, 6, 7]]


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"seq_len": 2.0}, TypeError, "seq_len must be an int"),
        ({"seq_len": -1}, ValueError, "seq_len must be >= 0"),
        ({"seq_len": 2, "offset": 1.5}, TypeError, "offset must be an int"),
        ({"seq_len": 2, "offset": torch.tensor([1.0])}, TypeError, "integer tensor"),
        ({"seq_len": 2, "offset": torch.tensor([[1]])}, ValueError, r"shape \[b\]"),
    ],
)
def test_arange_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        arange_positions(**kwargs)


def test_positions_from_left_padded_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]
    assert positions_from_mask(mask.bool()).tolist() == positions_from_mask(mask).tolist()


@given(st.lists(st.integers(0, 6), min_size=1, max_size=6), st.integers(0, 3))
def test_left_padding_gives_unpadded_positions(lengths, pad_extra):
    s = max(lengths) + pad_extra
    mask = torch.zeros(len(lengths), s, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, s - n :] = 1
    pos = positions_from_mask(mask)
    for row, n in enumerate(lengths):
        assert pos[row, s - n :].tolist() == list(range(n))


def test_mask_errors():
    with pytest.raises(ValueError, match=r"shape \[b, s\]"):
        positions_from_mask(torch.ones(3, dtype=torch.long))
    with pytest.raises(TypeError, match="bool or integer"):
        positions_from_mask(torch.ones(1, 3))
    with pytest.raises(TypeError, match="must be a tensor"):
        positions_from_mask([[1, 1]])


def test_cu_seqlens_restart_per_document():
    assert positions_from_cu_seqlens(torch.tensor([0, 3, 5, 5, 6])).tolist() == [0, 1, 2, 0, 1, 0]
    assert positions_from_cu_seqlens(torch.tensor([0])).numel() == 0


@pytest.mark.parametrize(
    ("cu", "err", "match"),
    [
        (torch.tensor([1, 3]), ValueError, "must start at 0"),
        (torch.tensor([0, 3, 2]), ValueError, "non-decreasing"),
        (torch.tensor([0.0, 3.0]), TypeError, "integer tensor"),
        (torch.tensor([[0, 3]]), ValueError, r"shape \[n \+ 1\]"),
    ],
)
def test_cu_seqlens_errors(cu, err, match):
    with pytest.raises(err, match=match):
        positions_from_cu_seqlens(cu)


def test_check_positions():
    assert check_positions(torch.arange(3, dtype=torch.int32), 3).dtype == torch.long
    with pytest.raises(TypeError, match="never held in float"):
        check_positions(torch.arange(3, dtype=torch.bfloat16), 3)
    with pytest.raises(ValueError, match="s = 4"):
        check_positions(torch.arange(3), 4)
    with pytest.raises(TypeError, match="integer tensor"):
        check_positions([0, 1, 2], 3)
    assert torch.equal(resolve_positions(None, 5, torch.device("cpu")), torch.arange(5))


# ---------------------------------------------------------------------------------------------- randomized
def test_randomized_positions_are_sorted_distinct_draws_from_the_range():
    g = torch.Generator().manual_seed(0)
    pos = randomized_positions(64, 8, 32, generator=g)  # [64, 8]
    assert pos.shape == (64, 8) and pos.dtype == torch.long
    assert bool((pos[:, 1:] > pos[:, :-1]).all())  # strictly increasing: sorted, no repeats
    assert int(pos.min()) >= 0 and int(pos.max()) < 32
    # uniform over the range: every value is drawn, each in about 8/32 of the rows
    counts = torch.bincount(pos.flatten(), minlength=32).float() / 64
    assert bool((counts > 0.05).all()) and abs(float(counts.mean()) - 0.25) < 1e-6
    assert len({tuple(r) for r in pos.tolist()}) > 60  # rows draw on their own
    same = randomized_positions(64, 8, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(pos, same)
    assert randomized_positions(2, 5, 5).tolist() == [[0, 1, 2, 3, 4]] * 2  # the whole range: arange


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((2, 9, 8), r"seq_len=9 distinct positions cannot be drawn from \[0, max_position=8\)"),
        ((0, 4, 8), "batch must be an int >= 1, got 0"),
        ((2, 4, 8.0), "max_position must be an int >= 1, got 8.0"),
    ],
)
def test_randomized_positions_errors(args, match):
    with pytest.raises(ValueError, match=match):
        randomized_positions(*args)
