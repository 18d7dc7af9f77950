/* rope_cpu.c's loops for CPUs with AVX2 and no AVX-512 (included there, inside its #if): bf16
   exact and rounded once, float32 interleaved. */
#include <immintrin.h>
/* AVX2 without AVX-512: the exact path's operations written for 8-lane vectors (GCC's own
   vectorization of it widens with cross-lane shuffles and rounds with one more operation per
   value). Every value goes through the same float operations and the same integer rounding as in
   pairs_bf16_*, so the bits are the same for every input (a NaN stays a NaN; which of two NaN
   operands a sum passes on is the compiler's choice in either path); only the order of lanes
   differs, and it is undone before the store:
   - 16 words widen as their even words (shifted up: ev16) and their odd words (masked: od16), in
     place, so a table block widens the same way and no lane crosses; a result's word goes back
     with a blend of the even result (shifted down) and the odd one (back16): 8 operations per 16
     pairs, 2 of them masks that any port runs, instead of 10 unpacks, shifts and packs, which
     only two of Zen 3's four vector ports run;
   - the rounding takes 3 operations, not 4 (rnd_add). This loop is bound by its vector operations
     (64 per 16 pairs; before these changes 78 in the half layout, 76 interleaved: about 0.95x the
     time in place, benchmarks/ab_kernel.py). */
static inline __m256i ld2(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline __m256 ev16(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
static inline __m256 od16(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
}
/* the high words of 8 + 8 results (rnd_add, before its mask) as 16 words: even from e, odd from o */
static inline __m256i back16(__m256i e, __m256i o) { return _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA); }
/* u + 0x7FFF + ((u >> 16) & 1): rbf before its mask (the high 16 bits are the rounded bf16); the
   bias 0x7FFF or 0x8000 is picked by bit 16, shifted into the sign bit that blendv reads */
static inline __m256i rnd_add(__m256 f) {
  const __m256 even = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF)), odd = _mm256_castsi256_ps(_mm256_set1_epi32(0x8000));
  __m256i u = _mm256_castps_si256(f);
  __m256 bias = _mm256_blendv_ps(even, odd, _mm256_castsi256_ps(_mm256_slli_epi32(u, 15)));
  return _mm256_add_epi32(u, _mm256_castps_si256(bias));
}
static inline __m256 rbf8(__m256 f) {
  return _mm256_castsi256_ps(_mm256_and_si256(rnd_add(f), _mm256_set1_epi32((int)0xFFFF0000u)));
}
/* a' = rnd(rnd(a c) - rnd(b s)), b' = rnd(rnd(b c) + rnd(a s)), before the final mask (rnd_add) */
static inline void rot8_bf16(__m256 a, __m256 b, __m256 c, __m256 s, __m256i* ao, __m256i* bo) {
  *ao = rnd_add(_mm256_sub_ps(rbf8(_mm256_mul_ps(a, c)), rbf8(_mm256_mul_ps(b, s))));
  *bo = rnd_add(_mm256_add_ps(rbf8(_mm256_mul_ps(b, c)), rbf8(_mm256_mul_ps(a, s))));
}

/* The g rows xp + k xg -> op + k og (k < g) of one table row, 16 pairs at a time, half layout
   (a = x[i], b = x[h + i]): each table block is split once for the g rows into the lanes of
   ev16 / od16 (SPLIT), the pairs are rotated by ROT (rot8_bf16: every product and sum rounded to
   bf16; rot8_once: float32 arithmetic, one rounding) and the last h % 16 pairs take the scalar
   loop TAIL. */
#define HALF16(NAME, TT, SPLIT, ROT, TAIL)                                                          \
static inline void NAME(const char* xp, char* op, i64 xg, i64 og, i64 g, const TT* c, const TT* s,  \
                        i64 h, float sgn, int tn) {                                                 \
  (void)tn;                                                                                         \
  const __m256 sg = _mm256_set1_ps(sgn);                                                            \
  i64 i = 0;                                                                                        \
  for (; i + 16 <= h; i += 16) {                                                                    \
    __m256 ce, co, se, so;                                                                          \
    SPLIT(c + i, &ce, &co);                                                                         \
    SPLIT(s + i, &se, &so);                                                                         \
    se = _mm256_mul_ps(sg, se);                                                                     \
    so = _mm256_mul_ps(sg, so);                                                                     \
    for (i64 k = 0; k < g; ++k) {                                                                   \
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og); \
      __m256i a = ld2(xr + i), b = ld2(xr + h + i), ae, ao, be, bo;                                 \
      ROT(ev16(a), ev16(b), ce, se, &ae, &be);                                                      \
      ROT(od16(a), od16(b), co, so, &ao, &bo);                                                      \
      _mm256_storeu_si256((__m256i*)(orow + i), back16(ae, ao));                                    \
      _mm256_storeu_si256((__m256i*)(orow + h + i), back16(be, bo));                                \
    }                                                                                               \
  }                                                                                                 \
  for (i64 k = 0; k < g && i < h; ++k)                                                              \
    TAIL((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);             \
}

/* As HALF16 for the interleaved layout (a = x[2i], b = x[2i + 1]: the even and odd words of x
   itself): LOAD8 reads 8 table values in natural order. */
#define INTL16(NAME, TT, LOAD8, ROT, TAIL)                                                          \
static inline void NAME(const char* xp, char* op, i64 xg, i64 og, i64 g, const TT* c, const TT* s,  \
                        i64 h, float sgn, int tn) {                                                 \
  (void)tn;                                                                                         \
  const __m256 sg = _mm256_set1_ps(sgn);                                                            \
  i64 i = 0;                                                                                        \
  for (; i + 16 <= h; i += 16) {                                                                    \
    __m256 c0 = LOAD8(c + i), c1 = LOAD8(c + i + 8);                                                \
    __m256 s0 = _mm256_mul_ps(sg, LOAD8(s + i)), s1 = _mm256_mul_ps(sg, LOAD8(s + i + 8));          \
    for (i64 k = 0; k < g; ++k) {                                                                   \
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og); \
      __m256i x0 = ld2(xr + 2 * i), x1 = ld2(xr + 2 * i + 16), a0, b0, a1, b1;                      \
      ROT(ev16(x0), od16(x0), c0, s0, &a0, &b0);                                                    \
      ROT(ev16(x1), od16(x1), c1, s1, &a1, &b1);                                                    \
      _mm256_storeu_si256((__m256i*)(orow + 2 * i), back16(a0, b0));                                \
      _mm256_storeu_si256((__m256i*)(orow + 2 * i + 16), back16(a1, b1));                           \
    }                                                                                               \
  }                                                                                                 \
  for (i64 k = 0; k < g && i < h; ++k)                                                              \
    TAIL((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);             \
}

/* 16 bf16 table words as their even (e) and odd (o) values: the lanes of ev16 / od16 */
static inline void evod16(const uint16_t* p, __m256* e, __m256* o) {
  __m256i w = ld2(p);
  *e = ev16(w);
  *o = od16(w);
}
/* 8 natural-order table values from bf16 words */
static inline __m256 widen8(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
HALF16(body2_bf16_half, uint16_t, evod16, rot8_bf16, pairs_bf16_half)
INTL16(body2_bf16_intl, uint16_t, widen8, rot8_bf16, pairs_bf16_intl)

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
/* Rounded once (float32 tables): HALF16 / INTL16 with float32 table blocks (evod8 splits one into
   even and odd values) and the float32 arithmetic of pairs_once_*, then rnd_add with NaN lanes set
   to 0x7FC0 (the scalar path's bits for every input, NaNs included). */
static inline __m256i once8(__m256 f) {
  __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(rnd_add(f)), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
}
static inline void rot8_once(__m256 a, __m256 b, __m256 c, __m256 s, __m256i* ao, __m256i* bo) {
  *ao = once8(_mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
  *bo = once8(_mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
}
/* float32 values 0, 2, .., 14 (e) and 1, 3, .., 15 (o) of p, in order: the lanes of ev16 / od16 */
static inline void evod8(const float* p, __m256* e, __m256* o) {
  __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
  /* in-lane shuffles give (0 2 8 10 | 4 6 12 14); 64-bit moves put them in order */
  *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xD8));
  *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8));
}
HALF16(body2_once_half, float, evod8, rot8_once, pairs_once_half)
INTL16(body2_once_intl, float, _mm256_loadu_ps, rot8_once, pairs_once_intl)
GROWFN(row_bf16_half, uint16_t, body2_bf16_half)
GROWFN(row_bf16_intl, uint16_t, body2_bf16_intl)
GROWFN2(row_once_half, uint16_t, float, body2_once_half)
GROWFN2(row_once_intl, uint16_t, float, body2_once_intl)
