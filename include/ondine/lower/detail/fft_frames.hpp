// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/fft_frames.hpp - forward real FFTs of many frames at once, one frame per SIMD lane (an
// STFT's frames, n a power of two): the frame's n/2 packed complex points in a structure of arrays (point j of
// every lane together), a radix-2 transform, then the split into the n/2 + 1 bins of the real frame. One source
// over simd.hpp's traits: 16 frames at a time with AVX-512, 8 with AVX2, 1 in scalar code.
//
// Why: KissFFT runs one frame at a time in scalar code, about 6 us per 1024-point frame on Zen 5 (3.0 of the
// bird classifier's 4.8 ms per 5-second window). Across lanes every butterfly is a vector operation on
// contiguous memory, with no shuffles.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/detail/simd.hpp"

namespace ondine::lower::detail::fft_frames {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// The ISA choice is SiLU's: one kernel per oneDNN effective ISA.
using silu::Kernel;

// The twiddles and the load order of frames of n points.
struct Plan {
  std::size_t n = 0, h = 0;                   // points, and complex points h = n / 2 (a power of two)
  std::vector<std::uint32_t> reversed;        // j -> its bit-reversed index in [0, h)
  std::vector<float> twiddle_re, twiddle_im;  // exp(-2 pi i k / h), k < h / 2
  std::vector<float> split_re, split_im;      // exp(-2 pi i k / n), k <= h
};

// Frames of n points this transform takes: a power of two from 4.
inline bool applies(std::int64_t n) { return n >= 4 && n <= (std::int64_t{1} << 24) && (n & (n - 1)) == 0; }

inline Plan make_plan(std::int64_t points) {
  Plan p;
  p.n = static_cast<std::size_t>(points);
  p.h = p.n / 2;
  unsigned bits = 0;
  while ((std::size_t{1} << bits) < p.h) ++bits;
  p.reversed.resize(p.h);
  for (std::size_t j = 0; j < p.h; ++j) {
    std::size_t r = 0;
    for (unsigned b = 0; b < bits; ++b) r |= ((j >> b) & 1u) << (bits - 1 - b);
    p.reversed[j] = static_cast<std::uint32_t>(r);
  }
  const double two_pi = 2.0 * 3.14159265358979323846;
  for (std::size_t k = 0; k < p.h / 2; ++k) {
    const double a = -two_pi * static_cast<double>(k) / static_cast<double>(p.h);
    p.twiddle_re.push_back(static_cast<float>(std::cos(a)));
    p.twiddle_im.push_back(static_cast<float>(std::sin(a)));
  }
  for (std::size_t k = 0; k <= p.h; ++k) {
    const double a = -two_pi * static_cast<double>(k) / static_cast<double>(p.n);
    p.split_re.push_back(k == p.h ? -1.0f : static_cast<float>(std::cos(a)));
    p.split_im.push_back(k == p.h ? 0.0f : static_cast<float>(std::sin(a)));
  }
  return p;
}

// Lanes of kernel k: the frames one call transforms.
inline std::size_t lanes(Kernel k) { return k == Kernel::Avx512 ? 16 : k == Kernel::Avx2 ? 8 : 1; }
// Floats of scratch one call needs.
inline std::size_t scratch_floats(const Plan& p, Kernel k) { return (2 * p.h + 2) * lanes(k); }

// simd.hpp's scalar traits with the arithmetic the AVX ones have.
struct ScalarTraits : simd::Scalar {
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
};

// Frames src[0..count) (count <= T::width), each n points times `window` (null: none), into dst[l][2 k], dst[l][2 k
// + 1] for the bins k < bins (bins <= h + 1). `work`: scratch_floats.
template <typename T>
inline __attribute__((always_inline)) void forward(const Plan& p, const float* const* src, std::size_t count,
                                                   const float* window, float* work, float* const* dst,
                                                   std::size_t bins) {
  using V = typename T::V;
  constexpr std::size_t W = T::width;
  const std::size_t h = p.h;
  float* re = work;
  float* im = work + h * W;
  float* lane_out = work + 2 * h * W;  // 2 W floats: one bin of every lane
  // z[j] = x[2j] + i x[2j+1], windowed, stored at its bit-reversed place; lanes past count hold zeros.
  for (std::size_t j = 0; j < h; ++j) {
    float* r = re + p.reversed[j] * W;
    float* i = im + p.reversed[j] * W;
    const float w0 = window ? window[2 * j] : 1.0f, w1 = window ? window[2 * j + 1] : 1.0f;
    for (std::size_t l = 0; l < count; ++l) {
      r[l] = src[l][2 * j] * w0;
      i[l] = src[l][2 * j + 1] * w1;
    }
    for (std::size_t l = count; l < W; ++l) r[l] = i[l] = 0.0f;
  }
  // Radix-2 stages over blocks of len points: (a, b) -> (a + w b, a - w b).
  for (std::size_t len = 2; len <= h; len <<= 1) {
    const std::size_t half = len / 2, stride = h / len;
    for (std::size_t k = 0; k < half; ++k) {
      const V wr = T::set1(p.twiddle_re[k * stride]), wi = T::set1(p.twiddle_im[k * stride]);
      for (std::size_t start = 0; start < h; start += len) {
        float* ar = re + (start + k) * W;
        float* ai = im + (start + k) * W;
        float* br = re + (start + k + half) * W;
        float* bi = im + (start + k + half) * W;
        const V xr = T::load(br), xi = T::load(bi);
        const V tr = T::sub(T::mul(xr, wr), T::mul(xi, wi));
        const V ti = T::fmadd(xr, wi, T::mul(xi, wr));
        const V yr = T::load(ar), yi = T::load(ai);
        T::store(br, T::sub(yr, tr));
        T::store(bi, T::sub(yi, ti));
        T::store(ar, T::add(yr, tr));
        T::store(ai, T::add(yi, ti));
      }
    }
  }
  // X[k] = E + W^k O with E = (Z[k] + conj Z[h-k]) / 2 and O = (Z[k] - conj Z[h-k]) / 2i (Z periodic in h).
  const V half_v = T::set1(0.5f);
  for (std::size_t k = 0; k < bins; ++k) {
    const std::size_t a = k % h, b = (h - k) % h;
    const V zar = T::load(re + a * W), zai = T::load(im + a * W);
    const V zbr = T::load(re + b * W), zbi = T::load(im + b * W);
    const V er = T::mul(half_v, T::add(zar, zbr)), ei = T::mul(half_v, T::sub(zai, zbi));
    const V orr = T::mul(half_v, T::add(zai, zbi)), oi = T::mul(half_v, T::sub(zbr, zar));
    const V wr = T::set1(p.split_re[k]), wi = T::set1(p.split_im[k]);
    T::store(lane_out, T::add(er, T::sub(T::mul(wr, orr), T::mul(wi, oi))));
    T::store(lane_out + W, T::add(ei, T::fmadd(wr, oi, T::mul(wi, orr))));
    for (std::size_t l = 0; l < count; ++l) {
      dst[l][2 * k] = lane_out[l];
      dst[l][2 * k + 1] = lane_out[W + l];
    }
  }
}

#ifdef ONDINE_SIMD_X86
__attribute__((target("avx512f"))) inline void forward_avx512(const Plan& p, const float* const* src, std::size_t count,
                                                              const float* window, float* work, float* const* dst,
                                                              std::size_t bins) {
  forward<simd::Avx512>(p, src, count, window, work, dst, bins);
}
__attribute__((target("avx2,fma"))) inline void forward_avx2(const Plan& p, const float* const* src, std::size_t count,
                                                             const float* window, float* work, float* const* dst,
                                                             std::size_t bins) {
  forward<simd::Avx2>(p, src, count, window, work, dst, bins);
}
#endif

// Up to lanes(k) frames with kernel k (which the CPU must support).
inline void run(Kernel k, const Plan& p, const float* const* src, std::size_t count, const float* window, float* work,
                float* const* dst, std::size_t bins) {
#ifdef ONDINE_SIMD_X86
  if (k == Kernel::Avx512) return forward_avx512(p, src, count, window, work, dst, bins);
  if (k == Kernel::Avx2) return forward_avx2(p, src, count, window, work, dst, bins);
#endif
  forward<ScalarTraits>(p, src, count, window, work, dst, bins);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace ondine::lower::detail::fft_frames
