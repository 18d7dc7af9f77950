"""Tests of posenc.model.stack: the Encoder / Decoder stacks (their schemes built causal or not, one
per layer or shared, learned tables' length limit) and the Transformer-XL Memory they carry
(capped, detached, at true positions; a memory covering the stream equals a full forward)."""

from __future__ import annotations

import pytest
import torch

import posenc
from _model_helpers import ALL, V, config, ids_, lm_or_skip
from _model_toys import register_toys
from posenc.model import EncoderDecoder, LMOutput, ModelConfig, TransformerLM
from posenc.registry import scheme_class


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


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


def test_share_position_false_builds_one_scheme_per_layer():
    shared = TransformerLM(config("toy_content"))
    per_layer = TransformerLM(config("toy_content", share_position=False))
    assert len(shared.decoder.schemes) == 1 and len(per_layer.decoder.schemes) == 2
    assert per_layer.decoder.scheme(0) is not per_layer.decoder.scheme(1)
    n = sum(p.numel() for p in shared.decoder.schemes[0].parameters())
    assert sum(p.numel() for p in per_layer.parameters()) - sum(p.numel() for p in shared.parameters()) == n
    embed_only = TransformerLM(config("sinusoidal", share_position=False))
    assert len(embed_only.decoder.schemes) == 0 and embed_only.decoder.embed.position is not None


def test_learned_positions_refuse_inputs_longer_than_max_len():
    model = TransformerLM(config("learned", max_len=8)).eval()
    model(ids_(1, 8))
    with pytest.raises(ValueError, match=r"needs positions up to 8 \(length 9\), longer than max_len=8"):
        model(ids_(1, 9))
    with pytest.raises(ValueError, match="max_len=8"):
        model.generate(ids_(1, 6), 5)


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
    assert TransformerLM(cfg).decoder.scheme(0).causal is True
    model = EncoderDecoder(cfg)
    assert model.encoder.scheme(0).causal is False and model.decoder.scheme(0).causal is True


# ---------------------------------------------------------------------------------------------- input layer
def test_embedding_scale_and_initialisations_come_from_the_config():
    d = 64
    base = dict(vocab_size=V, d_model=d, num_layers=2, num_heads=4, position="sinusoidal", tie="none")
    torch.manual_seed(0)
    default = TransformerLM(ModelConfig(**base))
    token = default.decoder.embed.token
    # the defaults are unchanged: sqrt(d) scale, the table at 1/sqrt(d), linear layers at 0.02
    assert token.scale == pytest.approx(d**0.5) and token.init_std == pytest.approx(d**-0.5)
    assert float(default.decoder.blocks[0].attn.q_proj.weight.detach().std()) == pytest.approx(0.02, rel=0.1)
    torch.manual_seed(0)
    plain = TransformerLM(ModelConfig(**base, embed_scale=None, init_std=0.05, embed_init_std=0.3))
    token = plain.decoder.embed.token
    assert token.scale == 1.0 and token.init_std == 0.3
    block = plain.decoder.blocks[0]
    assert float(block.attn.q_proj.weight.detach().std()) == pytest.approx(0.05, rel=0.1)
    assert float(block.attn.o_proj.weight.detach().std()) == pytest.approx(0.05 / 2, rel=0.1)  # / sqrt(2 L)
    assert float(plain.lm_head.weight.detach().std()) == pytest.approx(0.05, rel=0.1)
    ids = torch.tensor([[3, 5]])
    x = plain.decoder.embed.token(ids)  # unscaled: the table's rows themselves
    assert torch.equal(x, token.weight[ids])
    # no scale: the token part is 1/sqrt(d) per component, the sinusoidal part stays ~0.7
    torch.manual_seed(0)
    unscaled = TransformerLM(ModelConfig(**base, embed_scale=None)).decoder.embed.token
    assert float(unscaled.weight.detach().std()) == pytest.approx(d**-0.5, rel=0.1)


# ----------------------------------------------------------------------------------------------
# The block's forms
# ----------------------------------------------------------------------------------------------
def _block_input(model: TransformerLM, ids: torch.Tensor) -> torch.Tensor:
    return model.decoder.embed(ids)


@pytest.mark.parametrize("residual", ["parallel", "parallel_shared_norm"])
def test_parallel_residual_adds_both_branches_to_the_input(residual):
    """x + Attn(N1(x)) + MLP(N2(x)), with N2 = N1 for the shared form, written out by hand."""
    torch.manual_seed(0)
    model = TransformerLM(config("rope", num_layers=1, residual=residual, norm_type="rmsnorm")).eval()
    block = model.decoder.blocks[0]
    assert (block.norm2 is None) == (residual == "parallel_shared_norm")
    ids = ids_(2, 7)
    x = _block_input(model, ids)
    plan = posenc.model.plan_attention(2, 7, x.device, causal=True)
    with torch.no_grad():
        norm2 = block.norm1 if block.norm2 is None else block.norm2
        want = x + block.attn(block.norm1(x), plan, model.decoder.scheme(0)) + block.mlp(norm2(x))
        torch.testing.assert_close(block(x, plan, model.decoder.scheme(0)), want, rtol=0, atol=1e-6)
        # a parallel block is not the sequential one: the MLP reads x, not x + Attn
        seq = x + block.attn(block.norm1(x), plan, model.decoder.scheme(0))
        assert not torch.allclose(block(x, plan, model.decoder.scheme(0)), seq + block.mlp(norm2(seq)))


def test_parallel_residual_refuses_cross_attention():
    with pytest.raises(ValueError, match="decoder-only block"):
        EncoderDecoder(config("rope", residual="parallel"))


def test_qk_norm_normalises_each_head_before_the_scheme():
    torch.manual_seed(0)
    model = TransformerLM(config("rope", qk_norm=True, norm_eps=1e-6)).eval()
    attn = model.decoder.blocks[0].attn
    assert attn.q_norm.weight.shape == (attn.head_dim,) and attn.k_norm.dim == attn.head_dim
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        q, k, _ = attn.project(x)  # [b, h, s, d_h], normalised per head over d_h
        for got, proj, heads, norm in ((q, attn.q_proj, 4, attn.q_norm), (k, attn.k_proj, 2, attn.k_norm)):
            raw = proj(x).view(2, 5, heads, attn.head_dim).transpose(1, 2)
            want = raw / torch.sqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_modern_block_decodes_with_a_cache_as_a_full_forward():
    torch.manual_seed(0)
    model = TransformerLM(
        config(
            "rope",
            norm_type="rmsnorm",
            activation="silu",
            gated_mlp=True,
            qk_norm=True,
            residual="parallel",
            qkv_bias=True,
            output_bias=True,
        )
    ).eval()
    ids = ids_(2, 9)
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        steps = [model(ids[:, :4], cache=cache).logits] + [
            model(ids[:, t : t + 1], cache=cache).logits for t in range(4, 9)
        ]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
    assert model.lm_head.bias is not None and torch.count_nonzero(model.lm_head.bias) == 0


@pytest.mark.slow  # compiling takes ~30-90 s on 2 shared cores
def test_the_modern_block_compiles_with_the_same_numbers():
    torch.manual_seed(0)
    model = TransformerLM(
        config(
            "rope",
            norm_type="rmsnorm",
            activation="silu",
            gated_mlp=True,
            qk_norm=True,
            residual="parallel_shared_norm",
            d_head=16,
            num_layers=1,
        )
    ).eval()
    ids = ids_(2, 8)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
