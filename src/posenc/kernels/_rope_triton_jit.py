"""The Triton functions of :mod:`posenc.kernels.rope_triton` (imported only when Triton is installed).

Legend: ``R`` rows per program (``BLOCK_ROWS``), ``P`` pairs per row (``BLOCK_PAIRS``, a power of
two >= ``r/2``); a row is one ``d_h`` vector of ``x`` viewed as ``[b, h, s, d_h]``.
"""

import triton
import triton.language as tl


@triton.jit
def _rnd(v, ROUND: tl.constexpr):
    # round a float32 to the tensor's dtype and back (PyTorch rounds every elementwise result).
    # bfloat16 by integer ops, round to nearest even as c10::BFloat16 (Triton's interpreter
    # truncates in .to(tl.bfloat16)); the result's low 16 bits are zero, so storing it is exact
    if ROUND == 1:
        u = v.to(tl.uint32, bitcast=True)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.uint32)  # keep 32 bits for the bitcast
        # a NaN stays NaN: NVIDIA's canonical NaN 0x7FFFFFFF would carry into the sign (-0.0)
        v = tl.where(v != v, v, u.to(tl.float32, bitcast=True))
    elif ROUND == 2:
        v = v.to(tl.float16).to(tl.float32)
    return v


# one tensor's operands: pointers (x, out, cos, sin), its rows (n = b * h * s, H = h, S = s) and
# element strides over [b, h, s] of x (sx*), out (so*) and the tables (sc*, 0 where they broadcast)
@triton.jit
def _rows(
    x_ptr,
    o_ptr,
    c_ptr,
    s_ptr,
    row0,
    n_rows,
    H,
    S,
    sxb,
    sxh,
    sxs,
    sob,
    soh,
    sos,
    scb,
    sch,
    scs,
    half,
    d,
    sign,
    INTERLEAVED: tl.constexpr,
    ROUND: tl.constexpr,
    ONCE: tl.constexpr,
    COPY_REST: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    BLOCK_REST: tl.constexpr,
):
    rows = row0 + tl.arange(0, BLOCK_ROWS)  # [R] flat row index over [b, h, s]
    rmask = rows < n_rows
    s = (rows % S).to(tl.int64)
    t = rows // S
    hh = (t % H).to(tl.int64)
    b = (t // H).to(tl.int64)
    x_off = b * sxb + hh * sxh + s * sxs  # [R] element offsets of each row
    o_off = b * sob + hh * soh + s * sos
    c_off = b * scb + hh * sch + s * scs  # cos and sin share strides (0 where they broadcast)
    p = tl.arange(0, BLOCK_PAIRS)
    m = rmask[:, None] & (p < half)[None, :]  # [R, P]
    if INTERLEAVED:
        ia = 2 * p
        ib = 2 * p + 1
    else:
        ia = p
        ib = p + half
    a = tl.load(x_ptr + x_off[:, None] + ia[None, :], mask=m, other=0.0).to(tl.float32)
    bb = tl.load(x_ptr + x_off[:, None] + ib[None, :], mask=m, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + c_off[:, None] + p[None, :], mask=m, other=0.0).to(tl.float32)
    sn = tl.load(s_ptr + c_off[:, None] + p[None, :], mask=m, other=0.0).to(tl.float32) * sign
    if ONCE:  # float32 tables and arithmetic, each output rounded to x's dtype once
        ya = _rnd(a * c - bb * sn, ROUND)
        yb = _rnd(bb * c + a * sn, ROUND)
    else:  # every product and sum rounded to x's dtype, as PyTorch's elementwise ops round them
        ya = _rnd(_rnd(a * c, ROUND) - _rnd(bb * sn, ROUND), ROUND)
        yb = _rnd(_rnd(bb * c, ROUND) + _rnd(a * sn, ROUND), ROUND)
    tl.store(o_ptr + o_off[:, None] + ia[None, :], ya.to(o_ptr.dtype.element_ty), mask=m)
    tl.store(o_ptr + o_off[:, None] + ib[None, :], yb.to(o_ptr.dtype.element_ty), mask=m)
    if COPY_REST:  # partial rotary into a new tensor: dims r..d pass through
        for j0 in range(2 * half, d, BLOCK_REST):
            j = j0 + tl.arange(0, BLOCK_REST)
            mr = rmask[:, None] & (j < d)[None, :]
            v = tl.load(x_ptr + x_off[:, None] + j[None, :], mask=mr)
            tl.store(o_ptr + o_off[:, None] + j[None, :], v, mask=mr)


# row counts and sizes change with every shape (a decoding step grows the key cache): not
# specialized on, so they do not compile new variants; strides are (16-divisibility lets loads vectorize)
@triton.jit(do_not_specialize=["n1", "H1", "S1", "progs1", "n2", "H2", "S2"])
def rope_pair_kernel(
    x1,
    o1,
    c1,
    s1,
    n1,
    H1,
    S1,
    sxb1,
    sxh1,
    sxs1,
    sob1,
    soh1,
    sos1,
    scb1,
    sch1,
    scs1,
    progs1,
    x2,
    o2,
    c2,
    s2,
    n2,
    H2,
    S2,
    sxb2,
    sxh2,
    sxs2,
    sob2,
    soh2,
    sos2,
    scb2,
    sch2,
    scs2,
    half,
    d,
    sign,
    INTERLEAVED: tl.constexpr,
    ROUND: tl.constexpr,
    ONCE: tl.constexpr,
    COPY_REST: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    BLOCK_REST: tl.constexpr,
):
    # programs [0, progs1) rotate the first tensor (q), the rest the second (k): one launch
    pid = tl.program_id(0)
    if pid < progs1:
        _rows(
            x1,
            o1,
            c1,
            s1,
            pid * BLOCK_ROWS,
            n1,
            H1,
            S1,
            sxb1,
            sxh1,
            sxs1,
            sob1,
            soh1,
            sos1,
            scb1,
            sch1,
            scs1,
            half,
            d,
            sign,
            INTERLEAVED,
            ROUND,
            ONCE,
            COPY_REST,
            BLOCK_ROWS,
            BLOCK_PAIRS,
            BLOCK_REST,
        )
    else:
        row0 = (pid - progs1) * BLOCK_ROWS
        _rows(
            x2,
            o2,
            c2,
            s2,
            row0,
            n2,
            H2,
            S2,
            sxb2,
            sxh2,
            sxs2,
            sob2,
            soh2,
            sos2,
            scb2,
            sch2,
            scs2,
            half,
            d,
            sign,
            INTERLEAVED,
            ROUND,
            ONCE,
            COPY_REST,
            BLOCK_ROWS,
            BLOCK_PAIRS,
            BLOCK_REST,
        )
