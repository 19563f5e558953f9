// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/channel_norm.hpp - ondine.ChannelLayerNorm (ir/fused_ops.hpp) in float32: Ondine's
// kernel, on the layout its producer wrote (plain NCHW, channels-last, or channel-blocked nChw8c / 16c).
//
// pointwise-as-conv makes this op from ConvNeXt's channels-last LayerNorm so that the 1x1 convolutions
// around it keep their channel-blocked activations. oneDNN 2.6 normalises only over a dense last axis,
// which none of these layouts has, so the kernel walks the layout itself: element (n, c, p) of X
// [N, C, P positions] lies at ((n * Cp / B + c / B) * P + p) * B + c % B for a block of B channels (B = 1
// plain, B = C channels-last, B = 8 or 16 blocked; Cp is C rounded up to B, the padded channels read as
// nothing and written as zeros, as oneDNN keeps them).
//   - B a multiple of 8 (blocked, or channels-last with C % 8 == 0): eight positions at a time, their
//     channels 8 at a time in AVX2 vectors: the means, then the centred squares (the values are in L1 by
//     then), then y = (x - mean) * inv_std * scale[c] + bias[c];
//   - B = 1 (plain): 8 positions at a time, one AVX2 vector per channel row;
//   - otherwise, or without AVX2: the same in scalar C++.
// Statistics in float (C values; two passes, no cancellation); positions split over the run's threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/eltwise.hpp"
#include "ondine/lower/detail/silu.hpp"

namespace ondine::lower::detail {

namespace channel_norm {

struct Geometry {
  std::int64_t N = 0, C = 0, P = 0;  // X [N, C, P positions]
  std::int64_t B = 1, Cp = 0;         // channels per block, channels padded to a multiple of B
  float epsilon = 1e-5f;
  std::size_t at(std::int64_t n, std::int64_t c, std::int64_t p) const {
    return static_cast<std::size_t>(((n * (Cp / B) + c / B) * P + p) * B + c % B);
  }
};

// Positions [p0, p1) of image n, any layout; scale and bias hold Cp values (zero past C).
inline void normalize_scalar(const Geometry& g, const float* scale, const float* bias, const float* x, float* y,
                             std::int64_t n, std::int64_t p0, std::int64_t p1) {
  const auto count = static_cast<float>(g.C);
  for (std::int64_t p = p0; p < p1; ++p) {
    float sum = 0;
    for (std::int64_t c = 0; c < g.C; ++c) sum += x[g.at(n, c, p)];
    const float mean = sum / count;
    float squares = 0;
    for (std::int64_t c = 0; c < g.C; ++c) {
      const float d = x[g.at(n, c, p)] - mean;
      squares += d * d;
    }
    const float inv = 1.0f / std::sqrt(squares / count + g.epsilon);
    for (std::int64_t c = 0; c < g.C; ++c) y[g.at(n, c, p)] = (x[g.at(n, c, p)] - mean) * inv * scale[c] + bias[c];
    for (std::int64_t c = g.C; c < g.Cp; ++c) y[g.at(n, c, p)] = 0;
  }
}

#ifdef ONDINE_SILU_X86

// The 8 sums of a0..a7, in that order, as one vector.
__attribute__((target("avx2,fma"))) inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                                                           __m256 a5, __m256 a6, __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// B % 8 == 0: the 8 channels 8j..8j+7 of a position are contiguous. Eight positions at a time, one
// accumulator each (a position alone is one chain of dependent adds, latency-bound); the channels past the
// last full vector (C % 8) in scalar code.
__attribute__((target("avx2,fma"))) inline void normalize_blocked_avx2(const Geometry& g, const float* scale,
                                                                        const float* bias, const float* x, float* y,
                                                                        std::int64_t n, std::int64_t p0,
                                                                        std::int64_t p1) {
  const std::int64_t full = g.C / 8, vectors = g.Cp / 8;
  const auto count = static_cast<float>(g.C);
  const auto B = static_cast<std::size_t>(g.B);
  std::int64_t p = p0;
  for (; p + 8 <= p1; p += 8) {
    __m256 a[8];
    for (__m256& v : a) v = _mm256_setzero_ps();
    for (std::int64_t j = 0; j < full; ++j) {
      const float* q = x + g.at(n, 8 * j, p);
      for (std::size_t k = 0; k < 8; ++k) a[k] = _mm256_add_ps(a[k], _mm256_loadu_ps(q + k * B));
    }
    alignas(32) float mean[8], inv[8];
    _mm256_store_ps(mean, hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
    for (std::size_t k = 0; k < 8; ++k) {
      for (std::int64_t c = full * 8; c < g.C; ++c) mean[k] += x[g.at(n, c, p + static_cast<std::int64_t>(k))];
      mean[k] /= count;
    }
    __m256 m[8];
    for (std::size_t k = 0; k < 8; ++k) {
      m[k] = _mm256_set1_ps(mean[k]);
      a[k] = _mm256_setzero_ps();
    }
    for (std::int64_t j = 0; j < full; ++j) {
      const float* q = x + g.at(n, 8 * j, p);
      for (std::size_t k = 0; k < 8; ++k) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(q + k * B), m[k]);
        a[k] = _mm256_fmadd_ps(d, d, a[k]);
      }
    }
    _mm256_store_ps(inv, hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
    for (std::size_t k = 0; k < 8; ++k) {
      for (std::int64_t c = full * 8; c < g.C; ++c) {
        const float d = x[g.at(n, c, p + static_cast<std::int64_t>(k))] - mean[k];
        inv[k] += d * d;
      }
      inv[k] = 1.0f / std::sqrt(inv[k] / count + g.epsilon);
    }
    for (std::int64_t j = 0; j < full; ++j) {
      const std::size_t o = g.at(n, 8 * j, p);
      const __m256 s = _mm256_loadu_ps(scale + 8 * j), b = _mm256_loadu_ps(bias + 8 * j);
      for (std::size_t k = 0; k < 8; ++k) {
        const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + o + k * B), m[k]), _mm256_set1_ps(inv[k]));
        _mm256_storeu_ps(y + o + k * B, _mm256_fmadd_ps(t, s, b));
      }
    }
    for (std::size_t k = 0; k < 8; ++k)
      for (std::int64_t c = full * 8; c < vectors * 8; ++c) {
        const std::size_t o = g.at(n, c, p + static_cast<std::int64_t>(k));
        y[o] = c < g.C ? (x[o] - mean[k]) * inv[k] * scale[c] + bias[c] : 0.0f;
      }
  }
  if (p < p1) normalize_scalar(g, scale, bias, x, y, n, p, p1);
}

// B == 1 (plain): positions p..p+7 of one channel are contiguous.
__attribute__((target("avx2,fma"))) inline void normalize_plain_avx2(const Geometry& g, const float* scale,
                                                                      const float* bias, const float* x, float* y,
                                                                      std::int64_t n, std::int64_t p0,
                                                                      std::int64_t p1) {
  const __m256 inv_count = _mm256_set1_ps(1.0f / static_cast<float>(g.C)), eps = _mm256_set1_ps(g.epsilon),
               one = _mm256_set1_ps(1.0f);
  const float* xn = x + g.at(n, 0, 0);
  float* yn = y + g.at(n, 0, 0);
  const auto P = static_cast<std::size_t>(g.P);
  std::int64_t p = p0;
  for (; p + 8 <= p1; p += 8) {
    const std::size_t o = static_cast<std::size_t>(p);
    __m256 acc = _mm256_setzero_ps();
    for (std::int64_t c = 0; c < g.C; ++c) acc = _mm256_add_ps(acc, _mm256_loadu_ps(xn + c * P + o));
    const __m256 m = _mm256_mul_ps(acc, inv_count);
    acc = _mm256_setzero_ps();
    for (std::int64_t c = 0; c < g.C; ++c) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(xn + c * P + o), m);
      acc = _mm256_fmadd_ps(d, d, acc);
    }
    const __m256 inv = _mm256_div_ps(one, _mm256_sqrt_ps(_mm256_fmadd_ps(acc, inv_count, eps)));
    for (std::int64_t c = 0; c < g.C; ++c) {
      const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xn + c * P + o), m), inv);
      _mm256_storeu_ps(yn + c * P + o, _mm256_fmadd_ps(t, _mm256_set1_ps(scale[c]), _mm256_set1_ps(bias[c])));
    }
  }
  if (p < p1) normalize_scalar(g, scale, bias, x, y, n, p, p1);
}

#endif  // ONDINE_SILU_X86

inline void normalize(silu::Kernel k, const Geometry& g, const float* scale, const float* bias, const float* x,
                      float* y, std::int64_t n, std::int64_t p0, std::int64_t p1) {
#ifdef ONDINE_SILU_X86
  if (k != silu::Kernel::Scalar) {
    if (g.B % 8 == 0) return normalize_blocked_avx2(g, scale, bias, x, y, n, p0, p1);
    if (g.B == 1) return normalize_plain_avx2(g, scale, bias, x, y, n, p0, p1);
  }
#endif
  (void)k;
  normalize_scalar(g, scale, bias, x, y, n, p0, p1);
}

}  // namespace channel_norm

class ChannelNormStep : public runtime::Step {
 public:
  ChannelNormStep(runtime::StepInfo info, SlotId x, SlotId y, channel_norm::Geometry g, std::vector<float> scale,
                  std::vector<float> bias, silu::Kernel kernel)
      : Step(std::move(info), {x}, {y}), x_(x), y_(y), g_(g), scale_(std::move(scale)), bias_(std::move(bias)),
        kernel_(kernel) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const float*>(ctx.ptr(x_));
    auto* y = static_cast<float*>(ctx.ptr(y_));
    constexpr std::int64_t kChunk = 64;  // positions per task: a multiple of 8
    const std::int64_t chunks = (g_.P + kChunk - 1) / kChunk, tasks = g_.N * chunks;
#pragma omp parallel for schedule(static) if (tasks > 1 && g_.N * g_.Cp * g_.P > (1 << 14))
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t n = t / chunks, p0 = (t % chunks) * kChunk;
      channel_norm::normalize(kernel_, g_, scale_.data(), bias_.data(), x, y, n, p0, std::min(g_.P, p0 + kChunk));
    }
  }

 private:
  SlotId x_, y_;
  channel_norm::Geometry g_;
  std::vector<float> scale_, bias_;
  silu::Kernel kernel_;
};

// ondine.ChannelLayerNorm, float32 (a bf16 producer's output is converted on the way in), constant scale
// and bias, on its input's layout when that is plain, channels-last or channel-blocked (else plain).
inline bool lower_channel_layer_norm(Lowering& L, const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!is_f32(x) || !is_f32(y) || x->is_constant() || y->shape().sizes() != x->shape().sizes()) return false;
  const Dims xd = x->shape().sizes();
  if (xd.size() < 2 || xd.size() > 5) return false;
  channel_norm::Geometry g;
  g.N = xd[0];
  g.C = xd[1];
  g.P = 1;
  for (std::size_t i = 2; i < xd.size(); ++i) g.P *= xd[i];
  if (g.N * g.C * g.P == 0) return false;
  g.epsilon = n.attr_float("epsilon", 1e-5f);
  std::vector<float> params[2];
  for (std::size_t i = 0; i < 2; ++i) {
    const Value* p = n.num_inputs() > i + 1 ? n.input(i + 1) : nullptr;
    if (!p && i == 1) {
      params[i].assign(static_cast<std::size_t>(g.C), 0.0f);
      continue;
    }
    if (!p || !p->is_constant() || p->dtype() != DType::Float32 || p->constant().numel() != g.C) return false;
    params[i].assign(p->constant().data<float>(), p->constant().data<float>() + g.C);
  }

  // The producer's layout when the kernel walks it; a plain copy otherwise.
  const memory::desc given = L.md_of(x);
  memory::format_tag tag = channel_layout_tag(given);
  if (tag == memory::format_tag::undef) tag = channel_layout_tag(plain_md(xd));
  const memory::desc md(given.dims(), memory::data_type::f32, tag);
  const std::string layout = layout_name(md);
  if (md.data.format_desc.blocking.inner_nblks == 1) g.B = md.data.format_desc.blocking.inner_blks[0];
  else if (md.data.format_desc.blocking.strides[1] == 1) g.B = g.C;  // channels-last
  g.Cp = (g.C + g.B - 1) / g.B * g.B;
  for (std::vector<float>& v : params) v.resize(static_cast<std::size_t>(g.Cp), 0.0f);

  const IsaInfo isa = effective_isa();
  const silu::Kernel kernel = silu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa));
  SlotId xs = L.slot_in(x, md);
  SlotId ys = L.new_value_slot(y, md);
  L.define(y, ys, md);
  char eps_text[32];
  std::snprintf(eps_text, sizeof eps_text, "%g", static_cast<double>(g.epsilon));
  const std::string kernel_name = kernel == silu::Kernel::Scalar || (g.B % 8 != 0 && g.B != 1)
                                      ? std::string("ondine:c++")
                                      : std::string("ondine:avx2");
  L.add_step(std::make_unique<ChannelNormStep>(
      runtime::StepInfo{n.name(), n.op_type(), kernel_name,
                        std::to_string(g.C) + " channels, eps " + eps_text + " " + layout + dims_str(xd)},
      xs, ys, g, std::move(params[0]), std::move(params[1]), kernel));
  return true;
}

}  // namespace ondine::lower::detail
