#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
typedef int64_t i64;
#define MAXD 8

static inline float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
/* round a float to bfloat16 precision, staying in 32-bit lanes (vectorizes to 5 integer ops). Same
   rounding as c10::BFloat16 (round to nearest even) for every finite value and infinity; a NaN stays
   a NaN in the bf16 paths because every NaN there has zero low 16 bits (bf16 inputs widened, or
   x86's default NaN), so the rounding never carries into its exponent. (Float32 tables can bring
   NaNs with any payload: the rounded-once paths set NaN lanes apart first, f2bf_once / once8.) */
static inline float rbf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  memcpy(&f, &u, 4); return f;
}
/* store a float already rounded by rbf: its low 16 bits are zero */
static inline uint16_t f2bf_rounded(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }

/* Pairs lo..hi-1 of one row xr (pairs (i, i+r/2) or (2i, 2i+1)), rotated into orow. Iteration i
   reads and writes only the two elements of pair i, and orow is either xr itself or disjoint from
   it, so there is no dependence between iterations (ivdep lets the loop vectorize); the tables are
   never written (restrict: no aliasing checks). */
#define PAIRFN(NAME, T, F, LOAD, STORE, RND, IA, IB)                                       \
static inline void NAME(const T* xr, T* orow, const T* restrict c, const T* restrict s,   \
                        i64 lo, i64 hi, i64 h, float sgn) {                                 \
  (void)h; /* the interleaved layout does not use it */                                     \
  _Pragma("GCC ivdep")                                                                      \
  for (i64 i = lo; i < hi; ++i) {                                                           \
    F a = LOAD(xr[IA(i)]), b = LOAD(xr[IB(i)]);                                             \
    F cc = LOAD(c[i]), ss_ = (F)sgn * LOAD(s[i]);                                           \
    orow[IA(i)] = STORE(RND(RND(a * cc) - RND(b * ss_)));                                   \
    orow[IB(i)] = STORE(RND(RND(b * cc) + RND(a * ss_)));                                   \
  }                                                                                         \
}

/* A run of n rows along one row dim (byte strides xs, os, cs, ss), each at g places g_k = k * xg
   (k < g) of the next row dim out, which read the same table row: g > 1 reads each table row once
   for g rows (the rows of g heads at one position) instead of streaming the table once per head.
   Rotates r dims of each row, copies dims r..d if out != x. One call per run, not per row. BODY
   rotates pairs 0..h-1 of one row; tn says the tables were checked beforehand (bf16, below). */
#define ROWFN(NAME, T, BODY) ROWFN2(NAME, T, T, BODY)
#define ROWFN2(NAME, T, TT, BODY)                                                           \
static void NAME(const char* xp, char* op, const char* cp, const char* sp, i64 n, i64 xs,  \
                 i64 os, i64 cs, i64 ss, i64 h, i64 d, i64 r, float sgn, int tn, i64 g, i64 xg,    \
                 i64 og) {                                                                  \
  (void)tn;                                                                                 \
  for (i64 row = 0; row < n; ++row, xp += xs, op += os, cp += cs, sp += ss)                \
    for (i64 k = 0; k < g; ++k) {                                                           \
      const T* xr = (const T*)(xp + k * xg); T* orow = (T*)(op + k * og);                   \
      BODY((const T*)xr, orow, (const TT*)cp, (const TT*)sp, h, sgn, tn);                   \
      if (orow != xr) for (i64 i = r; i < d; ++i) orow[i] = xr[i];                          \
    }                                                                                       \
}

/* As ROWFN, with a body that rotates the g rows of one table row together (GBODY: bf16, whose
   fast blocks widen each table block once for the g rows). */
#define GROWFN(NAME, T, GBODY) GROWFN2(NAME, T, T, GBODY)
#define GROWFN2(NAME, T, TT, GBODY)                                                         \
static void NAME(const char* xp, char* op, const char* cp, const char* sp, i64 n, i64 xs,  \
                 i64 os, i64 cs, i64 ss, i64 h, i64 d, i64 r, float sgn, int tn, i64 g, i64 xg,    \
                 i64 og) {                                                                  \
  for (i64 row = 0; row < n; ++row, xp += xs, op += os, cp += cs, sp += ss) {              \
    GBODY(xp, op, xg, og, g, (const TT*)cp, (const TT*)sp, h, sgn, tn);                     \
    for (i64 k = 0; k < g; ++k) {                                                           \
      const T* xr = (const T*)(xp + k * xg); T* orow = (T*)(op + k * og);                   \
      if (orow != xr) for (i64 i = r; i < d; ++i) orow[i] = xr[i];                          \
    }                                                                                       \
  }                                                                                         \
}

#define ID(v) (v)
#define HALF_A(i) (i)
#define HALF_B(i) ((i) + h)
#define INTL_A(i) (2 * (i))
#define INTL_B(i) (2 * (i) + 1)
PAIRFN(pairs_f32_half, float, float, ID, ID, ID, HALF_A, HALF_B)
PAIRFN(pairs_f32_intl, float, float, ID, ID, ID, INTL_A, INTL_B)
PAIRFN(pairs_f64_half, double, double, ID, ID, ID, HALF_A, HALF_B)
PAIRFN(pairs_f64_intl, double, double, ID, ID, ID, INTL_A, INTL_B)
PAIRFN(pairs_bf16_half, uint16_t, float, bf2f, f2bf_rounded, rbf, HALF_A, HALF_B)
PAIRFN(pairs_bf16_intl, uint16_t, float, bf2f, f2bf_rounded, rbf, INTL_A, INTL_B)
/* Rounded once (dtype 3): bf16 x, float32 tables, float32 products and sums, one rounding to bf16
   at the end: PyTorch's ``(x.float() * cos - ...).to(bf16)``, NaN encodings aside (NaN -> 0x7FC0
   as c10's scalar conversion; PyTorch's vectorized one writes 0xFFFF). */
static inline uint16_t f2bf_once(float f) { return f != f ? (uint16_t)0x7FC0 : f2bf_rounded(rbf(f)); }
#define ONCEFN(NAME, IA, IB)                                                                \
static inline void NAME(const uint16_t* xr, uint16_t* orow, const float* restrict c,         \
                        const float* restrict s, i64 lo, i64 hi, i64 h, float sgn) {        \
  (void)h;                                                                                  \
  _Pragma("GCC ivdep")                                                                      \
  for (i64 i = lo; i < hi; ++i) {                                                           \
    float a = bf2f(xr[IA(i)]), b = bf2f(xr[IB(i)]), cc = c[i], ss_ = sgn * s[i];            \
    orow[IA(i)] = f2bf_once(a * cc - b * ss_);                                              \
    orow[IB(i)] = f2bf_once(b * cc + a * ss_);                                              \
  }                                                                                         \
}
ONCEFN(pairs_once_half, HALF_A, HALF_B)
ONCEFN(pairs_once_intl, INTL_A, INTL_B)
#define BODY_F32_HALF(xr, orow, c, s, h, sgn, tn) pairs_f32_half(xr, orow, c, s, 0, h, h, sgn)
#define BODY_F32_INTL(xr, orow, c, s, h, sgn, tn) pairs_f32_intl(xr, orow, c, s, 0, h, h, sgn)
#define BODY_F64_HALF(xr, orow, c, s, h, sgn, tn) pairs_f64_half(xr, orow, c, s, 0, h, h, sgn)
#define BODY_F64_INTL(xr, orow, c, s, h, sgn, tn) pairs_f64_intl(xr, orow, c, s, 0, h, h, sgn)

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
/* bfloat16, 32 pairs at a time, with AVX512-BF16's converter (one instruction rounds 32 floats to
   bf16, where the integer rounding above takes 5 per 16): the same roundings in the same order, so
   the same bits as the exact path, as long as no value it rounds is a subnormal float (the converter
   reads those as zero). The caller checks that first: when every nonzero |a|, |b|, |cos|, |sin| of
   the block is >= 2^-59 (bf16 exponent field >= 68), each product is exact (8-bit x 8-bit
   significands) and >= 2^-118, and each sum of two such bf16 values is 0 or >= 2^-125: all normal.
   Other blocks (and the last h % 32 pairs) take the exact path.

   Lane order: a float vector pair (l, h) holds 32 pairs, lane m of l pair pl(m), of h pair ph(m).
   Packing (h, l) to 32 bf16 words puts l's lanes in words 0-15 and h's in 16-31; widening words
   back to floats without a shuffle takes the even words (w << 16) as l and the odd ones
   (w & 0xFFFF0000) as h, so a trip through bf16 maps word s to word g(s) = 2s (s < 16), 2(s-16)+1
   (s >= 16) of the previous pack. The half layout widens raw rows the same way (pl(m) = 2m, ph(m) =
   2m+1) and makes two trips: word s of a result holds pair g(g(s)), NAT puts them back in order.
   The interleaved layout widens x's words (a even, b odd) to pl(m) = m, ph(m) = 16 + m and makes
   one more trip than it widens: word s holds pair g(s); ILV0/ILV1 put a' and b' (index >= 32: b')
   of pairs 0-15 and 16-31 back in order, interleaved. */
static const uint16_t NAT[32] = {0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                                 4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};
static const uint16_t ILV0[32] = {0, 32, 16, 48, 1, 33, 17, 49, 2, 34, 18, 50, 3, 35, 19, 51,
                                  4, 36, 20, 52, 5, 37, 21, 53, 6, 38, 22, 54, 7, 39, 23, 55};
static const uint16_t ILV1[32] = {8, 40, 24, 56, 9, 41, 25, 57, 10, 42, 26, 58, 11, 43, 27, 59,
                                  12, 44, 28, 60, 13, 45, 29, 61, 14, 46, 30, 62, 15, 47, 31, 63};

static inline __m512i ld(const void* p) { return _mm512_loadu_si512(p); }
static inline __m512 even16(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
static inline __m512 odd16(__m512i w) {
  return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
}
/* natural-order words 0-15 / 16-31 of w as floats (for tables read with the interleaved layout) */
static inline __m512 first16(__m512i w) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)), 16));
}
static inline __m512 last16(__m512i w) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1)), 16));
}
static inline __m512i pack16(__m512 h, __m512 l) { return (__m512i)_mm512_cvtne2ps_pbh(h, l); }

/* |v| - 1 of raw bf16 words: 0 wraps to 0xFFFF, so a word is below TINY only for a nonzero value
   under 2^-59 (the scalar form is bf16_tiny) */
#define TINY (0x2200 - 1)
static inline __m512i mag1(__m512i v) {
  return _mm512_sub_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0x7FFF)), _mm512_set1_epi16(1));
}
/* Whether every lane of a and b is 0 or >= 2^-59 */
static inline int bf16_normal(__m512i a, __m512i b) {
  return _mm512_cmplt_epu16_mask(_mm512_min_epu16(mag1(a), mag1(b)), _mm512_set1_epi16(TINY)) == 0;
}

/* a' = rnd(rnd(a c) - rnd(b s)), b' = rnd(rnd(b c) + rnd(a s)) for 32 pairs given as (l, h) float
   vectors, packed in word order g(.) of the inputs' order (above) */
static inline void bf16_rotate32(__m512 al, __m512 ah, __m512 bl, __m512 bh, __m512 cl, __m512 ch, __m512 sl,
                                 __m512 sh, __m512i* ao, __m512i* bo) {
  __m512i ac = pack16(_mm512_mul_ps(ah, ch), _mm512_mul_ps(al, cl));
  __m512i bs = pack16(_mm512_mul_ps(bh, sh), _mm512_mul_ps(bl, sl));
  __m512i bc = pack16(_mm512_mul_ps(bh, ch), _mm512_mul_ps(bl, cl));
  __m512i as = pack16(_mm512_mul_ps(ah, sh), _mm512_mul_ps(al, sl));
  *ao = pack16(_mm512_sub_ps(odd16(ac), odd16(bs)), _mm512_sub_ps(even16(ac), even16(bs)));
  *bo = pack16(_mm512_add_ps(odd16(bc), odd16(as)), _mm512_add_ps(even16(bc), even16(as)));
}

/* sin times sgn (+1 or -1) as the exact path computes it: a multiply, which also keeps a NaN's sign */
static inline __m512 signed16(__m512 s, float sgn) { return _mm512_mul_ps(_mm512_set1_ps(sgn), s); }

/* The g rows xp + k xg -> op + k og (k < g) that read one table row (c, s): each block of 32
   pairs widens its table values once for the g rows (the same operations per row as one row at a
   time, so the same bits). A block whose x or table values fail the check takes the exact path. */
static inline void body_bf16_half(const char* xp, char* op, i64 xg, i64 og, i64 g, const uint16_t* c,
                                  const uint16_t* s, i64 h, float sgn, int tn) {
  const __m512i nat = ld(NAT);
  i64 i = 0;
  for (; i + 32 <= h; i += 32) {
    __m512i cc = ld(c + i), ss = ld(s + i), ao, bo;
    int tab = tn || bf16_normal(cc, ss);
    __m512 cl = even16(cc), ch = odd16(cc), sl = signed16(even16(ss), sgn), sh = signed16(odd16(ss), sgn);
    for (i64 k = 0; k < g; ++k) {
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og);
      __m512i a = ld(xr + i), b = ld(xr + h + i);
      if (!tab || !bf16_normal(a, b)) { pairs_bf16_half(xr, orow, c, s, i, i + 32, h, sgn); continue; }
      bf16_rotate32(even16(a), odd16(a), even16(b), odd16(b), cl, ch, sl, sh, &ao, &bo);
      _mm512_storeu_si512(orow + i, _mm512_permutexvar_epi16(nat, ao));
      _mm512_storeu_si512(orow + h + i, _mm512_permutexvar_epi16(nat, bo));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_bf16_half((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);
}

static inline void body_bf16_intl(const char* xp, char* op, i64 xg, i64 og, i64 g, const uint16_t* c,
                                  const uint16_t* s, i64 h, float sgn, int tn) {
  const __m512i ilv0 = ld(ILV0), ilv1 = ld(ILV1);
  i64 i = 0;
  for (; i + 32 <= h; i += 32) {
    __m512i cc = ld(c + i), ss = ld(s + i), ao, bo;
    int tab = tn || bf16_normal(cc, ss);
    __m512 cl = first16(cc), ch = last16(cc), sl = signed16(first16(ss), sgn), sh = signed16(last16(ss), sgn);
    for (i64 k = 0; k < g; ++k) {
      const uint16_t* xr = (const uint16_t*)(xp + k * xg); uint16_t* orow = (uint16_t*)(op + k * og);
      __m512i x0 = ld(xr + 2 * i), x1 = ld(xr + 2 * i + 32);
      if (!tab || !bf16_normal(x0, x1)) { pairs_bf16_intl(xr, orow, c, s, i, i + 32, h, sgn); continue; }
      bf16_rotate32(even16(x0), even16(x1), odd16(x0), odd16(x1), cl, ch, sl, sh, &ao, &bo);
      _mm512_storeu_si512(orow + 2 * i, _mm512_permutex2var_epi16(ao, ilv0, bo));
      _mm512_storeu_si512(orow + 2 * i + 32, _mm512_permutex2var_epi16(ao, ilv1, bo));
    }
  }
  for (i64 k = 0; k < g && i < h; ++k)
    pairs_bf16_intl((const uint16_t*)(xp + k * xg), (uint16_t*)(op + k * og), c, s, i, h, h, sgn);
}
GROWFN(row_bf16_half, uint16_t, body_bf16_half)
GROWFN(row_bf16_intl, uint16_t, body_bf16_intl)
#elif defined(__AVX2__) && !defined(__AVX512F__)
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
#else
#define BODY_BF16_HALF(xr, orow, c, s, h, sgn, tn) pairs_bf16_half(xr, orow, c, s, 0, h, h, sgn)
#define BODY_BF16_INTL(xr, orow, c, s, h, sgn, tn) pairs_bf16_intl(xr, orow, c, s, 0, h, h, sgn)
ROWFN(row_bf16_half, uint16_t, BODY_BF16_HALF)
ROWFN(row_bf16_intl, uint16_t, BODY_BF16_INTL)
#endif
#if !(defined(__AVX2__) && !defined(__AVX512F__))
#define BODY_ONCE_HALF(xr, orow, c, s, h, sgn, tn) pairs_once_half(xr, orow, c, s, 0, h, h, sgn)
#define BODY_ONCE_INTL(xr, orow, c, s, h, sgn, tn) pairs_once_intl(xr, orow, c, s, 0, h, h, sgn)
ROWFN2(row_once_half, uint16_t, float, BODY_ONCE_HALF)
ROWFN2(row_once_intl, uint16_t, float, BODY_ONCE_INTL)
#endif
ROWFN(row_f32_half, float, BODY_F32_HALF)
#if defined(__AVX2__) && !defined(__AVX512F__)
GROWFN(row_f32_intl, float, body2_f32_intl)
#else
ROWFN(row_f32_intl, float, BODY_F32_INTL)
#endif
ROWFN(row_f64_half, double, BODY_F64_HALF)
ROWFN(row_f64_intl, double, BODY_F64_INTL)

typedef void (*rowfn)(const char*, char*, const char*, const char*, i64, i64, i64, i64, i64, i64, i64, i64,
                      float, int, i64, i64, i64);
static rowfn pick(int dtype, int interleaved) {
  static const rowfn table[4][2] = {{row_f32_half, row_f32_intl}, {row_f64_half, row_f64_intl},
                                     {row_bf16_half, row_bf16_intl}, {row_once_half, row_once_intl}};
  return table[dtype][interleaved];
}

/* One rotation: the rows of x (all dims but the last), each tensor's byte strides over them
   (broadcast dims of cos/sin have stride 0), and the row function. */
typedef struct {
  rowfn f; const char *x, *cs, *sn; char* out;
  i64 nd, d, r, rows, shape[MAXD], xs[MAXD], os[MAXD], cst[MAXD], sst[MAXD];
  i64 group;  /* rows per table row (run_groups), 0: run_rows */
  float sgn; int nthreads, tn;
} job;

/* Rows per table row for run_groups: when every row dim but the innermost reads the same table
   rows (the tables' strides are 0 there, as for [s, r/2] tables shared by every batch and head),
   the rows of G neighbours along the next dim out (heads) at one position share one read of the
   table row, instead of the whole table streaming from memory once per head (the tables are as big
   as a head's rows: 1.5x the traffic of the in-place floor). G = 4 in place; 2 out of place, whose
   reads and writes then make 4 streams (4 measured slower there, in place it reaches the floor).
   0: run_rows. */
static i64 group_size(const job* j) {
  i64 in = j->nd - 1;
  if (in < 1 || j->shape[in - 1] < 2 || j->shape[in] < 2) return 0;
  for (i64 k = 0; k < in; ++k)
    if (j->cst[k] != 0 || j->sst[k] != 0) return 0;
  return j->out == j->x ? 4 : 2;
}

static inline int bf16_tiny(uint16_t v) { return (uint16_t)((v & 0x7FFF) - 1) < 0x2200 - 1; }

/* bf16 tables read by run_groups (positions 0..s-1 of each): whether every value is 0 or >= 2^-59,
   so the fast blocks need not check them again for every head (1/(batch * heads) of the work). */
static int tables_checked(const job* j) {
  i64 in = j->nd - 1, h = j->r / 2, bad = 0;
  for (i64 p = 0; p < j->shape[in]; ++p) {
    const uint16_t* c = (const uint16_t*)(j->cs + p * j->cst[in]);
    const uint16_t* s = (const uint16_t*)(j->sn + p * j->sst[in]);
    for (i64 i = 0; i < h; ++i) bad |= bf16_tiny(c[i]) | bf16_tiny(s[i]);
  }
  return !bad;
}

/* a = [dtype, interleaved, x, out, cos, sin, nd, nthreads, sign (+1/-1), d, r, shape[nd], xs[nd],
   os[nd], cs[nd], ss[nd]] (strides in elements). dtype: 0 f32, 1 f64, 2 bf16, 3 bf16 x with float32
   tables, rounded once. Nonzero: rejected. */
static int parse(const i64* a, job* j) {
  static const i64 esize[4] = {4, 8, 2, 2}, tsize[4] = {4, 8, 2, 4};
  int dtype = (int)a[0];
  i64 nd = a[6];
  if (nd < 1 || nd > MAXD || dtype < 0 || dtype > 3) return 1;
  i64 e = esize[dtype], te = tsize[dtype];
  const i64* geo = a + 9;
  j->f = pick(dtype, a[1] != 0);
  j->x = (const char*)(intptr_t)a[2]; j->out = (char*)(intptr_t)a[3];
  j->cs = (const char*)(intptr_t)a[4]; j->sn = (const char*)(intptr_t)a[5];
  j->nd = nd; j->nthreads = (int)a[7]; j->sgn = (float)a[8];
  j->d = geo[0]; j->r = geo[1]; j->rows = 1;
  for (i64 k = 0; k < nd; ++k) {
    j->shape[k] = geo[2 + k]; j->rows *= j->shape[k];
    j->xs[k] = geo[2 + nd + k] * e; j->os[k] = geo[2 + 2 * nd + k] * e;
    j->cst[k] = geo[2 + 3 * nd + k] * te; j->sst[k] = geo[2 + 4 * nd + k] * te;
  }
  j->group = group_size(j);
  j->tn = dtype == 2 && j->group && tables_checked(j);
  return 0;
}

/* Rows lo..hi-1 of a job, walked with an odometer (no division per row), one row-function call
   per run of rows along the innermost row dim. */
static void run_rows(const job* j, i64 lo, i64 hi) {
  if (lo >= hi) return;
  i64 nd = j->nd, in = nd - 1, idx[MAXD], rem = lo, xo = 0, oo = 0, co = 0, so = 0, h = j->r / 2;
  for (i64 k = nd - 1; k >= 0; --k) { idx[k] = rem % j->shape[k]; rem /= j->shape[k]; }
  for (i64 k = 0; k < nd; ++k) {
    xo += idx[k] * j->xs[k]; oo += idx[k] * j->os[k]; co += idx[k] * j->cst[k]; so += idx[k] * j->sst[k];
  }
  for (i64 row = lo; row < hi;) {
    i64 run = j->shape[in] - idx[in];
    if (run > hi - row) run = hi - row;
    j->f(j->x + xo, j->out + oo, j->cs + co, j->sn + so, run, j->xs[in], j->os[in], j->cst[in], j->sst[in],
         h, j->d, j->r, j->sgn, j->tn, 1, 0, 0);
    row += run;
    idx[in] += run;
    xo += run * j->xs[in]; oo += run * j->os[in]; co += run * j->cst[in]; so += run * j->sst[in];
    for (i64 k = in; k >= 0 && idx[k] == j->shape[k]; --k) {  /* carry into the outer dims */
      xo -= j->xs[k] * j->shape[k]; oo -= j->os[k] * j->shape[k];
      co -= j->cst[k] * j->shape[k]; so -= j->sst[k] * j->shape[k];
      idx[k] = 0;
      if (k > 0) { ++idx[k - 1]; xo += j->xs[k - 1]; oo += j->os[k - 1]; co += j->cst[k - 1]; so += j->sst[k - 1]; }
    }
  }
}

/* Units lo..hi-1 of a grouped job: a unit is G neighbours (fewer at the end) along dim in-1 of one
   index of the dims further out, every position. */
static i64 group_units(const job* j) {
  i64 in = j->nd - 1, m = j->shape[in - 1], outer = j->rows / j->shape[in] / m;
  return outer * ((m + j->group - 1) / j->group);
}

static void run_groups(const job* j, i64 lo, i64 hi) {
  i64 in = j->nd - 1, m = j->shape[in - 1], G = j->group, per = (m + G - 1) / G, h = j->r / 2;
  for (i64 u = lo; u < hi; ++u) {
    i64 rem = u / per, g0 = (u % per) * G, g = m - g0 < G ? m - g0 : G;
    i64 xo = g0 * j->xs[in - 1], oo = g0 * j->os[in - 1];
    for (i64 k = in - 2; k >= 0; --k) {  /* the offsets of index rem of the dims further out */
      i64 ik = rem % j->shape[k];
      rem /= j->shape[k];
      xo += ik * j->xs[k]; oo += ik * j->os[k];
    }
    j->f(j->x + xo, j->out + oo, j->cs, j->sn, j->shape[in], j->xs[in], j->os[in], j->cst[in], j->sst[in], h, j->d,
         j->r, j->sgn, j->tn, g, j->xs[in - 1], j->os[in - 1]);
  }
}

/* Run n jobs (1 or 2: queries and keys) one after the other, each split evenly over the threads
   (one parallel region per job: threads that write two fresh outputs at once, each taking
   huge-page faults in both, measured 3x slower than one output after the other).
   Returns nonzero for arguments it cannot take. */
static int run_jobs(const i64* const* args, int n) {
  job jobs[2];
  if (n < 1 || n > 2) return 1;
  for (int i = 0; i < n; ++i)
    if (parse(args[i], &jobs[i])) return 1;
  for (int i = 0; i < n; ++i) {
    const job* j = &jobs[i];
#ifdef _OPENMP
    #pragma omp parallel num_threads(j->nthreads) if (j->nthreads > 1)
#endif
    {
      int tid = 0, nt = 1;
#ifdef _OPENMP
      tid = omp_get_thread_num(); nt = omp_get_num_threads();
#endif
      /* groups only when every thread gets one (batch 1 with few heads: rows, split finer) */
      int grouped = j->group && group_units(j) >= nt;
      i64 units = grouped ? group_units(j) : j->rows;
      i64 chunk = (units + nt - 1) / nt, lo = tid * chunk, hi = lo + chunk < units ? lo + chunk : units;
      if (grouped) run_groups(j, lo, hi); else run_rows(j, lo, hi);
    }
  }
  return 0;
}

/* All arguments of one rotation in one int64 array (see parse): one ctypes conversion per call. */
int posenc_rope_packed(const i64* a) { const i64* args[1] = {a}; return run_jobs(args, 1); }

/* Two rotations (queries and keys) in one call. */
int posenc_rope_packed2(const i64* a, const i64* b) { const i64* args[2] = {a, b}; return run_jobs(args, 2); }
