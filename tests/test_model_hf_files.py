"""Tests of posenc.model.hf.files and the reading side of posenc.model.hf: hostile folders and
configs (wrong types, missing or extra tensors, wrong shapes, shards outside the folder, pickle
files, sizes too large to allocate) each give one ValueError naming the file and the field."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

from posenc.model.hf import from_transformers
from posenc.model.hf.files import HFConfig, HFWeights, read_hf_folder, write_hf_folder

LLAMA = {
    "model_type": "llama",
    "vocab_size": 11,
    "hidden_size": 8,
    "intermediate_size": 12,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 16,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
#: A Qwen2 config with its window switched on (transformers reads the window fields only then).
QWEN2 = {**LLAMA, "model_type": "qwen2", "use_sliding_window": True}


def _llama_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (11, 8),
        "model.norm.weight": (8,),
        "model.layers.0.self_attn.q_proj.weight": (8, 8),
        "model.layers.0.self_attn.k_proj.weight": (4, 8),
        "model.layers.0.self_attn.v_proj.weight": (4, 8),
        "model.layers.0.self_attn.o_proj.weight": (8, 8),
        "model.layers.0.mlp.gate_proj.weight": (12, 8),
        "model.layers.0.mlp.up_proj.weight": (12, 8),
        "model.layers.0.mlp.down_proj.weight": (8, 12),
        "model.layers.0.input_layernorm.weight": (8,),
        "model.layers.0.post_attention_layernorm.weight": (8,),
    }
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def _folder(tmp_path, config=None, tensors=None):
    write_hf_folder(
        tmp_path, LLAMA if config is None else config, _llama_tensors() if tensors is None else tensors
    )
    return tmp_path


def test_a_handwritten_folder_loads(tmp_path):
    model = from_transformers(_folder(tmp_path))
    assert model.config.norm_type == "rmsnorm" and model.config.kv_heads == 1 and model.config.tie == "output"
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 11)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": "8"}, r"field 'hidden_size' must be an int"),
        ({"hidden_size": True}, r"field 'hidden_size' must be an int"),
        ({"num_hidden_layers": 0}, r"field 'num_hidden_layers' must be an int in \[1,"),
        ({"rms_norm_eps": -1.0}, r"field 'rms_norm_eps' must be a finite number > 0"),
        ({"tie_word_embeddings": "yes"}, r"field 'tie_word_embeddings' must be true or false"),
        ({"hidden_act": "swiglu_x"}, r"'hidden_act' = 'swiglu_x' is not an activation"),
        ({"model_type": "bert"}, r"model_type 'bert' is not one posenc converts"),
        ({"num_attention_heads": 3}, r"num_attention_heads=3 does not divide hidden_size=8"),
        ({"num_key_value_heads": 3}, r"num_kv_heads=3 does not divide num_heads=2"),
        ({"head_dim": "8"}, r"field 'head_dim' must be an int"),
        ({"rope_parameters": {"rope_type": "magic"}}, r"unsupported HF rope_type 'magic'"),
        ({"vocab_size": None}, r"lacks the field 'vocab_size'"),
    ],
)
def test_bad_config_fields_name_the_file_and_field(tmp_path, change, message):
    config = {**LLAMA, **change}
    with pytest.raises(ValueError, match=message) as err:
        from_transformers(_folder(tmp_path, config))
    assert "config.json" in str(err.value)


def test_a_head_dim_the_weights_do_not_have_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"q_proj.weight' has shape \[8, 8\], the config implies \[16, 8\]"):
        from_transformers(_folder(tmp_path, {**LLAMA, "head_dim": 8}))


def test_huge_sizes_are_refused_before_allocating(tmp_path):
    config = {**LLAMA, "vocab_size": 1 << 38, "hidden_size": 1 << 20, "num_attention_heads": 1 << 10}
    with pytest.raises(ValueError, match=r"config.json: a model with d_model=1048576.* GiB is free") as err:
        from_transformers(_folder(tmp_path, config))
    assert len(str(err.value)) < 400


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.pop("model.layers.0.mlp.up_proj.weight"),
            r"lacks the tensor 'model.layers.0.mlp.up_proj.weight'",
        ),
        (
            lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(12, 9)}),
            r"has shape \[12, 9\], the config implies \[12, 8\]",
        ),
        (
            lambda t: t.update({"model.layers.1.mlp.up_proj.weight": torch.zeros(12, 8)}),
            r"1 tensor\(s\) the config does not account for",
        ),
        (
            lambda t: t.update({"model.norm.weight": torch.zeros(8, dtype=torch.int32)}),
            r"dtype torch.int32, expected floating point",
        ),
    ],
)
def test_bad_weights_name_the_tensor(tmp_path, edit, message):
    tensors = _llama_tensors()
    edit(tensors)
    with pytest.raises(ValueError, match=message) as err:
        from_transformers(_folder(tmp_path, tensors=tensors))
    assert "model.safetensors" in str(err.value)


def test_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        read_hf_folder(tmp_path / "nothing")
    with pytest.raises(ValueError, match=r"has no config\.json"):
        read_hf_folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        read_hf_folder(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        read_hf_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ValueError, match="pickle file, which posenc does not read"):
        read_hf_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        read_hf_folder(tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "", 7])
def test_shard_index_stays_inside_the_folder(tmp_path, shard):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    index = {"weight_map": {"model.norm.weight": shard}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="is not a file name inside the folder"):
        read_hf_folder(tmp_path)


def test_shard_index_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": []}))
    with pytest.raises(ValueError, match="'weight_map' must be a non-empty object"):
        read_hf_folder(tmp_path)
    index.write_text(json.dumps({"weight_map": {"a": "one.safetensors"}}))
    with pytest.raises(
        ValueError, match=r"one\.safetensors' listed in model\.safetensors\.index\.json is missing"
    ):
        read_hf_folder(tmp_path)
    t = _llama_tensors()
    safetensors.torch.save_file(
        {"model.norm.weight": t["model.norm.weight"]}, str(tmp_path / "a.safetensors")
    )
    safetensors.torch.save_file(
        {"model.norm.weight": t["model.norm.weight"]}, str(tmp_path / "b.safetensors")
    )
    index.write_text(json.dumps({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}))
    with pytest.raises(ValueError, match="repeats tensors of another shard"):
        read_hf_folder(tmp_path)


def test_an_oversized_json_is_not_read(tmp_path):
    (tmp_path / "config.json").write_bytes(b" " * ((16 << 20) + 1))
    with pytest.raises(ValueError, match="too large"):
        read_hf_folder(tmp_path)


def test_hfconfig_reads_the_first_name_present():
    c = HFConfig({"n_embd": 64, "hidden_size": None}, "x.json")
    assert c.int("hidden_size", "n_embd") == 64
    assert c.int("n_layer", default=3) == 3
    with pytest.raises(ValueError, match=r"x\.json lacks the field 'n_head' / 'num_attention_heads'"):
        c.int("n_head", "num_attention_heads")
    with pytest.raises(ValueError, match="must be a JSON object"):
        HFConfig([1], "x.json")


def test_hfweights_ignores_only_whole_name_parts():
    w = HFWeights(
        {"h.0.attn.bias": torch.zeros(1), "h.0.attn.c_attn.bias": torch.zeros(1)}, "f", ("attn.bias",)
    )
    assert sorted(w.tensors) == ["h.0.attn.c_attn.bias"]


def test_an_absent_tie_field_keeps_a_llama_output_layer(tmp_path):
    """LlamaConfig (and Mistral, Qwen2/3, Phi-3) default to untied embeddings: a config.json without
    tie_word_embeddings keeps the file's own lm_head.weight; a config that says tied while the file
    holds a different output layer is refused rather than the layer dropped."""
    tensors = _llama_tensors()
    tensors["lm_head.weight"] = torch.randn(11, 8, generator=torch.Generator().manual_seed(5))
    config = {k: v for k, v in LLAMA.items() if k != "tie_word_embeddings"}
    model = from_transformers(_folder(tmp_path / "absent", config, tensors))
    assert model.config.tie == "none"
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])
    with pytest.raises(ValueError, match=r"holds an lm_head\.weight that differs from the token embedding"):
        from_transformers(_folder(tmp_path / "tied", LLAMA, tensors))


def test_a_large_shard_index_is_read_in_linear_time(tmp_path):
    """200,000 shard names (a 5 MB index, under the size limit): one pass, not a quadratic scan."""
    import time

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    names = {f"t{i}": f"s{i}.safetensors" for i in range(200_000)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    start = time.perf_counter()
    with pytest.raises(
        ValueError, match=r"s0\.safetensors' listed in model\.safetensors\.index\.json is missing"
    ):
        read_hf_folder(tmp_path)
    assert time.perf_counter() - start < 10  # the list scan took minutes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nests lists/objects more than"),
        (json.dumps({**LLAMA, "sliding_window": "4096"}), "sliding_window"),
        (json.dumps({**QWEN2, "use_sliding_window": "yes", "sliding_window": 4}), "use_sliding_window"),
        (json.dumps({**LLAMA, "sliding_window": 0}), "sliding_window"),
        (json.dumps({**QWEN2, "sliding_window": 4, "layer_types": "sliding_attention"}), "layer_types"),
        (
            json.dumps({**QWEN2, "sliding_window": 4, "layer_types": ["sliding_attention"] * 99}),
            "layer_types",
        ),
        (json.dumps({**QWEN2, "sliding_window": 4, "max_window_layers": -1}), "max_window_layers"),
    ],
)
def test_hostile_config_text_is_one_error_naming_the_file(tmp_path, text, message):
    _folder(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        from_transformers(tmp_path)
    assert "config.json" in str(err.value)


@pytest.mark.parametrize(
    ("fields", "want", "warns"),
    [
        # each row is what transformers' config class makes of the same fields (checked with 5.x)
        ({"model_type": "mistral", "sliding_window": 4}, 4, False),  # every layer
        ({"model_type": "mistral"}, 4096, False),  # MistralConfig's default
        ({"model_type": "mistral", "sliding_window": None}, None, False),
        ({"model_type": "phi3", "sliding_window": 4}, 4, False),
        ({"model_type": "phi3"}, None, False),
        ({"model_type": "llama", "sliding_window": 4}, None, "is ignored"),  # Llama has no window
        ({"model_type": "qwen2", "sliding_window": 4}, None, False),  # use_sliding_window defaults to false
        ({"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": False}, None, False),
        # switched on, from layer 28 (the default max_window_layers) of 3
        ({"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": True}, None, False),
        (
            {"model_type": "qwen3", "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 0},
            4,
            False,
        ),
        (
            {"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 3},
            None,
            False,
        ),
        (
            {"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 1},
            None,
            "is not reproduced",
        ),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 4,
                "use_sliding_window": False,
                "layer_types": ["sliding_attention"] * 3,
            },
            None,
            False,
        ),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 4,
                "use_sliding_window": True,
                "layer_types": ["sliding_attention"] * 3,
            },
            4,
            False,
        ),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 4,
                "use_sliding_window": True,
                "layer_types": ["full_attention", "sliding_attention", "full_attention"],
            },
            None,
            "is not reproduced",
        ),
    ],
)
def test_the_window_is_read_where_every_layer_has_it(fields, want, warns):
    import warnings

    from posenc.model.hf.fields import read_sliding_window
    from posenc.model.hf.files import HFConfig

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert read_sliding_window(HFConfig(fields), 3) == want
    assert len(seen) == bool(warns) and all(warns in str(w.message) for w in seen)
