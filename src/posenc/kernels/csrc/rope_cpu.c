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
   a NaN here because every NaN in this kernel has zero low 16 bits (bf16 inputs widened, or x86's
   default NaN), so the rounding never carries into its exponent. */
static inline float rbf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  memcpy(&f, &u, 4); return f;
}
/* store a float already rounded by rbf: its low 16 bits are zero */
static inline uint16_t f2bf_rounded(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }

/* One row: rotate r dims of xr (pairs (i, i+r/2) or (2i, 2i+1)) into orow, copy dims r..d if out != x.
   Iteration i reads and writes only the two elements of pair i, and orow is either xr itself or
   disjoint from it, so there is no dependence between iterations (ivdep lets the loop vectorize). */
#define ROWFN(NAME, T, F, LOAD, STORE, RND, IA, IB)                                        \
static void NAME(const char* xp, char* op, const char* cp, const char* sp,                \
                 i64 h, i64 d, i64 r, float sgn) {                                          \
  const T* xr = (const T*)xp; T* orow = (T*)op; const T* c = (const T*)cp;                  \
  const T* s = (const T*)sp;                                                                \
  _Pragma("GCC ivdep")                                                                      \
  for (i64 i = 0; i < h; ++i) {                                                             \
    F a = LOAD(xr[IA(i)]), b = LOAD(xr[IB(i)]);                                             \
    F cc = LOAD(c[i]), ss = (F)sgn * LOAD(s[i]);                                            \
    orow[IA(i)] = STORE(RND(RND(a * cc) - RND(b * ss)));                                    \
    orow[IB(i)] = STORE(RND(RND(b * cc) + RND(a * ss)));                                    \
  }                                                                                         \
  if (orow != xr) for (i64 i = r; i < d; ++i) orow[i] = xr[i];                              \
}

#define ID(v) (v)
#define HALF_A(i) (i)
#define HALF_B(i) ((i) + h)
#define INTL_A(i) (2 * (i))
#define INTL_B(i) (2 * (i) + 1)
ROWFN(row_f32_half, float, float, ID, ID, ID, HALF_A, HALF_B)
ROWFN(row_f32_intl, float, float, ID, ID, ID, INTL_A, INTL_B)
ROWFN(row_f64_half, double, double, ID, ID, ID, HALF_A, HALF_B)
ROWFN(row_f64_intl, double, double, ID, ID, ID, INTL_A, INTL_B)
ROWFN(row_bf16_half, uint16_t, float, bf2f, f2bf_rounded, rbf, HALF_A, HALF_B)
ROWFN(row_bf16_intl, uint16_t, float, bf2f, f2bf_rounded, rbf, INTL_A, INTL_B)

typedef void (*rowfn)(const char*, char*, const char*, const char*, i64, i64, i64, float);
static rowfn pick(int dtype, int interleaved) {
  static const rowfn table[3][2] = {{row_f32_half, row_f32_intl}, {row_f64_half, row_f64_intl},
                                     {row_bf16_half, row_bf16_intl}};
  return table[dtype][interleaved];
}

/* geo = [d, r, shape[nd], xs[nd], os[nd], cs[nd], ss[nd]]: the row dims (all dims but the last)
   and each tensor's strides over them, in elements (broadcast dims of cos/sin have stride 0).
   Rows are split evenly over threads and walked with an odometer (no division per row).
   dtype: 0 f32, 1 f64, 2 bf16. Returns nonzero for arguments it cannot take. */
int posenc_rope(int dtype, int interleaved, const char* x, char* out, const char* cs, const char* sn,
                const i64* geo, i64 nd, float sgn, int nthreads) {
  static const i64 esize[3] = {4, 8, 2};
  if (nd < 1 || nd > MAXD || dtype < 0 || dtype > 2) return 1;
  rowfn f = pick(dtype, interleaved != 0);
  i64 d = geo[0], r = geo[1], h = r / 2, e = esize[dtype];
  const i64* shape = geo + 2;
  i64 xs[MAXD], os[MAXD], cst[MAXD], sst[MAXD], rows = 1;
  for (i64 k = 0; k < nd; ++k) {
    rows *= shape[k];
    xs[k] = geo[2 + nd + k] * e; os[k] = geo[2 + 2 * nd + k] * e;
    cst[k] = geo[2 + 3 * nd + k] * e; sst[k] = geo[2 + 4 * nd + k] * e;
  }
#ifdef _OPENMP
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
#endif
  {
    int tid = 0, nt = 1;
#ifdef _OPENMP
    tid = omp_get_thread_num(); nt = omp_get_num_threads();
#endif
    i64 chunk = (rows + nt - 1) / nt, lo = tid * chunk, hi = lo + chunk < rows ? lo + chunk : rows;
    if (lo < hi) {
      i64 idx[MAXD], rem = lo, xo = 0, oo = 0, co = 0, so = 0;
      for (i64 k = nd - 1; k >= 0; --k) { idx[k] = rem % shape[k]; rem /= shape[k]; }
      for (i64 k = 0; k < nd; ++k) {
        xo += idx[k] * xs[k]; oo += idx[k] * os[k]; co += idx[k] * cst[k]; so += idx[k] * sst[k];
      }
      for (i64 row = lo; row < hi; ++row) {
        f(x + xo, out + oo, cs + co, sn + so, h, d, r, sgn);
        for (i64 k = nd - 1; k >= 0; --k) {
          xo += xs[k]; oo += os[k]; co += cst[k]; so += sst[k];
          if (++idx[k] < shape[k]) break;
          xo -= xs[k] * shape[k]; oo -= os[k] * shape[k]; co -= cst[k] * shape[k]; so -= sst[k] * shape[k];
          idx[k] = 0;
        }
      }
    }
  }
  return 0;
}

/* All arguments in one int64 array (one ctypes conversion per call instead of ten):
   [dtype, interleaved, x, out, cos, sin, nd, nthreads, sign (+1/-1), geo...] */
int posenc_rope_packed(const i64* a) {
  return posenc_rope((int)a[0], (int)a[1], (const char*)(intptr_t)a[2], (char*)(intptr_t)a[3],
                     (const char*)(intptr_t)a[4], (const char*)(intptr_t)a[5], a + 9, a[6],
                     (float)a[8], (int)a[7]);
}
