// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/simd.hpp - SIMD traits (scalar, AVX2 with FMA, AVX-512) over which Ondine's own kernels
// are written once, as templates, instead of as hand-kept copies per ISA that drift apart.
//
// How a kernel uses them: its body is a template over a traits type T, marked always_inline, that does its
// vector work through T's static functions; per-ISA entry points carrying the same target attribute as T's
// functions instantiate it. Each traits function is compiled for its ISA (the rest of the library keeps the
// host's flags), and after inlining the whole kernel is one function of that ISA. A kernel's own operations
// (PRelu's select, the recurrence's sigmoid) go in a traits type derived from these.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ONDINE_SIMD_X86 1
#endif

namespace ondine::lower::detail::simd {

// The traits pass vectors by value between functions that are all inlined into one ISA's entry point; GCC's
// note that such a signature's ABI depends on -mavx is moot there. GCC 12 also warns that the intrinsics' own
// _mm512_undefined_ps() may be used uninitialized (GCC bug 105593, see silu.hpp). Files that write kernels
// over the traits silence both around them as well.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// One float at a time: the tails of the vector loops, and the kernel where the CPU has neither ISA.
struct Scalar {
  static constexpr std::size_t width = 1;
  using V = float;
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V set1(float s) { return s; }
  static V zero() { return 0.0f; }
  static V fmadd(V a, V b, V c) { return a * b + c; }  // contracted as the compiler's flags say
  static V gather(const float* base, const std::int32_t* idx) { return base[*idx]; }
};

#ifdef ONDINE_SIMD_X86
// 16 floats. `Mask` selects lanes: tail(n) the first n, for loads that read nothing past them (zeros there)
// and stores that write nothing past them.
struct Avx512 {
  static constexpr std::size_t width = 16;
  using V = __m512;
  using Mask = __mmask16;
  __attribute__((target("avx512f"))) static V load(const float* p) { return _mm512_loadu_ps(p); }
  __attribute__((target("avx512f"))) static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  __attribute__((target("avx512f"))) static V set1(float s) { return _mm512_set1_ps(s); }
  __attribute__((target("avx512f"))) static V zero() { return _mm512_setzero_ps(); }
  __attribute__((target("avx512f"))) static V add(V a, V b) { return _mm512_add_ps(a, b); }
  __attribute__((target("avx512f"))) static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  __attribute__((target("avx512f"))) static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  __attribute__((target("avx512f"))) static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // max(a, b) returns b where either is NaN (as std::max(b, a)): the same rule on every ISA.
  __attribute__((target("avx512f"))) static V max(V a, V b) { return _mm512_max_ps(a, b); }
  // base[idx[j]] for each lane j.
  __attribute__((target("avx512f"))) static V gather(const float* base, const std::int32_t* idx) {
    return _mm512_i32gather_ps(_mm512_loadu_si512(idx), base, 4);
  }
  static Mask tail(int n) { return static_cast<Mask>((1u << n) - 1u); }  // n in [0, 16]
  __attribute__((target("avx512f"))) static V maskz_load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  __attribute__((target("avx512f"))) static void mask_store(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
};

// 8 floats; AVX2 here means AVX2 with FMA, as for silu.hpp's kernels. A mask is a vector whose lanes' sign
// bits select, as maskload/maskstore read it.
struct Avx2 {
  static constexpr std::size_t width = 8;
  using V = __m256;
  using Mask = __m256i;
  __attribute__((target("avx2,fma"))) static V load(const float* p) { return _mm256_loadu_ps(p); }
  __attribute__((target("avx2,fma"))) static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  __attribute__((target("avx2,fma"))) static V set1(float s) { return _mm256_set1_ps(s); }
  __attribute__((target("avx2,fma"))) static V zero() { return _mm256_setzero_ps(); }
  __attribute__((target("avx2,fma"))) static V add(V a, V b) { return _mm256_add_ps(a, b); }
  __attribute__((target("avx2,fma"))) static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  __attribute__((target("avx2,fma"))) static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  __attribute__((target("avx2,fma"))) static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  __attribute__((target("avx2,fma"))) static V max(V a, V b) { return _mm256_max_ps(a, b); }
  __attribute__((target("avx2,fma"))) static V gather(const float* base, const std::int32_t* idx) {
    return _mm256_i32gather_ps(base, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)), 4);
  }
  __attribute__((target("avx2,fma"))) static Mask tail(int n) {  // n in [0, 8]
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  __attribute__((target("avx2,fma"))) static V maskz_load(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  __attribute__((target("avx2,fma"))) static void mask_store(float* p, Mask m, V v) { _mm256_maskstore_ps(p, m, v); }
};
#endif  // ONDINE_SIMD_X86

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace ondine::lower::detail::simd
