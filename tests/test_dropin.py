"""The first script of an engineer coming from Hugging Face transformers or torchtune, written as
they would write it (public API only): both q/k layouts, schemes called directly, factory kwargs,
save_pretrained/from_pretrained, pretrained embeddings from both file formats, the LM output."""

from __future__ import annotations

import safetensors.torch
import torch

import posenc
from posenc.model import ModelConfig, TransformerLM


def test_a_hf_or_torchtune_users_first_script(tmp_path):
    torch.manual_seed(0)
    # RoPE on [b, s, h, d] (flash-attention, torchtune) and on [b, h, s, d] (SDPA): the same rotation
    q, k = torch.randn(1, 100, 4, 64), torch.randn(1, 100, 4, 64)
    rope_bshd = posenc.build("rope", head_dim=64, qk_layout="bshd")
    rope = posenc.build("rope", head_dim=64)
    q1, k1 = rope_bshd(q, k)
    q2, k2 = rope(q.transpose(1, 2), k.transpose(1, 2))
    assert torch.equal(q1.transpose(1, 2), q2) and torch.equal(k1.transpose(1, 2), k2)

    # every scheme is callable
    assert posenc.build("alibi", num_heads=4)(torch.arange(8), torch.arange(8)).shape == (1, 4, 8, 8)
    assert posenc.build("sinusoidal", d_model=64)(torch.zeros(2, 8, 64)).shape == (2, 8, 64)

    # factory kwargs, as nn.Linear's
    pe = posenc.build("learned", d_model=64, max_len=128, device="meta", dtype=torch.bfloat16)
    assert pe.weight.is_meta and pe.weight.dtype == torch.bfloat16
    lm = TransformerLM(
        ModelConfig(vocab_size=100, d_model=64, num_layers=2, num_heads=4, position="rope"),
        dtype=torch.float64,
    )

    # one output type with the loss for labels
    ids = torch.randint(0, 100, (2, 16))
    out = lm(ids, labels=ids)
    assert out.logits.shape == (2, 16, 100) and out.loss.dim() == 0
    cache = lm.new_cache()
    lm.eval()
    prefill = lm(ids[:, :10], cache=cache).logits
    step = lm(ids[:, 10:], cache=cache).logits
    torch.testing.assert_close(torch.cat((prefill, step), 1), lm(ids).logits)

    # save_pretrained / from_pretrained round trip
    lm.save_pretrained(tmp_path / "my-lm")
    again = TransformerLM.from_pretrained(tmp_path / "my-lm")
    assert torch.equal(again(ids).logits, lm(ids).logits)

    # pretrained embeddings: a tensor, a safetensors table, word2vec/GloVe text aligned to a vocabulary
    table = torch.randn(100, 64)
    emb = posenc.TokenEmbedding.from_pretrained(table, freeze=True)
    assert torch.equal(emb(ids), table[ids]) and not emb.weight.requires_grad
    safetensors.torch.save_file({"weight": table}, str(tmp_path / "emb.safetensors"))
    emb, _ = posenc.pretrained_embedding(tmp_path / "emb.safetensors")
    assert torch.equal(emb.weight.detach(), table)
    (tmp_path / "glove.txt").write_text("cat 0.5 0.25\ndog -1 2\n", encoding="utf-8")
    emb, coverage = posenc.pretrained_embedding(tmp_path / "glove.txt", ["<pad>", "cat", "dog", "eel"])
    assert (coverage.found, coverage.total) == (2, 4) and emb.weight[1].tolist() == [0.5, 0.25]
