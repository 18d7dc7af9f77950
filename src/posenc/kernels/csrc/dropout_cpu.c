#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
typedef int64_t i64;
typedef uint64_t u64;

static inline float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline u64 mix(u64 z) {  /* SplitMix64's output function */
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* out[i] = x[i] * (keep_i ? scale : 0) for i in [lo, hi), lo even; pairs (2j, 2j+1) share one
   64-bit draw. x and out may be the same array (each element is read, then written). */
#define DROPFN(NAME, T, F, LOAD, STORE)                                                     \
static void NAME(const T* x, T* out, i64 lo, i64 hi, uint32_t thr, F scale, u64 seed) {   \
  i64 j0 = lo / 2, j1 = hi / 2;                                                             \
  _Pragma("GCC ivdep")                                                                      \
  for (i64 j = j0; j < j1; ++j) {                                                           \
    u64 r = mix(seed + (u64)(j + 1) * 0x9E3779B97F4A7C15ull);                               \
    F k0 = (uint32_t)r >= thr ? scale : (F)0, k1 = (uint32_t)(r >> 32) >= thr ? scale : (F)0; \
    out[2 * j] = STORE(LOAD(x[2 * j]) * k0);                                                \
    out[2 * j + 1] = STORE(LOAD(x[2 * j + 1]) * k1);                                        \
  }                                                                                         \
  if (hi & 1) {  /* odd end: the first half of the last pair */                             \
    u64 r = mix(seed + (u64)(j1 + 1) * 0x9E3779B97F4A7C15ull);                              \
    out[hi - 1] = STORE(LOAD(x[hi - 1]) * ((uint32_t)r >= thr ? scale : (F)0));              \
  }                                                                                         \
}
#define ID(v) (v)
DROPFN(drop_f32, float, float, ID, ID)
DROPFN(drop_f64, double, double, ID, ID)
DROPFN(drop_bf16, uint16_t, float, bf2f, f2bf)

/* dtype: 0 f32, 1 f64, 2 bf16; scale already rounded to the dtype (as PyTorch's noise tensor is). */
int posenc_dropout(int dtype, const char* x, char* out, i64 n, uint32_t thr, double scale, u64 seed,
                   int nthreads) {
  if (dtype < 0 || dtype > 2) return 1;
#ifdef _OPENMP
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
#endif
  {
    int tid = 0, nt = 1;
#ifdef _OPENMP
    tid = omp_get_thread_num(); nt = omp_get_num_threads();
#endif
    i64 pairs = (n + 1) / 2, chunk = (pairs + nt - 1) / nt;
    i64 lo = 2 * tid * chunk, hi = 2 * (tid + 1) * chunk;
    if (hi > n) hi = n;
    if (lo < hi) {
      if (dtype == 0) drop_f32((const float*)x, (float*)out, lo, hi, thr, (float)scale, seed);
      else if (dtype == 1) drop_f64((const double*)x, (double*)out, lo, hi, thr, scale, seed);
      else drop_bf16((const uint16_t*)x, (uint16_t*)out, lo, hi, thr, (float)scale, seed);
    }
  }
  return 0;
}
