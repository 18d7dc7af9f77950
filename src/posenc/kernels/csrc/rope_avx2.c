/* rope_cpu.c's loops for CPUs with AVX2 and no AVX-512 (included there, inside its #if): bf16
   exact and rounded once, float32 interleaved. */
#include <immintrin.h>
/* AVX2 without AVX-512: the exact path's operations written for 8-lane vectors (GCC's own
   vectorization of it widens with cross-lane shuffles and rounds with one more operation per
   value). Every value goes through the same float operations and the same integer rounding as in
   pairs_bf16_*, so the bits are the same for every input (a NaN stays a NaN; which of two NaN
   operands a sum passes on is the compiler's choice in either path); only the order of lanes
   differs, and it is undone before the store, within 128-bit lanes:
   - widening by interleaving words with zero puts words 0-3, 8-11 of 16 in one vector (lo) and
     4-7, 12-15 in the other (hi); packing lo and hi back (packus) restores the order;
   - the interleaved layout's a (even words) and b (odd words) widen in place, in natural order,
     and a result's word goes back with a blend of a' (shifted down) and b' (high words). */
static inline __m256 lo16(__m256i w) { return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), w)); }
static inline __m256 hi16(__m256i w) { return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), w)); }
static inline __m256i ld2(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
/* u + 0x7FFF + ((u >> 16) & 1): rbf before its mask (the high 16 bits are the rounded bf16) */
static inline __m256i rnd_add(__m256 f) {
  __m256i u = _mm256_castps_si256(f);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd);
}
static inline __m256 rbf8(__m256 f) {
  return _mm256_castsi256_ps(_mm256_and_si256(rnd_add(f), _mm256_set1_epi32((int)0xFFFF0000u)));
}
/* a' = rnd(rnd(a c) - rnd(b s)), b' = rnd(rnd(b c) + rnd(a s)), before the final mask (rnd_add) */
static inline void rot8_bf16(__m256 a, __m256 b, __m256 c, __m256 s, __m256i* ao, __m256i* bo) {
  *ao = rnd_add(_mm256_sub_ps(rbf8(_mm256_mul_ps(a, c)), rbf8(_mm256_mul_ps(b, s))));
  *bo = rnd_add(_mm256_add_ps(rbf8(_mm256_mul_ps(b, c)), rbf8(_mm256_mul_ps(a, s))));
}
/* the bf16 words of 8 + 8 rounded results in lo/hi order, back in natural order */
static inline __m256i pack_words(__m256i lo, __m256i hi) {
  return _mm256_packus_epi32(_mm256_srli_epi32(lo, 16), _mm256_srli_epi32(hi, 16));
}

/* The g rows xp + k xg -> op + k og (k < g) of one table row, 16 pairs at a time: each table block
   is widened once for the g rows; the last h % 16 pairs take the scalar loop. */
static inline void body2_bf16_half(const char* xp, char* op, i64 xg, i64 og, i64 g, const uint16_t* c,
                                   const uint16_t* s, i64 h, float sgn, int tn) {
  (void)tn;
  const __m256 sg = _mm256_set1_ps(sgn);
  i64 i = 0;
  for (; i + 16 <= h; i += 16) {
    __m256i cc = ld2(c + i), ss = ld2(s + i), al, ah, bl, bh;
    __m256 cl = lo16(cc), ch = hi16(cc), sl = _mm256_mul_ps(sg, lo16(ss)), sh = _mm256_mul_ps(sg, hi16(ss));
    for (i64 k = 0; k < g; ++k) {
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og);
      __m256i a = ld2(xr + i), b = ld2(xr + h + i);
      rot8_bf16(lo16(a), lo16(b), cl, sl, &al, &bl);
      rot8_bf16(hi16(a), hi16(b), ch, sh, &ah, &bh);
      _mm256_storeu_si256((__m256i*)(orow + i), pack_words(al, ah));
      _mm256_storeu_si256((__m256i*)(orow + h + i), pack_words(bl, bh));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_bf16_half((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);
}

/* 8 natural-order table values from bf16 words */
static inline __m256 widen8(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static inline void body2_bf16_intl(const char* xp, char* op, i64 xg, i64 og, i64 g, const uint16_t* c,
                                   const uint16_t* s, i64 h, float sgn, int tn) {
  (void)tn;
  const __m256 sg = _mm256_set1_ps(sgn);
  const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
  i64 i = 0;
  for (; i + 16 <= h; i += 16) {
    __m256 c0 = widen8(c + i), c1 = widen8(c + i + 8);
    __m256 s0 = _mm256_mul_ps(sg, widen8(s + i)), s1 = _mm256_mul_ps(sg, widen8(s + i + 8));
    for (i64 k = 0; k < g; ++k) {
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og);
      __m256i x0 = ld2(xr + 2 * i), x1 = ld2(xr + 2 * i + 16), a0, b0, a1, b1;
      rot8_bf16(_mm256_castsi256_ps(_mm256_slli_epi32(x0, 16)), _mm256_castsi256_ps(_mm256_and_si256(x0, high)),
                c0, s0, &a0, &b0);
      rot8_bf16(_mm256_castsi256_ps(_mm256_slli_epi32(x1, 16)), _mm256_castsi256_ps(_mm256_and_si256(x1, high)),
                c1, s1, &a1, &b1);
      _mm256_storeu_si256((__m256i*)(orow + 2 * i), _mm256_blend_epi16(_mm256_srli_epi32(a0, 16), b0, 0xAA));
      _mm256_storeu_si256((__m256i*)(orow + 2 * i + 16), _mm256_blend_epi16(_mm256_srli_epi32(a1, 16), b1, 0xAA));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_bf16_intl((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);
}

/* float32, interleaved, 8 pairs at a time: x's pairs split into a = (0 1 4 5 | 2 3 6 7) and b in
   the same order with in-lane shuffles, the table block permuted once (64-bit moves) into that
   order for the g rows, the results interleaved back in natural order by unpacking. The same
   products and sums as pairs_f32_intl, so the same bits, NaN payloads aside (GCC's vectorization of that loop
   gathers with four cross-lane permutes per 8 pairs: 78% of x.mul_(1) in place). */
static inline void body2_f32_intl(const char* xp, char* op, i64 xg, i64 og, i64 g, const float* c,
                                  const float* s, i64 h, float sgn, int tn) {
  (void)tn;
  const __m256 sg = _mm256_set1_ps(sgn);
  i64 i = 0;
  for (; i + 8 <= h; i += 8) {
    __m256 cc = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(c + i)), 0xD8));
    __m256 ss = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(s + i)), 0xD8));
    ss = _mm256_mul_ps(sg, ss);
    for (i64 k = 0; k < g; ++k) {
      const float* xr = (const float*)(xp + k * xg); float* orow = (float*)(op + k * og);
      __m256 x0 = _mm256_loadu_ps(xr + 2 * i), x1 = _mm256_loadu_ps(xr + 2 * i + 8);
      __m256 a = _mm256_shuffle_ps(x0, x1, 0x88), b = _mm256_shuffle_ps(x0, x1, 0xDD);
      __m256 ao = _mm256_sub_ps(_mm256_mul_ps(a, cc), _mm256_mul_ps(b, ss));
      __m256 bo = _mm256_add_ps(_mm256_mul_ps(b, cc), _mm256_mul_ps(a, ss));
      _mm256_storeu_ps(orow + 2 * i, _mm256_unpacklo_ps(ao, bo));
      _mm256_storeu_ps(orow + 2 * i + 8, _mm256_unpackhi_ps(ao, bo));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_f32_intl((const float*)(xp + k * xg), (float*)(op + k * og), c, s, i, h, h, sgn);
}
/* Rounded once (float32 tables), 16 pairs at a time: x widened as in body2_bf16_half, each table
   block put in the same in-lane order once for the g rows; the float32 arithmetic of pairs_once_*,
   then rnd_add with NaN lanes set to 0x7FC0 (the scalar path's bits for every input, NaNs included). */
static inline __m256i once8(__m256 f) {
  __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(rnd_add(f)), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
}
static inline void rot8_once(__m256 a, __m256 b, __m256 c, __m256 s, __m256i* ao, __m256i* bo) {
  *ao = once8(_mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
  *bo = once8(_mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
}
static inline void body2_once_half(const char* xp, char* op, i64 xg, i64 og, i64 g, const float* c, const float* s,
                                   i64 h, float sgn, int tn) {
  (void)tn;
  const __m256 sg = _mm256_set1_ps(sgn);
  i64 i = 0;
  for (; i + 16 <= h; i += 16) {
    __m256 c0 = _mm256_loadu_ps(c + i), c1 = _mm256_loadu_ps(c + i + 8);
    __m256 s0 = _mm256_mul_ps(sg, _mm256_loadu_ps(s + i)), s1 = _mm256_mul_ps(sg, _mm256_loadu_ps(s + i + 8));
    /* lo16/hi16 order: pairs 0-3, 8-11 (lo) and 4-7, 12-15 (hi) */
    __m256 cl = _mm256_permute2f128_ps(c0, c1, 0x20), ch = _mm256_permute2f128_ps(c0, c1, 0x31);
    __m256 sl = _mm256_permute2f128_ps(s0, s1, 0x20), sh = _mm256_permute2f128_ps(s0, s1, 0x31);
    for (i64 k = 0; k < g; ++k) {
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og);
      __m256i a = ld2(xr + i), b = ld2(xr + h + i), al, ah, bl, bh;
      rot8_once(lo16(a), lo16(b), cl, sl, &al, &bl);
      rot8_once(hi16(a), hi16(b), ch, sh, &ah, &bh);
      _mm256_storeu_si256((__m256i*)(orow + i), pack_words(al, ah));
      _mm256_storeu_si256((__m256i*)(orow + h + i), pack_words(bl, bh));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_once_half((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);
}
static inline void body2_once_intl(const char* xp, char* op, i64 xg, i64 og, i64 g, const float* c, const float* s,
                                   i64 h, float sgn, int tn) {
  (void)tn;
  const __m256 sg = _mm256_set1_ps(sgn);
  const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
  i64 i = 0;
  for (; i + 16 <= h; i += 16) {
    __m256 c0 = _mm256_loadu_ps(c + i), c1 = _mm256_loadu_ps(c + i + 8);
    __m256 s0 = _mm256_mul_ps(sg, _mm256_loadu_ps(s + i)), s1 = _mm256_mul_ps(sg, _mm256_loadu_ps(s + i + 8));
    for (i64 k = 0; k < g; ++k) {
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og);
      __m256i x0 = ld2(xr + 2 * i), x1 = ld2(xr + 2 * i + 16), a0, b0, a1, b1;
      rot8_once(_mm256_castsi256_ps(_mm256_slli_epi32(x0, 16)), _mm256_castsi256_ps(_mm256_and_si256(x0, high)),
                c0, s0, &a0, &b0);
      rot8_once(_mm256_castsi256_ps(_mm256_slli_epi32(x1, 16)), _mm256_castsi256_ps(_mm256_and_si256(x1, high)),
                c1, s1, &a1, &b1);
      _mm256_storeu_si256((__m256i*)(orow + 2 * i), _mm256_blend_epi16(_mm256_srli_epi32(a0, 16), b0, 0xAA));
      _mm256_storeu_si256((__m256i*)(orow + 2 * i + 16), _mm256_blend_epi16(_mm256_srli_epi32(a1, 16), b1, 0xAA));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_once_intl((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);
}
GROWFN(row_bf16_half, uint16_t, body2_bf16_half)
GROWFN(row_bf16_intl, uint16_t, body2_bf16_intl)
GROWFN2(row_once_half, uint16_t, float, body2_once_half)
GROWFN2(row_once_intl, uint16_t, float, body2_once_intl)
