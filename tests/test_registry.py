import pytest
import torch

import posenc
from posenc.base import PositionalScheme
from posenc.registry import SCHEMES, build, build_with_context, config_keys, describe, register, schemes


def test_foundation_schemes_registered():
    for name in ("nope", "sinusoidal", "learned", "scaled_sinusoidal", "sinusoidal_2d", "sinusoidal_3d"):
        assert name in schemes()
    assert posenc.schemes() == schemes()
    for name in schemes():
        cls = SCHEMES[name]
        assert set(cls.hooks) <= set(posenc.HOOKS)
        assert cls.summary, f"{name} has no summary for `posenc list`"


def test_build_by_name():
    pe = posenc.build("sinusoidal", d_model=512)
    assert pe.d_model == 512 and pe.hooks == ("embed",)
    learned = posenc.build("learned", d_model=64, max_len=128)
    assert learned.max_len == 128


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown scheme 'rotary'; valid schemes: nope, sinusoidal"):
        build("rotary")
    with pytest.raises(TypeError, match="scheme name must be a str"):
        build(3)


def test_unknown_and_missing_keys():
    with pytest.raises(
        ValueError,
        match=r"unknown config key\(s\) \[.dim.\] for scheme .sinusoidal.; valid keys: d_model, base, vari",
    ):
        build("sinusoidal", dim=16)
    with pytest.raises(ValueError, match=r"scheme 'learned' needs d_model, max_len"):
        build("learned")


def test_build_with_context_takes_only_declared_keys():
    ctx = {"d_model": 32, "num_heads": 4, "head_dim": 8, "max_len": 64, "causal": True}
    assert build_with_context("learned", ctx).max_len == 64
    assert build_with_context("sinusoidal", ctx, {"variant": "tensor2tensor"}).variant == "tensor2tensor"
    assert build_with_context("learned", ctx, {"max_len": 10}).max_len == 10  # config wins
    assert isinstance(build_with_context("nope", ctx), PositionalScheme)


def test_describe_and_config_keys():
    info = describe("learned")
    assert info["hooks"] == ["embed"] and info["required"] == ["d_model", "max_len"]
    assert info["optional"]["init_std"] == 0.02
    assert "d_model" in config_keys("sinusoidal")


def test_register_custom_scheme():
    class Shift(PositionalScheme):
        name = "test_shift"
        hooks = ("embed",)
        summary = "adds the position"

        def __init__(self, d_model: int):
            super().__init__()

        def embed(self, x, positions=None):
            pos = torch.arange(x.shape[1]) if positions is None else positions
            return x + pos[..., None]

    try:
        register(Shift)
        assert "test_shift" in schemes()
        assert build("test_shift", d_model=4).embed(torch.zeros(1, 2, 4))[0, 1, 0] == 1
    finally:
        SCHEMES.pop("test_shift", None)
    with pytest.raises(TypeError, match="PositionalScheme subclass"):
        register(int)
    with pytest.raises(ValueError, match="lowercase"):
        register(Shift, name="Bad Name")


@pytest.mark.parametrize("name", posenc.schemes())
def test_every_scheme_takes_device_and_dtype_factory_kwargs(name):
    context = {"d_model": 16, "num_heads": 2, "head_dim": 8, "max_len": 32}
    extra = {"grid": (2, 2)} if name == "rope_2d" else {}
    scheme = build_with_context(name, context, {**extra, "device": "meta", "dtype": torch.bfloat16})
    for p in scheme.parameters():
        assert p.is_meta and p.dtype == torch.bfloat16
    assert "device" not in posenc.describe(name)["optional"]  # factory kwargs are not scheme options


def test_factory_kwargs_errors():
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype.*torch\.int64"):
        posenc.build("learned", d_model=4, max_len=3, dtype=torch.int64)
    with pytest.raises(ValueError, match="device 'gpu0' is not a device"):
        posenc.build("learned", d_model=4, max_len=3, device="gpu0")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['devise'\].*did you mean 'device'"):
        posenc.build("learned", d_model=4, max_len=3, devise="cpu")
    with pytest.raises(ValueError, match=r"unknown scheme 'rop'.*did you mean 'rope'"):
        posenc.build("rop", head_dim=8)


def test_a_user_scheme_without_factory_kwargs_is_placed_by_build(monkeypatch):
    class Table(posenc.PositionalScheme):
        name = "user_table"
        hooks = ("embed",)

        def __init__(self, d_model: int) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, d_model))

    monkeypatch.setitem(posenc.registry.SCHEMES, "user_table", Table)
    scheme = posenc.build("user_table", d_model=3, device="meta", dtype=torch.float64)
    assert scheme.weight.is_meta and scheme.weight.dtype == torch.float64
