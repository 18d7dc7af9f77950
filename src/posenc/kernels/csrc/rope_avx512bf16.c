/* rope_cpu.c's bfloat16 loops for CPUs with AVX512-BF16 (included there, inside its #if). */
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
