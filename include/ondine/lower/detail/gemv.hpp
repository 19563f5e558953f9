// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/gemv.hpp - a few rows times a constant matrix, Y += X W, for a decoder's tokens.
//
// Why: a decode step multiplies one row by every weight matrix of the model, so it reads each weight
// once and is bound by memory bandwidth. A plain row-major W streamed row after row, each thread its own
// contiguous band of rows (K split across threads, the partial rows summed after), reads at the bandwidth
// the machine has, from the weights as the model stores them: no second, packed copy of every matrix and
// no primitive made for one row (which costs a repacking of the weights at the first token).
//
// One source for every ISA: the loop body is written once and compiled for AVX-512 and for AVX2 + FMA by
// target attributes; the scalar build is the same loop.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <omp.h>

#include "ondine/lower/isa.hpp"

namespace ondine::lower::detail::gemv {

// Y[m, 0, N) += sum over k in [k0, k1) of X[m, k] * W[k, 0, N) for the M rows of X [M, K]: four rows of W
// at a time, applied to every row of Y before the next four (W is read once, whatever M).
#define ONDINE_GEMV_ROWS_BODY                                                                                    \
  std::int64_t k = k0;                                                                                           \
  for (; k + 4 <= k1; k += 4) {                                                                                  \
    const float* r0 = w + k * N;                                                                                 \
    const float* r1 = r0 + N;                                                                                    \
    const float* r2 = r1 + N;                                                                                    \
    const float* r3 = r2 + N;                                                                                    \
    for (std::int64_t m = 0; m < M; ++m) {                                                                       \
      const float* xm = x + m * K + k;                                                                           \
      const float a0 = xm[0], a1 = xm[1], a2 = xm[2], a3 = xm[3];                                                \
      float* ym = y + m * N;                                                                                     \
      _Pragma("omp simd") for (std::int64_t n = 0; n < N; ++n) ym[n] += a0 * r0[n] + a1 * r1[n] + a2 * r2[n] + a3 * r3[n]; \
    }                                                                                                            \
  }                                                                                                              \
  for (; k < k1; ++k) {                                                                                          \
    const float* r = w + k * N;                                                                                  \
    for (std::int64_t m = 0; m < M; ++m) {                                                                       \
      const float a = x[m * K + k];                                                                              \
      float* ym = y + m * N;                                                                                     \
      _Pragma("omp simd") for (std::int64_t n = 0; n < N; ++n) ym[n] += a * r[n];                                \
    }                                                                                                            \
  }

#define ONDINE_GEMV_ROWS_ARGS                                                                                    \
  const float *x, const float *w, std::int64_t M, std::int64_t K, std::int64_t k0, std::int64_t k1, std::int64_t N, \
      float *y

inline void rows_scalar(ONDINE_GEMV_ROWS_ARGS) { ONDINE_GEMV_ROWS_BODY }
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,fma"))) inline void rows_avx512(ONDINE_GEMV_ROWS_ARGS) { ONDINE_GEMV_ROWS_BODY }
__attribute__((target("avx2,fma"))) inline void rows_avx2(ONDINE_GEMV_ROWS_ARGS) { ONDINE_GEMV_ROWS_BODY }
#endif
#undef ONDINE_GEMV_ROWS_BODY
#undef ONDINE_GEMV_ROWS_ARGS

using RowsFn = void (*)(const float*, const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                        std::int64_t, float*);

// The loop for oneDNN's effective ISA (DNNL_MAX_CPU_ISA caps it too).
inline RowsFn rows_kernel() {
#if defined(__x86_64__) || defined(__i386__)
  const IsaInfo isa = effective_isa();
  if (isa.avx512) return rows_avx512;
  if (isa_runs_on(CpuIsa::Avx2, isa.isa)) return rows_avx2;
#endif
  return rows_scalar;
}

// Y[M, N] += X[M, K] W[K, N] on up to `threads` threads: thread t sums its band of K into its own rows of
// `partials` ([threads - 1, M, N] floats; thread 0 into Y), then the bands are added to Y. Under 16K
// weights one thread does it all (a fork costs more than it saves).
inline void multiply_add(RowsFn rows, const float* x, const float* w, std::int64_t M, std::int64_t K, std::int64_t N,
                         float* y, float* partials, int threads) {
  if (threads <= 1 || K * N < 16384 || K < 8 * threads) {
    rows(x, w, M, K, 0, K, N, y);
    return;
  }
  const std::int64_t size = M * N;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Bands of whole groups of four rows of W.
    const std::int64_t groups = (K + 3) / 4;
    const std::int64_t k0 = std::min(K, groups * t / nt * 4), k1 = std::min(K, groups * (t + 1) / nt * 4);
    float* out = t == 0 ? y : partials + static_cast<std::int64_t>(t - 1) * size;
    if (t != 0) std::fill(out, out + size, 0.0f);
    rows(x, w, M, K, k0, k1, N, out);
#pragma omp barrier
    // The bands summed into Y, its elements split across the threads.
    const std::int64_t e0 = size * t / nt, e1 = size * (t + 1) / nt;
    for (int p = 1; p < nt; ++p) {
      const float* part = partials + static_cast<std::int64_t>(p - 1) * size;
#pragma omp simd
      for (std::int64_t e = e0; e < e1; ++e) y[e] += part[e];
    }
  }
}

}  // namespace ondine::lower::detail::gemv
