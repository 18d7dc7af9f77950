#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#define STREAMS 1 /* store_row streams whole aligned rows: an sfence ends each thread's rows */
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
typedef int64_t i64;
typedef uint64_t u64;

/* The input layer in one pass over memory per row (float32): x = W[id] * scale + pe[row % period],
   then LayerNorm (when gamma is given) and dropout (when thr > 0), written once into out; the row
   is passed over three times in a scratch buffer that stays in L1.
   The dropout mask is dropout_cpu.c's: element i of the flat [n, d] output belongs to pair i / 2,
   whose 64-bit draw is mix(seed + (i / 2 + 1) * golden); its low half keeps element 2j, its high
   half element 2j + 1 (d is even, so pairs never straddle rows). */
static inline u64 mix(u64 z) {  /* SplitMix64's output function */
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

typedef struct {
  const float *w, *pe, *gamma, *beta;
  const i64* ids;
  float scale, eps, keep;  /* keep: 1 / (1 - p), rounded to float as PyTorch's noise is */
  i64 n, d, period;
  uint32_t thr;  /* dropout threshold: drop where the 32-bit draw < thr; 0 = no dropout */
  u64 seed;
  int stream;  /* the output is larger than the caches: streaming stores (store_row) */
} spec;

/* the dropout factors of one row's pairs into k[0..d-1] (the spec's fields copied to locals: k
   cannot alias them then, and the loop vectorizes) */
static void row_mask(const spec* sp, i64 row, float* restrict k) {
  const u64 seed = sp->seed, golden = 0x9E3779B97F4A7C15ull;
  const uint32_t thr = sp->thr;
  const float keep = sp->keep;
  const i64 j0 = row * sp->d / 2, pairs = sp->d / 2;
  for (i64 j = 0; j < pairs; ++j) {
    u64 r = mix(seed + (u64)(j0 + j + 1) * golden);
    k[2 * j] = (uint32_t)r >= thr ? keep : 0.0f;
    k[2 * j + 1] = (uint32_t)(r >> 32) >= thr ? keep : 0.0f;
  }
}

/* ask for the token row of a later row now: rows are gathered from random places in W, and the
   hardware prefetcher only follows a row once it is being read. PREFETCH rows ahead: 4 measured
   ~10% faster than 2 at d = 768 (eval forward, 2 threads); 8 no better. */
#define PREFETCH 4
static void prefetch_row(const spec* sp, i64 row) {
  const char* wr = (const char*)(sp->w + sp->ids[row] * sp->d);
  for (i64 b = 0; b < sp->d * (i64)sizeof(float); b += 64) __builtin_prefetch(wr + b, 0, 3);
}

/* Row sums: each sum over a row runs in 16 independent float lanes (c = l mod 16; they vectorize,
   and no lane needs reassociation), the lanes added in double at the end, then the last d % 16
   values in double. Every sum below is computed this way, inside the pass that makes its terms. */
#define LANES 16

/* x = W[id] * scale + pe: the LayerNorm's input, rebuilt where needed (never stored); returns the
   sum of x (in lanes) from the same pass */
static double row_input(const spec* sp, i64 row, float* restrict x) {
  const float* restrict wr = sp->w + sp->ids[row] * sp->d;
  const float* restrict pr = sp->pe ? sp->pe + (row % sp->period) * sp->d : NULL;
  const float scale = sp->scale;
  const i64 d = sp->d;
  float acc[LANES] = {0};
  i64 c = 0;
  if (pr)  /* two loops: a select inside one keeps it from vectorizing */
    for (; c + LANES <= d; c += LANES)
      for (int l = 0; l < LANES; ++l) acc[l] += x[c + l] = wr[c + l] * scale + pr[c + l];
  else
    for (; c + LANES <= d; c += LANES)
      for (int l = 0; l < LANES; ++l) acc[l] += x[c + l] = wr[c + l] * scale + 0.0f;
  double total = 0.0;
  for (int l = 0; l < LANES; ++l) total += acc[l];
  for (; c < d; ++c) {
    x[c] = wr[c] * scale + (pr ? pr[c] : 0.0f);
    total += x[c];
  }
  return total;
}

/* mean and 1 / sqrt(var + eps) of one row from the sum of x (made by row_input): the mean first,
   then one pass for the sum of the centred squares (x - m)^2, in lanes */
static void moments(const spec* sp, const float* restrict x, double total, float* mean, float* rstd) {
  const i64 d = sp->d;
  const float m = (float)(total / (double)d);
  float acc[LANES] = {0};
  i64 c = 0;
  for (; c + LANES <= d; c += LANES)
    for (int l = 0; l < LANES; ++l) {
      float t = x[c + l] - m;
      acc[l] += t * t;
    }
  double sq = 0.0;
  for (int l = 0; l < LANES; ++l) sq += acc[l];
  for (; c < d; ++c) {
    float t = x[c] - m;
    sq += (double)t * t;
  }
  *mean = m;
  *rstd = (float)(1.0 / sqrt(sq / (double)d + (double)sp->eps));
}

/* LayerNorm of one row: y = (x - mean) * rstd * gamma + beta (gamma NULL: y = x) */
typedef struct {
  const float *gamma, *beta;
  float mean, rstd;
} norm;

/* o[c] = y[c] (* k[c] when k), y the LayerNorm of x (as norm): the output row, normalized on its
   way out and written once. When the output outgrows the caches (stream), with AVX-512 (AVX) and a
   64-byte (32-byte) aligned row of whole vectors, streaming stores: the line is not read before it
   is written (a third of this kernel's traffic). Copy-only streaming measured 7% faster in eval,
   4% in train forward with AVX-512 ([8, 2048] ids, d = 768, 2 threads); 3-8% in eval with AVX2. A
   small output (a decode step) stays in the cache for the next layer. */
#define STREAM_BYTES (4 << 20)
static void store_row(float* restrict o, const float* restrict x, const float* restrict k, const norm* n, i64 d,
                      int stream) {
  const float *g = n->gamma, *b = n->beta, m = n->mean, r = n->rstd;
#if defined(__AVX512F__)
  if (stream && ((uintptr_t)o & 63) == 0 && d % 16 == 0) {
    const __m512 vm = _mm512_set1_ps(m), vr = _mm512_set1_ps(r);
    for (i64 c = 0; c < d; c += 16) {
      __m512 v = _mm512_loadu_ps(x + c);
      if (g) v = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(v, vm), vr), _mm512_loadu_ps(g + c));
      if (g) v = _mm512_add_ps(v, _mm512_loadu_ps(b + c));
      if (k) v = _mm512_mul_ps(v, _mm512_loadu_ps(k + c));
      _mm512_stream_ps(o + c, v);
    }
    return;
  }
#elif defined(__AVX__)
  if (stream && ((uintptr_t)o & 31) == 0 && d % 8 == 0) {
    const __m256 vm = _mm256_set1_ps(m), vr = _mm256_set1_ps(r);
    for (i64 c = 0; c < d; c += 8) {
      __m256 v = _mm256_loadu_ps(x + c);
      if (g) v = _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(v, vm), vr), _mm256_loadu_ps(g + c));
      if (g) v = _mm256_add_ps(v, _mm256_loadu_ps(b + c));
      if (k) v = _mm256_mul_ps(v, _mm256_loadu_ps(k + c));
      _mm256_stream_ps(o + c, v);
    }
    return;
  }
#endif
  for (i64 c = 0; c < d; ++c) {
    float v = g ? (x[c] - m) * r * g[c] + b[c] : x[c];
    o[c] = k ? v * k[c] : v;
  }
}

/* forward of rows [lo, hi) in three passes over each row (input and its sum, centred squares,
   normalized output); x and k are per-thread scratch rows of d floats */
static void forward_rows(const spec* sp, float* out, float* mean, float* rstd, i64 lo, i64 hi, float* x, float* k) {
  for (i64 row = lo; row < hi; ++row) {
    if (row + PREFETCH < hi) prefetch_row(sp, row + PREFETCH);
    double total = row_input(sp, row, x);
    norm n = {sp->gamma, sp->beta, 0.0f, 1.0f};
    if (sp->gamma) {
      moments(sp, x, total, mean + row, rstd + row);
      n.mean = mean[row], n.rstd = rstd[row];
    }
    if (sp->thr) row_mask(sp, row, k);
    store_row(out + row * sp->d, x, sp->thr ? k : NULL, &n, sp->d, sp->stream);
  }
#ifdef STREAMS
  _mm_sfence();  /* the streaming stores are visible before the thread's work counts as done */
#endif
}

/* One row's LayerNorm backward pieces from its input x and the gradient through dropout o: x becomes
   x-hat, k dy = o * gamma; gamma's and beta's gradients accumulate into gg, gb; returns sum(dy) in
   *sdy and sum(dy * x-hat) in *sdyx (in lanes). */
static void norm_grads(const spec* sp, float* restrict x, const float* restrict o, float* restrict k, double* restrict gg,
                       double* restrict gb, float m, float r, double* sdy, double* sdyx) {
  const i64 d = sp->d;
  const float* restrict gamma = sp->gamma;
  float a1[LANES] = {0}, a2[LANES] = {0};
  i64 c = 0;
  for (; c + LANES <= d; c += LANES)
    for (int l = 0; l < LANES; ++l) {
      float xh = (x[c + l] - m) * r, dy = o[c + l] * gamma[c + l];
      x[c + l] = xh, k[c + l] = dy;
      gg[c + l] += (double)o[c + l] * xh;
      gb[c + l] += o[c + l];
      a1[l] += dy, a2[l] += dy * xh;
    }
  double t1 = 0.0, t2 = 0.0;
  for (int l = 0; l < LANES; ++l) t1 += a1[l], t2 += a2[l];
  for (; c < d; ++c) {
    float xh = (x[c] - m) * r, dy = o[c] * gamma[c];
    x[c] = xh, k[c] = dy;
    gg[c] += (double)o[c] * xh;
    gb[c] += o[c];
    t1 += dy, t2 += (double)dy * xh;
  }
  *sdy = t1, *sdyx = t2;
}

/* backward of rows [lo, hi): dx = d loss / d x (times scale: the gradient of the gathered rows),
   and this thread's partial gradients of gamma and beta (accumulated into gg, gb) */
static void backward_rows(const spec* sp, const float* gout, const float* mean, const float* rstd, float* dx,
                          double* gg, double* gb, i64 lo, i64 hi, float* x, float* k) {
  const i64 d = sp->d;
  const float scale = sp->scale;  /* d x / d W[id] = scale */
  for (i64 row = lo; row < hi; ++row) {
    const float* restrict g = gout + row * d;
    float* restrict out = dx + row * d;
    if (sp->gamma && row + PREFETCH < hi) prefetch_row(sp, row + PREFETCH);  /* read by row_input */
    if (sp->thr) row_mask(sp, row, k);
    if (!sp->gamma) {  /* through dropout, times scale */
      if (sp->thr) for (i64 c = 0; c < d; ++c) out[c] = g[c] * k[c] * scale;
      else for (i64 c = 0; c < d; ++c) out[c] = g[c] * scale;
      continue;
    }
    if (sp->thr) for (i64 c = 0; c < d; ++c) out[c] = g[c] * k[c];  /* through dropout */
    else memcpy(out, g, sizeof(float) * d);
    row_input(sp, row, x);
    const float m = mean[row], r = rstd[row];
    double sdy, sdyx;
    norm_grads(sp, x, out, k, gg, gb, m, r, &sdy, &sdyx);
    const float ma = (float)(sdy / (double)d), mb = (float)(sdyx / (double)d);
    for (i64 c = 0; c < d; ++c) out[c] = r * (k[c] - ma - x[c] * mb) * scale;
  }
}

/* a = [w, ids, pe, gamma, beta, out, mean, rstd, scratch, n, d, period, thr, seed, nthreads] (pointers
   and ints as int64), f = [scale, eps, keep]. scratch: 2 * d floats per thread. */
static void parse(const i64* a, const double* f, spec* sp) {
  sp->w = (const float*)(intptr_t)a[0]; sp->ids = (const i64*)(intptr_t)a[1];
  sp->pe = (const float*)(intptr_t)a[2]; sp->gamma = (const float*)(intptr_t)a[3];
  sp->beta = (const float*)(intptr_t)a[4];
  sp->n = a[9]; sp->d = a[10]; sp->period = a[11] > 0 ? a[11] : 1; sp->thr = (uint32_t)a[12];
  sp->seed = (u64)a[13];
  sp->stream = sp->n * sp->d * (i64)sizeof(float) >= STREAM_BYTES;
  sp->scale = (float)f[0]; sp->eps = (float)f[1]; sp->keep = (float)f[2];
}

/* The rows split evenly over the threads, forward (backward = 0) or backward (1): a as parsed,
   a[5..8] = out (the incoming gradient in backward), mean, rstd, scratch (2 * d floats per thread);
   backward also a[15] = dx, a[16] = gamma/beta partials [nthreads, 2, d] float64 (zeroed and
   summed by the caller). */
static int run(const i64* a, const double* f, int backward) {
  spec sp;
  parse(a, f, &sp);
  float *out = (float*)(intptr_t)a[5], *mean = (float*)(intptr_t)a[6], *rstd = (float*)(intptr_t)a[7];
  float* scratch = (float*)(intptr_t)a[8];
  int nthreads = (int)a[14];
#ifdef _OPENMP
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
#endif
  {
    int tid = 0, nt = 1;
#ifdef _OPENMP
    tid = omp_get_thread_num(); nt = omp_get_num_threads();
#endif
    i64 chunk = (sp.n + nt - 1) / nt, lo = tid * chunk, hi = lo + chunk < sp.n ? lo + chunk : sp.n;
    float* x = scratch + 2 * tid * sp.d;
    if (lo < hi && !backward) forward_rows(&sp, out, mean, rstd, lo, hi, x, x + sp.d);
    if (lo < hi && backward) {
      double* gg = (double*)(intptr_t)a[16] + 2 * tid * sp.d;
      backward_rows(&sp, out, mean, rstd, (float*)(intptr_t)a[15], gg, gg + sp.d, lo, hi, x, x + sp.d);
    }
  }
  return 0;
}

int posenc_embed_forward(const i64* a, const double* f) { return run(a, f, 0); }

int posenc_embed_backward(const i64* a, const double* f) { return run(a, f, 1); }
