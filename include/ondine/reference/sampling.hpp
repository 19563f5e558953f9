// SPDX-License-Identifier: Apache-2.0
// ondine/reference/sampling.hpp - reference kernels of GridSample and RoiAlign, in double.
//
// GridSample follows the ONNX reference implementation (onnx/reference/ops/op_grid_sample.py), which
// agrees with PyTorch's grid_sample for every mode the backend suite checks: a normalised coordinate v
// of an axis of length L is ((v + 1) * L - 1) / 2 (align_corners 0: -1 and 1 are the outer pixels'
// edges) or (v + 1) / 2 * (L - 1) (align_corners 1: their centres); nearest rounds half to even. A
// coordinate outside [-0.5, L - 0.5] ([0, L - 1] with align_corners) is clamped to [0, L - 1] (border)
// or reflected at those bounds (reflection) before interpolating; each pixel read outside the image is
// 0 (zeros), the nearest edge pixel (border) or its mirror image (reflection). Linear interpolates the
// 2^r corners, cubic the 4x4 neighbours with A = -0.75 (the Keys kernel PyTorch uses).
//
// RoiAlign follows ONNX Runtime's kernel (the suite's expected values come from it): each output bin
// averages (avg) or takes the largest (max) of sampling_ratio^2 bilinear samples (ceil(roi / bins)
// per axis when sampling_ratio is 0); in max mode each sample is its largest weighted corner, as ONNX
// Runtime and the ONNX reference compute it. output_half_pixel (opset 10's only mode) does not shift
// the roi by half a pixel and makes it at least 1x1; half_pixel shifts it and keeps its size.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ondine/ir/infer/sampling.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::sampling {

namespace spec = ::ondine::infer::detail_sampling;
using std::int64_t;

// --- GridSample -------------------------------------------------------------------------------------

// `x` reflected into [lo, hi] as often as it takes (the ONNX reference's _gs_reflect).
inline double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double dx = lo - x;
    const auto k = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(k) * range;
    return k % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const auto k = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(k) * range;
    return k % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

// The Keys cubic convolution weights (A = -0.75) of the four taps floor(x) - 1 .. floor(x) + 2, for the
// fraction t = x - floor(x).
inline std::array<double, 4> cubic_weights(double t) {
  constexpr double A = -0.75;
  auto near = [](double d) { return ((A + 2) * d - (A + 3)) * d * d + 1; };       // |d| <= 1
  auto far = [](double d) { return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A; };  // 1 < |d| < 2
  return {far(t + 1), near(t), near(1 - t), far(2 - t)};
}

// The index along an axis of `dim` pixels at which tap `v` reads under the padding mode (lo, hi: the
// axis's coordinate bounds), or -1 for a zero (padding zeros, outside the image).
inline int64_t padded_index(spec::GridPadding padding, int64_t v, int64_t dim, double lo, double hi) {
  if (v >= 0 && v < dim) return v;
  if (padding == spec::GridPadding::Zeros) return -1;
  if (padding == spec::GridPadding::Border) return std::clamp<int64_t>(v, 0, dim - 1);
  return std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(v), lo, hi)), 0, dim - 1);
}

// The pixel coordinate of normalised grid value `v` along an axis of `dim` pixels, rounded (nearest) and
// clamped (border) or reflected (reflection) into [lo, hi] when outside it.
inline double grid_coordinate(const spec::GridSampleSpec& s, double v, int64_t dim, double lo, double hi) {
  const double len = static_cast<double>(dim);
  double c = s.align_corners ? (v + 1) / 2 * (len - 1) : ((v + 1) * len - 1) / 2;
  if (s.mode == spec::GridMode::Nearest) c = std::nearbyint(c);
  if (c < lo || c > hi) {
    if (s.padding == spec::GridPadding::Border) c = std::clamp(c, 0.0, len - 1);
    else if (s.padding == spec::GridPadding::Reflection) c = reflect(c, lo, hi);
  }
  return c;
}

struct GridSampler {
  spec::GridSampleSpec s;
  std::vector<int64_t> dims;       // D1..Dr
  std::vector<int64_t> strides;    // of one [D1..Dr] image
  std::vector<double> lo, hi;      // the coordinate bounds per axis (-0.5 / L - 0.5, or 0 / L - 1)

  // The pixel at integer index `idx` of image `img` under the padding mode.
  double pixel(const double* img, std::vector<int64_t> idx) const {
    int64_t off = 0;
    for (std::size_t i = 0; i < idx.size(); ++i) {
      const int64_t v = padded_index(s.padding, idx[i], dims[i], lo[i], hi[i]);
      if (v < 0) return 0.0;
      off += v * strides[i];
    }
    return img[off];
  }

  // The value of image `img` at (unnormalised, padded) coordinates `x`.
  double sample(const double* img, const std::vector<double>& x) const {
    const std::size_t r = x.size();
    std::vector<int64_t> idx(r);
    if (s.mode == spec::GridMode::Nearest) {
      for (std::size_t i = 0; i < r; ++i) idx[i] = static_cast<int64_t>(x[i]);  // already rounded
      return pixel(img, idx);
    }
    const int taps = s.mode == spec::GridMode::Linear ? 2 : 4;
    std::vector<int64_t> base(r);
    std::vector<std::array<double, 4>> w(r);
    for (std::size_t i = 0; i < r; ++i) {
      const double f = std::floor(x[i]);
      const double t = x[i] - f;
      base[i] = static_cast<int64_t>(f) - (taps == 4 ? 1 : 0);
      w[i] = taps == 2 ? std::array<double, 4>{1 - t, t, 0, 0} : cubic_weights(t);
    }
    // Every combination of taps, as an odometer over the r axes.
    std::vector<int> k(r, 0);
    double sum = 0;
    for (;;) {
      double weight = 1;
      for (std::size_t i = 0; i < r; ++i) {
        idx[i] = base[i] + k[i];
        weight *= w[i][static_cast<std::size_t>(k[i])];
      }
      if (weight != 0) sum += weight * pixel(img, idx);
      std::size_t d = r;
      while (d > 0 && ++k[d - 1] == taps) k[--d] = 0;
      if (d == 0) break;
    }
    return sum;
  }
};

inline std::vector<Tensor> grid_sample(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = nn::required(n, in, 0);
  const Tensor& grid = nn::required(n, in, 1);
  nn::require_floating(n, grid, "grid");
  GridSampler gs;
  gs.s = spec::grid_sample_spec(n);
  spec::check_grid_sample_rank(n, gs.s, x.rank());
  const std::size_t r = x.rank() - 2;
  if (grid.rank() != x.rank() || grid.dims()[0] != x.dims()[0] || grid.dims()[r + 1] != static_cast<int64_t>(r))
    throw n.error("grid " + dims_str(grid.dims()) + " does not fit X " + dims_str(x.dims()) + ": expected [" +
                  std::to_string(x.dims()[0]) + ", O1, ..., O" + std::to_string(r) + ", " + std::to_string(r) + "]");
  const int64_t N = x.dims()[0], C = x.dims()[1];
  gs.dims.assign(x.dims().begin() + 2, x.dims().end());
  gs.strides = strides_of(gs.dims);
  for (int64_t d : gs.dims) {
    gs.lo.push_back(gs.s.align_corners ? 0.0 : -0.5);
    gs.hi.push_back(gs.s.align_corners ? static_cast<double>(d - 1) : static_cast<double>(d) - 0.5);
  }
  const int64_t image = nn::product(gs.dims), points = nn::product(grid.dims(), 1, r + 1);
  std::vector<int64_t> out_dims{N, C};
  out_dims.insert(out_dims.end(), grid.dims().begin() + 1, grid.dims().begin() + 1 + static_cast<std::ptrdiff_t>(r));
  const std::vector<double> xv = nn::to_doubles(x), gv = nn::to_doubles(grid);
  std::vector<double> out(static_cast<std::size_t>(N * C * points));
  std::vector<double> coord(r);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < points; ++p) {
      // The grid's last axis lists the coordinates innermost spatial axis first (x, y, z).
      const double* g = gv.data() + (b * points + p) * static_cast<int64_t>(r);
      for (std::size_t i = 0; i < r; ++i) {
        coord[i] = grid_coordinate(gs.s, g[r - 1 - i], gs.dims[i], gs.lo[i], gs.hi[i]);
      }
      for (int64_t ch = 0; ch < C; ++ch)
        out[static_cast<std::size_t>((b * C + ch) * points + p)] = gs.sample(xv.data() + (b * C + ch) * image, coord);
    }
  return {nn::from_doubles(x.dtype(), out_dims, out, /*round*/ true)};
}

// --- RoiAlign ---------------------------------------------------------------------------------------

inline std::vector<Tensor> roi_align(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = nn::required(n, in, 0);
  const Tensor& rois = nn::required(n, in, 1);
  const Tensor& batch = nn::required(n, in, 2);
  nn::require_floating(n, x, "X");
  nn::require_same_dtype(n, x, rois, "rois");
  if (x.rank() != 4) throw n.error("X must be [N, C, H, W], got " + dims_str(x.dims()));
  if (rois.rank() != 2 || rois.dims()[1] != 4) throw n.error("rois must be [num_rois, 4], got " + dims_str(rois.dims()));
  if (batch.dtype() != DType::Int64 || batch.rank() != 1 || batch.dims()[0] != rois.dims()[0])
    throw n.error("batch_indices must be int64 [" + std::to_string(rois.dims()[0]) + "], got " +
                  std::string(dtype_name(batch.dtype())) + " " + dims_str(batch.dims()));
  const spec::RoiAlignSpec s = spec::roi_align_spec(n);
  const int64_t N = x.dims()[0], C = x.dims()[1], H = x.dims()[2], W = x.dims()[3], R = rois.dims()[0];
  const int64_t PH = s.output_height, PW = s.output_width;
  const std::vector<double> xv = nn::to_doubles(x), rv = nn::to_doubles(rois);
  const std::vector<int64_t> bi = batch.to_int64s();
  std::vector<double> out(static_cast<std::size_t>(R * C * PH * PW));
  const double offset = s.half_pixel ? 0.5 : 0.0, scale = s.spatial_scale;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = bi[static_cast<std::size_t>(r)];
    if (b < 0 || b >= N)
      throw n.error("batch_indices[" + std::to_string(r) + "] = " + std::to_string(b) + " is outside [0, " +
                    std::to_string(N) + ")");
    const double* roi = rv.data() + r * 4;  // x1, y1, x2, y2
    const double x0 = roi[0] * scale - offset, y0 = roi[1] * scale - offset;
    double rw = roi[2] * scale - offset - x0, rh = roi[3] * scale - offset - y0;
    if (!s.half_pixel) {
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    const double bh = rh / static_cast<double>(PH), bw = rw / static_cast<double>(PW);
    // The adaptive grid (sampling_ratio 0) grows with the ROI: a non-finite or absurd ROI would overflow the
    // conversion and loop without end, so a grid past 65536 samples a side is refused (found by fuzzing).
    auto grid = [&](double extent, int64_t bins, const char* side) -> int64_t {
      if (s.sampling_ratio > 0) return s.sampling_ratio;
      const double g = std::ceil(extent / static_cast<double>(bins));
      if (!(g <= 65536.0))
        throw n.error("roi " + std::to_string(r) + " needs a sampling grid of " + std::to_string(g) + " " + side +
                      " per bin (sampling_ratio 0): not finite or past 65536");
      return g > 0 ? static_cast<int64_t>(g) : 0;
    };
    const int64_t gh = grid(rh, PH, "rows"), gw = grid(rw, PW, "columns");
    // ... and so is one past 2^18 samples a bin (a 512 x 512 grid: a ROI of 3584 feature-map pixels a side at
    // 7 bins), which no real feature map reaches and which would run for minutes (a fuzzing timeout).
    if (s.sampling_ratio <= 0 && gh * gw > (int64_t{1} << 18))
      throw n.error("roi " + std::to_string(r) + " needs a sampling grid of " + std::to_string(gh) + " x " +
                    std::to_string(gw) + " per bin (sampling_ratio 0): past 2^18 samples");
    const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
    for (int64_t c = 0; c < C; ++c) {
      const double* img = xv.data() + (b * C + c) * H * W;
      for (int64_t ph = 0; ph < PH; ++ph)
        for (int64_t pw = 0; pw < PW; ++pw) {
          double acc = 0;
          bool any = false;
          for (int64_t iy = 0; iy < gh; ++iy)
            for (int64_t ix = 0; ix < gw; ++ix) {
              double yy = y0 + static_cast<double>(ph) * bh + (static_cast<double>(iy) + 0.5) * bh / static_cast<double>(gh);
              double xx = x0 + static_cast<double>(pw) * bw + (static_cast<double>(ix) + 0.5) * bw / static_cast<double>(gw);
              // A sample more than a pixel outside the image contributes 0 (ONNX Runtime's rule).
              std::array<double, 4> v{0, 0, 0, 0};
              // An empty image (H or W 0) has no pixel to read: every sample is outside it.
              // A NaN coordinate (a NaN box) makes its sample NaN.
              const bool inside = H > 0 && W > 0 &&
                                  !(yy < -1.0 || yy > static_cast<double>(H) || xx < -1.0 || xx > static_cast<double>(W));
              if (inside && (std::isnan(yy) || std::isnan(xx))) {
                v.fill(std::numeric_limits<double>::quiet_NaN());
              } else if (inside) {
                yy = std::max(yy, 0.0);
                xx = std::max(xx, 0.0);
                auto ylo = static_cast<int64_t>(yy), xlo = static_cast<int64_t>(xx), yhi = ylo + 1, xhi = xlo + 1;
                if (ylo >= H - 1) yhi = ylo = H - 1, yy = static_cast<double>(ylo);
                if (xlo >= W - 1) xhi = xlo = W - 1, xx = static_cast<double>(xlo);
                const double ly = yy - static_cast<double>(ylo), lx = xx - static_cast<double>(xlo);
                const double hy = 1 - ly, hx = 1 - lx;
                v = {hy * hx * img[ylo * W + xlo], hy * lx * img[ylo * W + xhi], ly * hx * img[yhi * W + xlo],
                     ly * lx * img[yhi * W + xhi]};
              }
              if (s.max) {
                const double m = std::max(std::max(v[0], v[1]), std::max(v[2], v[3]));
                acc = any ? std::max(acc, m) : m;
                any = true;
              } else {
                acc += v[0] + v[1] + v[2] + v[3];
              }
            }
          out[static_cast<std::size_t>(((r * C + c) * PH + ph) * PW + pw)] = s.max ? acc : acc / count;
        }
    }
  }
  return {nn::from_doubles(x.dtype(), {R, C, PH, PW}, out)};
}

}  // namespace detail::sampling

inline void register_sampling_kernels(KernelTable& t) {
  t["GridSample"] = detail::sampling::grid_sample;
  t["RoiAlign"] = detail::sampling::roi_align;
}

}  // namespace ondine::reference
