"""What limits bf16 RoPE on an AVX2 CPU: the AVX2 kernel against variants of itself, alternated in
one process on the shapes of benchmarks/RESULTS.md (q `[4, 32, 2048, 128]` bf16, half layout,
2 threads, allocator keep), each against the floor (``x.mul_(1)`` in place, a copy out of place).

    python benchmarks/rope_limits.py        # in place
    python benchmarks/rope_limits.py out    # out of place

The variants are the working tree's ``rope_avx2.c`` with one change each, made here in memory:

* ``unrounded``: no rounding at all (wrong numbers): what the loop's loads, widening, products and
  stores cost, an upper bound for any exact form;
* ``fma``: each product rounded to bf16 with Veltkamp's split, three FMA-unit operations
  (``t = x (c 65537)``, ``rnd(x c) = t - (t - x c)``, the inner product fused into one FMA) instead of
  a multiply and four integer operations. Exact only while every product is 0 or a normal float
  below 2^111 (a subnormal product rounds on another grid; an overflow or an infinity gives NaN),
  so on its own it is a bound, not a kernel;
* ``fma+check``: ``fma`` with the check that makes it exact for every input: per block, the table
  words must be 0 or have exponent fields in [64, 173), and per row the block's 32 words of x in
  [64, 192) (zeros take the fallback too); other blocks take the integer rounding.

Before timing, the FMA variants' outputs are compared with the kernel's on four sets of inputs
(``_cases``: random bit patterns, the same clamped to [-1, 1], values spread over the FMA form's
range, randn queries with 1% zeros rotated by real tables): ``fma+check`` must give the same bits
everywhere (else the script stops), and the line printed first says how many values ``fma`` alone
gets wrong in each. Then it prints each variant's median time, its share of the floor, and the
median of its per-round time ratios to the kernel (quartiles in brackets). Only for x86-64 with
AVX2 and FMA, without AVX-512.
"""

from __future__ import annotations

import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # ab_kernel.py beside this file

import ab_kernel

from posenc.benchmarks.harness import set_allocator
from posenc.kernels import rope_cpu

_UNROUNDED = {
    "static inline __m256i rnd_add(__m256 f) {": (
        "static inline __m256i rnd_add(__m256 f) { return _mm256_castps_si256(f); }\n"
        "static inline __m256i rnd_add_unused(__m256 f) {"
    ),
    "static inline __m256 rbf8(__m256 f) {": (
        "static inline __m256 rbf8(__m256 f) { return f; }\nstatic inline __m256 rbf8_unused(__m256 f) {"
    ),
}

# The FMA body for the half layout; FMA_CHECK 0: no check (a bound), 1: exact for every input.
_FMA_BODY = r"""
/* rnd(x y) for bf16 x, y (yC = y 65537, exact): x y is exact in float32, t - x y is one fnmadd */
static inline __m256 vkf(__m256 x, __m256 y, __m256 yC) {
  __m256 t = _mm256_mul_ps(x, yC);
  return _mm256_sub_ps(t, _mm256_fnmadd_ps(x, y, t));
}
static inline void rot8_fma(__m256 a, __m256 b, __m256 c, __m256 s, __m256 cC, __m256 sC, __m256i* ao,
                            __m256i* bo) {
  *ao = rnd_add(_mm256_sub_ps(vkf(a, c, cC), vkf(b, s, sC)));
  *bo = rnd_add(_mm256_add_ps(vkf(b, c, cC), vkf(a, s, sC)));
}
/* every word of w is 0 or has its exponent field in [lo, hi) (w + w: the magnitude, shifted) */
static inline int window16(__m256i w, int lo, int hi) {
  __m256i m = _mm256_add_epi16(w, w), m1 = _mm256_sub_epi16(m, _mm256_set1_epi16(1));
  __m256i bad = _mm256_or_si256(_mm256_subs_epu16(_mm256_set1_epi16((short)((lo << 8) - 1)), m1),
                                _mm256_subs_epu16(m, _mm256_set1_epi16((short)((hi << 8) - 2))));
  return _mm256_testz_si256(bad, bad);
}
/* every word of a and b has its exponent field in [64, 192): bit 14 of w + 0x2000 is set exactly
   then (2 operations per 16 words; a zero fails and takes the fallback) */
static inline int x_window(__m256i a, __m256i b) {
  const __m256i k = _mm256_set1_epi16(0x2000);
  __m256i y = _mm256_and_si256(_mm256_add_epi16(a, k), _mm256_add_epi16(b, k));
  return _mm256_testc_si256(y, _mm256_set1_epi16(0x4000));
}
static inline void body2_fma_half(const char* xp, char* op, i64 xg, i64 og, i64 g, const uint16_t* c,
                                  const uint16_t* s, i64 h, float sgn, int tn) {
  (void)tn;
  const __m256 sg = _mm256_set1_ps(sgn), K = _mm256_set1_ps(65537.0f);
  i64 i = 0;
  for (; i + 16 <= h; i += 16) {
    __m256i cw = ld2(c + i), sw = ld2(s + i);
    int tab = !FMA_CHECK || (window16(cw, 64, 173) && window16(sw, 64, 173));
    __m256 ce = ev16(cw), co = od16(cw), se = _mm256_mul_ps(sg, ev16(sw)), so = _mm256_mul_ps(sg, od16(sw));
    __m256 cCe = _mm256_mul_ps(K, ce), cCo = _mm256_mul_ps(K, co);
    __m256 sCe = _mm256_mul_ps(K, se), sCo = _mm256_mul_ps(K, so);
    for (i64 k = 0; k < g; ++k) {
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og);
      __m256i a = ld2(xr + i), b = ld2(xr + h + i), ae, ao, be, bo;
      if (FMA_CHECK && !(tab && x_window(a, b))) {
        rot8_bf16(ev16(a), ev16(b), ce, se, &ae, &be);
        rot8_bf16(od16(a), od16(b), co, so, &ao, &bo);
      } else {
        rot8_fma(ev16(a), ev16(b), ce, se, cCe, sCe, &ae, &be);
        rot8_fma(od16(a), od16(b), co, so, cCo, sCo, &ao, &bo);
      }
      _mm256_storeu_si256((__m256i*)(orow + i), back16(ae, ao));
      _mm256_storeu_si256((__m256i*)(orow + h + i), back16(be, bo));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_bf16_half((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);
}
GROWFN(row_bf16_half, uint16_t, body2_fma_half)
"""


def _fma(check: int) -> dict[str, str]:
    return {"GROWFN(row_bf16_half, uint16_t, body2_bf16_half)": f"#define FMA_CHECK {check}\n{_FMA_BODY}"}


_VARIANTS = {"kernel": {}, "unrounded": _UNROUNDED, "fma": _fma(0), "fma+check": _fma(1)}


def _load(patches: dict[str, str]) -> dict:
    """rope_cpu's loaded state, built with ``patches`` (old text -> new) applied to rope_avx2.c (its
    self-check skipped: the variants' outputs are compared in main)."""

    def read(filename: str) -> str:
        with open(f"{ab_kernel.CSRC}/{filename}") as f:
            text = f.read()
        if filename != "rope_avx2.c":
            return text
        for old, new in patches.items():
            if text.count(old) != 1:
                raise SystemExit(f"rope_avx2.c changed: {old!r} is not there once; update {__file__}")
            text = text.replace(old, new)
        return text

    return ab_kernel.build("rope", read, check=False)


def _spread(shape: tuple[int, ...], lo: int, hi: int, gen: torch.Generator) -> torch.Tensor:
    """bf16 values of random sign and significand, magnitudes spread over [2^lo, 2^hi)."""
    exponent = torch.randint(lo, hi, shape, generator=gen).double()
    sign = torch.randint(0, 2, shape, generator=gen).double() * 2 - 1
    return (sign * (1 + torch.rand(shape, generator=gen, dtype=torch.float64)) * 2**exponent).to(
        torch.bfloat16
    )


def _cases() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(x, cos, sin) to compare a variant with the kernel on: random bit patterns (NaN, infinities,
    subnormals, zeros: mostly the fallback), the same clamped to [-1, 1], values spread over the
    FMA form's range (x 2^-63..2^64, tables 2^-63..2^45: the FMA path, ties included), and randn
    queries with 1% zeros rotated by real tables."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**15), 2**15, (2, 8, 64, 128), dtype=torch.int16, generator=gen).view(
        torch.bfloat16
    )
    tables = torch.randint(-(2**15), 2**15, (2, 64, 64), dtype=torch.int16, generator=gen).view(
        torch.bfloat16
    )
    angles = torch.arange(256.0)[:, None] * torch.rand(64, generator=gen)  # [256, 64]
    real = torch.randn(4, 32, 256, 128, generator=gen)
    real = torch.where(torch.rand(real.shape, generator=gen) < 0.01, 0.0, real).to(torch.bfloat16)
    return [
        (bits, *tables),
        (bits.clamp(-1, 1), tables[0].clamp(-1, 1), tables[1]),
        (
            _spread((4, 32, 256, 128), -63, 64, gen),
            _spread((256, 64), -63, 45, gen),
            _spread((256, 64), -63, 45, gen),
        ),
        (real, angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)),
    ]


def _use(states: dict[str, dict], tag: str) -> None:
    """Switch rope_cpu to the build ``tag``."""
    rope_cpu._state.clear()
    rope_cpu._state.update(states[tag])


def _differ(states: dict[str, dict], tag: str) -> list[int]:
    """How many output values of variant ``tag`` differ from the kernel's, per case of :func:`_cases`."""
    outs = []
    for name in ("kernel", tag):
        _use(states, name)
        outs.append([rope_cpu.rotate(x, cos, sin, "half").view(torch.int16) for x, cos, sin in _cases()])
    return [int((a != b).sum()) for a, b in zip(*outs)]


def main(argv: list[str]) -> None:
    out = argv[:1] == ["out"]
    torch.set_num_threads(2)
    set_allocator("keep")
    states = {tag: _load(patches) for tag, patches in _VARIANTS.items()}
    if any(_differ(states, "fma+check")):
        raise SystemExit("fma+check does not give the kernel's bits")
    print(f"values unlike the kernel's, per case of _cases: fma {_differ(states, 'fma')}, fma+check none")
    call, limit, _output = ab_kernel._rope_case("bf16", "half", out)
    times = ab_kernel._time(call, limit, lambda tag: _use(states, tag), 15, tuple(states))
    floor = statistics.median(times["limit"])
    print(f"bf16 RoPE {'out of place' if out else 'in place'}, half layout; floor {floor * 1e3:.2f} ms")
    for tag in states:
        ratios = [t / k for t, k in zip(times[tag], times["kernel"])]
        q1, med, q3 = statistics.quantiles(ratios, n=4)
        t = statistics.median(times[tag])
        print(
            f"{tag:>10}: {t * 1e3:6.2f} ms, {100 * floor / t:5.1f}% of the floor, "
            f"{med:.3f}x the kernel's time ({q1:.3f}-{q3:.3f})"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
