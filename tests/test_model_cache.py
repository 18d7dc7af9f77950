"""Tests of posenc.model.cache: KVCache appends in place into buffers that grow by a quarter, keeps
earlier views intact, works after inference_mode, refuses another batch's keys, takes keys assigned
from outside, and concatenates (never writes in place) while gradients are on."""

from __future__ import annotations

import pytest
import torch

from _model_helpers import config, ids_, mha_config
from _model_toys import register_toys
from posenc.model import KVCache, TransformerLM


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    register_toys(monkeypatch)


def test_cache_appends_in_place_into_growing_buffers():
    """Appending writes only the new slots of a buffer that grows by a quarter (at least 256 slots)
    when full; the keys/values are those of concatenation, and views handed out earlier keep their
    values."""
    gen = torch.Generator().manual_seed(0)
    cache = KVCache(2)
    steps = [5, 1, 1, 3, 1, 7, 1, 300]  # a prefill, decode steps and chunks
    seen_k, seen_v, handed_out, capacity = [], [], [], []
    with torch.no_grad():
        for n in steps:
            k, v = torch.randn(2, 3, n, 4, generator=gen), torch.randn(2, 3, n, 4, generator=gen)
            seen_k.append(k)
            seen_v.append(v)
            got_k, got_v = cache.update(1, k, v)
            torch.testing.assert_close(got_k, torch.cat(seen_k, dim=2), rtol=0, atol=0)
            torch.testing.assert_close(got_v, torch.cat(seen_v, dim=2), rtol=0, atol=0)
            handed_out.append((got_k, got_k.clone()))
            capacity.append(got_k.untyped_storage().nbytes() // (2 * 3 * 4 * 4))  # slots of the buffer
    for view, copy in handed_out:
        assert torch.equal(view, copy)
    # lengths 5, 6, 7, 10, 11, 18, 19, 319: exact at the prefill, then 5 + 256, then 261 + 256
    assert capacity == [5, 261, 261, 261, 261, 261, 261, 517]
    assert cache.keys[0] is None  # the other layer untouched


def test_cache_filled_under_inference_mode_keeps_working_outside_it():
    cache = KVCache(1)
    ks = [torch.randn(1, 2, n, 4) for n in (3, 1, 1)]
    with torch.inference_mode():
        cache.update(0, ks[0], ks[0])
        cache.update(0, ks[1], ks[1])  # capacity 6: room left in an inference tensor
    with torch.no_grad():
        keys, _ = cache.update(0, ks[2], ks[2])
    assert torch.equal(keys, torch.cat(ks, dim=2))


def test_cache_refuses_keys_of_another_batch():
    cache = KVCache(1)
    cache.update(0, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"must agree in b, h_kv and d_h \(use a new KVCache"):
        cache.update(0, torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))


def test_cache_takes_keys_assigned_from_outside_into_new_buffers():
    """A rollback, a strided selection or a sliding window assigned to keys[layer]: the next update
    builds on exactly those keys, and no view handed out before is written."""
    with torch.no_grad():
        for select in (lambda t: t[:, :, ::2], lambda t: t[:, :, 1:], lambda t: t[:, :, :3]):
            cache = KVCache(1)
            first = torch.arange(6.0).view(1, 1, 6, 1).expand(1, 1, 6, 2).contiguous()
            cache.update(0, first, first)
            held, _ = cache.update(0, torch.full((1, 1, 1, 2), 6.0), torch.full((1, 1, 1, 2), 6.0))
            held_copy = held.clone()
            cache.keys[0], cache.values[0] = select(cache.keys[0]), select(cache.values[0])
            want = torch.cat((cache.keys[0].clone(), torch.full((1, 1, 1, 2), 9.0)), dim=2)
            keys, values = cache.update(0, torch.full((1, 1, 1, 2), 9.0), torch.full((1, 1, 1, 2), 9.0))
            assert torch.equal(keys, want) and torch.equal(values, want)
            assert torch.equal(held, held_copy)


def test_cache_never_writes_in_place_with_grad_enabled():
    """Training through a cache with frozen k/v projections (only q trainable, as with LoRA on q):
    SDPA keeps the cached keys for backward, so appending must not write into them."""
    torch.manual_seed(0)
    model = TransformerLM(mha_config(position="toy_rotate", num_layers=1, d_model=32))
    for name, p in model.named_parameters():
        p.requires_grad_("q_proj" in name)
    ids = torch.randint(0, 11, (1, 8))
    cache = model.new_cache()
    loss = model(ids[:, :4], cache=cache).logits.sum()
    for i in range(4, 7):
        loss = loss + model(ids[:, i : i + 1], cache=cache).logits.sum()
    loss.backward()  # raised "modified by an inplace operation" when the cache wrote into its buffers
    q_grad = model.decoder.blocks[0].attn.q_proj.weight.grad
    assert q_grad is not None and q_grad.abs().sum() > 0


def test_cache_concatenates_when_keys_carry_gradients():
    cache = KVCache(1)
    k = torch.randn(1, 2, 3, 4, requires_grad=True)
    cache.update(0, k, k.detach())
    k2 = torch.randn(1, 2, 1, 4, requires_grad=True)
    keys, _ = cache.update(0, k2, k2.detach())
    keys.sum().backward()
    assert k.grad is not None and torch.equal(k.grad, torch.ones_like(k))
    assert torch.equal(k2.grad, torch.ones_like(k2))


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


@pytest.mark.parametrize("position", ["rope", "sinusoidal", "alibi"])
def test_offset_after_a_prefill_at_explicit_positions(position):
    """A prefill at positions 100..104 leaves offset() at 105 (one past the last cached position, not
    the number of cached tokens), so a decode step without positions runs at 105 and gives the
    logits the whole sequence gets at 100..105."""
    torch.manual_seed(0)
    model = TransformerLM(config(position)).eval()
    ids = ids_(2, 6)
    with torch.no_grad():
        full = model(ids, positions=torch.arange(100, 106)).logits  # [2, 6, V]
        cache = model.new_cache()
        model(ids[:, :5], positions=torch.arange(100, 105), cache=cache)
        assert cache.offset() == 105 and len(cache) == 5
        step = model(ids[:, 5:], cache=cache).logits  # default positions: continue after the cache
    assert cache.positions[..., -1].item() == 105
    torch.testing.assert_close(step, full[:, 5:], rtol=1e-5, atol=1e-5)
