"""Tests of posenc.base: every scheme is callable, and a call runs its one hook."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.registry import SCHEMES


def _built(name: str):
    context = {"d_model": 16, "num_heads": 2, "head_dim": 8, "max_len": 32}
    return posenc.build_with_context(name, context, {"grid": (2, 3)} if name == "rope_2d" else None)


@pytest.mark.parametrize("name", [n for n, cls in SCHEMES.items() if len(cls.hooks) <= 1])
def test_calling_a_scheme_runs_its_hook(name):
    scheme = _built(name)
    torch.manual_seed(0)
    hooks = scheme.hooks
    if not hooks or "embed" in hooks:
        shape = (2, 6, 16) if scheme.position_dims == 1 else (2, *(3,) * scheme.position_dims, 16)
        x = torch.randn(shape)
        torch.testing.assert_close(scheme(x), scheme.embed(x), rtol=0, atol=0)
    elif "rotate" in hooks:
        q, k = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
        for got, want in zip(scheme(q, k), scheme.rotate(q, k)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    elif "queries" in hooks:
        q, pos = torch.randn(2, 2, 6, 8), torch.arange(9000, 9006)
        torch.testing.assert_close(scheme(q, pos), scheme.queries(q, pos), rtol=0, atol=0)
    else:
        pos, q = torch.arange(6), torch.randn(1, 2, 6, 8)
        torch.testing.assert_close(scheme(pos, pos, q), scheme.score_bias(pos, pos, q), rtol=0, atol=0)


def test_nope_call_is_the_identity_and_rope_call_takes_the_layout():
    x = torch.randn(1, 4, 8)
    assert posenc.build("nope")(x) is x
    rope = posenc.build("rope", head_dim=8)
    q = torch.randn(1, 5, 2, 8)  # [b, s, h, d_h]
    got, _ = rope(q, q, qk_layout="bshd")
    torch.testing.assert_close(got, rope.rotate(q, q, qk_layout="bshd")[0], rtol=0, atol=0)


def test_a_scheme_with_several_hooks_names_them_when_called():
    txl = posenc.build("transformer_xl", d_model=16, num_heads=2, head_dim=8)
    with pytest.raises(TypeError, match=r"several hooks \(queries, score_bias\).*scheme\.queries"):
        txl(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))


def test_a_scheme_with_relative_values_must_declare_them():
    """A model calls relative_values only for schemes that declare has_relative_values; an override
    without the declaration would be ignored silently, so defining such a class fails at once."""
    from posenc.base import PositionalScheme

    with pytest.raises(TypeError, match="overrides relative_values but does not declare has_relative_values"):

        class Forgetful(PositionalScheme):
            name = "forgetful"

            def relative_values(self, q_positions, k_positions):
                return None

    class Declared(PositionalScheme):
        name = "declared"
        has_relative_values = True

        def relative_values(self, q_positions, k_positions):
            return None

    assert Declared().has_relative_values and not PositionalScheme().has_relative_values


def test_a_scheme_that_transforms_queries_must_declare_the_hook():
    """Callers read ``hooks`` (never overrides): a ``queries`` override left out of them would be
    skipped by every model, so defining such a class fails at once."""
    from posenc.base import PositionalScheme

    with pytest.raises(TypeError, match=r'overrides queries but does not declare it in hooks.*"queries"'):

        class Undeclared(PositionalScheme):
            name = "undeclared"
            hooks = ("rotate",)

            def queries(self, q, q_positions=None, *, qk_layout=None):
                return 2 * q


def test_the_queries_hook_is_the_identity_unless_declared():
    q = torch.randn(1, 2, 3, 8)
    for name in ("nope", "rope", "alibi"):
        assert "queries" not in _built(name).hooks and _built(name).queries(q) is q
    assert [n for n, cls in SCHEMES.items() if "queries" in cls.hooks] == [
        "transformer_xl",
        "nope_temperature",
    ]


@pytest.mark.parametrize(
    "name, options",
    [("transformer_xl", {"head_dim": 8, "num_heads": 2, "d_model": 16}), ("nope_temperature", {})],
)
def test_rotate_on_a_queries_scheme_names_the_queries_hook(name, options):
    """A scheme whose transform acts on the queries alone refuses ``rotate`` (which would return q
    unchanged and silently drop u or the temperature) with the call to make instead."""
    scheme = posenc.build(name, **options)
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(
        TypeError, match=r"transforms the queries alone; call scheme.queries\(q, q_positions\)"
    ):
        scheme.rotate(q, q)
