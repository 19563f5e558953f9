// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/sampling.hpp - GridSample and RoiAlign compiled: Ondine's own float32 kernels.
//
// Contract: they compute what the reference kernels (reference/sampling.hpp, in double: the oracle)
// compute, from the same coordinate rules (the reference's grid_coordinate, padded_index, reflect and
// cubic_weights, in double), with the sums in float32. The lowerings decline (the node runs its reference
// kernel) for inputs that are not float32, a GridSample that is not 4-D (opset 20's 3-D and 5-D), and an
// image past 2^31 pixels (the gathers take 32-bit offsets).
//
// GridSample: what costs is the sum over 1, 4 or 16 taps per output point, and it is the same for every
// channel. So each output row (one batch item, one output row: OpenMP splits N * H_out of them) first turns
// its W_out grid points into taps, an offset into the image and a weight each (0 for a tap that padding
// zeros reads outside the image; NaN for a NaN grid value, as the reference's sum gives);
// then every channel's row is sum_k w[k][j] * img[off[k][j]], 16 (AVX-512) or 8 (AVX2) points at a time
// with gathers, chosen by oneDNN's effective ISA as silu.hpp does.
//
// RoiAlign: a bin's samples lie on a grid whose rows and columns are separate (y depends on the bin row and
// sample row, x on the bin column and sample column, and a sample counts only when both lie within a pixel
// of the image), so each ROI's row taps and column taps (two indices and two weights each) are computed
// once and shared by all its channels. The taps are the same for every channel, so the kernel that counts
// runs across channels: with X in a layout whose channels lie side by side (a convolution's blocked
// aBcd16b / aBcd8b or channels-last output, read as it is; the layout pass leaves RoiAlign's input in
// it), one vector load takes 16 (AVX-512) or 8 (AVX2) channels of a pixel, and a sample costs four loads
// and six vector operations for all of them; OpenMP splits the ROI x channel-block tasks. A row-major X
// is reordered to blocked first when the ROIs' samples outnumber its pixels (the reorder then costs less
// than it saves); otherwise, and without AVX2, the plane kernels run per ROI x channel plane, each sample
// row blending its two image rows once (roi_plane_avg). The ROIs are checked first (batch index in range,
// an adaptive grid at most 65536 a side), outside the parallel loop, so a bad one is an ondine::Error
// naming the node, as on the reference executor.
//
// Each kernel is one source, a template over simd.hpp's traits, instantiated for AVX-512 and AVX2 (and the
// GridSample sum for scalar code), so the ISA variants compute the same sums in the same order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ondine/ir/infer/sampling.hpp"
#include "ondine/lower/detail/context.hpp"
#include "ondine/lower/detail/silu.hpp"
#include "ondine/lower/detail/simd.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/reference/sampling.hpp"

namespace ondine::lower::detail {

namespace sampling {

namespace ref = ::ondine::reference::detail::sampling;
namespace spec = ::ondine::infer::detail_sampling;
using silu::Kernel;

// The kernels below are written once over simd.hpp's traits; GCC's notes on their by-value vectors, and its
// false positive on the intrinsics' own _mm512_undefined_ps() (GCC bug 105593, as in silu.hpp), are moot here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// dst[j] = sum_k w[k * n + j] * img[off[k * n + j]] for j in [begin, n): the taps of n points, k-major;
// T::width points at a time, the last ones (fewer than a vector) one by one.
template <typename T>
inline __attribute__((always_inline)) void gather_sum_from(const float* img, const std::int32_t* off, const float* w,
                                                           int taps, std::int64_t n, std::int64_t begin, float* dst) {
  constexpr auto width = static_cast<std::int64_t>(T::width);
  std::int64_t j = begin;
  for (; j + width <= n; j += width) {
    typename T::V acc = T::zero();
    for (int k = 0; k < taps; ++k) acc = T::fmadd(T::load(w + k * n + j), T::gather(img, off + k * n + j), acc);
    T::store(dst + j, acc);
  }
  if constexpr (width > 1) gather_sum_from<simd::Scalar>(img, off, w, taps, n, j, dst);
}

#ifdef ONDINE_SIMD_X86
__attribute__((target("avx512f"))) inline void gather_sum_avx512(const float* img, const std::int32_t* off,
                                                                 const float* w, int taps, std::int64_t n, float* dst) {
  gather_sum_from<simd::Avx512>(img, off, w, taps, n, 0, dst);
}

__attribute__((target("avx2,fma"))) inline void gather_sum_avx2(const float* img, const std::int32_t* off,
                                                                const float* w, int taps, std::int64_t n, float* dst) {
  gather_sum_from<simd::Avx2>(img, off, w, taps, n, 0, dst);
}
#endif  // ONDINE_SIMD_X86

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

inline void gather_sum(Kernel kernel, const float* img, const std::int32_t* off, const float* w, int taps,
                       std::int64_t n, float* dst) {
#ifdef ONDINE_SIMD_X86
  if (kernel == Kernel::Avx512) return gather_sum_avx512(img, off, w, taps, n, dst);
  if (kernel == Kernel::Avx2) return gather_sum_avx2(img, off, w, taps, n, dst);
#else
  (void)kernel;
#endif
  gather_sum_from<simd::Scalar>(img, off, w, taps, n, 0, dst);
}

// The taps along one axis of a coordinate c (already rounded, clamped or reflected by grid_coordinate):
// up to 4 indices (-1: a zero of padding zeros) and their weights.
struct AxisTaps {
  std::int64_t index[4];
  double weight[4];
};

inline AxisTaps axis_taps(const spec::GridSampleSpec& s, double c, std::int64_t dim, double lo, double hi, int taps) {
  AxisTaps t{};
  // Far outside, every tap is outside too (only padding zeros leaves c there): clamping keeps the
  // conversion to an integer defined and changes no result.
  c = std::clamp(c, -8.0, static_cast<double>(dim) + 8.0);
  if (taps == 1) {
    t.index[0] = ref::padded_index(s.padding, static_cast<std::int64_t>(c), dim, lo, hi);
    t.weight[0] = 1.0;
    return t;
  }
  const double f = std::floor(c), frac = c - f;
  const std::int64_t base = static_cast<std::int64_t>(f) - (taps == 4 ? 1 : 0);
  if (taps == 2) {
    t.weight[0] = 1 - frac;
    t.weight[1] = frac;
  } else {
    const std::array<double, 4> w = ref::cubic_weights(frac);
    for (int k = 0; k < 4; ++k) t.weight[k] = w[static_cast<std::size_t>(k)];
  }
  for (int k = 0; k < taps; ++k) t.index[k] = ref::padded_index(s.padding, base + k, dim, lo, hi);
  return t;
}

struct GridGeometry {
  spec::GridSampleSpec s;
  std::int64_t N = 0, C = 0, H = 0, W = 0, Ho = 0, Wo = 0;
  int taps = 1;  // per axis: 1 nearest, 2 linear, 4 cubic
};

// The taps of output row (b, ho): off/w hold taps^2 x Wo entries, tap-major.
inline void grid_row_taps(const GridGeometry& g, const float* grid, std::int64_t b, std::int64_t ho, std::int32_t* off,
                          float* w) {
  const double lo_x = g.s.align_corners ? 0.0 : -0.5, lo_y = lo_x;
  const double hi_x = g.s.align_corners ? static_cast<double>(g.W - 1) : static_cast<double>(g.W) - 0.5;
  const double hi_y = g.s.align_corners ? static_cast<double>(g.H - 1) : static_cast<double>(g.H) - 0.5;
  const int t = g.taps;
  for (std::int64_t j = 0; j < g.Wo; ++j) {
    const float* p = grid + ((b * g.Ho + ho) * g.Wo + j) * 2;  // (x, y): innermost axis first
    // A grid value past 2^40 is far outside any image; bounding it keeps reflect's integer count of
    // periods defined (the reference converts it unbounded) and changes no other result.
    auto bounded = [](float v) { return std::clamp(static_cast<double>(v), -0x1p40, 0x1p40); };
    const double cx = ref::grid_coordinate(g.s, bounded(p[0]), g.W, lo_x, hi_x);
    const double cy = ref::grid_coordinate(g.s, bounded(p[1]), g.H, lo_y, hi_y);
    if (std::isnan(cx) || std::isnan(cy)) {  // a NaN grid value: the sum is NaN, as the reference's
      for (int k = 0; k < t * t; ++k) {
        off[k * g.Wo + j] = 0;
        w[k * g.Wo + j] = std::numeric_limits<float>::quiet_NaN();
      }
      continue;
    }
    const AxisTaps ty = axis_taps(g.s, cy, g.H, lo_y, hi_y, t), tx = axis_taps(g.s, cx, g.W, lo_x, hi_x, t);
    for (int a = 0; a < t; ++a)
      for (int c = 0; c < t; ++c) {
        const int k = a * t + c;
        const bool zero = ty.index[a] < 0 || tx.index[c] < 0;
        off[k * g.Wo + j] = zero ? 0 : static_cast<std::int32_t>(ty.index[a] * g.W + tx.index[c]);
        w[k * g.Wo + j] = zero ? 0.0f : static_cast<float>(ty.weight[a] * tx.weight[c]);
      }
  }
}

// --- RoiAlign ---------------------------------------------------------------------------------------

// One sample row (or column) of a bin: two pixel indices and their weights; `valid` false for a sample
// more than a pixel outside the image (it adds 0).
struct SampleTap {
  std::int32_t lo = 0, hi = 0;
  float w_lo = 0.0f, w_hi = 0.0f;
  bool valid = false;
};

// The reference's bilinear taps of coordinate v along an axis of `size` pixels.
inline SampleTap sample_tap(double v, std::int64_t size) {
  SampleTap t;
  if (size <= 0 || v < -1.0 || v > static_cast<double>(size)) return t;  // an empty axis has no pixel
  t.valid = true;
  if (!std::isfinite(v)) {  // NaN: the sample is NaN, as the reference's sum
    t.w_lo = t.w_hi = std::numeric_limits<float>::quiet_NaN();
    return t;
  }
  v = std::max(v, 0.0);
  auto lo = static_cast<std::int64_t>(v), hi = lo + 1;
  if (lo >= size - 1) hi = lo = size - 1, v = static_cast<double>(lo);
  const double l = v - static_cast<double>(lo);
  t.lo = static_cast<std::int32_t>(lo);
  t.hi = static_cast<std::int32_t>(hi);
  t.w_lo = static_cast<float>(1 - l);
  t.w_hi = static_cast<float>(l);
  return t;
}

struct Roi {
  std::int64_t batch = 0, gh = 0, gw = 0;
  double x0 = 0, y0 = 0, bh = 0, bw = 0;
};

struct RoiGeometry {
  spec::RoiAlignSpec s;
  std::int64_t N = 0, C = 0, H = 0, W = 0, R = 0;
};

// ROI r's box and sampling grid, checked as the reference kernel checks them.
inline Roi roi_of(const Node& n, const RoiGeometry& g, const float* rois, const std::int64_t* batch, std::int64_t r) {
  Roi roi;
  roi.batch = batch[r];
  if (roi.batch < 0 || roi.batch >= g.N)
    throw n.error("batch_indices[" + std::to_string(r) + "] = " + std::to_string(roi.batch) + " is outside [0, " +
                  std::to_string(g.N) + ")");
  const float* box = rois + r * 4;  // x1, y1, x2, y2
  const double offset = g.s.half_pixel ? 0.5 : 0.0, scale = g.s.spatial_scale;
  roi.x0 = box[0] * scale - offset;
  roi.y0 = box[1] * scale - offset;
  double rw = box[2] * scale - offset - roi.x0, rh = box[3] * scale - offset - roi.y0;
  if (!g.s.half_pixel) {
    rw = std::max(rw, 1.0);
    rh = std::max(rh, 1.0);
  }
  roi.bh = rh / static_cast<double>(g.s.output_height);
  roi.bw = rw / static_cast<double>(g.s.output_width);
  // As the reference: an adaptive grid past 65536 samples a side (or not finite) is refused.
  auto grid = [&](double extent, std::int64_t bins, const char* side) -> std::int64_t {
    if (g.s.sampling_ratio > 0) return g.s.sampling_ratio;
    const double v = std::ceil(extent / static_cast<double>(bins));
    if (!(v <= 65536.0))
      throw n.error("roi " + std::to_string(r) + " needs a sampling grid of " + std::to_string(v) + " " + side +
                    " per bin (sampling_ratio 0): not finite or past 65536");
    return v > 0 ? static_cast<std::int64_t>(v) : 0;
  };
  roi.gh = grid(rh, g.s.output_height, "rows");
  roi.gw = grid(rw, g.s.output_width, "columns");
  if (g.s.sampling_ratio <= 0 && roi.gh * roi.gw > (std::int64_t{1} << 18))  // as the reference, too
    throw n.error("roi " + std::to_string(r) + " needs a sampling grid of " + std::to_string(roi.gh) + " x " +
                  std::to_string(roi.gw) + " per bin (sampling_ratio 0): past 2^18 samples");
  return roi;
}

// The taps of every bin row's sample rows (PH x gh) and bin column's sample columns (PW x gw).
inline void roi_taps(const RoiGeometry& g, const Roi& roi, std::vector<SampleTap>& ys, std::vector<SampleTap>& xs) {
  const std::int64_t PH = g.s.output_height, PW = g.s.output_width;
  ys.resize(static_cast<std::size_t>(PH * roi.gh));
  xs.resize(static_cast<std::size_t>(PW * roi.gw));
  for (std::int64_t ph = 0; ph < PH; ++ph)
    for (std::int64_t iy = 0; iy < roi.gh; ++iy)
      ys[static_cast<std::size_t>(ph * roi.gh + iy)] =
          sample_tap(roi.y0 + static_cast<double>(ph) * roi.bh +
                         (static_cast<double>(iy) + 0.5) * roi.bh / static_cast<double>(roi.gh),
                     g.H);
  for (std::int64_t pw = 0; pw < PW; ++pw)
    for (std::int64_t ix = 0; ix < roi.gw; ++ix)
      xs[static_cast<std::size_t>(pw * roi.gw + ix)] =
          sample_tap(roi.x0 + static_cast<double>(pw) * roi.bw +
                         (static_cast<double>(ix) + 0.5) * roi.bw / static_cast<double>(roi.gw),
                     g.W);
}

// The range of columns the ROI's column taps read: [first, last].
inline std::pair<std::int32_t, std::int32_t> column_range(const std::vector<SampleTap>& xs) {
  std::int32_t first = std::numeric_limits<std::int32_t>::max(), last = -1;
  for (const SampleTap& x : xs)
    if (x.valid) {
      first = std::min(first, x.lo);
      last = std::max(last, x.hi);
    }
  return {first, last};
}

// One channel plane of one ROI, mode avg: out[ph][pw] from image `img` (H x W). A sample's value is
// wx_lo * (wy_lo img[ylo][xlo] + wy_hi img[yhi][xlo]) + wx_hi * (... [xhi]): each sample row blends its two
// image rows once over the columns the ROI reads (a contiguous loop the compiler vectorises), and each sample
// then costs two products instead of four. `blend` holds W floats, `acc` PW.
inline void roi_plane_avg(const RoiGeometry& g, const Roi& roi, const std::vector<SampleTap>& ys,
                          const std::vector<SampleTap>& xs, const float* img, float* out, float* blend, float* acc) {
  const std::int64_t PH = g.s.output_height, PW = g.s.output_width, W = g.W;
  const float count = static_cast<float>(std::max<std::int64_t>(roi.gh * roi.gw, 1));
  const auto [first, last] = column_range(xs);
  for (std::int64_t ph = 0; ph < PH; ++ph) {
    std::fill(acc, acc + PW, 0.0f);
    for (std::int64_t iy = 0; iy < roi.gh; ++iy) {
      const SampleTap& y = ys[static_cast<std::size_t>(ph * roi.gh + iy)];
      if (!y.valid) continue;  // every sample of this row adds 0
      const float *row_lo = img + y.lo * W, *row_hi = img + y.hi * W;
      const float w_lo = y.w_lo, w_hi = y.w_hi;
#pragma omp simd
      for (std::int32_t c = first; c <= last; ++c) blend[c] = w_lo * row_lo[c] + w_hi * row_hi[c];
      for (std::int64_t pw = 0; pw < PW; ++pw) {
        const SampleTap* xrow = xs.data() + pw * roi.gw;
        float sum = 0.0f;
        for (std::int64_t ix = 0; ix < roi.gw; ++ix)
          if (xrow[ix].valid) sum += xrow[ix].w_lo * blend[xrow[ix].lo] + xrow[ix].w_hi * blend[xrow[ix].hi];
        acc[pw] += sum;
      }
    }
    for (std::int64_t pw = 0; pw < PW; ++pw) out[ph * PW + pw] = acc[pw] / count;
  }
}

// One channel plane of one ROI, mode max: each sample is its largest weighted corner (the reference's
// rule), so the corners stay separate.
inline void roi_plane_max(const RoiGeometry& g, const Roi& roi, const std::vector<SampleTap>& ys,
                          const std::vector<SampleTap>& xs, const float* img, float* out) {
  const std::int64_t PH = g.s.output_height, PW = g.s.output_width, W = g.W;
  for (std::int64_t ph = 0; ph < PH; ++ph)
    for (std::int64_t pw = 0; pw < PW; ++pw) {
      float acc = 0.0f;
      bool any = false;
      for (std::int64_t iy = 0; iy < roi.gh; ++iy) {
        const SampleTap& y = ys[static_cast<std::size_t>(ph * roi.gh + iy)];
        const float *row_lo = img + y.lo * W, *row_hi = img + y.hi * W;
        const SampleTap* xrow = xs.data() + pw * roi.gw;
        for (std::int64_t ix = 0; ix < roi.gw; ++ix) {
          const SampleTap& x = xrow[ix];
          float m = 0.0f;  // a sample outside the image is 0
          if (y.valid && x.valid)
            m = std::max(std::max(y.w_lo * x.w_lo * row_lo[x.lo], y.w_lo * x.w_hi * row_lo[x.hi]),
                         std::max(y.w_hi * x.w_lo * row_hi[x.lo], y.w_hi * x.w_hi * row_hi[x.hi]));
          acc = any ? std::max(acc, m) : m;
          any = true;
        }
      }
      out[ph * PW + pw] = acc;
    }
}

// The channel-vector kernels read X in a layout whose channels lie side by side: oneDNN's blocked
// aBcd16b / aBcd8b or channels-last acdb (what a convolution writes). Element
// (n, c, h, w) is at n sN + (c / B) sCB + h sH + w sW + c % B, so one load takes B channels of a pixel.
struct ChannelLayout {
  std::int64_t B = 0, sN = 0, sCB = 0, sH = 0, sW = 0;
};

// A sample row (column) of a bin as offsets into the channel layout: its two pixels' rows (columns)
// times sH (sW), with the tap's weights.
struct ChannelTap {
  std::int64_t lo = 0, hi = 0;
  float w_lo = 0.0f, w_hi = 0.0f;
  bool valid = false;
};

inline void channel_taps(const std::vector<SampleTap>& taps, std::int64_t stride, std::vector<ChannelTap>& out) {
  out.resize(taps.size());
  for (std::size_t i = 0; i < taps.size(); ++i)
    out[i] = ChannelTap{taps[i].lo * stride, taps[i].hi * stride, taps[i].w_lo, taps[i].w_hi, taps[i].valid};
}

#if defined(__GNUC__) && !defined(__clang__)  // as for gather_sum_from
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// One ROI, T::width channels (B) starting at `base` (its pixel (0, 0)), the first `lanes` of them read:
// tile[(ph * PW + pw) * B + k] for channel k. Mode avg: each sample is wx_lo (wy_lo p[ylo][xlo] + wy_hi
// p[yhi][xlo]) + wx_hi (... [xhi]); the sum over the bin's samples, over the sample count. Mode max: the
// largest of the four weighted corners, the largest over the samples (a sample outside the image is 0), each
// std::max as the reference takes it: std::max(a, b) is T::max(b, a) for NaNs too (both return their first
// operand then).
template <typename T>
inline __attribute__((always_inline)) void roi_chunk(const RoiGeometry& g, const Roi& roi,
                                                     const std::vector<ChannelTap>& ys,
                                                     const std::vector<ChannelTap>& xs, const float* base, int lanes,
                                                     float* tile) {
  using V = typename T::V;
  const std::int64_t PH = g.s.output_height, PW = g.s.output_width, gh = roi.gh, gw = roi.gw;
  const typename T::Mask mask = T::tail(lanes);
  const V inv = T::set1(1.0f / static_cast<float>(std::max<std::int64_t>(gh * gw, 1)));
  for (std::int64_t ph = 0; ph < PH; ++ph) {
    const ChannelTap* yrow = ys.data() + ph * gh;
    for (std::int64_t pw = 0; pw < PW; ++pw) {
      const ChannelTap* xrow = xs.data() + pw * gw;
      V acc = T::zero();
      if (!g.s.max) {
        for (std::int64_t iy = 0; iy < gh; ++iy) {
          const ChannelTap& y = yrow[iy];
          if (!y.valid) continue;
          const float *r0 = base + y.lo, *r1 = base + y.hi;
          const V wy0 = T::set1(y.w_lo), wy1 = T::set1(y.w_hi);
          for (std::int64_t ix = 0; ix < gw; ++ix) {
            const ChannelTap& x = xrow[ix];
            if (!x.valid) continue;
            const V p00 = T::maskz_load(mask, r0 + x.lo), p01 = T::maskz_load(mask, r0 + x.hi);
            const V p10 = T::maskz_load(mask, r1 + x.lo), p11 = T::maskz_load(mask, r1 + x.hi);
            const V lo = T::fmadd(wy1, p10, T::mul(wy0, p00));
            const V hi = T::fmadd(wy1, p11, T::mul(wy0, p01));
            acc = T::fmadd(T::set1(x.w_lo), lo, acc);
            acc = T::fmadd(T::set1(x.w_hi), hi, acc);
          }
        }
        acc = T::mul(acc, inv);
      } else {
        bool any = false;
        for (std::int64_t iy = 0; iy < gh; ++iy) {
          const ChannelTap& y = yrow[iy];
          const float *r0 = base + y.lo, *r1 = base + y.hi;
          for (std::int64_t ix = 0; ix < gw; ++ix) {
            const ChannelTap& x = xrow[ix];
            V m = T::zero();
            if (y.valid && x.valid) {
              const V a = T::mul(T::set1(y.w_lo * x.w_lo), T::maskz_load(mask, r0 + x.lo));
              const V b = T::mul(T::set1(y.w_lo * x.w_hi), T::maskz_load(mask, r0 + x.hi));
              const V c = T::mul(T::set1(y.w_hi * x.w_lo), T::maskz_load(mask, r1 + x.lo));
              const V d = T::mul(T::set1(y.w_hi * x.w_hi), T::maskz_load(mask, r1 + x.hi));
              m = T::max(T::max(d, c), T::max(b, a));
            }
            acc = any ? T::max(m, acc) : m;
            any = true;
          }
        }
      }
      T::store(tile + (ph * PW + pw) * static_cast<std::int64_t>(T::width), acc);
    }
  }
}

#ifdef ONDINE_SIMD_X86
// 16 channels a vector (AVX-512 machines, whose convolutions write aBcd16b).
__attribute__((target("avx512f"))) inline void roi_chunk_avx512(const RoiGeometry& g, const Roi& roi,
                                                                const std::vector<ChannelTap>& ys,
                                                                const std::vector<ChannelTap>& xs, const float* base,
                                                                int lanes, float* tile) {
  roi_chunk<simd::Avx512>(g, roi, ys, xs, base, lanes, tile);
}

// 8 channels a vector (AVX2 machines, whose convolutions write aBcd8b).
__attribute__((target("avx2,fma"))) inline void roi_chunk_avx2(const RoiGeometry& g, const Roi& roi,
                                                               const std::vector<ChannelTap>& ys,
                                                               const std::vector<ChannelTap>& xs, const float* base,
                                                               int lanes, float* tile) {
  roi_chunk<simd::Avx2>(g, roi, ys, xs, base, lanes, tile);
}
#endif  // ONDINE_SIMD_X86

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace sampling

// GridSample, 4-D float32: X [N, C, H, W], grid [N, Ho, Wo, 2] -> Y [N, C, Ho, Wo].
class GridSampleStep : public runtime::Step {
 public:
  GridSampleStep(runtime::StepInfo info, SlotId x, SlotId grid, SlotId y, sampling::GridGeometry g, silu::Kernel kernel)
      : Step(std::move(info), {x, grid}, {y}), x_(x), grid_(grid), y_(y), g_(g), kernel_(kernel) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const float*>(ctx.ptr(x_));
    const auto* grid = static_cast<const float*>(ctx.ptr(grid_));
    auto* y = static_cast<float*>(ctx.ptr(y_));
    const sampling::GridGeometry& g = g_;
    const int taps = g.taps * g.taps;
    const std::int64_t rows = g.N * g.Ho;
#pragma omp parallel if (rows > 1 && g.C * g.Ho * g.Wo * taps > (1 << 14))
    {
      std::vector<std::int32_t> off(static_cast<std::size_t>(taps * g.Wo));
      std::vector<float> w(static_cast<std::size_t>(taps * g.Wo));
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::int64_t b = row / g.Ho, ho = row % g.Ho;
        sampling::grid_row_taps(g, grid, b, ho, off.data(), w.data());
        for (std::int64_t c = 0; c < g.C; ++c)
          sampling::gather_sum(kernel_, x + (b * g.C + c) * g.H * g.W, off.data(), w.data(), taps, g.Wo,
                               y + ((b * g.C + c) * g.Ho + ho) * g.Wo);
      }
    }
  }

 private:
  SlotId x_, grid_, y_;
  sampling::GridGeometry g_;
  silu::Kernel kernel_;
};

inline bool lower_grid_sample(Lowering& L, const Node& n) {
  const Value *x = n.input(0), *grid = n.input(1), *y = n.output(0);
  if (!x || !grid || !y || x->dtype() != DType::Float32 || grid->dtype() != DType::Float32) return false;
  if (!x->shape().is_static() || !grid->shape().is_static() || x->shape().rank() != 4) return false;
  sampling::GridGeometry g;
  g.s = sampling::spec::grid_sample_spec(n);
  const Dims xd = x->shape().sizes(), gd = grid->shape().sizes();
  if (gd.size() != 4 || gd[0] != xd[0] || gd[3] != 2) return false;  // the reference kernel says why
  g.N = xd[0];
  g.C = xd[1];
  g.H = xd[2];
  g.W = xd[3];
  g.Ho = gd[1];
  g.Wo = gd[2];
  if (g.H * g.W >= std::numeric_limits<std::int32_t>::max() || g.H <= 0 || g.W <= 0) return false;
  g.taps = g.s.mode == sampling::spec::GridMode::Nearest ? 1 : g.s.mode == sampling::spec::GridMode::Linear ? 2 : 4;
  const IsaInfo isa = effective_isa();
  const silu::Kernel kernel = silu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa));
  SlotId xs = L.row_major_slot(x), gs = L.row_major_slot(grid), ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  const char* mode = g.taps == 1 ? "nearest" : g.taps == 2 ? "linear" : "cubic";
  L.add_step(std::make_unique<GridSampleStep>(
      runtime::StepInfo{n.name(), n.op_type(), silu::kernel_name(kernel),
                        Graph::value_type_str(x) + ", " + Graph::value_type_str(grid) + " -> " +
                            Graph::value_type_str(y) + ": " + mode + ", " + std::to_string(g.taps * g.taps) + " taps per point"},
      xs, gs, ys, g, kernel));
  return true;
}

// RoiAlign, float32: X [N, C, H, W], rois [R, 4], batch_indices int64 [R] -> Y [R, C, PH, PW] (row-major).
// With a channel layout (`layout.B` > 0) each (ROI, block of B channels) runs the channel-vector kernel
// into a tile that is then stored plane by plane; else each (ROI, channel) plane runs the plane kernels
// on row-major X.
class RoiAlignStep : public runtime::Step {
 public:
  RoiAlignStep(runtime::StepInfo info, const Node* node, SlotId x, SlotId rois, SlotId batch, SlotId y,
               sampling::RoiGeometry g, sampling::ChannelLayout layout, silu::Kernel kernel)
      : Step(std::move(info), {x, rois, batch}, {y}), node_(node), x_(x), rois_(rois), batch_(batch), y_(y), g_(g),
        layout_(layout), kernel_(kernel) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    const auto* x = static_cast<const float*>(ctx.ptr(x_));
    const auto* rois = static_cast<const float*>(ctx.ptr(rois_));
    const auto* batch = static_cast<const std::int64_t*>(ctx.ptr(batch_));
    auto* y = static_cast<float*>(ctx.ptr(y_));
    const sampling::RoiGeometry& g = g_;
    std::vector<sampling::Roi> boxes(static_cast<std::size_t>(g.R));
    for (std::int64_t r = 0; r < g.R; ++r)
      boxes[static_cast<std::size_t>(r)] = sampling::roi_of(*node_, g, rois, batch, r);
    if (layout_.B > 0) run_channel_blocks(x, y, boxes);
    else run_planes(x, y, boxes);
  }

 private:
  void run_planes(const float* x, float* y, const std::vector<sampling::Roi>& boxes) const {
    const sampling::RoiGeometry& g = g_;
    const std::int64_t planes = g.R * g.C, plane = g.s.output_height * g.s.output_width;
#pragma omp parallel if (planes > 1)
    {
      std::vector<sampling::SampleTap> ys, xs;
      std::vector<float> blend(static_cast<std::size_t>(g.W)), acc(static_cast<std::size_t>(g.s.output_width));
      std::int64_t taps_of = -1;  // the ROI whose taps ys/xs hold: a thread's planes are mostly one ROI's
#pragma omp for schedule(static)
      for (std::int64_t p = 0; p < planes; ++p) {
        const std::int64_t r = p / g.C, c = p % g.C;
        const sampling::Roi& roi = boxes[static_cast<std::size_t>(r)];
        if (r != taps_of) {
          sampling::roi_taps(g, roi, ys, xs);
          taps_of = r;
        }
        const float* img = x + (roi.batch * g.C + c) * g.H * g.W;
        float* out = y + p * plane;
        if (g.s.max) sampling::roi_plane_max(g, roi, ys, xs, img, out);
        else sampling::roi_plane_avg(g, roi, ys, xs, img, out, blend.data(), acc.data());
      }
    }
  }

  void run_channel_blocks(const float* x, float* y, const std::vector<sampling::Roi>& boxes) const {
    const sampling::RoiGeometry& g = g_;
    const sampling::ChannelLayout& l = layout_;
    const std::int64_t blocks = (g.C + l.B - 1) / l.B, tasks = g.R * blocks;
    const std::int64_t plane = g.s.output_height * g.s.output_width;
#pragma omp parallel if (tasks > 1)
    {
      std::vector<sampling::SampleTap> ys, xs;
      std::vector<sampling::ChannelTap> cys, cxs;
      std::vector<float> tile(static_cast<std::size_t>(plane * l.B));
      std::int64_t taps_of = -1;
#pragma omp for schedule(static)
      for (std::int64_t t = 0; t < tasks; ++t) {
        const std::int64_t r = t / blocks, cb = t % blocks;
        const sampling::Roi& roi = boxes[static_cast<std::size_t>(r)];
        if (r != taps_of) {
          sampling::roi_taps(g, roi, ys, xs);
          sampling::channel_taps(ys, l.sH, cys);
          sampling::channel_taps(xs, l.sW, cxs);
          taps_of = r;
        }
        const float* base = x + roi.batch * l.sN + cb * l.sCB;
        // A last block of channels-last X reads only its channels (a blocked layout pads its last block).
        const std::int64_t lanes = std::min(l.B, g.C - cb * l.B);
#ifdef ONDINE_SIMD_X86
        if (kernel_ == silu::Kernel::Avx512)
          sampling::roi_chunk_avx512(g, roi, cys, cxs, base, static_cast<int>(lanes), tile.data());
        else
          sampling::roi_chunk_avx2(g, roi, cys, cxs, base, static_cast<int>(lanes), tile.data());
#endif
        // The tile is [PH * PW][B]; Y's planes are [PH * PW] each, one per channel.
        float* out = y + (r * g.C + cb * l.B) * plane;
        for (std::int64_t k = 0; k < lanes; ++k)
          for (std::int64_t i = 0; i < plane; ++i) out[k * plane + i] = tile[static_cast<std::size_t>(i * l.B + k)];
      }
    }
  }

  const Node* node_;
  SlotId x_, rois_, batch_, y_;
  sampling::RoiGeometry g_;
  sampling::ChannelLayout layout_;
  silu::Kernel kernel_;
};

// X's layout as the channel-vector kernel reads it with B-channel vectors: oneDNN's blocked layout of
// block B (aBcd16b, aBcd8b), or channels-last (its last vector masked when B does not divide C); B = 0 for
// any other (or offset) layout.
inline sampling::ChannelLayout channel_layout(const memory::desc& md, std::int64_t C, std::int64_t B) {
  sampling::ChannelLayout l;
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims != 4 || d.format_kind != dnnl_blocked || d.data_type != dnnl_f32 || d.offset0 != 0 || d.extra.flags != 0)
    return l;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  const bool blocked = b.inner_nblks == 1 && b.inner_idxs[0] == 1 && b.inner_blks[0] == B;
  const bool channels_last = b.inner_nblks == 0 && b.strides[1] == 1 && b.strides[3] >= C;
  if (!blocked && !channels_last) return l;
  l.B = B;
  l.sN = b.strides[0];
  l.sCB = blocked ? b.strides[1] : B;
  l.sH = b.strides[2];
  l.sW = b.strides[3];
  return l;
}

inline bool lower_roi_align(Lowering& L, const Node& n) {
  const Value *x = n.input(0), *rois = n.input(1), *batch = n.input(2), *y = n.output(0);
  if (!x || !rois || !batch || !y || x->dtype() != DType::Float32 || rois->dtype() != DType::Float32 ||
      batch->dtype() != DType::Int64)
    return false;
  if (!x->shape().is_static() || !rois->shape().is_static() || !batch->shape().is_static()) return false;
  const Dims xd = x->shape().sizes(), rd = rois->shape().sizes(), bd = batch->shape().sizes();
  if (xd.size() != 4 || rd.size() != 2 || rd[1] != 4 || bd != Dims{rd[0]}) return false;  // the reference says why
  // An empty image (every sample outside it: zeros) is left to the reference kernel.
  if (xd[2] <= 0 || xd[3] <= 0 || xd[2] * xd[3] >= std::numeric_limits<std::int32_t>::max()) return false;
  sampling::RoiGeometry g;
  g.s = sampling::spec::roi_align_spec(n);
  g.N = xd[0];
  g.C = xd[1];
  g.H = xd[2];
  g.W = xd[3];
  g.R = rd[0];
  // X with its channels side by side (a convolution's blocked output, as detectors feed RoiAlign) is read
  // as it is, B channels a vector; a row-major X is reordered to blocked when the ROIs' samples (taking 2x2
  // a bin) outnumber its pixels, so the reorder costs less than what it saves, and C fills at least half a
  // vector (fewer channels would be mostly padding); else the plane kernels read it.
  const IsaInfo isa = effective_isa();
  const silu::Kernel kernel = silu::choose(isa.avx512, isa_runs_on(CpuIsa::Avx2, isa.isa));
  const std::int64_t B = kernel == silu::Kernel::Avx512 ? 16 : kernel == silu::Kernel::Avx2 ? 8 : 0;
  SlotId xs = 0;
  sampling::ChannelLayout layout;
  memory::desc read_md;
  if (B > 0 && L.md_of(x).data.format_kind == dnnl_blocked) {
    read_md = L.md_of(x);
    layout = channel_layout(read_md, g.C, B);
    if (layout.B == 0 && g.R * g.s.output_height * g.s.output_width * 4 >= g.N * g.H * g.W && g.C > B / 2) {
      const auto tag = B == 16 ? memory::format_tag::aBcd16b : memory::format_tag::aBcd8b;
      read_md = memory::desc(xd, memory::data_type::f32, tag);
      layout = channel_layout(read_md, g.C, B);
    }
    if (layout.B > 0) xs = L.slot_in(x, read_md);
  }
  if (layout.B == 0) xs = L.row_major_slot(x);
  SlotId rs = L.row_major_slot(rois), bs = L.row_major_slot(batch), ys = L.new_plain_slot(y);
  L.define_plain(y, ys);
  const std::string kernel_name = layout.B > 0 ? silu::kernel_name(kernel) : "ondine:c++";
  L.add_step(std::make_unique<RoiAlignStep>(
      runtime::StepInfo{n.name(), n.op_type(), kernel_name,
                        Graph::value_type_str(x) + (layout.B > 0 ? " (" + layout_name(read_md) + ")" : "") + ", " +
                            std::to_string(g.R) + " rois -> " + Graph::value_type_str(y) +
                            (g.s.max ? ": max" : ": avg") + (g.s.half_pixel ? ", half_pixel" : ", output_half_pixel") +
                            (layout.B > 0 ? ", " + std::to_string(layout.B) + " channels a vector" : "")},
      &n, xs, rs, bs, ys, g, layout, kernel));
  return true;
}

}  // namespace ondine::lower::detail
