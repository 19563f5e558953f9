// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/silu.hpp - Swish / SiLU, y = x * sigmoid(alpha * x), in place over float32 memory:
// Ondine's own kernels for AVX-512 and AVX2 (+FMA), and a scalar one.
//
// Why not oneDNN's eltwise_swish post-op: oneDNN 2.6's swish injector computes exp by its full-range
// polynomial and then divides, costing several times what the convolution itself spends per output element
// of EfficientNet's expansion convs; a separate pass over the convolution's output, still in cache, costs a
// fraction of that (docs/performance.md, "SiLU by Ondine's kernel"; bench/silu_kernels.cpp).
//
// Accuracy: exp(-alpha x) as 2^n * p(f) with a degree-5 minimax polynomial for 2^f on f in [-0.5, 0.5]
// (relative error 1.1e-7), the exponent clamped at +126 (below, scalef underflows to 0 on its own; x *
// sigmoid saturates long before either end); largest relative error 3.7e-6 over [-90, 90], exact signs,
// silu(0) = 0.
//
// Speed (bench/silu_kernels.cpp): x / (1 + e) by one vdivps is faster than rcp14 and a Newton step on AMD
// cores, whose divide unit runs beside the FMA pipes.
// Skylake-SP's zmm divide issues only every 10 cycles, about what the rest of the kernel takes, so the
// exact division is taken where the CPU's vendor is AMD, the reciprocal elsewhere (same accuracy).
//
// The functions are compiled for their ISA with target attributes (the rest of the library keeps the
// host's flags) and chosen when the model is compiled, by oneDNN's effective ISA, so DNNL_MAX_CPU_ISA
// caps them too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ONDINE_SILU_X86 1
#endif

namespace ondine::lower::detail::silu {

enum class Kernel { Scalar, Avx2, Avx512 };

inline const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::Avx512: return "ondine:avx512";
    case Kernel::Avx2: return "ondine:avx2";
    case Kernel::Scalar: break;
  }
  return "ondine:scalar";
}

// The degree-5 minimax polynomial of 2^f on [-0.5, 0.5] (relative error 1.1e-7; coefficients lowest
// degree first after 1).
inline constexpr float kC1 = 0.693147004f, kC2 = 0.240222424f, kC3 = 0.0555073395f, kC4 = 0.00967150927f,
                       kC5 = 0.00132646982f;
inline constexpr float kMinusLog2e = -1.44269504088896341f;

inline void run_scalar(float* p, std::size_t n, float alpha) {
  for (std::size_t i = 0; i < n; ++i) {
    const float x = p[i];
    p[i] = x / (1.0f + std::exp(-alpha * x));
  }
}

#ifdef ONDINE_SILU_X86

// GCC 12 warns that the intrinsics' own _mm512_undefined_ps() may be used uninitialized (GCC bug 105593, a
// false positive inside avx512fintrin.h at -O2 and above); the warning would reach every host that builds us.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// 1 + 2^t for 16 floats: t at most 126 (larger t clamps there; the callers saturate long before), any t below.
__attribute__((target("avx512f"))) inline __m512 one_plus_exp2_16(__m512 t) {
  const __m512 one = _mm512_set1_ps(1.0f);
  t = _mm512_min_ps(t, _mm512_set1_ps(126.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(kC5), f, _mm512_set1_ps(kC4));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(kC3));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(kC2));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(kC1));
  q = _mm512_fmadd_ps(q, f, one);
  return _mm512_add_ps(one, _mm512_scalef_ps(q, n));  // scalef: 2^n without integer tricks, 0 below -149
}

// 1 / d by rcp14 and one Newton step (relative error ~1e-7 where d is finite; d >= 1 here).
__attribute__((target("avx512f"))) inline __m512 reciprocal16(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}

// sigmoid(z) = 1 / (1 + exp(-z)) for 16 floats (saturates to 0 and 1, never NaN for finite z).
__attribute__((target("avx512f"))) inline __m512 sigmoid16(__m512 z) {
  return reciprocal16(one_plus_exp2_16(_mm512_mul_ps(z, _mm512_set1_ps(kMinusLog2e))));
}

// tanh(z) = 2 sigmoid(2z) - 1: absolute error ~3e-7 (relative error grows only where |tanh z| < 1e-3).
__attribute__((target("avx512f"))) inline __m512 tanh16(__m512 z) {
  const __m512 s = sigmoid16(_mm512_add_ps(z, z));
  return _mm512_fmsub_ps(_mm512_set1_ps(2.0f), s, _mm512_set1_ps(1.0f));
}

// x * sigmoid(alpha x) = x / (1 + 2^(k x)) with k = -alpha log2(e); by division or by the reciprocal.
template <bool Divide>
__attribute__((target("avx512f"))) inline __m512 silu16(__m512 x, __m512 k) {
  const __m512 d = one_plus_exp2_16(_mm512_mul_ps(x, k));
  if constexpr (Divide) return _mm512_div_ps(x, d);
  return _mm512_mul_ps(x, reciprocal16(d));
}

template <bool Divide>
__attribute__((target("avx512f"))) inline void run_avx512_as(float* p, std::size_t n, float alpha) {
  const __m512 k = _mm512_set1_ps(alpha * kMinusLog2e);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(p + i, silu16<Divide>(_mm512_loadu_ps(p + i), k));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(p + i, m, silu16<Divide>(_mm512_maskz_loadu_ps(m, p + i), k));
  }
}

// Whether vdivps is the cheaper way to 1 / d here (the header says why AMD's).
inline bool divide_is_fast() {
  static const bool fast = __builtin_cpu_is("amd");
  return fast;
}

inline void run_avx512(float* p, std::size_t n, float alpha) {
  if (divide_is_fast()) return run_avx512_as<true>(p, n, alpha);
  run_avx512_as<false>(p, n, alpha);
}

// 1 + 2^t for 8 floats (t clamped to [-126, 126]; the callers saturate long before either end).
__attribute__((target("avx2,fma"))) inline __m256 one_plus_exp2_8(__m256 t) {
  const __m256 one = _mm256_set1_ps(1.0f);
  t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(126.0f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(kC5), f, _mm256_set1_ps(kC4));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(kC3));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(kC2));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(kC1));
  q = _mm256_fmadd_ps(q, f, one);
  // 2^n for integer n in [-126, 126]: the exponent field set directly.
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_fmadd_ps(q, _mm256_castsi256_ps(bits), one);
}

// x * sigmoid(alpha x) for 8 floats, k = -alpha log2(e): x / (1 + 2^(k x)), by division (AMD: measured on
// Zen 3, 0.32-0.38 ns per element on one thread against 0.43 for rcp_ps and two Newton steps) or by the
// reciprocal (rcp_ps has 12 bits: two steps).
template <bool Divide>
__attribute__((target("avx2,fma"))) inline __m256 silu8(__m256 x, __m256 k) {
  const __m256 d = one_plus_exp2_8(_mm256_mul_ps(x, k));
  if constexpr (Divide) return _mm256_div_ps(x, d);
  __m256 r = _mm256_rcp_ps(d);
  r = _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, _mm256_set1_ps(2.0f)));
  r = _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, _mm256_set1_ps(2.0f)));
  return _mm256_mul_ps(x, r);
}

template <bool Divide>
__attribute__((target("avx2,fma"))) inline void run_avx2_as(float* p, std::size_t n, float alpha) {
  const __m256 k = _mm256_set1_ps(alpha * kMinusLog2e);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {  // two independent vectors per iteration
    const __m256 a = silu8<Divide>(_mm256_loadu_ps(p + i), k), b = silu8<Divide>(_mm256_loadu_ps(p + i + 8), k);
    _mm256_storeu_ps(p + i, a);
    _mm256_storeu_ps(p + i + 8, b);
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, silu8<Divide>(_mm256_loadu_ps(p + i), k));
  if (i < n) run_scalar(p + i, n - i, alpha);
}

inline void run_avx2(float* p, std::size_t n, float alpha) {
  if (divide_is_fast()) return run_avx2_as<true>(p, n, alpha);
  run_avx2_as<false>(p, n, alpha);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // ONDINE_SILU_X86

// The kernel for oneDNN's effective ISA (avx512 / avx2 flags of lower::IsaInfo).
inline Kernel choose(bool avx512, bool avx2) {
#ifdef ONDINE_SILU_X86
  if (avx512) return Kernel::Avx512;
  if (avx2) return Kernel::Avx2;
#else
  (void)avx512;
  (void)avx2;
#endif
  return Kernel::Scalar;
}

// x * sigmoid(alpha x) over p[0, n), with kernel k (which the CPU must support).
inline void run(Kernel k, float* p, std::size_t n, float alpha) {
#ifdef ONDINE_SILU_X86
  if (k == Kernel::Avx512) return run_avx512(p, n, alpha);
  if (k == Kernel::Avx2) return run_avx2(p, n, alpha);
#else
  (void)k;
#endif
  run_scalar(p, n, alpha);
}

}  // namespace ondine::lower::detail::silu
