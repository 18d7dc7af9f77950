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
#include "rope_avx512bf16.c"
#elif defined(__AVX2__) && !defined(__AVX512F__)
#include "rope_avx2.c"
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
