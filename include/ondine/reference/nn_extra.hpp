// SPDX-License-Identifier: Apache-2.0
// ondine/reference/nn_extra.hpp - reference kernels for Mish, BitwiseAnd/Or/Xor/Not, CenterCropPad,
// GroupNormalization (opsets 18 and 21), LpNormalization, LpPool, GlobalLpPool, MaxRoiPool and
// AffineGrid (opset 20). Shapes and attribute rules come from ondine/ir/infer/nn_extra.hpp.
//
// Floating kernels compute in double and round once (as reference/nn.hpp). Conventions where the spec
// leaves room, each as ONNX Runtime computes it: LpNormalization leaves a zero vector zero (no 0/0);
// MaxRoiPool rounds roi corners half away from zero (std::round), makes each roi at least 1x1 and
// writes 0 for an empty bin; LpPool's padding contributes nothing to the sum.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ondine/ir/infer/nn_extra.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::nn_extra {

namespace rules = ::ondine::infer::detail_nn_extra;
namespace geo = ::ondine::infer::detail_nn;
using nn::from_doubles;
using nn::input_or_empty;
using nn::require_floating;
using nn::required;
using nn::to_doubles;
using std::int64_t;

inline std::vector<Tensor> mish(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  require_floating(n, x, "X");
  std::vector<double> v = to_doubles(x);
  for (double& e : v) e = e * std::tanh(std::log1p(std::exp(-std::fabs(e))) + std::max(e, 0.0));  // stable softplus
  return {from_doubles(x.dtype(), x.dims(), v)};
}

inline std::vector<Tensor> bitwise(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& a = required(n, in, 0);
  const std::string& op = n.op_type();
  if (!is_integer(a.dtype()))
    throw n.error("A has element type " + std::string(dtype_name(a.dtype())) + "; expected an integer type");
  if (op == "BitwiseNot") {
    Tensor y(a.dtype(), a.dims());
    dispatch_dtype(a.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        for (int64_t i = 0; i < a.numel(); ++i) y.data<T>()[i] = static_cast<T>(~a.data<T>()[i]);
    });
    return {y};
  }
  const Tensor& b = required(n, in, 1);
  nn::require_same_dtype(n, a, b, "B");
  std::vector<int64_t> dims = broadcast_dims(n, a.dims(), b.dims());
  std::vector<int64_t> ia = broadcast_index_map(a.dims(), dims), ib = broadcast_index_map(b.dims(), dims);
  Tensor y(a.dtype(), dims);
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* py = y.data<T>();
      for (std::size_t i = 0; i < ia.size(); ++i) {
        T u = pa[ia[i]], v = pb[ib[i]];
        py[i] = static_cast<T>(op == "BitwiseAnd" ? (u & v) : op == "BitwiseOr" ? (u | v) : (u ^ v));
      }
    }
  });
  return {y};
}

// CenterCropPad: per axis, crop centred (start floor((in - out) / 2)) or pad with zeros centred
// (before floor((out - in) / 2)), as the ONNX reference slices.
inline std::vector<Tensor> center_crop_pad(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& shape = required(n, in, 1);
  const auto rank = static_cast<int64_t>(x.rank());
  std::vector<int64_t> axes = rules::crop_pad_axes(n, rank), target = shape.to_int64s();
  if (target.size() != axes.size())
    throw n.error("shape has " + std::to_string(target.size()) + " values for " + std::to_string(axes.size()) + " axes");
  std::vector<int64_t> out_dims = x.dims(), offset(x.rank(), 0);  // out position o reads input o + offset
  for (std::size_t i = 0; i < axes.size(); ++i) {
    auto a = static_cast<std::size_t>(axes[i]);
    if (target[i] < 0) throw n.error("shape values must not be negative");
    const int64_t have = x.dims()[a];
    offset[a] = target[i] <= have ? (have - target[i]) / 2 : -((target[i] - have) / 2);
    out_dims[a] = target[i];
  }
  if (nn::gathered_output_empty(n, out_dims, x.dtype())) return {Tensor(x.dtype(), out_dims)};
  std::vector<std::vector<int64_t>> source(x.rank());
  for (std::size_t a = 0; a < x.rank(); ++a)
    for (int64_t o = 0; o < out_dims[a]; ++o) {
      int64_t i = o + offset[a];
      source[a].push_back(i >= 0 && i < x.dims()[a] ? i : -1);
    }
  return {nn::gather_per_axis(x, source, out_dims, nn::fill_bytes(x.dtype(), 0.0))};
}

// GroupNormalization: the mean and variance of each (batch, group) over its channels and spatial
// positions; y = (x - mean) / sqrt(var + epsilon) * scale + bias, scale/bias per group (opset 18) or
// per channel (opset 21).
inline std::vector<Tensor> group_norm(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& scale = required(n, in, 1);
  const Tensor& bias = required(n, in, 2);
  require_floating(n, x, "X");
  nn::require_min_rank(n, x, 2, "X");
  const rules::GroupNormSpec s = rules::group_norm_spec(n);
  const int64_t N = x.dims()[0], C = x.dims()[1], G = s.groups, inner = nn::product(x.dims(), 2);
  if (C % G != 0)
    throw n.error("num_groups " + std::to_string(G) + " does not divide the " + std::to_string(C) + " channels");
  const int64_t count = s.per_channel ? C : G;
  nn::require_vector(n, scale, count, "scale");
  nn::require_vector(n, bias, count, "bias");
  const double eps = n.attr_float("epsilon", 1e-5f);
  std::vector<double> v = to_doubles(x), sc = to_doubles(scale), bi = to_doubles(bias);
  const int64_t per_group = C / G, block = per_group * inner;
  for (int64_t b = 0; b < N; ++b)
    for (int64_t g = 0; g < G; ++g) {
      double* p = v.data() + (b * C + g * per_group) * inner;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < block; ++i) mean += p[i];
      mean /= static_cast<double>(block);
      for (int64_t i = 0; i < block; ++i) var += (p[i] - mean) * (p[i] - mean);
      var /= static_cast<double>(block);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < per_group; ++c) {
        const auto k = static_cast<std::size_t>(s.per_channel ? g * per_group + c : g);
        for (int64_t i = 0; i < inner; ++i) {
          double& e = p[c * inner + i];
          e = (e - mean) * inv * sc[k] + bi[k];
        }
      }
    }
  return {from_doubles(x.dtype(), x.dims(), v)};
}

// ondine.ChannelLayerNorm (ir/fused_ops.hpp): each position's C channel values normalised, in double.
inline std::vector<Tensor> channel_layer_norm(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& scale = required(n, in, 1);
  require_floating(n, x, "X");
  nn::require_min_rank(n, x, 2, "X");
  const int64_t N = x.dims()[0], C = x.dims()[1], inner = nn::product(x.dims(), 2);
  nn::require_vector(n, scale, C, "scale");
  std::vector<double> sc = to_doubles(scale), bi(static_cast<std::size_t>(C), 0.0);
  if (in.size() > 2 && !in[2].empty()) {
    nn::require_vector(n, in[2], C, "bias");
    bi = to_doubles(in[2]);
  }
  const double eps = n.attr_float("epsilon", 1e-5f);
  std::vector<double> v = to_doubles(x);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t i = 0; i < inner; ++i) {
      double* p = v.data() + b * C * inner + i;
      double mean = 0, var = 0;
      for (int64_t c = 0; c < C; ++c) mean += p[c * inner];
      mean /= static_cast<double>(C);
      for (int64_t c = 0; c < C; ++c) var += (p[c * inner] - mean) * (p[c * inner] - mean);
      var /= static_cast<double>(C);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < C; ++c) {
        double& e = p[c * inner];
        e = (e - mean) * inv * sc[static_cast<std::size_t>(c)] + bi[static_cast<std::size_t>(c)];
      }
    }
  return {from_doubles(x.dtype(), x.dims(), v)};
}

// ondine.RMSNorm (ir/fused_ops.hpp) in double, rounded once into X's type.
inline std::vector<Tensor> rms_norm(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& scale = required(n, in, 1);
  require_floating(n, x, "X");
  const auto rank = static_cast<int64_t>(x.rank());
  int64_t axis = n.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) throw n.error("axis " + std::to_string(n.attr_int("axis", -1)) + " is out of range for X " + dims_str(x.dims()));
  const std::vector<int64_t> norm(x.dims().begin() + axis, x.dims().end());
  if (scale.dims() != norm)
    throw n.error("scale " + dims_str(scale.dims()) + " is not the normalised shape " + dims_str(norm) + " of X " +
                  dims_str(x.dims()));
  const int64_t d = nn::product(norm), rows = d ? x.numel() / d : 0;
  const double eps = n.attr_float("epsilon", 1e-5f);
  std::vector<double> v = to_doubles(x), sc = to_doubles(scale);
  for (int64_t r = 0; r < rows; ++r) {
    double* p = v.data() + r * d;
    double sum = 0;
    for (int64_t i = 0; i < d; ++i) sum += p[i] * p[i];
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(d) + eps);
    for (int64_t i = 0; i < d; ++i) p[i] = p[i] * inv * sc[static_cast<std::size_t>(i)];
  }
  return {from_doubles(x.dtype(), x.dims(), v)};
}

// ondine.Rotary (ir/fused_ops.hpp) in double, rounded once into X's type.
inline std::vector<Tensor> rotary(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& c = required(n, in, 1);
  const Tensor& s = required(n, in, 2);
  require_floating(n, x, "X");
  if (x.rank() == 0 || c.rank() == 0 || c.dims() != s.dims() || c.dims().back() != x.dims().back() ||
      x.dims().back() % 2 != 0 || detail::broadcast_dims(n, x.dims(), c.dims()) != x.dims())
    throw n.error("X " + dims_str(x.dims()) + ", cos " + dims_str(c.dims()) + " and sin " + dims_str(s.dims()) +
                  " do not make a rotary embedding (cos and sin one shape, broadcasting to X's, X's last dim even)");
  const int64_t d = x.dims().back(), h = d / 2;
  const std::vector<int64_t> at = detail::broadcast_index_map(c.dims(), x.dims());
  std::vector<double> xv = to_doubles(x), cv = to_doubles(c), sv = to_doubles(s), y(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const auto j = static_cast<int64_t>(i) % d;
    const double rotated = j < h ? -xv[i + static_cast<std::size_t>(h)] : xv[i - static_cast<std::size_t>(h)];
    const auto k = static_cast<std::size_t>(at[i]);
    y[i] = xv[i] * cv[k] + rotated * sv[k];
  }
  return {from_doubles(x.dtype(), x.dims(), y)};
}

inline std::vector<Tensor> lp_norm(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  require_floating(n, x, "input");
  const double p = rules::lp_order(n);
  if (p != 1 && p != 2) throw n.error("p must be 1 or 2, got " + std::to_string(p));
  std::vector<double> v = to_doubles(x);
  if (x.rank() == 0 || v.empty()) return {from_doubles(x.dtype(), x.dims(), v)};  // (no row to normalise)
  const auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", -1), static_cast<int64_t>(x.rank())));
  const int64_t outer = nn::product(x.dims(), 0, axis), len = x.dims()[axis], inner = nn::product(x.dims(), axis + 1);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double* base = v.data() + o * len * inner + i;
      double norm = 0;
      for (int64_t k = 0; k < len; ++k) norm += p == 1 ? std::fabs(base[k * inner]) : base[k * inner] * base[k * inner];
      if (p == 2) norm = std::sqrt(norm);
      if (norm == 0) continue;  // a zero vector stays zero
      for (int64_t k = 0; k < len; ++k) base[k * inner] /= norm;
    }
  return {from_doubles(x.dtype(), x.dims(), v)};
}

// LpPool: (sum over the window's taps inside the input of |x|^p)^(1/p); GlobalLpPool over all of
// each plane.
inline std::vector<Tensor> lp_pool(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  require_floating(n, x, "X");
  nn::require_min_rank(n, x, 3, "X");
  const double p = rules::lp_order(n);
  std::vector<int64_t> in_spatial(x.dims().begin() + 2, x.dims().end());
  geo::Window win;
  geo::ResolvedWindow r;
  if (n.op_type() == "GlobalLpPool") {
    win.kernel = in_spatial;
    win.strides = win.dilations = std::vector<int64_t>(in_spatial.size(), 1);
    r.out = std::vector<int64_t>(in_spatial.size(), 1);
    r.pad_begin = r.pad_end = std::vector<int64_t>(in_spatial.size(), 0);
  } else {
    win = geo::read_window(n, geo::pool_kernel(n, in_spatial.size()));
    r = geo::resolve_window(n, win, in_spatial);
  }
  nn::Spatial3 g = nn::to_spatial3(n, win, in_spatial, r.out, r.pad_begin);
  std::vector<int64_t> out_dims{x.dims()[0], x.dims()[1]};
  out_dims.insert(out_dims.end(), r.out.begin(), r.out.end());
  std::vector<double> xd = to_doubles(x);
  const int64_t planes = x.dims()[0] * x.dims()[1], isz = g.in_size(), osz = g.out_size();
  std::vector<double> y(static_cast<std::size_t>(planes * osz));
  for (int64_t pl = 0; pl < planes; ++pl) {
    const double* xp = xd.data() + pl * isz;
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow) {
          double sum = 0;
          for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
            int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dilation[0];
            if (id < 0 || id >= g.in[0]) continue;
            for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
              int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dilation[1];
              if (ih < 0 || ih >= g.in[1]) continue;
              for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dilation[2];
                if (iw < 0 || iw >= g.in[2]) continue;
                sum += std::pow(std::fabs(xp[(id * g.in[1] + ih) * g.in[2] + iw]), p);
              }
            }
          }
          y[static_cast<std::size_t>(pl * osz + (od * g.out[1] + oh) * g.out[2] + ow)] = std::pow(sum, 1.0 / p);
        }
  }
  return {from_doubles(x.dtype(), out_dims, y)};
}

inline std::vector<Tensor> max_roi_pool(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  const Tensor& rois = required(n, in, 1);
  require_floating(n, x, "X");
  nn::require_same_dtype(n, x, rois, "rois");
  if (x.rank() != 4) throw n.error("X has shape " + dims_str(x.dims()) + ", expected [N, C, H, W]");
  if (rois.rank() != 2 || rois.dims()[1] != 5)
    throw n.error("rois has shape " + dims_str(rois.dims()) + ", expected [num_rois, 5]");
  const auto ps = rules::pooled_shape(n);
  const double scale = n.attr_float("spatial_scale", 1.0f);
  const int64_t N = x.dims()[0], C = x.dims()[1], H = x.dims()[2], W = x.dims()[3], R = rois.dims()[0];
  const int64_t PH = ps[0], PW = ps[1];
  std::vector<double> xd = to_doubles(x), rd = to_doubles(rois), y(static_cast<std::size_t>(R * C * PH * PW));
  for (int64_t r = 0; r < R; ++r) {
    const double* roi = rd.data() + r * 5;
    const auto b = static_cast<int64_t>(roi[0]);
    if (b < 0 || b >= N) throw n.error("roi " + std::to_string(r) + " names batch " + std::to_string(b) + " of " + std::to_string(N));
    const auto x1 = static_cast<int64_t>(std::round(roi[1] * scale)), y1 = static_cast<int64_t>(std::round(roi[2] * scale));
    const auto x2 = static_cast<int64_t>(std::round(roi[3] * scale)), y2 = static_cast<int64_t>(std::round(roi[4] * scale));
    const double bin_h = static_cast<double>(std::max<int64_t>(y2 - y1 + 1, 1)) / static_cast<double>(PH);
    const double bin_w = static_cast<double>(std::max<int64_t>(x2 - x1 + 1, 1)) / static_cast<double>(PW);
    for (int64_t c = 0; c < C; ++c) {
      const double* plane = xd.data() + (b * C + c) * H * W;
      for (int64_t ph = 0; ph < PH; ++ph)
        for (int64_t pw = 0; pw < PW; ++pw) {
          auto clamp = [](int64_t v, int64_t hi) { return std::min(std::max<int64_t>(v, 0), hi); };
          const int64_t hs = clamp(static_cast<int64_t>(std::floor(ph * bin_h)) + y1, H);
          const int64_t he = clamp(static_cast<int64_t>(std::ceil((ph + 1) * bin_h)) + y1, H);
          const int64_t ws = clamp(static_cast<int64_t>(std::floor(pw * bin_w)) + x1, W);
          const int64_t we = clamp(static_cast<int64_t>(std::ceil((pw + 1) * bin_w)) + x1, W);
          double best = 0;
          if (he > hs && we > ws) {
            best = -std::numeric_limits<double>::infinity();
            for (int64_t h = hs; h < he; ++h)
              for (int64_t w = ws; w < we; ++w) best = std::max(best, plane[h * W + w]);
          }
          y[static_cast<std::size_t>(((r * C + c) * PH + ph) * PW + pw)] = best;
        }
    }
  }
  return {from_doubles(x.dtype(), {R, C, PH, PW}, y)};
}

// AffineGrid: the normalised base grid (align_corners: -1 and 1 at the first and last sample; else at
// the outer edges, samples at (2i + 1) / n - 1) mapped by theta: out = theta [x, y, (z,) 1].
inline std::vector<Tensor> affine_grid(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& theta = required(n, in, 0);
  const Tensor& size_t_ = required(n, in, 1);
  require_floating(n, theta, "theta");
  const std::vector<int64_t> size = size_t_.to_int64s();
  if (size.size() != 4 && size.size() != 5)
    throw n.error("size has " + std::to_string(size.size()) + " values; expected 4 (2-D) or 5 (3-D)");
  const std::size_t S = size.size() - 2;  // spatial axes
  const int64_t N = size[0];
  if (theta.rank() != 3 || theta.dims()[0] != N || theta.dims()[1] != static_cast<int64_t>(S) ||
      theta.dims()[2] != static_cast<int64_t>(S + 1))
    throw n.error("theta has shape " + dims_str(theta.dims()) + ", expected [" + std::to_string(N) + ", " +
                  std::to_string(S) + ", " + std::to_string(S + 1) + "]");
  for (std::size_t i = 2; i < size.size(); ++i)
    if (size[i] < 0) throw n.error("size values must not be negative");
  const bool align = n.attr_int("align_corners", 0) != 0;
  auto coord = [&](int64_t i, int64_t len) {
    if (align) return len == 1 ? -1.0 : -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(len - 1);
    return (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(len) - 1.0;
  };
  // Spatial sizes as (D, H, W), D = 1 for 2-D.
  const int64_t D = S == 3 ? size[2] : 1, H = size[size.size() - 2], W = size[size.size() - 1];
  std::vector<int64_t> out_dims{N};
  out_dims.insert(out_dims.end(), size.begin() + 2, size.end());
  out_dims.push_back(static_cast<int64_t>(S));
  std::vector<double> th = to_doubles(theta), y;
  y.reserve(static_cast<std::size_t>(N * D * H * W) * S);
  for (int64_t b = 0; b < N; ++b) {
    const double* t = th.data() + b * static_cast<int64_t>(S * (S + 1));
    for (int64_t d = 0; d < D; ++d)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          // Base point in (x, y, z) order: x along W, y along H, z along D.
          double base[4] = {coord(w, W), coord(h, H), S == 3 ? coord(d, D) : 1.0, 1.0};
          for (std::size_t row = 0; row < S; ++row) {
            double acc = 0;
            for (std::size_t k = 0; k < S; ++k) acc += t[row * (S + 1) + k] * base[k];
            y.push_back(acc + t[row * (S + 1) + S]);
          }
        }
  }
  return {from_doubles(theta.dtype(), out_dims, y)};
}

}  // namespace detail::nn_extra

inline void register_nn_extra_kernels(KernelTable& table) {
  namespace k = detail::nn_extra;
  table["Mish"] = k::mish;
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"}) table[op] = k::bitwise;
  table["CenterCropPad"] = k::center_crop_pad;
  table["GroupNormalization"] = k::group_norm;
  table[std::string(fused::kDomain) + ".GroupNorm"] = k::group_norm;  // per-channel scale/bias, as opset 21
  table[std::string(fused::kDomain) + ".ChannelLayerNorm"] = k::channel_layer_norm;
  table[std::string(fused::kDomain) + ".RMSNorm"] = k::rms_norm;
  table[std::string(fused::kDomain) + ".Rotary"] = k::rotary;
  table["LpNormalization"] = k::lp_norm;
  table["LpPool"] = k::lp_pool;
  table["GlobalLpPool"] = k::lp_pool;
  table["MaxRoiPool"] = k::max_roi_pool;
  table["AffineGrid"] = k::affine_grid;
}

}  // namespace ondine::reference
