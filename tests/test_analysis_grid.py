"""Tests of posenc.analysis.grid: grid schemes measured on their grid (the kernel from the centre over
each plane, equal to the positional kernel on coordinates and to the closed form of 2-D sinusoids),
their axes named as declared, and a rotation's head mapped to its axes as text (`posenc show`)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.analysis.grid import (
    GRID_SIZE,
    axes_text,
    axis_names,
    grid_planes,
    is_grid,
    plane_coordinates,
    plane_kernel,
    rotation_axes,
)
from posenc.analysis.kernel import make_probe, positional_kernel
from posenc.rotary.mrope import default_mrope_section, pair_axes

SMALL = {"d_model": 16, "head_dim": 16, "num_heads": 2, "max_len": 64}


def test_planes_and_their_coordinates():
    assert grid_planes(2) == [(0, 1)] and grid_planes(3) == [(0, 1), (0, 2), (1, 2)]
    coords = plane_coordinates(3, (0, 2), size=5)  # [25, 3]
    assert coords.shape == (25, 3)
    assert coords[:, 1].eq(2).all()  # the axis off the plane stays at the centre
    assert coords[7].tolist() == [1, 2, 2]  # row 1 on axis 0, column 2 on axis 2
    with pytest.raises(ValueError, match="two different axes"):
        plane_coordinates(2, (0, 0))
    with pytest.raises(ValueError, match="size must be >= 1"):
        plane_coordinates(2, (0, 1), size=0)


def test_sinusoidal_2d_plane_kernel_is_the_sum_of_two_axis_kernels():
    # PE(x, y) = [PE_8(x); PE_8(y)], so PE(c) . PE(p) / sqrt(16) = sum_i cos(dx w_i) + cos(dy w_i), / 4
    probe = make_probe("sinusoidal_2d", SMALL)
    k = plane_kernel(probe, (0, 1), size=9)[0]  # [9, 9]
    w = [10000 ** (-2 * i / 8) for i in range(4)]
    for dx, dy in [(0, 0), (1, 0), (0, 3), (-4, 2)]:
        expected = (sum(math.cos(dx * v) for v in w) + sum(math.cos(dy * v) for v in w)) / 4
        assert float(k[4 + dx, 4 + dy]) == pytest.approx(expected, abs=1e-5)


def test_plane_kernel_equals_the_positional_kernel_on_coordinates():
    probe = make_probe("mrope", SMALL)
    k = plane_kernel(probe, (1, 2))  # [1, G, G]
    c = GRID_SIZE // 2
    q, key = torch.tensor([[c, c, c]]), torch.tensor([[c, c + 3, c - 5]])  # 3 rows down, 5 columns left
    assert float(k[0, c + 3, c - 5]) == float(positional_kernel(probe, q, key)[0, 0, 0])
    # a rotation sees only the offset: the same offset elsewhere gives the same K
    other = positional_kernel(probe, torch.tensor([[0, 1, 9]]), torch.tensor([[0, 4, 4]]))
    assert float(other[0, 0, 0]) == pytest.approx(float(k[0, c + 3, c - 5]), abs=1e-5)
    with pytest.raises(ValueError, match="not a grid"):
        plane_kernel(make_probe("rope", SMALL), (0, 1))


def test_axis_names_as_declared_else_numbered():
    assert axis_names(make_probe("mrope", SMALL)) == ("time", "height", "width")
    assert axis_names(make_probe("rope_2d", SMALL)) == ("row", "column")
    assert is_grid(make_probe("sinusoidal_3d", SMALL)) and not is_grid(make_probe("rope", SMALL))


def test_rotation_axes_of_mrope_follow_its_section():
    probe = make_probe("mrope", SMALL)
    axis, angle = rotation_axes(probe)  # [16], [16]
    pairs = pair_axes(default_mrope_section(8), False)  # [8]: half layout, pair i = dims i, i + 8
    assert axis.tolist() == torch.cat([pairs, pairs]).tolist()
    theta = torch.tensor([10000.0 ** (-2 * i / 16) for i in range(8)], dtype=torch.float64)
    torch.testing.assert_close(angle, torch.cat([theta, theta]), rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="does not rotate q and k with position"):
        rotation_axes(make_probe("alibi", SMALL))


def test_axes_text_draws_the_head():
    text = axes_text(make_probe("rope_2d", SMALL), digits=3, rows=3)
    lines = text.splitlines()
    assert lines[0].startswith("rope_2d: rotates q and k; 2 position axes (row, column); head_dim = 16")
    assert lines[1] == "head: RRRRCCCCRRRRCCCC  (R row, C column)"
    assert len(lines) == 3 + 3  # header lines and three dimensions
    assert lines[3].split()[:3] == ["0", "row", "1.000"]
