// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/vector_exp.hpp - exp over float32 arrays in place (AVX-512, AVX2 + FMA, scalar), for the
// softmax rows of the shape-free kernels (lower/detail/dynamic_kernels.hpp), whose lengths change at every
// call, so no oneDNN softmax primitive made for one length serves them.
//
// exp(x) = 2^n * 2^f with n = round(x log2 e), f in [-0.5, 0.5], 2^f by the degree-5 minimax polynomial of
// silu.hpp (relative error 1.1e-7); x below -87.3 (where 2^n leaves the normal range) gives 0 exactly, -inf
// gives 0, x above 88.7 gives +inf, NaN stays NaN. Selected once per process by oneDNN's effective ISA
// (DNNL_MAX_CPU_ISA caps it too).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ondine/lower/detail/silu.hpp"

namespace ondine::lower::detail::vexp {

inline void exp_scalar(float* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::exp(p[i]);
}

#if defined(ONDINE_SILU_X86)
// GCC 12's _mm512_roundscale_ps reads an undefined vector it then masks away: not a real use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  using namespace silu;
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kC5), f, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  // scalef computes p * 2^n for any n: underflows to 0 and overflows to inf by itself; NaN passes.
  return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f"))) inline void exp_avx512(float* p, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(p + i, exp16(_mm512_loadu_ps(p + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(p + i, m, exp16(_mm512_maskz_loadu_ps(m, p + i)));
  }
}

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  using namespace silu;
  const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.7f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  // 0 (and -inf -> 0)
  const __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);   // +inf
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 t = _mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f));
  const __m256 nf = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, nf);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kC5), f, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  // 2^n in two halves (n in [-126, 128]: 2^128 is not a float, 2^64 * 2^64 is inf where it must be).
  const __m256i n = _mm256_cvtps_epi32(nf);
  const __m256i half = _mm256_srai_epi32(n, 1);
  const __m256i rest = _mm256_sub_epi32(n, half);
  const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, a), b);
  y = _mm256_andnot_ps(under, y);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
  return _mm256_blendv_ps(y, x, nan);
}

__attribute__((target("avx2,fma"))) inline void exp_avx2(float* p, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, exp8(_mm256_loadu_ps(p + i)));
  if (i < n) {
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t j = i; j < n; ++j) tail[j - i] = p[j];
    _mm256_storeu_ps(tail, exp8(_mm256_loadu_ps(tail)));
    for (std::size_t j = i; j < n; ++j) p[j] = tail[j - i];
  }
}
#pragma GCC diagnostic pop
#endif

using ExpFn = void (*)(float*, std::size_t);

// The kernel for `k` (silu::Kernel names the ISA tiers; the same choice as the SiLU kernels').
inline ExpFn exp_kernel(silu::Kernel k) {
#if defined(ONDINE_SILU_X86)
  if (k == silu::Kernel::Avx512) return exp_avx512;
  if (k == silu::Kernel::Avx2) return exp_avx2;
#endif
  (void)k;
  return exp_scalar;
}

}  // namespace ondine::lower::detail::vexp
