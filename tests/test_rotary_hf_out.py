"""Tests of posenc.rotary.hf_out: the HF fields of a posenc RoPE read back (hf_rope_config) as the
same RoPE, for every scaling; schemes that are not a plain RoPE have none."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.rotary.hf import hf_rope_config
from posenc.rotary.hf_out import hf_rope_fields

SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
]


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("partial", [None, 0.5])
def test_fields_read_back_as_the_same_rotation(scaling, partial):
    rope = posenc.build("rope", head_dim=16, base=500.0, scaling=scaling, partial_rotary_factor=partial)
    fields = hf_rope_fields(rope, 64)
    assert fields.pop("layout") == "half"
    again = posenc.build("rope", **hf_rope_config({**fields, "head_dim": 16}))
    q, k = torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)
    for a, b in zip(rope.rotate(q, k), again.rotate(q, k)):
        assert torch.equal(a, b)


def test_length_fields_follow_transformers_conventions():
    dynamic = posenc.build(
        "rope",
        head_dim=8,
        scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16},
    )
    assert hf_rope_fields(dynamic, 64)["max_position_embeddings"] == 16  # HF grows past it
    assert hf_rope_fields(posenc.build("rope", head_dim=8), None)["max_position_embeddings"] == 2048


def test_other_schemes_have_no_rope_fields():
    assert hf_rope_fields(posenc.build("xpos", head_dim=8), 64) is None
    assert hf_rope_fields(posenc.build("alibi", num_heads=4), 64) is None
    assert hf_rope_fields(None, 64) is None


def test_static_ntk_has_no_hf_rope_type_and_is_refused():
    """transformers has no "ntk" rope_type (its loader raises KeyError on one): the export refuses it
    and says how to write the same rotation."""
    rope = posenc.build("rope", head_dim=16, scaling={"rope_type": "ntk", "factor": 2.0})
    with pytest.raises(ValueError, match=r"'ntk' .* has no Hugging Face rope_type.*base b \* s\^"):
        hf_rope_fields(rope, 64)
