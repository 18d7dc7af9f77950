"""Grid sinusoidal encodings (posenc.absolute_nd): the positional-encodings package's numbers,
explicit coordinates, errors."""

import pytest
import torch

from posenc.absolute_nd import Sinusoidal2D, Sinusoidal3D, sinusoidal_nd_table


@pytest.mark.parametrize(
    ("shape", "channels"), [((5, 7), 16), ((4, 6), 10), ((3, 4, 5), 12), ((2, 3, 4), 20)]
)
def test_nd_matches_positional_encodings_package(shape, channels):
    pe_pkg = pytest.importorskip("positional_encodings.torch_encodings")
    cls = pe_pkg.PositionalEncoding2D if len(shape) == 2 else pe_pkg.PositionalEncoding3D
    x = torch.zeros(2, *shape, channels)
    theirs = cls(channels)(x)
    scheme = Sinusoidal2D(channels) if len(shape) == 2 else Sinusoidal3D(channels)
    torch.testing.assert_close(scheme.embed(x), theirs, rtol=0, atol=1e-6)
    # explicit coordinates give the same result as the default grid
    coords = torch.stack(torch.meshgrid(*(torch.arange(n) for n in shape), indexing="ij"), -1)
    torch.testing.assert_close(scheme.embed(x, coords), theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("call", "err", "match"),
    [
        (lambda: Sinusoidal2D(16).embed(torch.zeros(1, 3, 16)), ValueError, "channels last"),
        (lambda: sinusoidal_nd_table((3, 0), 8), ValueError, r"shape\[1\] must be >= 1"),
    ],
)
def test_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()
