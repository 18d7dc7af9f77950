"""Tests of posenc.rotary.mrope: multimodal RoPE against Hugging Face Qwen2-VL's and Qwen3-VL's own
rotary (``Qwen2VLRotaryEmbedding`` / ``Qwen3VLTextRotaryEmbedding`` + ``apply_rotary_pos_emb``, built
from a config, no downloads) on text and on image-grid positions, bit for bit with HF's frequencies;
the float64 formula (each pair turns by its axis's coordinate); text equals plain RoPE; validation."""

from __future__ import annotations

import pytest
import torch

import posenc
from _rotary_refs import F64, angle_tol, ref_rotate
from posenc.rotary.mrope import MultimodalRope, mrope_from_hf, mrope_positions_from_hf, pair_axes


def grid_positions(text_before: int, grid: tuple[int, int, int], text_after: int) -> torch.Tensor:
    """HF's layout [3, 1, s] for text, then one image of (frames, rows, cols) patches, then text:
    the image's coordinates start at the position after the text, and the text after it continues
    from the largest coordinate + 1 (Qwen2-VL's get_rope_index)."""
    t, h, w = grid
    pos = [[p, p, p] for p in range(text_before)]
    start = text_before
    for f in range(t):
        for r in range(h):
            for c in range(w):
                pos.append([start + f, start + r, start + c])
    nxt = max(max(p) for p in pos) + 1
    pos += [[nxt + p] * 3 for p in range(text_after)]
    return torch.tensor(pos).T[:, None]  # [s, 3] -> [3, 1, s]


def hf_qwen(version: int, head_dim: int, section: list[int]):
    pytest.importorskip("transformers").logging.set_verbosity_error()  # skip here when HF is missing
    if version == 2:
        from transformers import Qwen2VLTextConfig as Config
        from transformers.models.qwen2_vl import modeling_qwen2_vl as mod

        params = {"rope_type": "mrope", "mrope_section": section, "rope_theta": 1e6}
        rotary_cls = mod.Qwen2VLRotaryEmbedding
    else:
        from transformers import Qwen3VLTextConfig as Config
        from transformers.models.qwen3_vl import modeling_qwen3_vl as mod

        params = {"rope_type": "default", "mrope_section": section, "mrope_interleaved": True}
        params["rope_theta"] = 1e6
        rotary_cls = mod.Qwen3VLTextRotaryEmbedding
    cfg = Config(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        num_hidden_layers=1,
        intermediate_size=16,
        vocab_size=16,
        rope_parameters=params,
    )
    return cfg, rotary_cls(cfg), mod.apply_rotary_pos_emb


@pytest.mark.parametrize(("version", "section"), [(2, [16, 24, 24]), (2, [8, 12, 12]), (3, [24, 20, 20])])
def test_equals_hf_qwen_vl_rotary_on_text_and_image_grids(version, section):
    head_dim = 2 * sum(section)
    cfg, hf, hf_apply = hf_qwen(version, head_dim, section)
    ours = mrope_from_hf(cfg)
    assert ours.mrope_section == tuple(section) and ours.interleaved == (version == 3)
    torch.testing.assert_close(ours.inv_freq.float(), hf.inv_freq, rtol=4 * 2.0**-23, atol=0)
    torch.manual_seed(0)
    for pos in (torch.arange(40)[None, None].expand(3, 1, 40), grid_positions(5, (2, 3, 4), 6)):
        s = pos.shape[-1]
        q, k = torch.randn(1, 2, s, head_dim), torch.randn(1, 1, s, head_dim)
        cos, sin = hf(q, pos)
        hq, hk = hf_apply(q, k, cos, sin)
        coords = mrope_positions_from_hf(pos)  # [1, s, 3]
        oq, ok = ours.rotate(q, k, coords, coords)
        tol = angle_tol(int(pos.max()) + 1) * 2 * q.abs().max().item()
        torch.testing.assert_close(oq, hq, rtol=0, atol=tol)
        torch.testing.assert_close(ok, hk, rtol=0, atol=tol * k.abs().max().item() / q.abs().max().item())
        exact = MultimodalRope(head_dim, base=1e6, mrope_section=section, interleaved=version == 3)
        exact.inv_freq = hf.inv_freq.double()  # HF's frequencies: the rest are HF's operations, bit for bit
        eq, ek = exact.rotate(q, k, coords, coords)
        assert torch.equal(eq, hq) and torch.equal(ek, hk)


def test_matches_the_float64_formula_and_text_is_plain_rope():
    """Each pair turns by its own axis's coordinate (float64 rotation matrix); with equal coordinates
    (text) the rotation is RoPE's."""
    torch.manual_seed(1)
    scheme = MultimodalRope(16, mrope_section=[2, 3, 3])
    coords = torch.tensor([[0, 0, 0], [3, 1, 7], [3, 2, 0], [1000, 5, 9]])  # [s, 3]
    x = torch.randn(1, 2, 4, 16, dtype=F64)
    got, _ = scheme.rotate(x, x, coords, coords)
    axes = pair_axes([2, 3, 3], False)  # [8]
    inv = 10000.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16)
    angles = coords[:, axes].to(F64) * inv  # [s, 8]: pair i from its axis
    torch.testing.assert_close(got, ref_rotate(x, angles, "half"), rtol=1e-12, atol=1e-12)
    assert axes.tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert pair_axes([4, 2, 2], True).tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    q = torch.randn(2, 2, 9, 16)
    rope = posenc.build("rope", head_dim=16)
    text = torch.arange(9)
    for a, b in zip(scheme.rotate(q, q, text, text), rope.rotate(q, q, text, text)):
        assert torch.equal(a, b)
    both = scheme.rotate(q, q, torch.arange(9)[None].expand(2, 9), None)[0]  # [b, s] text positions
    assert torch.equal(both, rope.rotate(q, q)[0])


def test_compiles_to_the_eager_numbers():
    scheme = MultimodalRope(16, mrope_section=[2, 3, 3], interleaved=True)
    coords = grid_positions(2, (1, 2, 3), 2)[:, 0].T  # [s, 3]
    q = torch.randn(2, 2, coords.shape[0], 16)
    compiled = torch.compile(scheme.rotate, fullgraph=True, dynamic=False, backend="aot_eager")  # one graph
    for a, b in zip(compiled(q, q, coords, coords), scheme.rotate(q, q, coords, coords)):
        torch.testing.assert_close(a, b)


def test_registered_verified_and_validated():
    assert posenc.describe("mrope")["hooks"] == ["rotate"]
    scheme = posenc.build("mrope", head_dim=128)
    assert scheme.mrope_section == (16, 24, 24)  # Qwen2-VL's split of 64 pairs
    from posenc.analysis import verify

    results = verify(["mrope"])
    assert results and not [r for r in results if r.status == "FAIL"]
    with pytest.raises(ValueError, match=r"summing to head_dim / 2 = 8"):
        MultimodalRope(16, mrope_section=[2, 2, 2])
    with pytest.raises(ValueError, match="could be \\[b, s\\] text positions or \\[s, 3\\] coordinates"):
        x = torch.randn(3, 1, 3, 128)
        scheme.rotate(x, x, torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"must be \[s\], \[b, s\], \[s, 3\] or \[b, s, 3\] with s = 2, got \(5, 3\)"
    ):
        scheme.rotate(
            torch.randn(1, 1, 2, 128), torch.randn(1, 1, 2, 128), torch.zeros(5, 3, dtype=torch.long)
        )
    with pytest.raises(TypeError, match="integer tensor"):
        scheme.rotate(torch.randn(1, 1, 2, 128), torch.randn(1, 1, 2, 128), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"position_ids must be \[3, b, s\]"):
        mrope_positions_from_hf(torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mrope_section \[2, 3, 3\]: a multimodal RoPE .*mrope_from_hf"):
        posenc.rope_from_hf({"head_dim": 16, "rope_parameters": {"mrope_section": [2, 3, 3]}})
    with pytest.raises(ValueError, match="no mrope_section"):
        mrope_from_hf({"head_dim": 64, "rope_parameters": {"rope_type": "default"}})
    with pytest.raises(ValueError, match="grids, not token sequences"):
        posenc.TransformerLM(posenc.ModelConfig(vocab_size=11, d_model=32, num_heads=2, position="mrope"))
    half = scheme.to(torch.bfloat16)
    assert half.inv_freq.dtype == torch.float64  # the frequencies are never rounded to the module's dtype


def test_builds_on_the_meta_device_with_cpu_exact_frequencies():
    """Under torch.device("meta") the float64 frequencies are still computed on the CPU, then moved."""
    with torch.device("meta"):
        rope = MultimodalRope(16)
    assert rope.inv_freq.is_meta and rope.inv_freq.shape == (8,)
    assert rope.inv_freq.dtype == torch.float64
