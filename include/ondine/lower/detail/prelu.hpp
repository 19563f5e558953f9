// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/prelu.hpp - PRelu with one slope per channel, y = x > 0 ? x : slope[c] * x, over float32
// memory in the layout its producer wrote: row-major, channels-last or channel-blocked (8 or 16). One kernel
// source over simd.hpp's traits (AVX-512, AVX2, scalar), chosen by oneDNN's effective ISA when the model is
// compiled.
//
// Why Ondine's own: oneDNN 2.6 has no jit convolution with a prelu post-op (every layout gives "ref:any") and
// only its reference prelu primitive for channel-blocked data, so a conv's PRelu cost two reorders and a pass
// of its own. Run in place on the conv's output while it is still in cache, it is one cheap pass
// (docs/performance.md, "PRelu").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/detail/simd.hpp"

namespace ondine::lower::detail::prelu {

// The kernel is written once over simd.hpp's traits; GCC's notes on their by-value vectors are moot here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// The ISA choice is SiLU's (as the sampling kernels'): one kernel per oneDNN effective ISA.
using silu::Kernel;
using silu::kernel_name;
using silu::choose;

// A dense float32 tensor seen as [outer][groups][repeats][block] where element (o, g, r, j) belongs to channel
// g * block + j: row-major NC(spatial) is block 1 (a run of `repeats` = spatial size per channel),
// channels-last N(spatial)C is groups 1 and repeats 1 with block C, channel-blocked NC/b(spatial)b is block b.
// The slopes are padded with zeros to groups * block (a blocked layout's padding channels hold zeros).
struct Shape {
  std::size_t outer = 1, groups = 1, repeats = 1, block = 1;
  std::size_t count() const { return outer * groups * repeats * block; }
};

// simd.hpp's traits with PRelu's select: apply(x, s) = x < 0 ? x * s : x.
struct ScalarTraits : simd::Scalar {
  static V apply(V x, V s) { return x < 0.0f ? x * s : x; }
};

#ifdef ONDINE_SIMD_X86
struct Avx512Traits : simd::Avx512 {
  __attribute__((target("avx512f"))) static V apply(V x, V s) {
    return _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), x, s);
  }
};

struct Avx2Traits : simd::Avx2 {
  __attribute__((target("avx2,fma"))) static V apply(V x, V s) {
    return _mm256_blendv_ps(x, _mm256_mul_ps(x, s), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
  }
};
#endif

// Rows [first, last) of the [outer * groups] rows of `shape`, from src to dst (which may be the same memory).
template <typename T>
inline __attribute__((always_inline)) void run_rows(const float* src, float* dst, const float* slopes,
                                                    const Shape& shape, std::size_t first, std::size_t last) {
  const std::size_t row = shape.repeats * shape.block;
  for (std::size_t r = first; r < last; ++r) {
    const float* s = slopes + (r % shape.groups) * shape.block;
    const float* x = src + r * row;
    float* y = dst + r * row;
    if (shape.block == 1) {  // one slope over the row
      const typename T::V sv = T::set1(s[0]);
      std::size_t i = 0;
      for (; i + T::width <= row; i += T::width) T::store(y + i, T::apply(T::load(x + i), sv));
      for (; i < row; ++i) y[i] = ScalarTraits::apply(x[i], s[0]);
    } else {  // a slope vector per block (they stay in L1)
      for (std::size_t k = 0; k < row; k += shape.block) {
        std::size_t j = 0;
        for (; j + T::width <= shape.block; j += T::width)
          T::store(y + k + j, T::apply(T::load(x + k + j), T::load(s + j)));
        for (; j < shape.block; ++j) y[k + j] = ScalarTraits::apply(x[k + j], s[j]);
      }
    }
  }
}

#ifdef ONDINE_SIMD_X86
__attribute__((target("avx512f"))) inline void run_avx512(const float* src, float* dst, const float* slopes,
                                                          const Shape& shape, std::size_t first, std::size_t last) {
  run_rows<Avx512Traits>(src, dst, slopes, shape, first, last);
}
__attribute__((target("avx2,fma"))) inline void run_avx2(const float* src, float* dst, const float* slopes,
                                                         const Shape& shape, std::size_t first, std::size_t last) {
  run_rows<Avx2Traits>(src, dst, slopes, shape, first, last);
}
#endif

// Rows [first, last) with kernel k (which the CPU must support).
inline void run(Kernel k, const float* src, float* dst, const float* slopes, const Shape& shape, std::size_t first,
                std::size_t last) {
#ifdef ONDINE_SIMD_X86
  if (k == Kernel::Avx512) return run_avx512(src, dst, slopes, shape, first, last);
  if (k == Kernel::Avx2) return run_avx2(src, dst, slopes, shape, first, last);
#else
  (void)k;
#endif
  run_rows<ScalarTraits>(src, dst, slopes, shape, first, last);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace ondine::lower::detail::prelu
