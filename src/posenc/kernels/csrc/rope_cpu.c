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

/* A run of n rows along one row dim (byte strides xs, os, cs, ss): rotate r dims of each row xr
   (pairs (i, i+r/2) or (2i, 2i+1)) into orow, copy dims r..d if out != x. Iteration i reads and
   writes only the two elements of pair i, and orow is either xr itself or disjoint from it, so
   there is no dependence between iterations (ivdep lets the loop vectorize); the tables are never
   written (restrict: no aliasing checks per row). One call per run, not per row. */
#define ROWFN(NAME, T, F, LOAD, STORE, RND, IA, IB)                                        \
static void NAME(const char* xp, char* op, const char* cp, const char* sp, i64 n, i64 xs,  \
                 i64 os, i64 cs, i64 ss, i64 h, i64 d, i64 r, float sgn) {                  \
  for (i64 row = 0; row < n; ++row, xp += xs, op += os, cp += cs, sp += ss) {              \
    const T* xr = (const T*)xp; T* orow = (T*)op;                                           \
    const T* restrict c = (const T*)cp; const T* restrict s = (const T*)sp;                 \
    _Pragma("GCC ivdep")                                                                    \
    for (i64 i = 0; i < h; ++i) {                                                           \
      F a = LOAD(xr[IA(i)]), b = LOAD(xr[IB(i)]);                                           \
      F cc = LOAD(c[i]), ss_ = (F)sgn * LOAD(s[i]);                                         \
      orow[IA(i)] = STORE(RND(RND(a * cc) - RND(b * ss_)));                                 \
      orow[IB(i)] = STORE(RND(RND(b * cc) + RND(a * ss_)));                                 \
    }                                                                                       \
    if (orow != xr) for (i64 i = r; i < d; ++i) orow[i] = xr[i];                            \
  }                                                                                         \
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

typedef void (*rowfn)(const char*, char*, const char*, const char*, i64, i64, i64, i64, i64, i64, i64, i64,
                      float);
static rowfn pick(int dtype, int interleaved) {
  static const rowfn table[3][2] = {{row_f32_half, row_f32_intl}, {row_f64_half, row_f64_intl},
                                     {row_bf16_half, row_bf16_intl}};
  return table[dtype][interleaved];
}

/* One rotation: the rows of x (all dims but the last), each tensor's byte strides over them
   (broadcast dims of cos/sin have stride 0), and the row function. */
typedef struct {
  rowfn f; const char *x, *cs, *sn; char* out;
  i64 nd, d, r, rows, shape[MAXD], xs[MAXD], os[MAXD], cst[MAXD], sst[MAXD];
  float sgn; int nthreads;
} job;

/* a = [dtype, interleaved, x, out, cos, sin, nd, nthreads, sign (+1/-1), d, r, shape[nd], xs[nd],
   os[nd], cs[nd], ss[nd]] (strides in elements). dtype: 0 f32, 1 f64, 2 bf16. Nonzero: rejected. */
static int parse(const i64* a, job* j) {
  static const i64 esize[3] = {4, 8, 2};
  int dtype = (int)a[0];
  i64 nd = a[6];
  if (nd < 1 || nd > MAXD || dtype < 0 || dtype > 2) return 1;
  i64 e = esize[dtype];
  const i64* geo = a + 9;
  j->f = pick(dtype, a[1] != 0);
  j->x = (const char*)(intptr_t)a[2]; j->out = (char*)(intptr_t)a[3];
  j->cs = (const char*)(intptr_t)a[4]; j->sn = (const char*)(intptr_t)a[5];
  j->nd = nd; j->nthreads = (int)a[7]; j->sgn = (float)a[8];
  j->d = geo[0]; j->r = geo[1]; j->rows = 1;
  for (i64 k = 0; k < nd; ++k) {
    j->shape[k] = geo[2 + k]; j->rows *= j->shape[k];
    j->xs[k] = geo[2 + nd + k] * e; j->os[k] = geo[2 + 2 * nd + k] * e;
    j->cst[k] = geo[2 + 3 * nd + k] * e; j->sst[k] = geo[2 + 4 * nd + k] * e;
  }
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
         h, j->d, j->r, j->sgn);
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
      i64 rows = j->rows, chunk = (rows + nt - 1) / nt, lo = tid * chunk;
      run_rows(j, lo, lo + chunk < rows ? lo + chunk : rows);
    }
  }
  return 0;
}

/* All arguments of one rotation in one int64 array (see parse): one ctypes conversion per call. */
int posenc_rope_packed(const i64* a) { const i64* args[1] = {a}; return run_jobs(args, 1); }

/* Two rotations (queries and keys) in one call. */
int posenc_rope_packed2(const i64* a, const i64* b) { const i64* args[2] = {a, b}; return run_jobs(args, 2); }
