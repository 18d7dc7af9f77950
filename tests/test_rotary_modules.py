"""Tests of posenc.rotary.modules: RotaryEmbedding (position zero, incremental decoding, per-token
positions, torch.compile, meta device, registry flags, prebuilt tables, float64 frequencies,
compute_dtype, precomputed rows). Its variants XPos and Rope2D: tests/test_rotary_variants.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _rotary_refs import scaling_for, vec_dims
from posenc.rotary import Rope2D, RotaryEmbedding, XPos


@settings(deadline=None, max_examples=20)
@given(d=vec_dims, layout=st.sampled_from(["half", "interleaved"]), seed=st.integers(0, 2**16))
def test_property_position_zero_is_identity(d, layout, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 3, d, generator=g)
    rope = posenc.build("rope", head_dim=d, layout=layout)
    oq, ok = rope.rotate(q, q, torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    assert torch.equal(oq, q) and torch.equal(ok, q)


@pytest.mark.parametrize("rule", ["default", "yarn", "dynamic", "longrope", "xpos"])
def test_incremental_decoding_equals_full(rule):
    """Rotating token by token with offset positions == rotating the whole sequence; for length-dependent
    rules the model keeps raw keys and rotates the whole cache at each step (needs_unrotated_cache)."""
    torch.manual_seed(0)
    d, s = 16, 40
    if rule == "xpos":
        rope = posenc.build("xpos", head_dim=d)
    else:
        rope = posenc.build("rope", head_dim=d, scaling=scaling_for(rule, d, factor=4.0, l0=16))
    q, k = torch.randn(2, 2, s, d), torch.randn(2, 1, s, d)  # GQA: 2 query heads, 1 key head
    fq, fk = rope.rotate(q, k)
    logits_full = fq @ fk.transpose(-1, -2)
    cache = []
    for t in range(s):
        pos = torch.tensor([t])
        if rope.needs_unrotated_cache:
            qt, kt = rope.rotate(q[:, :, t : t + 1], k[:, :, : t + 1], pos, torch.arange(t + 1))
        else:
            qt, kn = rope.rotate(q[:, :, t : t + 1], k[:, :, t : t + 1], pos, pos)
            cache.append(kn)
            kt = torch.cat(cache, dim=2)
        step = qt @ kt.transpose(-1, -2)  # [b, h, 1, t+1]
        if rule in ("dynamic", "longrope"):  # the base follows the current length t + 1, as in HF
            rq, rk = rope.rotate(q[:, :, : t + 1], k[:, :, : t + 1])
            torch.testing.assert_close(step[..., 0, :], (rq @ rk.transpose(-1, -2))[..., t, :])
        else:
            torch.testing.assert_close(step[..., 0, :], logits_full[..., t, : t + 1])


def test_per_token_positions_packing_and_left_padding():
    """Positions [b, s] (left padding from a mask) == rotating each row with its own positions."""
    torch.manual_seed(0)
    rope = posenc.build("rope", head_dim=16, scaling=scaling_for("yarn", 16))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = posenc.positions_from_mask(mask)
    q = torch.randn(2, 3, 5, 16)
    oq, ok = rope.rotate(q, q, pos, pos)
    for row in range(2):
        rq, rk = rope.rotate(q[row : row + 1], q[row : row + 1], pos[row], pos[row])
        torch.testing.assert_close(oq[row : row + 1], rq, rtol=0, atol=0)
        torch.testing.assert_close(ok[row : row + 1], rk, rtol=0, atol=0)
    explicit, _ = rope.rotate(q, q, torch.arange(5), torch.arange(5))
    assert torch.equal(explicit, rope.rotate(q, q)[0])  # explicit arange == default, bit for bit


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    rope = posenc.build("rope", head_dim=16, partial_rotary_factor=0.5, scaling=scaling_for("yarn", 8))
    dyn = posenc.build("rope", head_dim=16, scaling=scaling_for("dynamic", 16, l0=8))
    xpos = posenc.build("xpos", head_dim=16, layout="interleaved")

    def f(q, k, pq, pk):
        return (*rope.rotate(q, k, pq, pk), *dyn.rotate(q, k, pq, pk), *xpos.rotate(q, k))

    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 12, 16), torch.randn(2, 1, 12, 16)
    pq = torch.arange(12)[None].expand(2, -1) + torch.tensor([[0], [5]])
    compiled = torch.compile(f, fullgraph=True)
    for a, b in zip(compiled(q, k, pq, pq), f(q, k, pq, pq)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_meta_device_build_and_materialize():
    with torch.device("meta"):
        m = posenc.build("rope", head_dim=32, scaling=scaling_for("longrope", 32))
        x = posenc.build("xpos", head_dim=32)
        a = posenc.build("rope_2d", head_dim=32, grid=(2, 3))
    assert not list(m.buffers()) and not list(m.parameters())  # nothing to materialize: config only
    m.to_empty(device="cpu")
    q = torch.randn(1, 1, 6, 32)
    ref = posenc.build("rope", head_dim=32, scaling=scaling_for("longrope", 32))
    assert torch.equal(m.rotate(q, q)[0], ref.rotate(q, q)[0])
    for mod in (x, a):
        mq, _ = mod.rotate(q.to("meta"), q.to("meta"))
        assert mq.shape == q.shape and mq.device.type == "meta"


def test_registry_and_flags():
    assert {"rope", "xpos", "rope_2d"} <= set(posenc.schemes())
    assert isinstance(posenc.build("rope", head_dim=8), RotaryEmbedding)
    assert posenc.build("rope", head_dim=8).needs_unrotated_cache is False
    assert posenc.build("rope", head_dim=8, scaling=scaling_for("dynamic", 8)).needs_unrotated_cache is True
    assert posenc.build("rope", head_dim=8, scaling=scaling_for("longrope", 8)).needs_unrotated_cache is True
    ctx = posenc.build_with_context("rope", {"head_dim": 16, "d_model": 64, "num_heads": 4})
    assert ctx.head_dim == 16 and posenc.describe("rope")["hooks"] == ["rotate"]


def test_classes_are_exported():
    assert posenc.RotaryEmbedding is RotaryEmbedding and posenc.XPos is XPos and posenc.Rope2D is Rope2D


@pytest.mark.parametrize("per_row", [False, True])
def test_rotate_with_prebuilt_tables_equals_rotate(per_row):
    """rotary_tables + rotate(tables=...) gives rotate's bits; equal q/k positions share one table."""
    rope = RotaryEmbedding(
        16, rotary_dim=8, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8}
    )
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    pos = torch.arange(3, 8).expand(2, 5) if per_row else torch.arange(3, 8)
    tabs = rope.rotary_tables(q, k, pos, pos.clone())
    assert tabs.k_cos is tabs.q_cos  # equal positions (a copy): built once
    got = rope.rotate(q, k, pos, pos, tables=tabs)
    want = rope.rotate(q, k, pos, pos)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(TypeError, match="tables must come from rotary_tables"):
        rope.rotate(q, k, tables=(tabs.q_cos, tabs.q_sin))
    with pytest.raises(TypeError, match="for 'bhsd'"):
        rope.rotate(q.transpose(1, 2), k.transpose(1, 2), qk_layout="bshd", tables=tabs)
    assert XPos(16).rotary_tables(q, k) is None and Rope2D(16, grid=(1, 5)).rotary_tables(q, k) is None


@pytest.mark.parametrize("rule", ["default", "linear", "ntk", "yarn", "llama3", "dynamic", "longrope"])
def test_fixed_frequencies_are_kept_in_float64_through_casts(rule):
    """A rule that does not depend on the length keeps its frequencies (computed at build, and again
    after a move or cast, never in the module's dtype): frequencies() returns them bit for bit, they
    stay out of the state dict, and a bf16 module rotates as a freshly built one does."""
    from posenc.rotary.scalings import ROPE_SCALINGS

    spec = ROPE_SCALINGS[rule]
    rope = RotaryEmbedding(64, scaling=scaling_for(rule, 64))
    if spec.length_dependent:
        assert rope.inv_freq is None  # per-call: the length changes them
        return
    want, scale = spec.compute(64, rope.base, rope.scaling_params, None, "cpu")
    got, got_scale = rope.frequencies(device="cpu")
    assert got is rope.inv_freq and torch.equal(got, want) and got.dtype == torch.float64
    assert got_scale == scale and "inv_freq" not in rope.state_dict()
    q = torch.randn(2, 3, 40, 64).bfloat16()
    fresh = RotaryEmbedding(64, scaling=scaling_for(rule, 64)).rotate(q, q, torch.arange(40) + 5000)
    for cast in (torch.bfloat16, torch.float16, torch.float64):
        rope.to(cast)
        assert rope.inv_freq.dtype == torch.float64 and torch.equal(rope.inv_freq, want)
    out = rope.rotate(q, q, torch.arange(40) + 5000)
    assert torch.equal(out[0], fresh[0]) and torch.equal(out[1], fresh[1])


def test_fixed_frequencies_materialize_after_a_meta_build():
    with torch.device("meta"):
        m = RotaryEmbedding(32, scaling=scaling_for("yarn", 32))
    assert m.inv_freq.is_meta
    m.to_empty(device="cpu")
    ref = RotaryEmbedding(32, scaling=scaling_for("yarn", 32))
    assert torch.equal(m.inv_freq, ref.inv_freq)
    q = torch.randn(1, 2, 9, 32)
    assert torch.equal(m.rotate(q, q)[0], ref.rotate(q, q)[0])


@pytest.mark.parametrize("per_row", [False, True])
def test_compute_dtype_float32_builds_float32_tables_and_rounds_once(per_row):
    """RotaryEmbedding on bf16 q/k (default, or compute_dtype=torch.float32): its tables are float32
    (built once by rotary_tables, shared by rotate) and rotate gives apply_rotary_qk's rounded-once
    numbers; compute_dtype="input" gives other (per-operation) numbers; float32 q/k are rotated the
    same either way; the setting shows in repr and survives the JSON forms "float32" and "input"."""
    gen = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(2, 4, 9, 16, generator=gen).bfloat16(),
        torch.randn(2, 2, 9, 16, generator=gen).bfloat16(),
    )
    pos = torch.arange(9).repeat(2, 1) + torch.tensor([[0], [5]]) if per_row else None
    rope = RotaryEmbedding(16)
    tables = rope.rotary_tables(q, k, pos, pos)
    assert tables.q_cos.dtype == torch.float32 and tables.k_cos is tables.q_cos
    got = rope.rotate(q, k, pos, pos)
    assert all(torch.equal(a, b) for a, b in zip(got, rope.rotate(q, k, pos, pos, tables=tables)))
    assert all(
        torch.equal(a, b)
        for a, b in zip(got, RotaryEmbedding(16, compute_dtype=torch.float32).rotate(q, k, pos, pos))
    )
    want = posenc.apply_rotary_qk(q, k, tables.q_cos, tables.q_sin, compute_dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    per_op = RotaryEmbedding(16, compute_dtype="input")
    assert per_op.rotary_tables(q, k, pos, pos).q_cos.dtype == torch.bfloat16
    assert not torch.equal(got[0], per_op.rotate(q, k, pos, pos)[0])
    q32, k32 = q.float(), k.float()
    assert all(
        torch.equal(a, b) for a, b in zip(rope.rotate(q32, k32, pos, pos), per_op.rotate(q32, k32, pos, pos))
    )
    assert "compute_dtype" not in repr(rope) and "compute_dtype='input'" in repr(per_op)
    assert RotaryEmbedding(16, compute_dtype="float32").compute_dtype == "float32"
    assert RotaryEmbedding(16, compute_dtype="input").compute_dtype == "input"


def _tables_equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[:4], b[:4]))


@pytest.mark.parametrize("wide", [None, torch.float32])
def test_precomputed_rows_give_the_tables_each_call_builds(wide):
    """precompute=n: calls at the default positions of up to n tokens read rows made at build time,
    bit for bit the tables a call builds (also past 4096 tokens, where some angles are split, and in
    every table dtype), and so do explicit positions inside the rows; positions past them build
    their own. Forward never writes the rows; they are not saved."""
    plain = RotaryEmbedding(32, compute_dtype=wide)
    kept = RotaryEmbedding(32, compute_dtype=wide, precompute=9000)
    assert kept.rows.shape == (2, 9000, 16) and kept.rows.dtype == torch.float32
    assert "rows" not in kept.state_dict() and "precompute=9000" in repr(kept)
    for s in (1, 7, 4096, 4097, 8999, 9000, 9001):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            q, k = torch.randn(1, 2, s, 32).to(dtype), torch.randn(1, 1, s, 32).to(dtype)
            assert _tables_equal(kept.rotary_tables(q, k), plain.rotary_tables(q, k)), (s, dtype)
            if s in (7, 9000):
                for a, b in zip(kept.rotate(q, k), plain.rotate(q, k)):
                    assert torch.equal(a, b)
    rows = kept.rows
    kept.rows = rows + 1  # the rows are what default positions of up to 9000 tokens read, and only those
    q = torch.randn(1, 2, 20, 32)
    assert not _tables_equal(kept.rotary_tables(q, q), plain.rotary_tables(q, q))
    pos = torch.arange(20) + 8980  # explicit positions inside the rows read them; past the rows, not
    assert not _tables_equal(kept.rotary_tables(q, q, pos, pos), plain.rotary_tables(q, q, pos, pos))
    far = pos + 1
    assert _tables_equal(kept.rotary_tables(q, q, far, far), plain.rotary_tables(q, q, far, far))
    long = torch.randn(1, 2, 9001, 32)
    assert _tables_equal(kept.rotary_tables(long, long), plain.rotary_tables(long, long))
    kept.rows = rows
    kept.rotate(q, q)
    assert kept.rows is rows
    kept.rotary_tables(q, q).q_cos.mul_(0)  # the tables handed out are copies, never the buffer
    assert torch.equal(kept.rows, rows)


@pytest.mark.parametrize(
    "build, call",
    [
        ({}, {"qk_layout": "bshd"}),  # [b, s, h, d]: s is dim 1
        ({"rotary_dim": 16}, {}),  # partial
        ({"scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}, {}),
        ({"layout": "interleaved"}, {"k_dtype": torch.bfloat16}),  # k in another dtype than q
        ({}, {"s_k": 30}),  # keys longer than queries (GQA, 4 query heads, 2 key heads)
        ({}, {"positions": "decode"}),  # explicit one position: gathered
        ({}, {"positions": "per_token"}),  # [b, s] positions: gathered
        ({}, {"positions": "beyond"}),  # past the rows: built in the call
    ],
)
def test_precomputed_rows_serve_every_call_shape(build, call):
    """Kept rows against tables built in the call, bit for bit, over layouts, partial rotary, a scaling
    with an attention scale, mixed dtypes, different lengths, and explicit positions (gathered on
    CPU when they all lie in 0..n-1, built otherwise)."""
    plain, kept = RotaryEmbedding(32, **build), RotaryEmbedding(32, precompute=40, **build)
    s_q, s_k = 12, call.get("s_k", 12)
    bshd = call.get("qk_layout") == "bshd"
    q = torch.randn(2, s_q, 4, 32) if bshd else torch.randn(2, 4, s_q, 32)
    k = torch.randn(2, s_k, 2, 32) if bshd else torch.randn(2, 2, s_k, 32)
    k = k.to(call.get("k_dtype", torch.float32))
    pos = {
        "decode": (torch.tensor([39]), torch.tensor([39])),
        "per_token": (torch.arange(s_q).expand(2, s_q) + torch.tensor([[0], [7]]),) * 2,
        "beyond": (torch.arange(s_q) + 35,) * 2,
    }.get(call.get("positions"), (None, None))
    if call.get("positions") == "decode":
        q, k = q[..., :1, :], k[..., :1, :]
    kw = {"qk_layout": "bshd"} if bshd else {}
    assert _tables_equal(kept.rotary_tables(q, k, *pos, **kw), plain.rotary_tables(q, k, *pos, **kw))
    for a, b in zip(kept.rotate(q, k, *pos, **kw), plain.rotate(q, k, *pos, **kw)):
        assert torch.equal(a, b)


def test_precomputed_rows_in_a_model_and_after_inference_mode():
    """A model's attention plan passes explicit positions: they read the rows (changing the rows
    changes the output), the same output as without them; a module built under inference_mode
    still trains; copies and pickles keep the option."""
    import copy
    import pickle

    from posenc.model import ModelConfig, TransformerLM

    def lm(options):
        torch.manual_seed(0)
        cfg = ModelConfig(
            vocab_size=50,
            d_model=32,
            num_layers=2,
            num_heads=4,
            position="rope",
            position_options=options,
            max_len=64,
        )
        return TransformerLM(cfg).eval()

    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    plain, kept = lm({}), lm({"precompute": 64})
    with torch.no_grad():
        want, got = plain(ids).logits, kept(ids).logits
        assert torch.equal(got, want)
        rope = next(m for m in kept.modules() if isinstance(m, RotaryEmbedding))
        rope.rows = rope.rows + 1
        assert not torch.equal(kept(ids).logits, want)
    with torch.inference_mode():
        frozen = RotaryEmbedding(16, precompute=32)
    x = torch.randn(1, 2, 10, 16, requires_grad=True)
    frozen.rotate(x, x)[0].sum().backward()
    assert x.grad is not None
    for twin in (copy.deepcopy(frozen), pickle.loads(pickle.dumps(RotaryEmbedding(16, precompute=32)))):
        assert twin.precompute == 32 and twin.rows.shape == (2, 32, 8)
        assert all(torch.equal(a, b) for a, b in zip(twin.rotate(x, x), RotaryEmbedding(16).rotate(x, x)))
    with pytest.raises(TypeError):
        XPos(16, precompute=8)  # the variants do not take it


@pytest.mark.parametrize("dtype, qk_layout", [(torch.float32, "bhsd"), (torch.bfloat16, "bshd")])
def test_precomputed_rows_generate_the_same_tokens(dtype, qk_layout):
    """Greedy generation with a KV cache (decode steps pass explicit positions, gathered from the
    rows while they last, built past them: 9 + 8 positions, 14 rows) gives the same tokens and the
    same logits as without kept rows."""
    from posenc.model import ModelConfig, TransformerLM

    def lm(options):
        torch.manual_seed(0)
        sizes = {"vocab_size": 50, "d_model": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
        cfg = ModelConfig(**sizes, position="rope", position_options=options, max_len=64, qk_layout=qk_layout)
        return TransformerLM(cfg).to(dtype).eval()

    prompt = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
    plain, kept = lm({}), lm({"precompute": 14})
    with torch.no_grad():
        want, got = plain.generate(prompt, 8, temperature=0), kept.generate(prompt, 8, temperature=0)
        assert torch.equal(got, want)
        assert torch.equal(kept(got).logits, plain(got).logits)


def test_precomputed_rows_follow_casts_moves_and_meta():
    """A cast recomputes the rows at a table's precision (float32 in a bf16 module, float64 in a
    float64 one); a meta build makes them for real on to_empty; compiled graphs read them."""
    plain, kept = RotaryEmbedding(16), RotaryEmbedding(16, precompute=64)
    kept.to(torch.bfloat16)
    assert kept.rows.dtype == torch.float32
    q = torch.randn(2, 2, 50, 16, dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(kept.rotate(q, q), plain.rotate(q, q)))
    kept.double()
    q64 = torch.randn(2, 2, 50, 16, dtype=torch.float64)
    assert kept.rows.dtype == torch.float64
    assert all(torch.equal(a, b) for a, b in zip(kept.rotate(q64, q64), plain.double().rotate(q64, q64)))
    with torch.device("meta"):
        lazy = posenc.build("rope", head_dim=16, precompute=64)
    assert lazy.rows.is_meta
    lazy.to_empty(device="cpu")
    assert torch.equal(lazy.rows, RotaryEmbedding(16, precompute=64).rows)
    x = torch.randn(1, 2, 40, 16)
    want = plain.rotate(x, x)[0]
    got = torch.compile(lambda t: lazy.rotate(t, t)[0], fullgraph=True)(x)
    assert torch.equal(got, want)


def test_precompute_rejects_bad_values_and_length_dependent_rules():
    with pytest.raises(ValueError, match="precompute must be >= 0"):
        RotaryEmbedding(16, precompute=-1)
    with pytest.raises(TypeError, match="precompute"):
        RotaryEmbedding(16, precompute=2.5)
    fix = r"precompute=64 needs frequencies that do not depend on the length.*pass precompute=0"
    with pytest.raises(ValueError, match=fix):
        RotaryEmbedding(16, scaling=scaling_for("dynamic", 16, factor=2.0, l0=32), precompute=64)


# ---------------------------------------------------------------------------------------------- call habits
def test_one_positions_tensor_rotates_q_and_k_there():
    """rope(q, k, p) places q and k both at p, as HF's apply_rotary_pos_emb(q, k, cos, sin) and
    torchtune's input_pos do (it used to place k at 0..s-1: rope(q, k, p)[1] equalled
    rope(q, k, p, arange(4))[1], 3.7 off the keys at p); position_ids= is the same argument."""
    torch.manual_seed(0)
    rope = posenc.build("rope", head_dim=8)
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    p = torch.arange(4) + 5
    both = rope(q, k, p, p)
    for got in (rope(q, k, p), rope(q, k, position_ids=p), rope.rotate(q, k, q_positions=p)):
        assert torch.equal(got[0], both[0]) and torch.equal(got[1], both[1])
    assert not torch.allclose(rope(q, k, p)[1], rope(q, k, p, torch.arange(4))[1])
    tables = rope.rotary_tables(q, k, position_ids=p)
    assert torch.equal(rope(q, k, tables=tables)[1], both[1])


def test_one_positions_tensor_for_q_and_k_of_different_lengths_is_refused():
    rope = posenc.build("rope", head_dim=8)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"s_q = 1 and k has s_k = 5: pass the keys' positions as k_pos"):
        rope(q, k, torch.tensor([4]))
    with pytest.raises(ValueError, match="k_positions is given without q_positions"):
        rope(q, k, k_positions=torch.arange(5))
    with pytest.raises(ValueError, match="pass the positions once"):
        rope(q, k, torch.tensor([4]), position_ids=torch.tensor([4]))
    qr, kr = rope(q, k, torch.tensor([4]), torch.arange(5))  # a KV-cache step: both given
    full_q, full_k = rope(torch.cat((k[..., :4, :], q), 2), k)
    torch.testing.assert_close(qr, full_q[..., 4:, :])
    torch.testing.assert_close(kr, full_k)


@pytest.mark.parametrize("name", ["rope", "rope_2d"])
def test_one_tensor_rotated_alone(name):
    """rope(x), rope(x, positions), rope(x, position_ids=...) and rope.rotate_one(x, ...) rotate one
    tensor (torchtune's and rotary-embedding-torch's habit): the matching half of rotate(q, k)."""
    torch.manual_seed(1)
    rope = posenc.build(name, head_dim=8, **({"grid": (2, 3)} if name == "rope_2d" else {}))
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8)
    grid = torch.tensor([[0, 1], [1, 1], [2, 0], [3, 5], [4, 4], [7, 2]])  # [s, 2] (row, col)
    p = torch.arange(6) + 3 if name == "rope" else grid
    rq, rk = rope(q, k, p)
    assert torch.equal(rope(q, p), rq) and torch.equal(rope(k, p), rk)
    assert torch.equal(rope(q, position_ids=p), rq) and torch.equal(rope.rotate_one(k, p), rk)
    assert torch.equal(rope(q), rope(q, q)[0])
    bshd = rope.rotate_one(q.transpose(1, 2), p, qk_layout="bshd")
    assert torch.equal(bshd.transpose(1, 2), rq)
    with pytest.raises(ValueError, match="k_positions needs keys"):
        rope(q, k_positions=p)


def test_xpos_refuses_one_tensor_alone():
    xpos = posenc.build("xpos", head_dim=8)
    with pytest.raises(TypeError, match="rotates q and k together"):
        xpos(torch.randn(1, 1, 3, 8), torch.arange(3))


def test_head_axis_checked_when_the_module_knows_its_heads():
    """A [b, s, h, d_h] tensor under the default "bhsd" passed silently without positions (6.0 off
    the right rotation); with num_heads (a model passes it) its head axis gives it away."""
    torch.manual_seed(0)
    x, y = torch.randn(1, 16, 4, 64), torch.randn(1, 16, 4, 64)  # [b, s, h, d_h]
    plain = posenc.build("rope", head_dim=64)
    assert (plain(x, y)[0] - plain(x, y, qk_layout="bshd")[0]).abs().max() > 1  # what cannot be caught
    rope = posenc.build("rope", head_dim=64, num_heads=4)
    with pytest.raises(ValueError, match="pass qk_layout='bshd'"):
        rope(x, y)
    with pytest.raises(ValueError, match="num_heads=4"):
        rope(x)
    kv = torch.randn(1, 2, 16, 64)  # grouped-query keys: 2 heads for 4 query heads
    q = torch.randn(1, 4, 16, 64)
    assert rope(q, kv)[1].shape == kv.shape and rope(kv).shape == kv.shape
    with pytest.raises(ValueError, match="a divisor of it"):
        rope(q, torch.randn(1, 3, 16, 64))
    assert torch.equal(rope(x, y, qk_layout="bshd")[0], plain(x, y, qk_layout="bshd")[0])
    with pytest.raises(ValueError, match="num_heads"):
        posenc.build("rope", head_dim=64, num_heads=0)


def test_a_model_passes_its_head_count():
    from posenc.model import ModelConfig, TransformerLM

    for scheme in ("rope", "xpos"):
        lm = TransformerLM(
            ModelConfig(vocab_size=16, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, position=scheme)
        )
        assert lm.decoder.scheme(0).num_heads == 4
        assert lm(torch.randint(0, 16, (2, 5))).logits.shape == (2, 5, 16)


def test_every_scheme_forward_has_its_hooks_signature():
    """help(rope) and IDEs see rotate's arguments, not *args/**kwargs; a call runs the hook."""
    import inspect

    for name in posenc.schemes():
        cls = type(posenc.build(name, **_small(name)))
        params = inspect.signature(cls.forward).parameters.values()
        if len(cls.hooks) <= 1:
            assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params), name
    sig = inspect.signature(RotaryEmbedding.forward).parameters
    assert {"q", "k", "q_positions", "k_positions", "position_ids", "qk_layout"} <= set(sig)
    assert "q_positions" in inspect.signature(posenc.ALiBi.forward).parameters


def _small(name):
    options = {"d_model": 8, "head_dim": 8, "num_heads": 2, "max_len": 16}
    keys = posenc.registry.config_keys(name)
    return {k: v for k, v in options.items() if k in keys} | ({"grid": (2, 2)} if name == "rope_2d" else {})


def test_full_width_tables_are_converted_with_a_clear_message():
    """Hugging Face's cos/sin are full width (each value twice); apply_rotary says how to convert them
    and half_width_tables does, checking the two copies (against HF's own rotary module)."""
    torch.manual_seed(0)
    rope = posenc.build("rope", head_dim=16)
    x = torch.randn(1, 2, 5, 16)
    cos, sin = rope.cos_sin(torch.arange(5))  # [5, 8] half width
    full_cos, full_sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # HF's [5, 16]
    with pytest.raises(ValueError, match=r"look full width .* posenc.half_width_tables"):
        posenc.apply_rotary(x, full_cos, full_sin)
    half = posenc.half_width_tables(full_cos, full_sin)
    assert torch.equal(posenc.apply_rotary(x, *half), posenc.apply_rotary(x, cos, sin))
    inter = posenc.half_width_tables(
        cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1), layout="interleaved"
    )
    assert torch.equal(inter[0], cos) and torch.equal(inter[1], sin)
    with pytest.raises(ValueError, match="does not hold each value twice"):
        posenc.half_width_tables(torch.randn(5, 16), torch.randn(5, 16))
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    config = pytest.importorskip("transformers").LlamaConfig(
        hidden_size=32, num_attention_heads=2, head_dim=16
    )
    hf_cos, hf_sin = llama.LlamaRotaryEmbedding(config)(x, torch.arange(5)[None])  # [1, 5, 16]
    hq = llama.apply_rotary_pos_emb(x, x, hf_cos, hf_sin)[0]
    ours = posenc.apply_rotary(x, *posenc.half_width_tables(hf_cos[:, None], hf_sin[:, None]))
    torch.testing.assert_close(ours, hq)


def test_building_and_running_rope_imports_no_compiler_stack():
    """import posenc, building a RoPE module and running it (and the input layer) in eager mode,
    forward and backward, import neither torch.compile's stack (torch._dynamo, ~1 s) nor Triton."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, torch, posenc\n"
        "rope = posenc.build('rope', head_dim=64)\n"
        "assert 'torch._dynamo' not in sys.modules and 'triton' not in sys.modules, 'on build'\n"
        "q = torch.randn(1, 2, 5, 64, requires_grad=True)\n"
        "sum(t.sum() for t in rope.rotate(q, q)).backward()\n"
        "layer = posenc.InputEmbedding(40, 8, 'sinusoidal', dropout=0.1).train()\n"
        "layer(torch.randint(0, 40, (2, 5))).sum().backward()\n"
        "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))\n"
    )
    src = str(Path(posenc.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
