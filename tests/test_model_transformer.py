"""Tests of posenc.model.transformer (and config, io): any scheme by name, cache, packing, padding, memory.

The generic tests loop over every registered scheme (``posenc.schemes()``, so the rotary and bias
schemes are covered as soon as they are merged) plus the test-only toy schemes of
``_model_toys``, which cover every hook path today. Models are tiny (d=32, 2 layers) and float32.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _model_toys import CAUSAL_TOYS, register_toys
from posenc.kernels import set_enabled
from posenc.model import (
    Decoder,
    Encoder,
    EncoderDecoder,
    KVCache,
    LMOutput,
    ModelConfig,
    TransformerLM,
    load_model,
    save_model,
)
from posenc.registry import scheme_class

V = 37
ALL = [*posenc.schemes(), *CAUSAL_TOYS]


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tensors are tiny: one thread is fastest, and spinning OpenMP threads on a shared
    machine made single forwards 100x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(position="toy_rotate", **kw) -> ModelConfig:
    base = dict(
        vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, position=position, max_len=64
    )
    base.update(kw)
    return ModelConfig(**base)


def lm_or_skip(position: str, seed: int = 0, **kw) -> TransformerLM:
    """A small eval-mode LM for ``position``, or skip schemes a causal sequence model cannot take."""
    if not scheme_class(position).causal_ok:
        pytest.skip(f"{position} has no causal form")
    torch.manual_seed(seed)
    try:
        model = TransformerLM(config(position, **kw))
    except ValueError as err:
        if "grids" in str(err):
            pytest.skip(f"{position} encodes grids, not sequences")
        raise
    return model.eval()


def count_calls(monkeypatch, owner, name: str, calls: list | None = None) -> list:
    """Wrap ``owner.name`` (for the test's duration) so that each call appends to ``calls``."""
    calls = [] if calls is None else calls
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def ids_(b: int, s: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# Generic: every causal scheme
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("position", ALL)
def test_incremental_decoding_equals_full_forward(position):
    """Prefill 4 tokens, then 1, 1, then a chunk of 3: each call's logits equal a full forward of
    the prefix ending with that call (for length-independent schemes: the full forward of everything;
    a length-dependent rotation such as dynamic NTK rescales with the current length by design)."""
    model = lm_or_skip(position)
    ids = ids_(2, 9)
    cache = model.new_cache()
    with torch.no_grad():
        for start, stop in [(0, 4), (4, 5), (5, 6), (6, 9)]:
            got = model(ids[:, start:stop], cache=cache).logits
            torch.testing.assert_close(
                got, model(ids[:, :stop]).logits[:, start:], msg=f"{position}: {start}:{stop}"
            )
        assert len(cache) == 9
        if not scheme_class(position).needs_unrotated_cache:
            torch.testing.assert_close(got, model(ids).logits[:, 6:])


@pytest.mark.parametrize("position", ["rope", "alibi", "t5"])
def test_incremental_decoding_with_gradients_on_equals_full_forward(position):
    """The cache's path while gradients are enabled (keys carry grad: concatenated, never written in
    place): prefill and one step, with random keys, against a full forward, values and gradients."""
    torch.manual_seed(3)
    model = TransformerLM(config(position))
    ids = ids_(2, 7)
    cache = model.new_cache()
    prefill = model(ids[:, :6], cache=cache).logits
    step = model(ids[:, 6:], cache=cache).logits
    full = model(ids).logits
    torch.testing.assert_close(torch.cat((prefill, step), dim=1), full, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(step.sum(), list(model.parameters()), allow_unused=True)
    want = torch.autograd.grad(full[:, 6:].sum(), list(model.parameters()), allow_unused=True)
    for a, b in zip(grads, want):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("position", ALL)
def test_packed_documents_equal_separate_runs(position):
    model = lm_or_skip(position)
    docs = [ids_(1, 5, seed=2), ids_(1, 3, seed=3), ids_(1, 6, seed=4)]
    packed = torch.cat(docs, dim=1)  # [1, 14]
    cu = torch.tensor([0, 5, 8, 14])
    with torch.no_grad():
        got = model(packed, cu_seqlens=cu).logits
        want = torch.cat([model(d).logits for d in docs], dim=1)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("position", ALL)
def test_left_padded_batch_equals_unpadded(position):
    """Full forward and cached generation of a left-padded batch match each row run alone."""
    model = lm_or_skip(position)
    rows = [ids_(1, 6, seed=5)[0], ids_(1, 3, seed=6)[0]]
    s = max(len(r) for r in rows)
    ids = torch.zeros(2, s, dtype=torch.long)
    mask = torch.zeros(2, s, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, s - len(r) :], mask[i, s - len(r) :] = r, 1
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
        for i, r in enumerate(rows):
            torch.testing.assert_close(got[i, s - len(r) :], model(r[None]).logits[0])
        assert torch.isfinite(got).all()  # padding rows see themselves, never an all -inf softmax
        out = model.generate(ids, 4, attention_mask=mask, temperature=0)
        for i, r in enumerate(rows):
            alone = model.generate(r[None], 4, temperature=0)[0]
            assert torch.equal(out[i, s - len(r) :], alone)


@pytest.mark.parametrize("position", ALL)
def test_transformer_xl_memory_covering_the_stream_equals_full_forward(position):
    """With memory_len >= everything seen, chunked processing is exactly a full causal forward."""
    model = lm_or_skip(position, memory_len=16)
    ids = ids_(2, 12)
    with torch.no_grad():
        full = model(ids).logits
        memory, chunks = None, []
        for start in range(0, 12, 4):
            out = model(ids[:, start : start + 4], memory=memory)
            chunks.append(out.logits)
            memory = out.memory
    if position == "toy_dynamic":  # the rotation depends on the length, so compare to the prefix
        with torch.no_grad():
            torch.testing.assert_close(chunks[1], model(ids[:, :8]).logits[:, 4:])
        return
    torch.testing.assert_close(torch.cat(chunks, dim=1), full)
    assert memory.next_position == 12 and len(memory) == 12


# ---------------------------------------------------------------------------------------------
# Transformer-XL memory
# ---------------------------------------------------------------------------------------------
def test_memory_is_capped_detached_and_attends_to_the_last_m_tokens():
    """One layer: layer 0's memory holds embeddings, so segment 2 with memory m equals a full forward
    of the last m tokens of segment 1 plus segment 2, at their true positions."""
    torch.manual_seed(0)
    model = TransformerLM(config("toy_alibi", num_layers=1, memory_len=3)).eval()
    ids = ids_(2, 10)
    out1 = model(ids[:, :6])
    assert isinstance(out1, LMOutput)
    assert len(out1.memory) == 3 and out1.memory.next_position == 6
    assert not any(h.requires_grad for h in out1.memory.states)
    out2 = model(ids[:, 6:], memory=out1.memory)
    window = model(ids[:, 3:], positions=torch.arange(3, 10)).logits
    torch.testing.assert_close(out2.logits, window[:, 3:])
    out2.logits.sum().backward()  # the gradient reaches the weights, never the previous segment
    assert model.lm_head.weight.grad is not None


def test_memory_errors():
    plain = TransformerLM(config())
    with_mem = TransformerLM(config(memory_len=4))
    memory = with_mem(ids_(1, 4)).memory
    with pytest.raises(ValueError, match="memory_len is 0"):
        plain(ids_(1, 4), memory=memory)
    with pytest.raises(ValueError, match="cannot be combined with cache"):
        with_mem(ids_(1, 4), memory=memory, cache=with_mem.new_cache())
    with pytest.raises(ValueError, match="decoder-only"):
        EncoderDecoder(config(memory_len=4))


# ---------------------------------------------------------------------------------------------
# Configuration variants and validation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        dict(norm="post"),
        dict(num_kv_heads=None),
        dict(num_kv_heads=1),
        dict(share_position=False, position="toy_content"),
        dict(embed_norm=True, position="learned", bias=True),
        dict(tie="none", d_ff=48),
        dict(position="toy_shaw", share_position=False),
    ],
)
def test_variants_decode_incrementally(options):
    position = options.pop("position", "toy_rotate")
    model = lm_or_skip(position, **options)
    ids = ids_(2, 7)
    cache = model.new_cache()
    with torch.no_grad():
        got = torch.cat(
            [
                model(ids[:, :3], cache=cache).logits,
                model(ids[:, 3:5], cache=cache).logits,
                model(ids[:, 5:], cache=cache).logits,
            ],
            dim=1,
        )
        torch.testing.assert_close(got, model(ids).logits)


def test_share_position_false_builds_one_scheme_per_layer():
    shared = TransformerLM(config("toy_content"))
    per_layer = TransformerLM(config("toy_content", share_position=False))
    assert len(shared.decoder.schemes) == 1 and len(per_layer.decoder.schemes) == 2
    assert per_layer.decoder.scheme(0) is not per_layer.decoder.scheme(1)
    n = sum(p.numel() for p in shared.decoder.schemes[0].parameters())
    assert sum(p.numel() for p in per_layer.parameters()) - sum(p.numel() for p in shared.parameters()) == n
    embed_only = TransformerLM(config("sinusoidal", share_position=False))
    assert len(embed_only.decoder.schemes) == 0 and embed_only.decoder.embed.position is not None


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
    ],
)
def test_bad_configurations_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        config(**kwargs)


def test_bad_models_fail_at_construction():
    with pytest.raises(ValueError, match="'toy_bidir' has no causal form, so it cannot run in a decoder"):
        TransformerLM(config("toy_bidir"))
    with pytest.raises(ValueError, match="has no causal form"):
        EncoderDecoder(config("toy_bidir"))
    Encoder(config("toy_bidir"))  # an encoder is fine
    with pytest.raises(ValueError, match="tie='three_way' needs an encoder"):
        TransformerLM(config(tie="three_way"))
    with pytest.raises(ValueError, match="src_vocab_size=50 != vocab_size=37"):
        EncoderDecoder(config(tie="three_way", src_vocab_size=50))
    with pytest.raises(ValueError, match="encodes 2-D grids, not token sequences"):
        TransformerLM(config("sinusoidal_2d"))
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        config(vocab_size=3.0)


def test_learned_positions_refuse_inputs_longer_than_max_len():
    model = TransformerLM(config("learned", max_len=8)).eval()
    model(ids_(1, 8))
    with pytest.raises(ValueError, match=r"needs positions up to 8 \(length 9\), longer than max_len=8"):
        model(ids_(1, 9))
    with pytest.raises(ValueError, match="max_len=8"):
        model.generate(ids_(1, 6), 5)


def test_forward_argument_errors():
    model = TransformerLM(config())
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[b, s\] = \[1, 4\]"):
        model(ids_(1, 4), attention_mask=torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_mask must be bool or integer"):
        model(ids_(1, 4), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"take ids of shape \[1, total\], got batch 2"):
        model(ids_(2, 4), cu_seqlens=torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\] = 5 must equal the packed length s = 4"):
        model(ids_(1, 4), cu_seqlens=torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match="cache has 3 layers, the model 2"):
        model(ids_(1, 4), cache=KVCache(3))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[0, V]]))
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        model.generate(ids_(1, 2), -1)
    with pytest.raises(ValueError, match="top_k must be None or an int >= 1"):
        model.generate(ids_(1, 2), 2, top_k=0)
    with pytest.raises(
        ValueError, match=r"ids must be an integer tensor \[b, s\], got \(4,\); add a batch dim"
    ):
        model(torch.zeros(4, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# Generation, loss
# ---------------------------------------------------------------------------------------------
def test_greedy_generation_matches_argmax_of_full_forwards():
    model = lm_or_skip("toy_content")
    ids = ids_(2, 4)
    out = model.generate(ids, 5, temperature=0)
    ref = ids
    with torch.no_grad():
        for _ in range(5):  # the plain algorithm: no cache, recompute everything each step
            ref = torch.cat([ref, model(ref).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ref)


def test_sampling_is_reproducible_and_top_k_restricts():
    model = lm_or_skip("toy_rotate")
    ids = ids_(2, 3)
    a = model.generate(ids, 6, temperature=1.0, generator=torch.Generator().manual_seed(7))
    b = model.generate(ids, 6, temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.shape == (2, 9)
    greedy = model.generate(ids, 6, temperature=0)
    top1 = model.generate(ids, 6, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(top1, greedy)  # top-1 sampling is greedy


def test_loss_is_cross_entropy_of_the_logits():
    model = lm_or_skip("toy_alibi")
    ids, targets = ids_(2, 6), ids_(2, 6, seed=9)
    targets[0, 0] = -100
    logits = model(ids).logits
    keep = targets != -100
    want = -torch.log_softmax(logits, -1)[keep].gather(-1, targets[keep][:, None]).mean()
    torch.testing.assert_close(model.loss(ids, targets), want)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    model = TransformerLM(config(dropout=0.5))
    ids = ids_(1, 6)
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)
    model.eval()
    assert torch.equal(model(ids).logits, model(ids).logits)


# ---------------------------------------------------------------------------------------------
# Encoder-decoder, tying
# ---------------------------------------------------------------------------------------------
def test_encoder_decoder_runs_masks_padding_and_decodes_incrementally():
    torch.manual_seed(0)
    model = EncoderDecoder(config("toy_alibi", tie="three_way")).eval()
    src, tgt = ids_(2, 7), ids_(2, 5, seed=3)
    logits = model(src, tgt)
    assert logits.shape == (2, 5, V) and torch.isfinite(logits).all()
    # right-padding the source (masked) changes nothing
    padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(2, 7), torch.zeros(2, 3)], dim=1).long()
    torch.testing.assert_close(model(padded, tgt, src_mask=mask), logits)
    # the source matters
    assert not torch.allclose(model(ids_(2, 7, seed=11), tgt), logits)
    # incremental decoding of the target equals the full decode
    with torch.no_grad():
        context = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, :2], context, cache=cache)]
        steps += [model.decode(tgt[:, t : t + 1], context, cache=cache) for t in range(2, 5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits.detach())
    with pytest.raises(ValueError, match="pass context=encoder_output"):
        model.decoder(tgt)


def test_encoder_is_bidirectional_and_its_scheme_is_built_non_causal(monkeypatch):
    seen = []

    class Spy(scheme_class("toy_alibi")):
        def __init__(self, num_heads: int, causal: bool = True) -> None:
            super().__init__(num_heads)
            seen.append(causal)

    monkeypatch.setitem(posenc.registry.SCHEMES, "toy_alibi", Spy)
    torch.manual_seed(0)
    model = EncoderDecoder(config("toy_alibi")).eval()
    assert seen == [False, True]  # encoder, decoder
    src = ids_(1, 6)
    out = model.encode(src)
    changed = src.clone()
    changed[0, -1] = (changed[0, -1] + 1) % V
    assert not torch.allclose(model.encode(changed)[0, 0], out[0, 0])  # the first token sees the last


def test_t5_buckets_are_one_directional_in_a_decoder_and_two_directional_in_an_encoder():
    """A decoder never sees keys after the query: all T5 buckets go to past distances; an
    encoder splits them between the two directions (T5's own setting)."""
    cfg = ModelConfig(vocab_size=V, d_model=16, num_layers=1, num_heads=2, position="t5")
    assert TransformerLM(cfg).decoder.scheme(0).bidirectional is False
    model = EncoderDecoder(cfg)
    assert model.encoder.scheme(0).bidirectional is True and model.decoder.scheme(0).bidirectional is False


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() lists a tied tensor once


def test_tying_reduces_parameters_and_shares_storage():
    v_d = V * 32
    sizes = {
        tie: _count(EncoderDecoder(config(tie=tie)))
        for tie in ("none", "output", "encoder_decoder", "three_way")
    }
    assert sizes["none"] - sizes["output"] == v_d
    assert sizes["none"] - sizes["encoder_decoder"] == v_d
    assert sizes["none"] - sizes["three_way"] == 2 * v_d
    model = EncoderDecoder(config(tie="three_way"))
    ptr = model.encoder.embed.token.weight.data_ptr()
    assert model.decoder.embed.token.weight.data_ptr() == ptr == model.lm_head.weight.data_ptr()
    lm, untied = TransformerLM(config()), TransformerLM(config(tie="none"))
    assert lm.lm_head.weight is lm.decoder.embed.token.weight
    assert _count(untied) - _count(lm) == v_d


# ---------------------------------------------------------------------------------------------
# Save / load, compile, meta device
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: TransformerLM(config("toy_content", share_position=False)),
        lambda: TransformerLM(config("scaled_sinusoidal", tie="none", memory_len=0)),
        lambda: EncoderDecoder(config("learned", tie="three_way")),
        lambda: Decoder(config("toy_alibi")),
    ],
)
def test_save_load_round_trip_gives_identical_outputs(tmp_path, make):
    torch.manual_seed(0)
    model = make().eval()
    path = tmp_path / "model.safetensors"
    save_model(model, path)
    loaded = load_model(path)
    assert type(loaded) is type(model) and loaded.config == model.config
    src, tgt = ids_(2, 6), ids_(2, 4, seed=2)
    with torch.no_grad():
        if isinstance(model, EncoderDecoder):
            a, b = model(src, tgt), loaded(src, tgt)
            assert loaded.lm_head.weight is loaded.encoder.embed.token.weight  # ties survive
        elif isinstance(model, Decoder):
            ctx = torch.randn(2, 3, 32)
            a, b = model(tgt, ctx)[0], loaded(tgt, ctx)[0]
        else:
            a, b = model(src).logits, loaded(src).logits
    assert torch.equal(a, b)
    for (name, p), (_, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(p, q), name


def test_load_rejects_files_without_posenc_metadata(tmp_path):
    import safetensors.torch

    path = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="has no posenc metadata"):
        load_model(path)
    with pytest.raises(TypeError, match=r"save_model takes one of .*TransformerLM.*, got Linear"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_model(tmp_path / "empty.safetensors")
    with pytest.raises(ValueError, match="no model file at"):
        load_model(tmp_path / "missing.safetensors")
    # weights whose shapes do not match the config stored beside them (a hand-edited file)
    import json

    import safetensors.torch

    save_model(TransformerLM(config("alibi")), tmp_path / "lm.safetensors")
    tensors = safetensors.torch.load_file(str(tmp_path / "lm.safetensors"))
    with safetensors.safe_open(str(tmp_path / "lm.safetensors"), framework="pt") as f:
        meta = f.metadata()
    cfg = json.loads(meta["posenc_config"])
    meta["posenc_config"] = json.dumps({**cfg, "d_ff": 2 * cfg["d_model"]})
    safetensors.torch.save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match=r"has shape .* the file's config does not describe its weights"):
        load_model(tmp_path / "bad.safetensors")


def test_compiled_forward_matches_eager():
    torch.manual_seed(0)
    # bias + GQA: the float-mask path; two layers share the bias computed once in the forward
    model = TransformerLM(config("toy_alibi", num_layers=2)).eval()
    ids = ids_(2, 8)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits)


@pytest.mark.parametrize("position", ["toy_content", "learned", "sinusoidal"])
def test_builds_on_the_meta_device(position):
    with torch.device("meta"):
        model = TransformerLM(config(position))
    assert all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.decoder.embed.token.weight
    model = model.to_empty(device="cpu")  # materialise: the structure was complete
    assert model.lm_head.weight.shape == (V, 32)


# ---------------------------------------------------------------------------------------------
# Properties, precision
# ---------------------------------------------------------------------------------------------
_PACK_MODEL: dict[str, TransformerLM] = {}


@settings(deadline=None, max_examples=15)
@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_packing_any_document_lengths_equals_separate_runs(lengths, seed):
    if "m" not in _PACK_MODEL:
        torch.manual_seed(0)
        _PACK_MODEL["m"] = TransformerLM(config("toy_rotate", num_kv_heads=1)).eval()
    model = _PACK_MODEL["m"]
    docs = [ids_(1, n, seed=seed + i) for i, n in enumerate(lengths)]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    with torch.no_grad():
        got = model(torch.cat(docs, dim=1), cu_seqlens=cu).logits
        want = torch.cat([model(d).logits for d in docs], dim=1)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("position", ["toy_alibi", "toy_rotate", "sinusoidal"])
def test_bfloat16_model_tracks_float32(position):
    """module.to(bfloat16) casts weights only: positions stay integer, tables/angles are float32."""
    model = lm_or_skip(position)
    ids = ids_(2, 40)
    with torch.no_grad():
        want = model(ids).logits
        got = model.to(torch.bfloat16)(ids).logits
    assert got.dtype == torch.bfloat16
    # The logits reach |7|, where one bf16 ulp is 2^-5 = 0.031: measured max error 0.026 (2 layers).
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=0.04)


# ---------------------------------------------------------------------------------------------
# Established implementations
# ---------------------------------------------------------------------------------------------
def test_nope_attention_matches_torch_multihead_attention():
    """posenc's MHA with no scheme is torch.nn.MultiheadAttention (same weights, causal mask)."""
    from posenc.model import MultiHeadAttention, plan_attention

    torch.manual_seed(0)
    ours = MultiHeadAttention(config("nope", num_kv_heads=None)).eval()
    ref = torch.nn.MultiheadAttention(32, 4, bias=False, batch_first=True).eval()
    with torch.no_grad():  # in_proj_weight is [q; k; v] stacked: [3 d, d]
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.out_proj.weight.copy_(ours.o_proj.weight)
        x = torch.randn(2, 7, 32)
        want = ref(x, x, x, attn_mask=~torch.ones(7, 7, dtype=torch.bool).tril(), need_weights=False)[0]
        got = ours(x, plan_attention(2, 7, x.device, causal=True))
    torch.testing.assert_close(got, want)


class LucidrainsRoPE(posenc.PositionalScheme):
    """A rotate scheme built on rotary-embedding-torch (test-only), to run the model's cache and
    padding paths with an established RoPE implementation."""

    name = "lucidrains_rope"
    hooks = ("rotate",)

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        from rotary_embedding_torch import RotaryEmbedding

        self.rope = RotaryEmbedding(dim=head_dim, cache_if_possible=False)

    def _apply(self, x, positions):
        from rotary_embedding_torch import apply_rotary_emb

        freqs = self.rope(positions)  # [(b,) s, d_h]
        freqs = freqs[:, None] if freqs.dim() == 3 else freqs  # [b, 1, s, d_h] broadcast over heads
        return apply_rotary_emb(freqs, x)

    def rotate(self, q, k, q_positions=None, k_positions=None):
        return self._apply(q, q_positions), self._apply(k, k_positions)


def test_established_rope_runs_through_cache_and_padding(monkeypatch):
    monkeypatch.setitem(posenc.registry.SCHEMES, "lucidrains_rope", LucidrainsRoPE)
    model = lm_or_skip("lucidrains_rope")
    ids = ids_(2, 8)
    cache = model.new_cache()
    with torch.no_grad():
        steps = torch.cat(
            [model(ids[:, :5], cache=cache).logits, model(ids[:, 5:], cache=cache).logits], dim=1
        )
        torch.testing.assert_close(steps, model(ids).logits)
        padded = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], dim=1)
        mask = torch.cat([torch.zeros(2, 3), torch.ones(2, 8)], dim=1).long()
        torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, 3:], model(ids).logits)
        # relative: shifting every position leaves the logits unchanged
        torch.testing.assert_close(
            model(ids, positions=torch.arange(8) + 100).logits, model(ids).logits, rtol=1e-4, atol=1e-4
        )


@pytest.mark.parametrize(
    ("position", "share", "expected"),
    [("alibi", True, 1), ("t5", True, 1), ("alibi", False, 3), ("toy_content", True, 3), ("shaw", True, 3)],
)
def test_content_free_bias_is_computed_once_per_forward(position, share, expected, monkeypatch):
    """A shared bias that does not read q is built once per forward, not once per layer (the
    full-table path; the blocked CPU path is counted in the next test)."""
    monkeypatch.setenv("POSENC_C_KERNELS", "0")
    torch.manual_seed(0)
    model = TransformerLM(config(position, num_layers=3, share_position=share)).eval()
    calls = []  # one list for every scheme: all score_bias calls of the forward
    for scheme in model.decoder.schemes:
        count_calls(monkeypatch, scheme, "score_bias", calls)
    ids = ids_(2, 6)
    with torch.no_grad():
        out = model(ids).logits
        assert len(calls) == expected
        cache = model.new_cache()
        model(ids[:, :4], cache=cache)  # a new forward plans (and builds) its bias anew
        assert len(calls) == 2 * expected
        torch.testing.assert_close(model(ids[:, 4:], cache=cache).logits, out[:, 4:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("position", "share", "expected"),
    [("alibi", True, 1), ("t5", True, 1), ("alibi", False, 3), ("toy_content", True, 3)],
)
def test_block_bias_builder_is_made_once_per_forward(position, share, expected, monkeypatch):
    """On the blocked CPU path a content-free scheme's block builder (with its scratch buffers) is
    made once per forward and shared by the layers sharing the scheme; a bias reading q gets one
    builder per layer."""
    from posenc.kernels import attention_cpu

    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    made = count_calls(monkeypatch, attention_cpu, "scheme_bias_fn")
    torch.manual_seed(0)
    model = TransformerLM(config(position, num_layers=3, share_position=share, max_len=512)).eval()
    ids = ids_(1, attention_cpu.BLOCK_SIZE + 10)  # two query blocks: the blocked path is taken
    with torch.no_grad():
        model(ids)
        assert len(made) == expected
        model(ids)
        assert len(made) == 2 * expected


def test_torch_func_transforms_take_the_full_table_path(monkeypatch):
    """torch.func.grad wraps tensors without storage: the blocked path steps aside for them."""
    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    torch.manual_seed(0)
    model = TransformerLM(config("alibi", num_layers=1, max_len=512)).eval()
    ids = ids_(1, 300)
    params = dict(model.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (ids,)).logits.square().mean())(
        params
    )
    model.zero_grad()
    model(ids).logits.square().mean().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("position", ["transformer_xl", "alibi"])
def test_blocked_path_with_a_memory_equals_a_full_forward(position, monkeypatch):
    """Transformer-XL memory before 300 new queries (two blocks): the same logits as one forward."""
    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    torch.manual_seed(0)
    model = TransformerLM(config(position, memory_len=300, max_len=1024)).eval()
    ids = ids_(1, 600)
    with torch.no_grad():
        first = model(ids[:, :300])
        second = model(ids[:, 300:], memory=first.memory)
        full = model(ids).logits
    torch.testing.assert_close(torch.cat((first.logits, second.logits), dim=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("position", ["alibi", "t5", "transformer_xl", "toy_content", "toy_alibi"])
def test_blocked_cpu_bias_path_equals_the_full_table_path(position, monkeypatch):
    """The model's blocked causal attention (kernels.attention_cpu, 256 queries per block) gives the
    logits and gradients of the full-table path (POSENC_C_KERNELS=0), for a sequence of three blocks
    and for a chunked prefill after a cache."""
    from posenc.kernels import attention_cpu

    blocked_calls = count_calls(monkeypatch, attention_cpu, "causal_attention_with_bias")
    torch.manual_seed(0)
    model = TransformerLM(config(position, max_len=1024))
    model.train(False)
    ids = ids_(2, 600)

    def run(fast: str):
        monkeypatch.setenv("POSENC_C_KERNELS", fast)
        set_enabled(None)  # the switch is read once per process: read it again
        blocked_calls.clear()
        model.zero_grad()
        logits = model(ids).logits
        (logits.square().mean()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        with torch.no_grad():
            cache = model.new_cache()
            model(ids[:, :300], cache=cache)
            chunk = model(ids[:, 300:], cache=cache).logits  # 300 queries after 300 cached keys: 2 blocks
        # one call per layer and forward (forward, prefill, chunk) on the fast path, none without
        assert len(blocked_calls) == (3 * model.config.num_layers if fast == "1" else 0)
        return logits.detach(), grads, chunk

    fast, slow = run("1"), run("0")
    torch.testing.assert_close(fast[0], slow[0], rtol=1e-5, atol=1e-5)
    assert len(fast[1]) == len(slow[1]) > 0
    for a, b in zip(fast[1], slow[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fast[2], slow[0][:, 300:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(slow[2], slow[0][:, 300:], rtol=1e-4, atol=1e-4)


def test_position_options_that_contradict_the_model_are_refused_at_config_time():
    with pytest.raises(ValueError, match=r"position_options num_heads=2 \(the model has 4\) disagree"):
        ModelConfig(
            vocab_size=V, d_model=32, num_heads=4, position="alibi", position_options={"num_heads": 2}
        )
    ModelConfig(vocab_size=V, d_model=32, num_heads=4, position="alibi", position_options={"num_heads": 4})


def test_files_saved_before_a_default_changed_load_as_they_were_trained(tmp_path):
    """T5's max_distance now follows max_len; a file from before (no defaults-version mark) keeps
    the 128 it was built and trained with, instead of silently changing its buckets."""
    import json

    import safetensors.torch

    model = TransformerLM(ModelConfig(vocab_size=V, d_model=16, num_heads=2, position="t5", max_len=64))
    assert model.decoder.scheme(0).max_distance == 32
    path = tmp_path / "lm.safetensors"
    save_model(model, path)
    assert load_model(path).decoder.scheme(0).max_distance == 32  # a current file: as saved
    tensors = safetensors.torch.load_file(str(path))
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = {k: v for k, v in f.metadata().items() if k != "posenc_defaults"}
    safetensors.torch.save_file(tensors, str(tmp_path / "old.safetensors"), metadata=meta)
    old = load_model(tmp_path / "old.safetensors")
    assert old.decoder.scheme(0).max_distance == 128
    assert old.config.position_options == {"max_distance": 128}
    assert json.loads(meta["posenc_config"])["position_options"] == {}


def test_forward_returns_one_output_type_with_the_loss_for_labels():
    model = lm_or_skip("toy_alibi")
    ids = ids_(2, 6)
    out = model(ids)
    assert isinstance(out, LMOutput) and out.loss is None and out.memory is None
    labels = ids.clone()
    labels[1, 3] = -100
    got = model(ids, labels=labels)
    logp = torch.log_softmax(got.logits[:, :-1].double(), -1)  # position t predicts labels[:, t + 1]
    keep = labels[:, 1:] != -100
    want = -logp[keep].gather(-1, labels[:, 1:][keep][:, None]).mean()
    torch.testing.assert_close(got.loss.double(), want, rtol=1e-6, atol=1e-6)
    assert got.loss.dtype == torch.float32 and got.loss.dim() == 0
    got.loss.backward()
    with pytest.raises(ValueError, match=r"labels must have the shape of ids \(2, 6\), got \(2, 5\)"):
        model(ids, labels=ids[:, :5])


def test_models_take_factory_kwargs_and_keep_ties():
    lm = TransformerLM(config(), dtype=torch.float64)
    assert {p.dtype for p in lm.parameters()} == {torch.float64}
    assert lm.lm_head.weight is lm.decoder.embed.token.weight
    assert lm(ids_(1, 4)).logits.dtype == torch.float64
    meta = EncoderDecoder(config(tie="three_way"), device="meta")
    assert all(p.is_meta for p in meta.parameters())
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        TransformerLM(config(), dtype=torch.int32)
