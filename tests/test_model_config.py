"""Tests of posenc.model.config: ModelConfig refuses a bad field at construction, naming the field,
the value and the fix, and refuses position_options that contradict the model."""

from __future__ import annotations

import pytest

import posenc
from _model_helpers import V, config
from _model_toys import register_toys
from posenc.model import ModelConfig


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(d_model=30, num_heads=4), "num_heads=4 does not divide d_model=30"),
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads=3 does not divide num_heads=4"),
        (dict(position="no_such_scheme"), "unknown scheme 'no_such_scheme'; valid schemes: nope"),
        (dict(position="learned", max_len=None), "position='learned' needs max_len"),
        (dict(position_options={"bogus": 1}), r"unknown position_options \['bogus'\]"),
        (dict(norm="middle"), "unknown norm 'middle'"),
        (dict(tie="everything"), "unknown tie 'everything'"),
        (dict(dropout=1.5), r"dropout must be in \[0, 1\)"),
        (dict(memory_len=-1), "memory_len must be >= 0"),
        (dict(embed_scale="sqrt_d"), "embed_scale must be 'sqrt_d_model', None or a positive number"),
        (dict(embed_scale=-2.0), "embed_scale must be a finite number > 0"),
        (dict(embed_init_std=0), "embed_init_std must be a finite number > 0"),
        (dict(init_std=float("inf")), "init_std must be a finite number > 0"),
    ],
)
def test_bad_configurations_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        config(**kwargs)


def test_position_options_that_contradict_the_model_are_refused_at_config_time():
    with pytest.raises(ValueError, match=r"position_options num_heads=2 \(the model has 4\) disagree"):
        ModelConfig(
            vocab_size=V, d_model=32, num_heads=4, position="alibi", position_options={"num_heads": 2}
        )
    ModelConfig(vocab_size=V, d_model=32, num_heads=4, position="alibi", position_options={"num_heads": 4})


@pytest.fixture
def alarm():
    """Fail (instead of hanging the suite) when the body runs longer than 5 s."""
    import signal

    def expire(*_):
        raise TimeoutError("took more than 5 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(d_model=10**12 + 1, num_heads=2), "among the divisors of 1000000000001"),
        (dict(d_model=2**40, num_heads=2**40, num_kv_heads=3), "among the divisors of 1099511627776"),
        (dict(d_model=10**30 + 1, num_heads=7), "among the divisors of"),
    ],
)
def test_a_huge_size_from_a_file_gets_its_message_at_once(kwargs, match, alarm):
    """A size read from a file (config.json, a model's metadata) must not make the message's divisor
    list take time proportional to it: 10^12 + 1 ran for ever."""
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=V, **kwargs)


def test_the_divisors_listed_are_all_of_them():
    with pytest.raises(ValueError, match=r"among \[1, 2, 3, 4, 6, 9, 12, 18, 36\]"):
        ModelConfig(vocab_size=V, d_model=36, num_heads=5)


# ----------------------------------------------------------------------------------------------
# The block's fields
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"norm_type": "batchnorm"}, ValueError, "unknown norm_type 'batchnorm'"),
        ({"norm_eps": 0.0}, ValueError, "norm_eps must be a finite number > 0"),
        ({"activation": "swish"}, ValueError, "unknown activation 'swish'"),
        ({"residual": "paralel"}, ValueError, "did you mean 'parallel'"),
        ({"gated_mlp": 1}, TypeError, "gated_mlp must be a bool"),
        ({"qk_norm": "yes"}, TypeError, "qk_norm must be a bool"),
        ({"qkv_bias": 0}, TypeError, r"qkv_bias must be a bool or None \(= bias\)"),
        ({"residual": "parallel", "norm": "post"}, ValueError, "needs norm='pre'"),
        ({"d_head": 0}, ValueError, "d_head must be >= 1"),
        ({"d_head": 8.0}, TypeError, "d_head must be an int"),
        ({"sliding_window": 0}, ValueError, "sliding_window must be >= 1"),
        ({"sliding_window": 4.0}, TypeError, "sliding_window must be an int"),
        ({"sliding_window": True}, TypeError, "sliding_window must be an int"),
        ({"sliding_window": "4"}, TypeError, "sliding_window must be an int"),
        ({"sliding_window": 4, "memory_len": 8}, ValueError, "use one of them"),
    ],
)
def test_block_fields_are_checked(kw, error, message):
    with pytest.raises(error, match=message):
        ModelConfig(vocab_size=5, d_model=8, num_heads=2, **kw)


def test_projection_bias_falls_back_to_bias():
    config = ModelConfig(vocab_size=5, d_model=8, num_heads=2, bias=True, out_bias=False)
    assert [config.projection_bias(p) for p in ("qkv", "out", "mlp")] == [True, False, True]
    qwen2 = ModelConfig(vocab_size=5, d_model=8, num_heads=2, qkv_bias=True)
    assert [qwen2.projection_bias(p) for p in ("qkv", "out", "mlp")] == [True, False, False]


def test_d_head_sets_the_head_width():
    config = ModelConfig(vocab_size=5, d_model=8, num_heads=2, d_head=16)
    assert config.head_dim == 16 and ModelConfig(vocab_size=5, d_model=8, num_heads=2).head_dim == 4


def test_a_gated_mlp_counts_its_third_matrix():
    plain = ModelConfig(vocab_size=5, d_model=8, num_heads=2, d_ff=16)
    gated = ModelConfig(vocab_size=5, d_model=8, num_heads=2, d_ff=16, gated_mlp=True)
    assert gated.approx_num_params() - plain.approx_num_params() == plain.num_layers * 8 * 16


def test_a_config_saved_before_the_block_fields_loads_with_the_classic_block():
    old = ModelConfig(vocab_size=5, d_model=8, num_heads=2).to_dict()
    for name in (
        "norm_type",
        "norm_eps",
        "activation",
        "gated_mlp",
        "qkv_bias",
        "out_bias",
        "mlp_bias",
        "residual",
        "qk_norm",
        "output_bias",
        "d_head",
    ):
        old.pop(name)
    config = ModelConfig.from_dict(old)
    assert (config.norm_type, config.activation, config.residual) == ("layernorm", "gelu", "sequential")
    assert config == ModelConfig(vocab_size=5, d_model=8, num_heads=2)


def test_scheme_context_offers_one_causal_argument():
    """A model offers its form once, as ``causal``; T5 reads it (one-directional buckets in a
    decoder) and ALiBi, whose bias is the same in both, takes no form argument."""
    cfg = ModelConfig(vocab_size=10, position="t5")
    for causal in (True, False):
        context = cfg.scheme_context(causal)
        assert context["causal"] is causal and "bidirectional" not in context
        assert posenc.build_with_context("t5", context).causal is causal
        assert "causal" not in vars(posenc.build_with_context("alibi", context))
