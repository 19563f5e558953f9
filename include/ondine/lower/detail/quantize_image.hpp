// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/quantize_image.hpp - a model's 3-channel fp32 image input quantized straight into the
// channels-last int8 layout its int8 convolutions read.
//
// oneDNN's reorder does f32 NCHW -> u8 NHWC with 3 channels at about 2 GB/s here (a generic transposing
// kernel: 0.6 ms, 6% of MobileNetV2's int8 time at batch 8). This step quantizes 16 pixels of each colour
// plane in AVX-512 registers and interleaves them with two-source permutes, so the input is read once at
// streaming speed, and rounds as ONNX's QuantizeLinear (see quantize_one).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "ondine/lower/detail/context.hpp"

namespace ondine::lower::detail {

struct ImageQuantization {
  float inv_scale = 1.0f;
  std::int32_t zero_point = 0;
  std::int32_t lo = 0, hi = 255;  // the int8 type's range: [0, 255] for u8, [-128, 127] for s8
};

// One value, as the vector path computes it: ONNX's saturate(round(x / scale) + zero point), rounding to
// nearest even before the zero point is added (oneDNN's reorder adds it first, which moves ties by one
// step when the zero point is odd). Clamping x / scale to [lo - zp, hi - zp] before rounding is the same
// as saturating after, and takes NaN to `lo`.
inline std::int8_t quantize_one(float x, const ImageQuantization& q) {
  float v = x * q.inv_scale;
  float lo = static_cast<float>(q.lo - q.zero_point), hi = static_cast<float>(q.hi - q.zero_point);
  v = !(v > lo) ? lo : v > hi ? hi : std::nearbyint(v);
  return static_cast<std::int8_t>(static_cast<std::uint8_t>((static_cast<std::int32_t>(v) + q.zero_point) & 0xff));
}

// GCC 12 warns about the intrinsics' own undefined pass-through operands (_mm512_undefined_*, GCC bug
// 105593) where they inline into a target("avx512f") function.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx512f,avx512bw"))) inline __m512i quantize16_avx512(const float* x, __m512 inv, __m512i zp,
                                                                            __m512 lo, __m512 hi) {
  __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), inv);
  v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);         // max returns its second operand for NaN: lo
  return _mm512_add_epi32(_mm512_cvtps_epi32(v), zp);  // nearest even (the default rounding mode)
}

// Rows [row_begin, row_end) of an [N, 3, H, W] image (row r: image r / H, line r % H) into the [N, H, W, 3]
// result `out`.
__attribute__((target("avx512f,avx512bw"))) inline void quantize_rgb_rows_avx512(
    const float* image, std::int8_t* out, std::int64_t row_begin, std::int64_t row_end, std::int64_t H, std::int64_t W,
    const ImageQuantization& q) {
  // Output vector k (16 int32) holds interleaved positions p = 16k + j: pixel p / 3, channel p % 3. The
  // red and green lanes come from one two-source permute, the blue lanes are merged in by a second.
  alignas(64) std::int32_t rg_index[3][16], b_index[3][16];
  __mmask16 b_mask[3] = {0, 0, 0};
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 16; ++j) {
      int p = 16 * k + j, pixel = p / 3, channel = p % 3;
      rg_index[k][j] = channel == 1 ? 16 + pixel : pixel;
      b_index[k][j] = pixel;
      if (channel == 2) b_mask[k] = static_cast<__mmask16>(b_mask[k] | (1u << j));
    }
  __m512i rg_idx[3], b_idx[3];
  for (int k = 0; k < 3; ++k) {
    rg_idx[k] = _mm512_load_si512(rg_index[k]);
    b_idx[k] = _mm512_load_si512(b_index[k]);
  }
  const __m512 inv = _mm512_set1_ps(q.inv_scale);
  const __m512i zp = _mm512_set1_epi32(q.zero_point);
  const __m512 lo = _mm512_set1_ps(static_cast<float>(q.lo - q.zero_point)),
               hi = _mm512_set1_ps(static_cast<float>(q.hi - q.zero_point));
  const std::int64_t plane = H * W;
  for (std::int64_t r = row_begin; r < row_end; ++r) {
    const float* red = image + (r / H) * 3 * plane + (r % H) * W;
    std::int8_t* dst = out + r * W * 3;
    std::int64_t w = 0;
    for (; w + 16 <= W; w += 16) {
      __m512i R = quantize16_avx512(red + w, inv, zp, lo, hi), G = quantize16_avx512(red + plane + w, inv, zp, lo, hi),
              B = quantize16_avx512(red + 2 * plane + w, inv, zp, lo, hi);
      for (int k = 0; k < 3; ++k) {
        __m512i v = _mm512_mask_permutexvar_epi32(_mm512_permutex2var_epi32(R, rg_idx[k], G), b_mask[k], b_idx[k], B);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + w * 3 + 16 * k), _mm512_cvtepi32_epi8(v));
      }
    }
    for (; w < W; ++w)
      for (int c = 0; c < 3; ++c) dst[w * 3 + c] = quantize_one(red[c * plane + w], q);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The step: [N, 3, H, W] f32 (row-major) -> [N, H, W, 3] u8 / s8. Needs AVX-512 (avx512_core).
class QuantizeImageStep : public runtime::Step {
 public:
  QuantizeImageStep(runtime::StepInfo info, SlotId src, SlotId dst, std::int64_t N, std::int64_t H, std::int64_t W,
                    ImageQuantization q)
      : Step(std::move(info), {src}, {dst}), src_(src), dst_(dst), N_(N), H_(H), W_(W), q_(q) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* image = static_cast<const float*>(ctx.ptr(src_));
    auto* out = static_cast<std::int8_t*>(ctx.ptr(dst_));
    const std::int64_t rows = N_ * H_;
    // Rows in blocks of 8 (a block is about 20 KB of input at W = 224), spread over OpenMP's team:
    // the team oneDNN runs on, with the thread count of this run.
    const std::int64_t blocks = (rows + 7) / 8;
#pragma omp parallel for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      std::int64_t begin = b * 8, end = begin + 8 < rows ? begin + 8 : rows;
      quantize_rgb_rows_avx512(image, out, begin, end, H_, W_, q_);
    }
  }

 private:
  SlotId src_, dst_;
  std::int64_t N_, H_, W_;
  ImageQuantization q_;
};

}  // namespace ondine::lower::detail
