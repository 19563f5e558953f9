// SPDX-License-Identifier: Apache-2.0
// ondine/reference/nn.hpp - reference kernels for the nn ops.
//
// Floating-point kernels read their inputs into double buffers, compute in double and round once
// into the output type: the oracle should be at least as exact as anything checked against it. Loops
// are plain but ordered so the innermost one runs over contiguous memory (Conv at ResNet-50 sizes
// takes seconds, not minutes). Window geometry comes from ondine/ir/infer/nn.hpp so that inference
// and execution agree on every output size.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ondine/ir/infer/nn.hpp"
#include "ondine/reference/common.hpp"

namespace ondine::reference {
namespace detail::nn {

namespace geo = ::ondine::infer::detail_nn;
using std::int64_t;

// --- element access -------------------------------------------------------------------------------

inline std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(t.raw());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(p[i]);
  });
  return out;
}

// Rounds a double into T: 16-bit floats round to nearest, integers saturate (NaN becomes 0) so that
// no conversion is undefined.
template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (std::is_integral_v<T>) {
    if (std::isnan(v)) return T(0);
    if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  } else {
    return static_cast<T>(v);
  }
}

// A tensor of `dtype` holding `values` (integer types round to nearest when `round` is set).
inline Tensor from_doubles(DType dtype, std::vector<int64_t> dims, const std::vector<double>& values,
                           bool round = false) {
  Tensor t(dtype, std::move(dims));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data<T>();
    bool r = round && std::is_integral_v<T>;
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = from_double<T>(r ? std::nearbyint(values[i]) : values[i]);
  });
  return t;
}

inline const Tensor& input_or_empty(const std::vector<Tensor>& inputs, std::size_t i) {
  static const Tensor none;
  return i < inputs.size() ? inputs[i] : none;
}
inline const Tensor& required(const Node& n, const std::vector<Tensor>& inputs, std::size_t i) {
  const Tensor& t = input_or_empty(inputs, i);
  if (t.empty()) throw n.error("missing required input #" + std::to_string(i));
  return t;
}

inline void require_floating(const Node& n, const Tensor& t, const char* role) {
  if (!is_floating(t.dtype()))
    throw n.error(std::string(role) + " has element type " + std::string(dtype_name(t.dtype())) +
                  "; expected a floating-point type");
}
inline void require_same_dtype(const Node& n, const Tensor& a, const Tensor& b, const char* role_b) {
  if (a.dtype() != b.dtype())
    throw n.error(std::string(role_b) + " has element type " + std::string(dtype_name(b.dtype())) + ", expected " +
                  std::string(dtype_name(a.dtype())));
}
inline void require_min_rank(const Node& n, const Tensor& t, std::size_t rank, const char* role) {
  if (t.rank() < rank)
    throw n.error(std::string(role) + " has shape " + dims_str(t.dims()) + ", expected rank >= " + std::to_string(rank));
}
inline void require_vector(const Node& n, const Tensor& t, int64_t count, const char* role) {
  if (t.rank() != 1 || t.dims()[0] != count)
    throw n.error(std::string(role) + " has shape " + dims_str(t.dims()) + ", expected [" + std::to_string(count) + "]");
}

inline int64_t product(const std::vector<int64_t>& d, std::size_t from = 0, std::size_t to = SIZE_MAX) {
  auto first = d.begin() + static_cast<std::ptrdiff_t>(std::min(from, d.size()));
  auto last = d.begin() + static_cast<std::ptrdiff_t>(std::min(to, d.size()));
  int64_t p = 1;
  for (auto it = first; it < last; ++it) p *= *it;
  return p;
}

// Up to three spatial axes as a 3-D problem: missing leading axes get size 1 and a trivial window.
struct Spatial3 {
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1}, dilation{1, 1, 1},
      pad{0, 0, 0};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t kernel_size() const { return kernel[0] * kernel[1] * kernel[2]; }
};

inline Spatial3 to_spatial3(const Node& n, const geo::Window& w, const std::vector<int64_t>& in,
                            const std::vector<int64_t>& out, const std::vector<int64_t>& pad_begin) {
  std::size_t s = in.size();
  if (s == 0 || s > 3) throw n.error(std::to_string(s) + " spatial axes are unsupported (expected 1 to 3)");
  Spatial3 g;
  for (std::size_t i = 0; i < s; ++i) {
    std::size_t j = 3 - s + i;
    g.in[j] = in[i];
    g.out[j] = out[i];
    g.kernel[j] = w.kernel[i];
    g.stride[j] = w.strides[i];
    g.dilation[j] = w.dilations[i];
    g.pad[j] = pad_begin[i];
  }
  return g;
}

// The range [lo, hi) of output positions o for which o * stride - pad + offset lies in [0, in).
inline void valid_range(int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t offset, int64_t& lo,
                        int64_t& hi) {
  lo = std::max<int64_t>(0, geo::ceil_div(pad - offset, stride));
  hi = std::min<int64_t>(out, geo::floor_div(in - 1 + pad - offset, stride) + 1);
  if (hi < lo) hi = lo;
}

// The kernel's spatial size: the weight's dims, which kernel_shape (when given) must match.
inline std::vector<int64_t> weight_kernel(const Node& n, const Tensor& w) {
  std::vector<int64_t> k(w.dims().begin() + 2, w.dims().end());
  if (n.has_attr("kernel_shape") && n.attr_ints("kernel_shape") != k)
    throw n.error("kernel_shape " + dims_str(n.attr_ints("kernel_shape")) + " does not match weight shape " +
                  dims_str(w.dims()));
  return k;
}

// --- Conv -----------------------------------------------------------------------------------------

inline std::vector<Tensor> conv(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  const Tensor& w = required(n, inputs, 1);
  const Tensor& b = input_or_empty(inputs, 2);
  require_floating(n, x, "X");
  require_same_dtype(n, x, w, "W");
  require_min_rank(n, x, 3, "X");
  if (w.rank() != x.rank())
    throw n.error("W has shape " + dims_str(w.dims()) + ", expected rank " + std::to_string(x.rank()) + " like X " +
                  dims_str(x.dims()));
  int64_t batch = x.dims()[0], channels = x.dims()[1], out_channels = w.dims()[0], group_channels = w.dims()[1];
  int64_t group = n.attr_int("group", 1);
  if (group <= 0) throw n.error("group " + std::to_string(group) + " must be positive");
  if (channels != group_channels * group)
    throw n.error("X has " + std::to_string(channels) + " channels but W " + dims_str(w.dims()) + " expects " +
                  std::to_string(group_channels) + " x group " + std::to_string(group));
  if (out_channels % group != 0)
    throw n.error("W has " + std::to_string(out_channels) + " output channels, not a multiple of group " +
                  std::to_string(group));
  if (!b.empty()) {
    require_same_dtype(n, x, b, "B");
    require_vector(n, b, out_channels, "B");
  }
  std::vector<int64_t> in_spatial(x.dims().begin() + 2, x.dims().end());
  geo::Window win = geo::read_window(n, weight_kernel(n, w));
  geo::ResolvedWindow r = geo::resolve_window(n, win, in_spatial);
  Spatial3 g = to_spatial3(n, win, in_spatial, r.out, r.pad_begin);

  std::vector<int64_t> out_dims{batch, out_channels};
  out_dims.insert(out_dims.end(), r.out.begin(), r.out.end());
  std::vector<double> xd = to_doubles(x), wd = to_doubles(w), bd = b.empty() ? std::vector<double>() : to_doubles(b);
  std::vector<double> y(static_cast<std::size_t>(product(out_dims)));
  int64_t isz = g.in_size(), osz = g.out_size(), ksz = g.kernel_size(), mg = out_channels / group;
  auto [ID, IH, IW] = g.in;
  auto [OD, OH, OW] = g.out;
  auto [KD, KH, KW] = g.kernel;
  for (int64_t bn = 0; bn < batch; ++bn) {
    for (int64_t m = 0; m < out_channels; ++m) {
      int64_t grp = m / mg;
      double* acc = y.data() + (bn * out_channels + m) * osz;
      std::fill(acc, acc + osz, bd.empty() ? 0.0 : bd[static_cast<std::size_t>(m)]);
      for (int64_t c = 0; c < group_channels; ++c) {
        const double* xc = xd.data() + (bn * channels + grp * group_channels + c) * isz;
        const double* wc = wd.data() + (m * group_channels + c) * ksz;
        for (int64_t kd = 0; kd < KD; ++kd)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              double wv = wc[(kd * KH + kh) * KW + kw];
              int64_t lo, hi;
              valid_range(OW, IW, g.stride[2], g.pad[2], kw * g.dilation[2], lo, hi);
              if (lo >= hi) continue;
              for (int64_t od = 0; od < OD; ++od) {
                int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dilation[0];
                if (id < 0 || id >= ID) continue;
                for (int64_t oh = 0; oh < OH; ++oh) {
                  int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dilation[1];
                  if (ih < 0 || ih >= IH) continue;
                  const double* xr = xc + (id * IH + ih) * IW + (lo * g.stride[2] - g.pad[2] + kw * g.dilation[2]);
                  double* yr = acc + (od * OH + oh) * OW;
                  if (g.stride[2] == 1) {
                    for (int64_t ow = lo; ow < hi; ++ow) yr[ow] += wv * xr[ow - lo];
                  } else {
                    for (int64_t ow = lo; ow < hi; ++ow) yr[ow] += wv * xr[(ow - lo) * g.stride[2]];
                  }
                }
              }
            }
      }
    }
  }
  return {from_doubles(x.dtype(), out_dims, y)};
}

// --- ConvTranspose --------------------------------------------------------------------------------

inline std::vector<Tensor> conv_transpose(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  const Tensor& w = required(n, inputs, 1);
  const Tensor& b = input_or_empty(inputs, 2);
  require_floating(n, x, "X");
  require_same_dtype(n, x, w, "W");
  require_min_rank(n, x, 3, "X");
  if (w.rank() != x.rank())
    throw n.error("W has shape " + dims_str(w.dims()) + ", expected rank " + std::to_string(x.rank()) + " like X " +
                  dims_str(x.dims()));
  int64_t batch = x.dims()[0], channels = x.dims()[1];
  int64_t group = n.attr_int("group", 1);
  if (group <= 0) throw n.error("group " + std::to_string(group) + " must be positive");
  if (w.dims()[0] != channels)
    throw n.error("X has " + std::to_string(channels) + " channels but W " + dims_str(w.dims()) + " expects " +
                  std::to_string(w.dims()[0]));
  if (channels % group != 0)
    throw n.error("X has " + std::to_string(channels) + " channels, not a multiple of group " + std::to_string(group));
  int64_t mg = w.dims()[1], out_channels = mg * group, cg = channels / group;
  if (!b.empty()) {
    require_same_dtype(n, x, b, "B");
    require_vector(n, b, out_channels, "B");
  }
  std::vector<int64_t> in_spatial(x.dims().begin() + 2, x.dims().end());
  geo::TransposeWindow t = geo::read_transpose_window(n, weight_kernel(n, w));
  std::vector<int64_t> out_spatial(in_spatial.size()), pad_begin(in_spatial.size());
  for (std::size_t i = 0; i < in_spatial.size(); ++i) {
    int64_t pe;
    out_spatial[i] = geo::transpose_output_size(t, i, in_spatial[i], pad_begin[i], pe);
    if (out_spatial[i] <= 0) throw n.error("the output would be empty along spatial axis " + std::to_string(i));
  }
  Spatial3 g = to_spatial3(n, t.window, in_spatial, out_spatial, pad_begin);

  std::vector<int64_t> out_dims{batch, out_channels};
  out_dims.insert(out_dims.end(), out_spatial.begin(), out_spatial.end());
  std::vector<double> xd = to_doubles(x), wd = to_doubles(w), bd = b.empty() ? std::vector<double>() : to_doubles(b);
  std::vector<double> y(static_cast<std::size_t>(product(out_dims)));
  int64_t isz = g.in_size(), osz = g.out_size(), ksz = g.kernel_size();
  auto [ID, IH, IW] = g.in;
  auto [OD, OH, OW] = g.out;
  auto [KD, KH, KW] = g.kernel;
  for (int64_t bn = 0; bn < batch; ++bn) {
    for (int64_t m = 0; m < out_channels; ++m) {
      int64_t grp = m / mg, mm = m % mg;
      double* acc = y.data() + (bn * out_channels + m) * osz;
      std::fill(acc, acc + osz, bd.empty() ? 0.0 : bd[static_cast<std::size_t>(m)]);
      for (int64_t c = 0; c < cg; ++c) {
        int64_t ic = grp * cg + c;
        const double* xc = xd.data() + (bn * channels + ic) * isz;
        const double* wc = wd.data() + (ic * mg + mm) * ksz;
        for (int64_t kd = 0; kd < KD; ++kd)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              double wv = wc[(kd * KH + kh) * KW + kw];
              // Input positions iw whose output iw * stride - pad + kw * dilation lies in [0, OW).
              int64_t off = kw * g.dilation[2] - g.pad[2];
              int64_t lo = std::max<int64_t>(0, geo::ceil_div(-off, g.stride[2]));
              int64_t hi = std::min<int64_t>(IW, geo::floor_div(OW - 1 - off, g.stride[2]) + 1);
              if (lo >= hi) continue;
              for (int64_t id = 0; id < ID; ++id) {
                int64_t od = id * g.stride[0] - g.pad[0] + kd * g.dilation[0];
                if (od < 0 || od >= OD) continue;
                for (int64_t ih = 0; ih < IH; ++ih) {
                  int64_t oh = ih * g.stride[1] - g.pad[1] + kh * g.dilation[1];
                  if (oh < 0 || oh >= OH) continue;
                  const double* xr = xc + (id * IH + ih) * IW;
                  double* yr = acc + (od * OH + oh) * OW + off;
                  for (int64_t iw = lo; iw < hi; ++iw) yr[iw * g.stride[2]] += wv * xr[iw];
                }
              }
            }
      }
    }
  }
  return {from_doubles(x.dtype(), out_dims, y)};
}

// --- pools ----------------------------------------------------------------------------------------

inline std::vector<Tensor> pool(const Node& n, const std::vector<Tensor>& inputs, bool is_max) {
  const Tensor& x = required(n, inputs, 0);
  if (is_max) {
    if (!is_floating(x.dtype()) && x.dtype() != DType::Int8 && x.dtype() != DType::UInt8)
      throw n.error("X has element type " + std::string(dtype_name(x.dtype())) +
                    "; expected a floating-point type, int8 or uint8");
  } else {
    require_floating(n, x, "X");
  }
  require_min_rank(n, x, 3, "X");
  std::vector<int64_t> in_spatial(x.dims().begin() + 2, x.dims().end());
  geo::Window win = geo::read_window(n, geo::pool_kernel(n, in_spatial.size()));
  geo::ResolvedWindow r = geo::resolve_window(n, win, in_spatial);
  Spatial3 g = to_spatial3(n, win, in_spatial, r.out, r.pad_begin);
  std::array<int64_t, 3> pad_end{0, 0, 0};
  for (std::size_t i = 0; i < in_spatial.size(); ++i) pad_end[3 - in_spatial.size() + i] = r.pad_end[i];
  bool include_pad = n.attr_int("count_include_pad", 0) != 0;
  int64_t storage_order = n.attr_int("storage_order", 0);
  if (storage_order != 0 && storage_order != 1) throw n.error("storage_order must be 0 or 1");
  bool want_indices = is_max && n.num_outputs() > 1 && n.output(1);

  std::vector<int64_t> out_dims{x.dims()[0], x.dims()[1]};
  out_dims.insert(out_dims.end(), r.out.begin(), r.out.end());
  std::vector<double> xd = to_doubles(x);
  int64_t planes = x.dims()[0] * x.dims()[1], isz = g.in_size(), osz = g.out_size();
  std::vector<double> y(static_cast<std::size_t>(planes * osz));
  std::vector<int64_t> indices(want_indices ? y.size() : 0);
  auto [ID, IH, IW] = g.in;
  auto [OD, OH, OW] = g.out;
  // Per axis and output position: the taps inside the input, and (for count_include_pad) the taps
  // inside the padded input.
  auto axis_counts = [&](int a, int64_t o, int64_t& valid, int64_t& padded) {
    valid = padded = 0;
    for (int64_t k = 0; k < g.kernel[a]; ++k) {
      int64_t i = o * g.stride[a] - g.pad[a] + k * g.dilation[a];
      if (i >= 0 && i < g.in[a]) ++valid;
      if (i >= -g.pad[a] && i < g.in[a] + pad_end[a]) ++padded;
    }
  };
  for (int64_t p = 0; p < planes; ++p) {
    const double* xp = xd.data() + p * isz;
    for (int64_t od = 0; od < OD; ++od)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          int64_t best_at = -1;
          for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
            int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dilation[0];
            if (id < 0 || id >= ID) continue;
            for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
              int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dilation[1];
              if (ih < 0 || ih >= IH) continue;
              for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dilation[2];
                if (iw < 0 || iw >= IW) continue;
                int64_t at = (id * IH + ih) * IW + iw;
                double v = xp[at];
                if (is_max) {
                  if (best_at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                    best = v;
                    best_at = storage_order == 0 ? at : id + ih * ID + iw * ID * IH;
                  }
                } else {
                  sum += v;
                }
              }
            }
          }
          std::size_t o = static_cast<std::size_t>(p * osz + (od * OH + oh) * OW + ow);
          if (is_max) {
            y[o] = best;
            if (want_indices) indices[o] = best_at < 0 ? -1 : p * isz + best_at;
          } else {
            int64_t count = 1;
            std::array<int64_t, 3> pos{od, oh, ow};
            for (int a = 0; a < 3; ++a) {
              int64_t valid, padded;
              axis_counts(a, pos[static_cast<std::size_t>(a)], valid, padded);
              count *= include_pad ? padded : valid;
            }
            y[o] = sum / static_cast<double>(count);
          }
        }
  }
  std::vector<Tensor> outs{from_doubles(x.dtype(), out_dims, y)};
  if (is_max) {
    for (std::size_t i = 1; i < n.num_outputs(); ++i)
      outs.push_back(want_indices && i == 1 ? Tensor::from_vector<int64_t>(out_dims, indices) : Tensor());
  }
  return outs;
}

inline std::vector<Tensor> global_pool(const Node& n, const std::vector<Tensor>& inputs, bool is_max) {
  const Tensor& x = required(n, inputs, 0);
  if (is_max) {
    if (!is_floating(x.dtype()) && x.dtype() != DType::Int8 && x.dtype() != DType::UInt8)
      throw n.error("X has element type " + std::string(dtype_name(x.dtype())) +
                    "; expected a floating-point type, int8 or uint8");
  } else {
    require_floating(n, x, "X");
  }
  require_min_rank(n, x, 3, "X");
  int64_t planes = x.dims()[0] * x.dims()[1], size = product(x.dims(), 2);
  std::vector<int64_t> out_dims(x.rank(), 1);
  out_dims[0] = x.dims()[0];
  out_dims[1] = x.dims()[1];
  std::vector<double> xd = to_doubles(x), y(static_cast<std::size_t>(planes));
  for (int64_t p = 0; p < planes; ++p) {
    const double* xp = xd.data() + p * size;
    if (is_max) {
      double best = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < size; ++i)
        if (xp[i] > best || std::isnan(xp[i])) {
          best = xp[i];
          if (std::isnan(best)) break;
        }
      y[static_cast<std::size_t>(p)] = best;
    } else {
      double sum = 0;
      for (int64_t i = 0; i < size; ++i) sum += xp[i];
      y[static_cast<std::size_t>(p)] = sum / static_cast<double>(size);
    }
  }
  return {from_doubles(x.dtype(), out_dims, y)};
}

// --- normalisations -------------------------------------------------------------------------------

inline std::vector<Tensor> batch_norm(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  require_floating(n, x, "X");
  require_min_rank(n, x, 2, "X");
  const char* roles[] = {"X", "scale", "B", "input_mean", "input_var"};
  std::vector<std::vector<double>> p(5);
  for (std::size_t i = 1; i < 5; ++i) {
    require_floating(n, required(n, inputs, i), roles[i]);
    p[i] = to_doubles(inputs[i]);
  }
  int64_t batch = x.dims()[0], channels = x.dims()[1], inner = product(x.dims(), 2);
  bool spatial = n.opset() >= 9 || n.attr_int("spatial", 1) != 0;
  // Parameters per channel, or (spatial = 0, before opset 9) per channel and position.
  int64_t per = spatial ? channels : channels * inner;
  for (std::size_t i = 1; i < 5; ++i)
    if (static_cast<int64_t>(p[i].size()) != per)
      throw n.error(std::string(roles[i]) + " has shape " + dims_str(inputs[i].dims()) + ", expected " +
                    std::to_string(per) + " values for X " + dims_str(x.dims()));
  int64_t training = n.opset() >= 14 ? n.attr_int("training_mode", 0) : 0;
  if (training != 0 && training != 1) throw n.error("training_mode must be 0 or 1");
  if (n.opset() < 14 && n.num_outputs() > 1)
    for (std::size_t i = 1; i < n.num_outputs(); ++i)
      if (n.output(i) && (n.output(i)->has_uses() || n.output(i)->is_graph_output()))
        throw n.error("the training outputs of BatchNormalization before opset 14 are unsupported");
  double eps = n.attr_float("epsilon", 1e-5f);
  double momentum = n.attr_float("momentum", 0.9f);
  std::vector<double> xd = to_doubles(x), y(xd.size());
  std::vector<double> mean = p[3], var = p[4];
  if (training) {
    // Batch statistics per channel (biased variance), as the ONNX training-mode definition.
    if (!spatial) throw n.error("training mode needs spatial batch normalization");
    double count = static_cast<double>(batch * inner);
    for (int64_t c = 0; c < channels; ++c) {
      double s = 0, ss = 0;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < inner; ++i) s += xd[static_cast<std::size_t>((b * channels + c) * inner + i)];
      double m = s / count;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < inner; ++i) {
          double d = xd[static_cast<std::size_t>((b * channels + c) * inner + i)] - m;
          ss += d * d;
        }
      mean[static_cast<std::size_t>(c)] = m;
      var[static_cast<std::size_t>(c)] = ss / count;
    }
  }
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        auto k = static_cast<std::size_t>(spatial ? c : c * inner + i);
        auto at = static_cast<std::size_t>((b * channels + c) * inner + i);
        y[at] = (xd[at] - mean[k]) / std::sqrt(var[k] + eps) * p[1][k] + p[2][k];
      }
  std::vector<Tensor> outs{from_doubles(x.dtype(), x.dims(), y)};
  for (std::size_t i = 1; i < n.num_outputs(); ++i) {
    // Running statistics: updated in training mode, passed through otherwise.
    std::size_t src = i == 1 || i == 3 ? 3 : 4;
    std::vector<double> stat = p[src];
    if (training && i <= 2) {
      const std::vector<double>& batch_stat = i == 1 ? mean : var;
      for (std::size_t c = 0; c < stat.size(); ++c) stat[c] = stat[c] * momentum + batch_stat[c] * (1 - momentum);
    }
    outs.push_back(from_doubles(inputs[src].dtype(), inputs[src].dims(), stat));
  }
  return outs;
}

inline std::vector<Tensor> instance_norm(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  const Tensor& scale = required(n, inputs, 1);
  const Tensor& bias = required(n, inputs, 2);
  require_floating(n, x, "X");
  require_min_rank(n, x, 3, "X");
  int64_t batch = x.dims()[0], channels = x.dims()[1], inner = product(x.dims(), 2);
  require_floating(n, scale, "scale");
  require_floating(n, bias, "B");
  require_vector(n, scale, channels, "scale");
  require_vector(n, bias, channels, "B");
  double eps = n.attr_float("epsilon", 1e-5f);
  std::vector<double> xd = to_doubles(x), sd = to_doubles(scale), bd = to_doubles(bias), y(xd.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < channels; ++c) {
      const double* xp = xd.data() + (b * channels + c) * inner;
      double* yp = y.data() + (b * channels + c) * inner;
      double s = 0, ss = 0;
      for (int64_t i = 0; i < inner; ++i) s += xp[i];
      double m = s / static_cast<double>(inner);
      for (int64_t i = 0; i < inner; ++i) ss += (xp[i] - m) * (xp[i] - m);
      double inv = 1.0 / std::sqrt(ss / static_cast<double>(inner) + eps);
      for (int64_t i = 0; i < inner; ++i)
        yp[i] = (xp[i] - m) * inv * sd[static_cast<std::size_t>(c)] + bd[static_cast<std::size_t>(c)];
    }
  return {from_doubles(x.dtype(), x.dims(), y)};
}

// Broadcasts a parameter unidirectionally to `dims` (numpy rules, the parameter never grows `dims`).
inline std::vector<double> broadcast_param(const Node& n, const Tensor& p, const std::vector<int64_t>& dims,
                                           const char* role) {
  bool ok = p.rank() <= dims.size();
  for (std::size_t i = 0; ok && i < p.rank(); ++i) {
    int64_t d = p.dims()[p.rank() - 1 - i];
    ok = d == 1 || d == dims[dims.size() - 1 - i];
  }
  if (!ok) throw n.error(std::string(role) + " of shape " + dims_str(p.dims()) + " does not broadcast to " + dims_str(dims));
  std::vector<double> v = to_doubles(p), out;
  auto map = detail::broadcast_index_map(p.dims(), dims);
  out.reserve(map.size());
  for (auto i : map) out.push_back(v[static_cast<std::size_t>(i)]);
  return out;
}

inline std::vector<Tensor> layer_norm(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  const Tensor& scale = required(n, inputs, 1);
  const Tensor& bias = input_or_empty(inputs, 2);
  require_floating(n, x, "X");
  require_floating(n, scale, "Scale");
  if (x.rank() == 0) throw n.error("X must have rank >= 1");
  auto axis = static_cast<std::size_t>(detail::normalize_axis(n, n.attr_int("axis", -1), static_cast<int64_t>(x.rank())));
  DType stash = geo::stash_dtype(n);
  std::vector<int64_t> norm_dims(x.dims().begin() + static_cast<std::ptrdiff_t>(axis), x.dims().end());
  int64_t outer = product(x.dims(), 0, axis), inner = product(norm_dims);
  std::vector<double> sd = broadcast_param(n, scale, norm_dims, "Scale");
  std::vector<double> bd = bias.empty() ? std::vector<double>(sd.size(), 0.0) : broadcast_param(n, bias, norm_dims, "B");
  double eps = n.attr_float("epsilon", 1e-5f);
  std::vector<double> xd = to_doubles(x), y(xd.size()), means(static_cast<std::size_t>(outer)),
      inv_std(static_cast<std::size_t>(outer));
  for (int64_t o = 0; o < outer; ++o) {
    const double* xp = xd.data() + o * inner;
    double* yp = y.data() + o * inner;
    double s = 0, ss = 0;
    for (int64_t i = 0; i < inner; ++i) s += xp[i];
    double m = inner ? s / static_cast<double>(inner) : 0.0;
    for (int64_t i = 0; i < inner; ++i) ss += (xp[i] - m) * (xp[i] - m);
    double inv = 1.0 / std::sqrt((inner ? ss / static_cast<double>(inner) : 0.0) + eps);
    for (int64_t i = 0; i < inner; ++i)
      yp[i] = (xp[i] - m) * inv * sd[static_cast<std::size_t>(i)] + bd[static_cast<std::size_t>(i)];
    means[static_cast<std::size_t>(o)] = m;
    inv_std[static_cast<std::size_t>(o)] = inv;
  }
  std::vector<int64_t> stat_dims(x.dims().begin(), x.dims().begin() + static_cast<std::ptrdiff_t>(axis));
  stat_dims.resize(x.rank(), 1);
  std::vector<Tensor> outs{from_doubles(x.dtype(), x.dims(), y)};
  if (n.num_outputs() > 1) outs.push_back(from_doubles(stash, stat_dims, means));
  if (n.num_outputs() > 2) outs.push_back(from_doubles(stash, stat_dims, inv_std));
  return outs;
}

inline std::vector<Tensor> lrn(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  require_floating(n, x, "X");
  require_min_rank(n, x, 2, "X");
  int64_t size = n.attr_int("size");
  if (size <= 0) throw n.error("size must be positive");
  double alpha = n.attr_float("alpha", 1e-4f), beta = n.attr_float("beta", 0.75f), bias = n.attr_float("bias", 1.0f);
  int64_t batch = x.dims()[0], channels = x.dims()[1], inner = product(x.dims(), 2);
  int64_t before = (size - 1) / 2, after = size - 1 - before;
  std::vector<double> xd = to_doubles(x), y(xd.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < channels; ++c) {
      int64_t lo = std::max<int64_t>(0, c - before), hi = std::min<int64_t>(channels - 1, c + after);
      for (int64_t i = 0; i < inner; ++i) {
        double sq = 0;
        for (int64_t k = lo; k <= hi; ++k) {
          double v = xd[static_cast<std::size_t>((b * channels + k) * inner + i)];
          sq += v * v;
        }
        auto at = static_cast<std::size_t>((b * channels + c) * inner + i);
        y[at] = xd[at] / std::pow(bias + alpha / static_cast<double>(size) * sq, beta);
      }
    }
  return {from_doubles(x.dtype(), x.dims(), y)};
}

// MeanVarianceNormalization: (x - mean) / (sqrt(variance) + 1e-9) over `axes`, ONNX's function body
// (whose variance is E[x^2] - E[x]^2; here E[(x - mean)^2], the same value without the cancellation).
inline std::vector<Tensor> mean_variance_normalization(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  require_floating(n, x, "X");
  const auto rank = static_cast<int64_t>(x.rank());
  std::vector<int64_t> axes = geo::mvn_axes(n, rank);
  // Each element's group (its index with the reduced axes dropped), by an odometer over x.
  std::vector<bool> reduced(x.rank(), false);
  for (auto a : axes) reduced[static_cast<std::size_t>(a)] = true;
  std::vector<int64_t> group_dims;
  for (std::size_t d = 0; d < x.rank(); ++d) group_dims.push_back(reduced[d] ? 1 : x.dims()[d]);
  const std::vector<int64_t> gstride = ::ondine::reference::detail::strides_of(group_dims);
  const int64_t groups = product(group_dims), total = x.numel();
  std::vector<int64_t> group(static_cast<std::size_t>(total)), pos(x.rank(), 0);
  for (int64_t i = 0; i < total; ++i) {
    int64_t g = 0;
    for (std::size_t d = 0; d < x.rank(); ++d)
      if (!reduced[d]) g += pos[d] * gstride[d];
    group[static_cast<std::size_t>(i)] = g;
    for (std::size_t d = x.rank(); d-- > 0;) {
      if (++pos[d] < x.dims()[d]) break;
      pos[d] = 0;
    }
  }
  std::vector<double> xd = to_doubles(x), y(xd.size()), mean(static_cast<std::size_t>(groups), 0.0),
      var(static_cast<std::size_t>(groups), 0.0), count(static_cast<std::size_t>(groups), 0.0);
  for (std::size_t i = 0; i < xd.size(); ++i) {
    mean[static_cast<std::size_t>(group[i])] += xd[i];
    count[static_cast<std::size_t>(group[i])] += 1;
  }
  for (std::size_t g = 0; g < mean.size(); ++g) mean[g] /= count[g];
  for (std::size_t i = 0; i < xd.size(); ++i) {
    const double c = xd[i] - mean[static_cast<std::size_t>(group[i])];
    var[static_cast<std::size_t>(group[i])] += c * c;
  }
  for (std::size_t i = 0; i < xd.size(); ++i) {
    const auto g = static_cast<std::size_t>(group[i]);
    y[i] = (xd[i] - mean[g]) / (std::sqrt(var[g] / count[g]) + 1e-9);
  }
  return {from_doubles(x.dtype(), x.dims(), y)};
}

// --- Softmax, LogSoftmax, Hardmax -----------------------------------------------------------------

// The rows Softmax, LogSoftmax and Hardmax normalise: `outer` x `inner` rows of `len` elements, element l
// of a row `inner` apart. Opset 13 normalises along one axis; before, over the input flattened to 2-D
// at `axis`.
struct SoftmaxRows {
  int64_t outer = 1, len = 1, inner = 1;
};

inline SoftmaxRows softmax_rows(const Node& n, const Tensor& x) {
  auto rank = static_cast<int64_t>(x.rank());
  int64_t axis = n.attr_int("axis", n.opset() >= 13 ? -1 : 1);
  SoftmaxRows r;
  if (rank == 0) {
    if (axis != 0 && axis != -1) throw n.error("axis " + std::to_string(axis) + " is out of range for a scalar");
    return r;
  }
  auto a = static_cast<std::size_t>(detail::normalize_axis(n, axis, rank));
  r.outer = product(x.dims(), 0, a);
  if (n.opset() >= 13) {
    r.len = x.dims()[a];
    r.inner = product(x.dims(), a + 1);
  } else {
    r.len = product(x.dims(), a);
  }
  return r;
}

inline std::vector<Tensor> softmax(const Node& n, const std::vector<Tensor>& inputs, bool log) {
  const Tensor& x = required(n, inputs, 0);
  require_floating(n, x, "input");
  auto [outer, len, inner] = softmax_rows(n, x);
  std::vector<double> xd = to_doubles(x), y(xd.size());
  if (xd.empty()) return {from_doubles(x.dtype(), x.dims(), y)};  // no row (and no data pointer to offset)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const double* xp = xd.data() + o * len * inner + i;
      double* yp = y.data() + o * len * inner + i;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t l = 0; l < len; ++l) mx = std::max(mx, xp[l * inner]);
      if (std::isinf(mx)) mx = 0;  // all -inf (or a +inf): no shift keeps the IEEE result
      double sum = 0;
      for (int64_t l = 0; l < len; ++l) sum += std::exp(xp[l * inner] - mx);
      double log_sum = std::log(sum);
      for (int64_t l = 0; l < len; ++l)
        yp[l * inner] = log ? xp[l * inner] - mx - log_sum : std::exp(xp[l * inner] - mx) / sum;
    }
  return {from_doubles(x.dtype(), x.dims(), y)};
}

// Hardmax: 1 at the first largest element of each row (a NaN counts as largest, as numpy's argmax
// has it), 0 elsewhere.
inline std::vector<Tensor> hardmax(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  require_floating(n, x, "input");
  auto [outer, len, inner] = softmax_rows(n, x);
  std::vector<double> xd = to_doubles(x), y(xd.size(), 0.0);
  if (xd.empty()) return {from_doubles(x.dtype(), x.dims(), y)};  // no row: rows of length 0 have no largest
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * len * inner + i;
      int64_t best = 0;
      for (int64_t l = 1; l < len && !std::isnan(xd[static_cast<std::size_t>(base + best * inner)]); ++l) {
        const double v = xd[static_cast<std::size_t>(base + l * inner)];
        if (std::isnan(v) || v > xd[static_cast<std::size_t>(base + best * inner)]) best = l;
      }
      if (len > 0) y[static_cast<std::size_t>(base + best * inner)] = 1.0;
    }
  return {from_doubles(x.dtype(), x.dims(), y)};
}

// --- MatMul, Gemm ---------------------------------------------------------------------------------

inline void require_matmul_dtype(const Node& n, const Tensor& t, const char* role) {
  if (!infer::detail_nn::is_matmul_dtype(t.dtype()))
    throw n.error(std::string(role) + " has element type " + std::string(dtype_name(t.dtype())) +
                  "; expected a floating-point type or (u)int32/(u)int64");
}

// C[M,N] (+)= A[M,K] x B[K,N] on contiguous row-major buffers; the inner loop runs along B's rows.
template <typename Acc>
void matmul_block(const Acc* a, const Acc* b, Acc* c, int64_t m, int64_t k, int64_t nn) {
  for (int64_t i = 0; i < m; ++i) {
    Acc* cr = c + i * nn;
    for (int64_t j = 0; j < nn; ++j) cr[j] = Acc(0);
    for (int64_t p = 0; p < k; ++p) {
      Acc av = a[i * k + p];
      const Acc* br = b + p * nn;
      for (int64_t j = 0; j < nn; ++j) cr[j] += av * br[j];
    }
  }
}

inline std::vector<Tensor> matmul(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& a = required(n, inputs, 0);
  const Tensor& b = required(n, inputs, 1);
  require_matmul_dtype(n, a, "A");
  require_same_dtype(n, a, b, "B");
  if (a.rank() == 0 || b.rank() == 0)
    throw n.error("MatMul operands must have rank >= 1, got " + dims_str(a.dims()) + " and " + dims_str(b.dims()));
  std::vector<int64_t> ad = a.dims(), bd = b.dims();
  bool a_vec = ad.size() == 1, b_vec = bd.size() == 1;
  if (a_vec) ad.insert(ad.begin(), 1);
  if (b_vec) bd.push_back(1);
  int64_t m = ad[ad.size() - 2], k = ad.back(), nn = bd.back();
  if (bd[bd.size() - 2] != k)
    throw n.error("inner dimensions differ: " + dims_str(a.dims()) + " x " + dims_str(b.dims()));
  std::vector<int64_t> a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
  std::vector<int64_t> batch = detail::broadcast_dims(n, a_batch, b_batch);
  auto a_map = detail::broadcast_index_map(a_batch, batch), b_map = detail::broadcast_index_map(b_batch, batch);
  std::vector<int64_t> out_dims = batch;
  if (!a_vec) out_dims.push_back(m);
  if (!b_vec) out_dims.push_back(nn);
  auto run = [&](auto zero, auto load, auto store) {
    using Acc = decltype(zero);
    std::vector<Acc> av = load(a), bv = load(b), cv(static_cast<std::size_t>(product(batch) * m * nn));
    for (std::size_t i = 0; i < a_map.size(); ++i)
      matmul_block<Acc>(av.data() + a_map[i] * m * k, bv.data() + b_map[i] * k * nn,
                        cv.data() + static_cast<int64_t>(i) * m * nn, m, k, nn);
    return store(cv);
  };
  if (is_floating(a.dtype()))
    return {run(0.0, to_doubles, [&](const std::vector<double>& c) { return from_doubles(a.dtype(), out_dims, c); })};
  // Integers: wrap-around arithmetic in uint64 (two's complement), as the integer types themselves do.
  return {run(std::uint64_t(0),
              [](const Tensor& t) {
                std::vector<std::uint64_t> v(static_cast<std::size_t>(t.numel()));
                dispatch_dtype(t.dtype(), [&](auto tag) {
                  using T = typename decltype(tag)::type;
                  if constexpr (std::is_integral_v<T>) {
                    const T* p = static_cast<const T*>(t.raw());
                    for (std::size_t i = 0; i < v.size(); ++i)
                      v[i] = static_cast<std::uint64_t>(static_cast<std::int64_t>(p[i]));
                  }
                });
                return v;
              },
              [&](const std::vector<std::uint64_t>& c) {
                Tensor t(a.dtype(), out_dims);
                dispatch_dtype(a.dtype(), [&](auto tag) {
                  using T = typename decltype(tag)::type;
                  if constexpr (std::is_integral_v<T>) {
                    T* p = t.data<T>();
                    for (std::size_t i = 0; i < c.size(); ++i) p[i] = static_cast<T>(c[i]);
                  }
                });
                return t;
              })};
}

inline std::vector<Tensor> gemm(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& a = required(n, inputs, 0);
  const Tensor& b = required(n, inputs, 1);
  const Tensor& c = input_or_empty(inputs, 2);
  require_matmul_dtype(n, a, "A");
  require_same_dtype(n, a, b, "B");
  if (a.rank() != 2 || b.rank() != 2)
    throw n.error("Gemm operands must be matrices, got " + dims_str(a.dims()) + " and " + dims_str(b.dims()));
  bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  int64_t m = a.dims()[ta ? 1 : 0], k = a.dims()[ta ? 0 : 1], kb = b.dims()[tb ? 1 : 0], nn = b.dims()[tb ? 0 : 1];
  if (k != kb)
    throw n.error("inner dimensions differ: A " + dims_str(a.dims()) + (ta ? " (transposed)" : "") + " x B " +
                  dims_str(b.dims()) + (tb ? " (transposed)" : ""));
  double alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
  std::vector<double> ad = to_doubles(a), bd = to_doubles(b);
  // Bring both operands to row-major A[M,K] and B[K,N].
  if (ta) {
    std::vector<double> t(ad.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) t[static_cast<std::size_t>(i * k + p)] = ad[static_cast<std::size_t>(p * m + i)];
    ad.swap(t);
  }
  if (tb) {
    std::vector<double> t(bd.size());
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < nn; ++j) t[static_cast<std::size_t>(p * nn + j)] = bd[static_cast<std::size_t>(j * k + p)];
    bd.swap(t);
  }
  std::vector<double> y(static_cast<std::size_t>(m * nn));
  matmul_block<double>(ad.data(), bd.data(), y.data(), m, k, nn);
  for (auto& v : y) v *= alpha;
  if (!c.empty()) {
    require_same_dtype(n, a, c, "C");
    std::vector<int64_t> out{m, nn};
    bool ok = c.rank() <= 2;
    for (std::size_t i = 0; ok && i < c.rank(); ++i) {
      int64_t d = c.dims()[c.rank() - 1 - i];
      ok = d == 1 || d == out[1 - i];
    }
    if (!ok) throw n.error("C of shape " + dims_str(c.dims()) + " does not broadcast to the output " + dims_str(out));
    std::vector<double> cd = to_doubles(c);
    auto map = detail::broadcast_index_map(c.dims(), out);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += beta * cd[static_cast<std::size_t>(map[i])];
  }
  return {from_doubles(a.dtype(), {m, nn}, y, true)};
}

// --- Resize ---------------------------------------------------------------------------------------

// One input sample of a 1-D interpolation.
struct Tap {
  int64_t index;
  double weight;
};

// For each output position along one axis: its taps, or none when it takes the extrapolation value.
inline std::vector<std::vector<Tap>> resize_taps(const geo::ResizeSpec& s, int64_t in, int64_t out, double scale,
                                                 double roi_start, double roi_end) {
  std::vector<std::vector<Tap>> taps(static_cast<std::size_t>(out));
  double length = scale * static_cast<double>(in);  // the unrounded output length, as the ONNX reference uses
  double lin = static_cast<double>(in);
  auto clamp = [&](int64_t i) { return std::min<int64_t>(std::max<int64_t>(i, 0), in - 1); };
  for (int64_t o = 0; o < out; ++o) {
    double x = static_cast<double>(o), xo;
    const std::string& m = s.coordinate_mode;
    if (m == "half_pixel") {
      xo = (x + 0.5) / scale - 0.5;
    } else if (m == "half_pixel_symmetric") {
      double adjustment = static_cast<double>(out) / length;
      double offset = lin / 2 * (1 - adjustment);
      xo = offset + (x + 0.5) / scale - 0.5;
    } else if (m == "pytorch_half_pixel") {
      xo = length == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
    } else if (m == "align_corners") {
      xo = length == 1 ? 0.0 : x * (lin - 1) / (length - 1);
    } else if (m == "asymmetric") {
      xo = x / scale;
    } else if (m == "tf_half_pixel_for_nn") {
      xo = (x + 0.5) / scale;
    } else {  // tf_crop_and_resize
      xo = length == 1 ? (roi_end - roi_start) * (lin - 1) / 2 : x * (roi_end - roi_start) * (lin - 1) / (length - 1);
      xo += roi_start * (lin - 1);
      if (xo < 0 || xo > lin - 1) continue;  // extrapolation
    }
    if (!std::isfinite(xo)) continue;  // only a degenerate roi gets here: extrapolate
    // Far outside the input every tap clamps to the edge; bounding xo keeps the index arithmetic exact.
    xo = std::min(std::max(xo, -4.0), lin + 4.0);
    auto& t = taps[static_cast<std::size_t>(o)];
    double base = std::floor(xo);
    double ratio = xo - base;
    auto x0 = static_cast<int64_t>(base);
    if (ratio == 0) {
      t.push_back({clamp(x0), 1.0});
      continue;
    }
    if (s.mode == "nearest") {
      bool up = s.nearest_mode == "round_prefer_floor" ? ratio > 0.5
                : s.nearest_mode == "round_prefer_ceil" ? ratio >= 0.5
                : s.nearest_mode == "ceil";
      t.push_back({clamp(up ? x0 + 1 : x0), 1.0});
      continue;
    }
    std::vector<std::pair<int64_t, double>> raw;
    if (s.mode == "linear") {
      raw = {{x0, 1 - ratio}, {x0 + 1, ratio}};
    } else {
      double a = s.cubic_a;
      auto far = [a](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };  // 1 <= |d| < 2
      auto near = [a](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };       // |d| < 1
      raw = {{x0 - 1, far(ratio + 1)}, {x0, near(ratio)}, {x0 + 1, near(1 - ratio)}, {x0 + 2, far(2 - ratio)}};
    }
    if (s.exclude_outside) {
      double sum = 0;
      for (auto& [i, w] : raw) {
        if (i < 0 || i >= in) w = 0;
        sum += w;
      }
      for (auto& r : raw) r.second /= sum;
    }
    for (auto& [i, w] : raw)
      if (w != 0) t.push_back({clamp(i), w});
  }
  return taps;
}

// The bytes of `v` in `dtype`: the value Resize and Pad write outside the input.
inline std::vector<unsigned char> fill_bytes(DType dtype, double v) {
  std::vector<unsigned char> fill(dtype_size(dtype));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T t = from_double<T>(v);
    std::memcpy(fill.data(), &t, fill.size());
  });
  return fill;
}

// Whether the output of a per-axis gather is empty; an Error naming the node when it passes
// Limits::max_tensor_bytes. Called before the per-axis index maps are built: an axis of 10^12 positions
// beside an empty one is an empty output, not 10^12 indices (found by fuzzing: a Pad of shape arithmetic).
inline bool gathered_output_empty(const Node& n, const std::vector<int64_t>& out_dims, DType dtype) {
  try {
    return ::ondine::detail::checked_tensor_bytes(out_dims, dtype_size(dtype), "output") == 0;
  } catch (const Error& e) {
    throw n.error(e.what());
  }
}

// y[o_0, ..., o_r] = x[source[0][o_0], ..., source[r][o_r]], or `fill` when any source index is -1.
// Nearest-neighbour Resize and every Pad mode are this gather with different per-axis index maps.
inline Tensor gather_per_axis(const Tensor& x, const std::vector<std::vector<int64_t>>& source,
                              const std::vector<int64_t>& out_dims, const std::vector<unsigned char>& fill) {
  Tensor y(x.dtype(), out_dims);
  const std::size_t rank = out_dims.size();
  const auto esize = static_cast<int64_t>(dtype_size(x.dtype()));
  auto in_strides = ::ondine::reference::detail::strides_of(x.dims());
  const auto* src = static_cast<const unsigned char*>(x.raw());
  auto* dst = static_cast<unsigned char*>(y.raw());
  std::vector<int64_t> pos(rank, 0);
  for (int64_t o = 0, total = y.numel(); o < total; ++o) {
    int64_t at = 0;
    bool outside = false;
    for (std::size_t a = 0; a < rank; ++a) {
      int64_t i = source[a][static_cast<std::size_t>(pos[a])];
      if (i < 0) outside = true;
      at += i * in_strides[a];
    }
    std::memcpy(dst + o * esize, outside ? fill.data() : src + at * esize, static_cast<std::size_t>(esize));
    for (std::size_t a = rank; a-- > 0;) {  // odometer increment
      if (++pos[a] < out_dims[a]) break;
      pos[a] = 0;
    }
  }
  return y;
}

inline std::vector<Tensor> resize(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  if (x.dtype() == DType::Bool || x.dtype() == DType::String)
    throw n.error("X has element type " + std::string(dtype_name(x.dtype())) + "; expected a numeric type");
  if (x.rank() == 0) throw n.error("X must have rank >= 1");
  geo::ResizeSpec spec = geo::read_resize_spec(n, static_cast<int64_t>(x.rank()));
  const Tensor& scales = input_or_empty(inputs, geo::resize_scales_index(n));
  const Tensor& sizes = input_or_empty(inputs, geo::resize_sizes_index(n));
  geo::ResizeTarget target =
      geo::resize_target(n, spec, x.dims(), scales.empty() ? nullptr : &scales, sizes.empty() ? nullptr : &sizes);
  std::size_t rank = x.rank();
  // The crop box of tf_crop_and_resize: starts then ends, over the resized axes.
  std::vector<double> roi_start(rank, 0.0), roi_end(rank, 1.0);
  if (spec.coordinate_mode == "tf_crop_and_resize") {
    const Tensor& roi = input_or_empty(inputs, 1);
    std::size_t k = spec.axes.size();
    if (roi.empty() || static_cast<std::size_t>(roi.numel()) != 2 * k)
      throw n.error("tf_crop_and_resize needs a roi of " + std::to_string(2 * k) + " values");
    if (!is_floating(roi.dtype())) throw n.error("roi must be a floating-point tensor");
    for (std::size_t i = 0; i < k; ++i) {
      auto ax = static_cast<std::size_t>(spec.axes[i]);
      roi_start[ax] = roi.at_double(i);
      roi_end[ax] = roi.at_double(i + k);
    }
  }
  for (std::size_t a = 0; a < rank; ++a)
    if (x.dims()[a] == 0 && target.out[a] > 0) throw n.error("cannot resize an empty axis to a non-empty one");
  std::vector<std::vector<std::vector<Tap>>> taps(rank);
  for (std::size_t a = 0; a < rank; ++a)
    taps[a] = resize_taps(spec, x.dims()[a], target.out[a], target.scales[a], roi_start[a], roi_end[a]);
  auto identity = [&](std::size_t a) {
    if (target.out[a] != x.dims()[a]) return false;
    for (int64_t o = 0; o < target.out[a]; ++o) {
      auto& t = taps[a][static_cast<std::size_t>(o)];
      if (t.size() != 1 || t[0].index != o || t[0].weight != 1.0) return false;
    }
    return true;
  };

  if (spec.mode == "nearest") {
    // A gather, exact for every type: one index per axis and output position (-1: extrapolate).
    std::vector<std::vector<int64_t>> index(rank);
    for (std::size_t a = 0; a < rank; ++a)
      for (auto& t : taps[a]) index[a].push_back(t.empty() ? -1 : t[0].index);
    return {gather_per_axis(x, index, target.out, fill_bytes(x.dtype(), spec.extrapolation))};
  }

  // linear / cubic: separable, one axis at a time in double.
  std::vector<double> cur = to_doubles(x);
  std::vector<int64_t> dims = x.dims();
  for (std::size_t a = 0; a < rank; ++a) {
    if (identity(a)) continue;
    int64_t outer = product(dims, 0, a), in_len = dims[a], inner = product(dims, a + 1), out_len = target.out[a];
    std::vector<double> next(static_cast<std::size_t>(outer * out_len * inner));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < out_len; ++j) {
        double* dst = next.data() + (o * out_len + j) * inner;
        auto& t = taps[a][static_cast<std::size_t>(j)];
        if (t.empty()) {
          std::fill(dst, dst + inner, spec.extrapolation);
          continue;
        }
        std::fill(dst, dst + inner, 0.0);
        for (auto& tap : t) {
          const double* src = cur.data() + (o * in_len + tap.index) * inner;
          for (int64_t i = 0; i < inner; ++i) dst[i] += tap.weight * src[i];
        }
      }
    cur.swap(next);
    dims[a] = out_len;
  }
  return {from_doubles(x.dtype(), dims, cur, true)};
}

// Upsample is Resize-10 (geo::resize_is_legacy); Upsample-7's scales attribute becomes the scales input.
inline std::vector<Tensor> upsample(const Node& n, const std::vector<Tensor>& inputs) {
  if (!geo::upsample_scales_attribute(n)) return resize(n, inputs);
  std::vector<float> s = n.attr_floats("scales");
  return resize(n, {required(n, inputs, 0), Tensor::from_vector<float>({static_cast<int64_t>(s.size())}, s)});
}

// --- MaxUnpool ------------------------------------------------------------------------------------

// MaxUnpool: a zero tensor of the default output shape (each spatial axis (in - 1) * stride + kernel -
// pads) with y.flat[I[j]] = X.flat[j] (I indexes the whole tensor, as MaxPool's Indices do; an index
// outside it is an error). A larger output_shape pads that result with zeros at the end of each axis,
// as ONNX Runtime does and the backend suite expects (its indices are those of the default shape).
inline std::vector<Tensor> max_unpool(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  const Tensor& indices = required(n, inputs, 1);
  const Tensor& shape = input_or_empty(inputs, 2);
  require_floating(n, x, "X");
  require_min_rank(n, x, 3, "X");
  if (indices.dtype() != DType::Int64) throw n.error("I must be an int64 tensor");
  if (indices.dims() != x.dims())
    throw n.error("I has shape " + dims_str(indices.dims()) + ", expected the shape of X " + dims_str(x.dims()));
  const std::size_t spatial = x.rank() - 2;
  geo::UnpoolWindow w = geo::read_unpool_window(n, spatial);
  std::vector<int64_t> dims{x.dims()[0], x.dims()[1]};
  for (std::size_t i = 0; i < spatial; ++i) {
    int64_t d = (x.dims()[i + 2] - 1) * w.strides[i] + w.kernel[i] - w.pads[i] - w.pads[i + spatial];
    if (d < 0) throw n.error("pads " + dims_str(w.pads) + " leave no output for input " + dims_str(x.dims()));
    dims.push_back(d);
  }
  Tensor y(x.dtype(), dims);
  const auto es = static_cast<int64_t>(dtype_size(x.dtype()));
  const int64_t total = y.numel();
  const int64_t* idx = indices.data<int64_t>();
  const auto* src = static_cast<const unsigned char*>(x.raw());
  auto* dst = static_cast<unsigned char*>(y.raw());
  for (int64_t j = 0, count = x.numel(); j < count; ++j) {
    if (idx[j] < 0 || idx[j] >= total)
      throw n.error("index " + std::to_string(idx[j]) + " in I is outside the output of " + std::to_string(total) +
                    " elements " + dims_str(dims));
    std::memcpy(dst + idx[j] * es, src + j * es, static_cast<std::size_t>(es));
  }
  if (shape.empty()) return {y};
  if (shape.dtype() != DType::Int64 || shape.rank() != 1 || static_cast<std::size_t>(shape.numel()) != x.rank())
    throw n.error("output_shape must be an int64 vector of " + std::to_string(x.rank()) + " values, got " +
                  std::string(dtype_name(shape.dtype())) + dims_str(shape.dims()));
  const std::vector<int64_t> out_dims = shape.to_int64s();
  for (std::size_t a = 0; a < x.rank(); ++a)
    if (out_dims[a] < dims[a])
      throw n.error("output_shape " + dims_str(out_dims) + " is smaller than the default output " + dims_str(dims));
  if (gathered_output_empty(n, out_dims, x.dtype())) return {Tensor(x.dtype(), out_dims)};
  std::vector<std::vector<int64_t>> source(x.rank());
  for (std::size_t a = 0; a < x.rank(); ++a) {
    for (int64_t o = 0; o < out_dims[a]; ++o) source[a].push_back(o < dims[a] ? o : -1);
  }
  return {gather_per_axis(y, source, out_dims, fill_bytes(x.dtype(), 0.0))};
}

// --- Pad ------------------------------------------------------------------------------------------

inline std::vector<Tensor> pad(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = required(n, inputs, 0);
  if (x.dtype() == DType::String) throw n.error("strings are unsupported");
  std::string mode = geo::pad_mode(n);
  std::size_t rank = x.rank();
  const Tensor& pads_t = input_or_empty(inputs, 1);
  const Tensor& axes_t = input_or_empty(inputs, 3);
  if (n.opset() >= 11 && pads_t.empty()) throw n.error("missing required input pads");
  bool have_axes = n.opset() >= 18 && !axes_t.empty();
  auto pads = *geo::pad_amounts(n, rank, &pads_t, &axes_t, have_axes);
  // The fill value of constant mode: the `value` attribute before opset 11, the optional input after.
  double value = 0;
  const Tensor* value_t = nullptr;
  if (n.opset() < 11) {
    value = n.attr_float("value", 0.0f);
  } else if (const Tensor& v = input_or_empty(inputs, 2); !v.empty()) {
    if (v.numel() != 1) throw n.error("constant_value must hold one value");
    require_same_dtype(n, x, v, "constant_value");
    value_t = &v;
  }
  std::vector<int64_t> out_dims(rank);
  // Per axis and output position: the input position it copies, or -1 for the fill value.
  std::vector<std::vector<int64_t>> source(rank);
  for (std::size_t a = 0; a < rank; ++a) {
    int64_t len = x.dims()[a], before = pads[a], after = pads[a + rank];
    if (__builtin_add_overflow(len, before, &out_dims[a]) || __builtin_add_overflow(out_dims[a], after, &out_dims[a]))
      throw n.error("pads " + dims_str(pads) + " overflow int64 on axis " + std::to_string(a));
    if (out_dims[a] < 0)
      throw n.error("pads " + dims_str(pads) + " remove more than the " + std::to_string(len) + " elements of axis " +
                    std::to_string(a));
  }
  if (gathered_output_empty(n, out_dims, x.dtype())) return {Tensor(x.dtype(), out_dims)};
  for (std::size_t a = 0; a < rank; ++a) {
    int64_t len = x.dims()[a], before = pads[a];
    for (int64_t o = 0; o < out_dims[a]; ++o) {
      int64_t i = o - before;
      if (i < 0 || i >= len) {
        if (mode == "constant") {
          i = -1;
        } else if (len == 0) {
          throw n.error("cannot pad an empty axis in " + mode + " mode");
        } else if (mode == "edge") {
          i = std::min<int64_t>(std::max<int64_t>(i, 0), len - 1);
        } else if (mode == "wrap") {
          i = ((i % len) + len) % len;
        } else if (len == 1) {  // reflect
          i = 0;
        } else {
          int64_t period = 2 * (len - 1);
          i = ((i % period) + period) % period;
          if (i >= len) i = period - i;
        }
      }
      source[a].push_back(i);
    }
  }
  std::vector<unsigned char> fill = fill_bytes(x.dtype(), value);
  if (value_t) std::memcpy(fill.data(), value_t->raw(), fill.size());  // exact, whatever the dtype
  return {gather_per_axis(x, source, out_dims, fill)};
}

}  // namespace detail::nn

inline void register_nn_kernels(KernelTable& table) {
  namespace k = detail::nn;
  table["Conv"] = k::conv;
  table["ConvTranspose"] = k::conv_transpose;
  table["MaxPool"] = [](const Node& n, const std::vector<Tensor>& in) { return k::pool(n, in, true); };
  table["AveragePool"] = [](const Node& n, const std::vector<Tensor>& in) { return k::pool(n, in, false); };
  table["GlobalMaxPool"] = [](const Node& n, const std::vector<Tensor>& in) { return k::global_pool(n, in, true); };
  table["GlobalAveragePool"] = [](const Node& n, const std::vector<Tensor>& in) { return k::global_pool(n, in, false); };
  table["MaxUnpool"] = k::max_unpool;
  table["BatchNormalization"] = k::batch_norm;
  table["InstanceNormalization"] = k::instance_norm;
  table["LayerNormalization"] = k::layer_norm;
  table["LRN"] = k::lrn;
  table["MeanVarianceNormalization"] = k::mean_variance_normalization;
  table["Softmax"] = [](const Node& n, const std::vector<Tensor>& in) { return k::softmax(n, in, false); };
  table["LogSoftmax"] = [](const Node& n, const std::vector<Tensor>& in) { return k::softmax(n, in, true); };
  table["Hardmax"] = k::hardmax;
  table["MatMul"] = k::matmul;
  table["Gemm"] = k::gemm;
  table["Resize"] = k::resize;
  table["Upsample"] = k::upsample;
  table["Pad"] = k::pad;
}

}  // namespace ondine::reference
