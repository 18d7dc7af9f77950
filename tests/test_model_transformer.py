"""Tests of posenc.model.transformer: TransformerLM and EncoderDecoder with any scheme by name (cache,
packing, padding, tying, meta device, compile) and sampling (greedy, top-k, the loss).

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
from _model_helpers import ALL, V, config, ids_, lm_or_skip
from _model_toys import register_toys
from posenc.model import (
    Encoder,
    EncoderDecoder,
    KVCache,
    LMOutput,
    TransformerLM,
)
from posenc.registry import scheme_class


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
    a = model.generate(ids, 6, do_sample=True, generator=torch.Generator().manual_seed(7))
    b = model.generate(ids, 6, do_sample=True, temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.shape == (2, 9)
    greedy = model.generate(ids, 6, temperature=0)
    top1 = model.generate(ids, 6, do_sample=True, top_k=1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(top1, greedy)  # top-1 sampling is greedy
    tiny_p = model.generate(ids, 6, do_sample=True, top_p=1e-6, generator=torch.Generator().manual_seed(3))
    assert torch.equal(tiny_p, greedy)  # the nucleus of a tiny top_p is the most likely token


def test_generate_is_greedy_by_default_as_hugging_face():
    """generate(ids, n) used to sample at temperature 1.0; Hugging Face's is greedy unless
    do_sample=True, and a sampling option without it is refused rather than ignored."""
    model = lm_or_skip("toy_rotate")
    ids = ids_(2, 3)
    default = model.generate(ids, 6)
    assert torch.equal(default, model.generate(ids, 6, temperature=0))
    assert torch.equal(model.generate(ids), model.generate(ids, max_new_tokens=20))
    assert model.generate(ids).shape == (2, 23)  # max_new_tokens defaults to 20
    for bad in ({"temperature": 0.8}, {"top_k": 5}, {"top_p": 0.9}):
        with pytest.raises(ValueError, match="do_sample=True"):
            model.generate(ids, 2, **bad)
    for bad, match in (
        ({"temperature": float("nan")}, "finite"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": 0}, "temperature=0 with do_sample"),
    ):
        with pytest.raises(ValueError, match=match):
            model.generate(ids, 2, do_sample=True, **bad)
    with pytest.raises(TypeError, match="do_sample must be a bool"):
        model.generate(ids, 2, do_sample="yes")
    with pytest.raises(ValueError, match="eos_token_id"):
        model.generate(ids, 2, eos_token_id=V)


def test_generate_stops_at_eos_and_pads_finished_rows():
    model = lm_or_skip("toy_rotate")
    ids = ids_(2, 3)
    greedy = model.generate(ids, 8)
    eos = int(greedy[0, 4])  # row 0's second new token: it ends there
    out = model.generate(ids, 8, eos_token_id=eos, pad_token_id=0)
    row0 = (greedy[0, 3:] == eos).nonzero()[0, 0].item() + 3  # where row 0 first emits eos
    assert torch.equal(out[0, : row0 + 1], greedy[0, : row0 + 1]) and bool((out[0, row0 + 1 :] == 0).all())
    ends = [(r[3:] == eos).nonzero() for r in greedy]
    if all(len(e) for e in ends):  # every row ended: the output stops at the last end
        assert out.shape[1] == 3 + max(int(e[0, 0]) for e in ends) + 1
    assert torch.equal(
        model.generate(ids, 8, eos_token_id=[V - 1, eos])[0, : row0 + 1], greedy[0, : row0 + 1]
    )


def test_top_p_matches_hugging_face_nucleus():
    """The tokens sample_next keeps under top_p are those transformers' TopPLogitsWarper keeps."""
    from posenc.model import sample_next

    warpers = pytest.importorskip("transformers.generation.logits_process")
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for top_p in (0.05, 0.3, 0.9, 0.999):
        keep_hf = torch.isfinite(warpers.TopPLogitsWarper(top_p)(None, logits.clone()))
        draws = torch.cat(
            [sample_next(logits, 1.0, None, torch.Generator().manual_seed(i), top_p) for i in range(400)], 1
        )
        kept = torch.zeros_like(keep_hf).scatter(1, draws, True)
        assert bool((kept <= keep_hf).all())  # never outside HF's nucleus
        if top_p <= 0.3:
            assert torch.equal(kept, keep_hf)  # small nuclei: every kept token drawn in 400 tries


def test_lm_output_is_indexable_like_hugging_face():
    model = lm_or_skip("toy_alibi")
    ids = ids_(2, 5)
    out = model(ids)
    assert out[0] is out.logits and out["logits"] is out.logits and out.keys() == ["logits"]
    with pytest.raises(KeyError, match="loss"):
        out["loss"]
    out = model(ids, labels=ids)
    assert out[0] is out.loss and out[1] is out.logits and out.to_tuple() == (out.loss, out.logits)
    assert list(out) == ["loss", "logits"] and "loss" in out and dict(out.items())["logits"] is out.logits
    assert out[:1] == (out.loss,) and out.values() == [out.loss, out.logits]


def test_model_answers_hugging_face_questions():
    """device, dtype, num_parameters(), get_input_embeddings(), get_output_embeddings()."""
    cfg = config("rope", tie="output")
    model = TransformerLM(cfg, dtype=torch.float64)
    assert model.device == torch.device("cpu") and model.dtype == torch.float64
    total = sum(p.numel() for p in model.parameters())
    assert model.num_parameters() == total  # a tied matrix counted once
    emb = model.get_input_embeddings()
    assert emb is model.decoder.embed.token and model.get_output_embeddings().weight is emb.weight
    assert model.num_parameters(exclude_embeddings=True) == total - emb.weight.numel()
    emb.weight.requires_grad_(False)
    assert model.num_parameters(only_trainable=True) == total - emb.weight.numel()
    ed = EncoderDecoder(config("t5", tie="three_way"))
    assert ed.get_input_embeddings() is ed.encoder.embed.token and ed.num_parameters() > 0


@pytest.mark.parametrize("position", ["rope", "learned", "t5", "sinusoidal"])
def test_init_weights_after_meta_construction(position):
    """A model built on the meta device and materialised with to_empty gets the configuration's
    initialisation from init_weights: under one random state, the bits of an ordinary build."""
    cfg = config(position, max_len=32)
    torch.manual_seed(5)
    want = TransformerLM(cfg)
    model = TransformerLM(cfg, device="meta").to_empty(device="cpu")
    torch.manual_seed(5)
    model.init_weights()
    for (name, a), b in zip(want.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert model.lm_head.weight is model.decoder.embed.token.weight  # still tied
    ids = ids_(2, 6)
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, want.eval()(ids).logits)


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
# Compile, meta device
# ---------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("position", posenc.schemes())
def test_meta_device_forward_gives_shapes_without_values(position):
    """A model built under torch.device("meta") runs forward for shapes: no check reads a value
    (``.item()`` is impossible on a meta tensor), and float64 frequencies are built on the CPU."""
    with torch.device("meta"):
        try:
            model = TransformerLM(config(position, num_kv_heads=None, num_layers=1))
        except ValueError as err:  # grid-only schemes are refused by every sequence model
            assert "grids, not token sequences" in str(err)
            pytest.skip(f"{position} encodes grids only")
    ids = torch.zeros(2, 8, dtype=torch.long, device="meta")
    logits = model(ids).logits
    assert logits.is_meta and logits.shape == (2, 8, V)
