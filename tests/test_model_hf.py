"""Tests of posenc.model.hf: Hugging Face checkpoints in (every family, prefill and KV-cache
decoding equal to transformers' logits to float32 rounding), out (a posenc model exported reloads in
transformers with the same logits), from a folder without transformers, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from _hf_families import FAMILY_CONFIGS, V, hf_model
from posenc.model import ModelConfig, TransformerLM
from posenc.model.hf import export_state, from_transformers, save_transformers, to_transformers

transformers = pytest.importorskip("transformers")

# float32 logits of magnitude ~1 through a few layers: rounding differs between the two orders of
# operations by a few 1e-7; 1e-5 is 30x that and 50x below the smallest real mismatch seen (5e-4,
# a rotary factor written wrong)
ATOL = 1e-5


#: entries whose rotation depends on the current length (original length 8)
LENGTH_DEPENDENT = ("llama_dynamic", "phi3_longrope")


def _ids(b: int = 2, s: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))


def _decode(model: TransformerLM, ids: torch.Tensor, prefix: int) -> torch.Tensor:
    """Logits of ``ids`` by a prefill of ``prefix`` tokens then one token at a time with a KV cache."""
    cache = model.new_cache()
    out = [model(ids[:, :prefix], cache=cache).logits]
    for t in range(prefix, ids.shape[1]):
        out.append(model(ids[:, t : t + 1], cache=cache).logits)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_every_family_converts_with_the_same_logits_prefill_and_decode(name):
    hf = hf_model(name)
    ids = _ids(s=20 if name in LENGTH_DEPENDENT else 12)  # past the original length
    # past the original length a full forward rotates every token with the frequencies of the whole
    # length, which no causal decoding can reproduce: decode within it. (Before the long forward:
    # transformers' dynamic rule keeps the frequencies of the longest length it has seen.)
    short = ids[:, :8] if name in LENGTH_DEPENDENT else ids
    with torch.no_grad():
        ref_short = hf(short).logits
        ref = hf(ids).logits
        model = from_transformers(hf)
        torch.testing.assert_close(model(ids).logits, ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(_decode(model, short, 5), ref_short, atol=ATOL, rtol=0)
    assert not model.training


def test_a_folder_reads_without_transformers_and_matches(tmp_path, monkeypatch):
    hf = hf_model("qwen2")
    hf.save_pretrained(tmp_path)
    ids = _ids()
    with torch.no_grad():
        ref = hf(ids).logits
    monkeypatch.setitem(sys.modules, "transformers", None)  # any import of it now fails
    model = from_transformers(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, atol=ATOL, rtol=0)


def test_a_sharded_folder_reads(tmp_path):
    hf = hf_model("llama")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(from_transformers(tmp_path)(ids).logits, hf(ids).logits, atol=ATOL, rtol=0)


def test_bf16_checkpoint_loads_in_its_dtype_or_the_one_asked(tmp_path):
    hf = hf_model("llama").to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    assert from_transformers(tmp_path).lm_head.weight.dtype == torch.bfloat16
    assert from_transformers(tmp_path, dtype=torch.float32).lm_head.weight.dtype == torch.float32


def test_posenc_imports_without_transformers():
    code = "import sys; sys.modules['transformers'] = None; import posenc, posenc.model.hf; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def _posenc(seed: int = 1, **kw) -> TransformerLM:
    base = dict(vocab_size=V, d_model=64, num_layers=2, num_heads=4, max_len=64)
    torch.manual_seed(seed)
    model = TransformerLM(ModelConfig(**{**base, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


LLAMA_BLOCK = dict(norm_type="rmsnorm", activation="silu", gated_mlp=True)
EXPORTS = {
    "llama": (
        dict(**LLAMA_BLOCK, num_kv_heads=2, d_ff=96, embed_scale=None, norm_eps=1e-6),
        "LlamaForCausalLM",
    ),
    "qwen3_untied_scaled": (
        dict(**LLAMA_BLOCK, num_kv_heads=2, qk_norm=True, tie="none"),
        "Qwen3ForCausalLM",
    ),
    "qwen2": (dict(**LLAMA_BLOCK, qkv_bias=True, embed_scale=None), "Qwen2ForCausalLM"),
    "llama_d_head_24": (dict(**LLAMA_BLOCK, d_head=24, num_kv_heads=2), "LlamaForCausalLM"),
    "qwen3_interleaved": (
        dict(**LLAMA_BLOCK, qk_norm=True, num_kv_heads=2, position_options={"layout": "interleaved"}),
        "Qwen3ForCausalLM",
    ),
    "neox_interleaved_partial": (
        dict(position_options={"layout": "interleaved", "partial_rotary_factor": 0.5}),
        "GPTNeoXForCausalLM",
    ),
    "posenc_default": (dict(), "GPTNeoXForCausalLM"),
    "neox_parallel_partial": (
        dict(residual="parallel", bias=True, position_options={"partial_rotary_factor": 0.25}),
        "GPTNeoXForCausalLM",
    ),
    "gpt2": (dict(position="learned", activation="gelu_tanh", embed_scale=None), "GPT2LMHeadModel"),
    "mistral_window": (dict(**LLAMA_BLOCK, num_kv_heads=2, sliding_window=5), "MistralForCausalLM"),
    "qwen2_window": (dict(**LLAMA_BLOCK, qkv_bias=True, sliding_window=3), "Qwen2ForCausalLM"),
    "llama_yarn": (
        dict(
            **LLAMA_BLOCK,
            position_options={
                "scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
            },
        ),
        "LlamaForCausalLM",
    ),
}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_export_reloads_in_transformers_with_the_same_logits(name, tmp_path):
    kw, cls = EXPORTS[name]
    model = _posenc(**kw)
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
        hf = to_transformers(model)
        assert type(hf).__name__ == cls
        torch.testing.assert_close(hf(ids).logits, ref, atol=ATOL, rtol=0)
        save_transformers(model, tmp_path)
        # the class named in the file is the one its model_type loads (tools that read the field)
        assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [cls]
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        torch.testing.assert_close(reloaded(ids).logits, ref, atol=ATOL, rtol=0)
        back = from_transformers(tmp_path)
        torch.testing.assert_close(back(ids).logits, ref, atol=ATOL, rtol=0)


def test_hf_in_out_in_is_exact():
    """A converted Llama written back gives bit-identical tensors."""
    hf = hf_model("llama")
    model = from_transformers(hf)
    _, tensors = export_state(model)
    for name, t in hf.state_dict().items():
        if name in tensors:
            assert torch.equal(tensors[name], t), name


def test_export_refuses_what_no_family_computes(tmp_path):
    model = _posenc(position="alibi")
    with pytest.raises(ValueError, match="fits no Hugging Face family"):
        export_state(model)
    with pytest.raises(ValueError, match="unknown family 'bert'"):
        export_state(_posenc(), family="bert")
    with pytest.raises(ValueError, match="gpt2: learns one vector per position"):
        export_state(_posenc(), family="gpt2")
    with pytest.raises(TypeError, match="TransformerLM"):
        export_state(torch.nn.Linear(2, 2))


def test_save_transformers_never_overwrites_silently(tmp_path):
    model = _posenc()
    save_transformers(model, tmp_path)
    before = (tmp_path / "config.json").read_text()
    with pytest.raises(ValueError, match="already holds"):
        save_transformers(_posenc(**LLAMA_BLOCK), tmp_path)
    assert (tmp_path / "config.json").read_text() == before
    save_transformers(_posenc(**LLAMA_BLOCK), tmp_path, overwrite=True)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        save_transformers(model, tmp_path / "file")


def test_from_transformers_rejects_other_objects():
    with pytest.raises(TypeError, match="folder or a transformers model"):
        from_transformers(42)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bloom"])
def test_greedy_generation_equals_transformers(name):
    hf = hf_model(name)
    model = from_transformers(hf)
    prompt = _ids(b=2, s=6, seed=4)
    with torch.no_grad():
        want = hf.generate(prompt, do_sample=False, max_new_tokens=10, min_new_tokens=10, pad_token_id=0)
        got = model.generate(prompt, 10, temperature=0)  # temperature 0 = greedy
    assert torch.equal(got, want)


def test_hostile_family_fields_are_refused(tmp_path):
    hf = hf_model("gpt2")
    for change, message in (
        ({"scale_attn_by_inverse_layer_idx": True}, "scales attention logits by 1/sqrt"),
        ({"add_cross_attention": True}, "not a decoder-only GPT-2"),
        ({"activation_function": "gelu_fast"}, "'gelu_fast' is not an activation"),
    ):
        bad = type(
            "Bad",
            (),
            {
                "config": type(hf.config).from_dict({**hf.config.to_dict(), **change}),
                "state_dict": hf.state_dict,
            },
        )()
        with pytest.raises(ValueError, match=message):
            from_transformers(bad)
    bloom = hf_model("bloom")
    bloom.config.apply_residual_connection_post_layernorm = True
    with pytest.raises(ValueError, match="apply_residual_connection_post_layernorm"):
        from_transformers(bloom)


def test_a_window_on_some_layers_only_warns_and_attends_to_every_token():
    hf = hf_model("qwen2_window")
    hf.config.layer_types = ["full_attention", "sliding_attention"]  # posenc windows all layers or none
    with pytest.warns(UserWarning, match=r"sliding_window=5 in 1 of 2 layers is not reproduced"):
        model = from_transformers(hf)
    assert model.config.sliding_window is None


@pytest.mark.parametrize(
    ("name", "fields", "drop", "window"),
    [
        ("llama", {"sliding_window": 4}, (), None),  # LlamaForCausalLM has no window, whatever the field says
        ("qwen2", {"sliding_window": 4}, ("use_sliding_window", "layer_types", "max_window_layers"), None),
        # switched on, but from layer 28 (the default max_window_layers) of 2
        (
            "qwen2",
            {"sliding_window": 4, "use_sliding_window": True},
            (
                "layer_types",
                "max_window_layers",
            ),
            None,
        ),
        ("mistral", {}, ("sliding_window",), 4096),  # absent: MistralConfig's default
    ],
)
def test_a_window_field_is_read_as_transformers_reads_it(tmp_path, name, fields, drop, window):
    import warnings

    hf_model(name).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in drop:
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps({**config, **fields}))
    ids = _ids()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Llama's ignored field is announced; the logits are the test
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        model = from_transformers(tmp_path)
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=ATOL, rtol=0)
    assert model.config.sliding_window == window


def test_a_windowed_model_exports_only_to_a_family_with_windows(tmp_path):
    with pytest.raises(ValueError, match="gpt_neox: has no sliding-window attention"):
        export_state(_posenc(sliding_window=4), family="gpt_neox")
    with pytest.raises(ValueError, match=r"mistral: \(a Llama block with sliding_window\) has no biases"):
        export_state(_posenc(**LLAMA_BLOCK, bias=True, sliding_window=4), family="llama")


def test_a_posenc_folder_is_pointed_to_load_model(tmp_path):
    _posenc().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"posenc\.load_model"):
        from_transformers(tmp_path)
