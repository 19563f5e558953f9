// SPDX-License-Identifier: Apache-2.0
// ondine/reference/qoperator.hpp - reference kernels for the QOperator ops and dynamic quantization:
// QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and DynamicQuantizeLinear.
//
// Integer ops accumulate (x - x_zero_point) * (w - w_zero_point) exactly and wrap to int32 (the spec
// lets only the 32-bit accumulation overflow). The QLinear ops then requantize as ONNX Runtime does,
// in float32: y = saturate(round_half_even(float(acc) * (x_scale * w_scale / y_scale)) + y_zero_point).
// The convolution itself is nn.hpp's Conv kernel run on the zero-point-shifted values in double (exact
// for every 8-bit problem below 2^53 / 2^16 taps), so the window geometry is shared with Conv.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ondine/ir/infer/qoperator.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::qop {

namespace chk = ::ondine::infer::detail_qop;
using std::int64_t;

inline const Tensor& input_or_empty(const std::vector<Tensor>& in, std::size_t i) {
  return ::ondine::reference::detail::nn::input_or_empty(in, i);
}
inline const Tensor& required(const Node& n, const std::vector<Tensor>& in, std::size_t i) {
  return ::ondine::reference::detail::nn::required(n, in, i);
}

inline void require_q8(const Node& n, const Tensor& t, const std::string& role) {
  if (!chk::is_q8(t.dtype()))
    throw n.error(role + " has element type " + std::string(dtype_name(t.dtype())) + "; " + n.op_type() +
                  " takes uint8 or int8");
}

// The zero point's values (one, or one per channel), or {0} when it is omitted.
inline std::vector<int64_t> zero_points(const Node& n, const Tensor& zp, const Tensor& data, const std::string& role) {
  if (zp.empty()) return {0};
  require_q8(n, zp, role);
  if (zp.dtype() != data.dtype())
    throw n.error(role + " has element type " + std::string(dtype_name(zp.dtype())) + " but its tensor is " +
                  std::string(dtype_name(data.dtype())) + "; they must match");
  return zp.to_int64s();
}

inline std::vector<float> scales(const Node& n, const Tensor& s, const std::string& role) {
  if (s.dtype() != DType::Float32)
    throw n.error(role + " has element type " + std::string(dtype_name(s.dtype())) + "; scales are float32");
  chk::check_scale_values(n, s, role, role);
  return std::vector<float>(s.data<float>(), s.data<float>() + s.numel());
}

inline void require_count(const Node& n, std::size_t got, std::size_t one_or, const std::string& role) {
  if (got != 1 && got != one_or)
    throw n.error(role + " has " + std::to_string(got) + " elements; expected 1 (per tensor)" +
                  (one_or != 1 ? " or " + std::to_string(one_or) + " (per channel)" : std::string()));
}

inline std::int32_t wrap_int32(int64_t v) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(v)); }

// saturate(round_half_even(v) + zp) into T (8-bit); NaN cannot occur (finite scales, finite acc).
template <typename T>
T requantize(float v, int64_t zp) {
  double q = static_cast<double>(std::nearbyint(v)) + static_cast<double>(zp);  // nearbyint: ties to even
  q = std::clamp(q, static_cast<double>(std::numeric_limits<T>::lowest()), static_cast<double>(std::numeric_limits<T>::max()));
  return static_cast<T>(q);
}

// --- convolution ----------------------------------------------------------------------------------

// sum((x - x_zp) * (w - w_zp[m])) (+ bias[m]) per output element, in double (exact), in Conv's layout.
inline Tensor conv_accumulate(const Node& n, const Tensor& x, int64_t x_zp, const Tensor& w,
                              const std::vector<int64_t>& w_zp, const Tensor& bias) {
  if (w.rank() < 1) throw n.error("w has shape " + dims_str(w.dims()) + ", expected rank >= 3");
  int64_t m = w.dims()[0];
  require_count(n, w_zp.size(), static_cast<std::size_t>(m), "w_zero_point");
  Tensor xd(DType::Float64, x.dims()), wd(DType::Float64, w.dims());
  std::vector<int64_t> xv = x.to_int64s(), wv = w.to_int64s();
  double* px = xd.data<double>();
  for (std::size_t i = 0; i < xv.size(); ++i) px[i] = static_cast<double>(xv[i] - x_zp);
  double* pw = wd.data<double>();
  int64_t per_m = m ? static_cast<int64_t>(wv.size()) / m : 0;
  for (std::size_t i = 0; i < wv.size(); ++i)
    pw[i] = static_cast<double>(wv[i] - w_zp[w_zp.size() == 1 ? 0 : static_cast<std::size_t>(static_cast<int64_t>(i) / per_m)]);
  Tensor bd;
  if (!bias.empty()) {
    if (bias.dtype() != DType::Int32)
      throw n.error("B has element type " + std::string(dtype_name(bias.dtype())) + "; int32 expected");
    bd = Tensor(DType::Float64, bias.dims());
    for (int64_t i = 0; i < bias.numel(); ++i) bd.data<double>()[i] = bias.at_double(static_cast<std::size_t>(i));
  }
  return nn::conv(n, {xd, wd, bd})[0];
}

inline std::vector<Tensor> qlinear_conv(const Node& n, const std::vector<Tensor>& in) {
  const Tensor &x = required(n, in, 0), &x_scale = required(n, in, 1), &x_zp = required(n, in, 2);
  const Tensor &w = required(n, in, 3), &w_scale = required(n, in, 4), &w_zp = required(n, in, 5);
  const Tensor &y_scale = required(n, in, 6), &y_zp = required(n, in, 7), &bias = input_or_empty(in, 8);
  require_q8(n, x, "x");
  require_q8(n, w, "w");
  require_q8(n, y_zp, "y_zero_point");
  std::vector<float> xs = scales(n, x_scale, "x_scale"), ws = scales(n, w_scale, "w_scale"),
                     ys = scales(n, y_scale, "y_scale");
  std::vector<int64_t> xz = zero_points(n, x_zp, x, "x_zero_point"), wz = zero_points(n, w_zp, w, "w_zero_point"),
                       yz = zero_points(n, y_zp, y_zp, "y_zero_point");
  require_count(n, xs.size(), 1, "x_scale");
  require_count(n, xz.size(), 1, "x_zero_point");
  require_count(n, ys.size(), 1, "y_scale");
  require_count(n, yz.size(), 1, "y_zero_point");
  int64_t m = w.rank() > 0 ? w.dims()[0] : 0;
  require_count(n, ws.size(), static_cast<std::size_t>(m), "w_scale");
  Tensor acc = conv_accumulate(n, x, xz[0], w, wz, bias);
  // One float32 multiplier per output channel, as ONNX Runtime computes it.
  std::vector<float> mult(ws.size());
  for (std::size_t c = 0; c < ws.size(); ++c) mult[c] = xs[0] * ws[c] / ys[0];
  Tensor y(y_zp.dtype(), acc.dims());
  int64_t inner = nn::product(acc.dims(), 2);
  const double* pa = acc.data<double>();
  dispatch_dtype(y.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>) {
      T* py = y.data<T>();
      for (int64_t i = 0; i < acc.numel(); ++i) {
        float s = mult[mult.size() == 1 ? 0 : static_cast<std::size_t>((i / inner) % m)];
        py[i] = requantize<T>(static_cast<float>(wrap_int32(static_cast<int64_t>(pa[i]))) * s, yz[0]);
      }
    }
  });
  return {y};
}

inline std::vector<Tensor> conv_integer(const Node& n, const std::vector<Tensor>& in) {
  const Tensor &x = required(n, in, 0), &w = required(n, in, 1);
  require_q8(n, x, "x");
  require_q8(n, w, "w");
  std::vector<int64_t> xz = zero_points(n, input_or_empty(in, 2), x, "x_zero_point"),
                       wz = zero_points(n, input_or_empty(in, 3), w, "w_zero_point");
  require_count(n, xz.size(), 1, "x_zero_point");
  Tensor acc = conv_accumulate(n, x, xz[0], w, wz, Tensor());
  Tensor y(DType::Int32, acc.dims());
  const double* pa = acc.data<double>();
  for (int64_t i = 0; i < acc.numel(); ++i) y.data<std::int32_t>()[i] = wrap_int32(static_cast<int64_t>(pa[i]));
  return {y};
}

// --- matrix product -------------------------------------------------------------------------------

// numpy.matmul geometry: vectors promoted to matrices, batch dims broadcast.
struct MatMulGeom {
  std::vector<int64_t> ad, bd, out_dims, a_map, b_map;
  int64_t m = 0, k = 0, nn = 0, batches = 0;
};
inline MatMulGeom matmul_geom(const Node& n, const Tensor& a, const Tensor& b) {
  if (a.rank() == 0 || b.rank() == 0)
    throw n.error("matrix operands must have rank >= 1, got " + dims_str(a.dims()) + " and " + dims_str(b.dims()));
  MatMulGeom g;
  g.ad = a.dims();
  g.bd = b.dims();
  bool a_vec = g.ad.size() == 1, b_vec = g.bd.size() == 1;
  if (a_vec) g.ad.insert(g.ad.begin(), 1);
  if (b_vec) g.bd.push_back(1);
  g.m = g.ad[g.ad.size() - 2];
  g.k = g.ad.back();
  g.nn = g.bd.back();
  if (g.bd[g.bd.size() - 2] != g.k) throw n.error("inner dimensions differ: " + dims_str(a.dims()) + " x " + dims_str(b.dims()));
  std::vector<int64_t> a_batch(g.ad.begin(), g.ad.end() - 2), b_batch(g.bd.begin(), g.bd.end() - 2);
  std::vector<int64_t> batch = detail::broadcast_dims(n, a_batch, b_batch);
  g.a_map = detail::broadcast_index_map(a_batch, batch);
  g.b_map = detail::broadcast_index_map(b_batch, batch);
  g.batches = static_cast<int64_t>(g.a_map.size());
  g.out_dims = batch;
  if (!a_vec) g.out_dims.push_back(g.m);
  if (!b_vec) g.out_dims.push_back(g.nn);
  return g;
}

// A per-tensor / per-row (of A) / per-column (of B) parameter broadcast to the operand's (promoted)
// dims. ONNX writes A's per-row parameter of a 2-D [M, K] as an M-vector, which numpy would broadcast
// along K: that one case is read as [M, 1]; the N-D forms ([.., M, 1], [.., 1, N]) broadcast as they are.
inline std::vector<int64_t> param_map(const Node& n, const Tensor& p, const std::vector<int64_t>& dims, bool row,
                                      const std::string& role) {
  std::vector<int64_t> pd = p.dims();
  if (p.numel() == 1) pd.assign(1, 1);
  else if (row && pd.size() == 1 && pd[0] == dims[dims.size() - 2]) pd = {pd[0], 1};
  if (pd.size() > dims.size() || detail::broadcast_dims(n, dims, pd) != dims)
    throw n.error(role + " has shape " + dims_str(p.dims()) + ", which is neither per tensor nor per " +
                  (row ? "row of " : "column of ") + dims_str(dims));
  return detail::broadcast_index_map(pd, dims);
}

// (A - a_zp) x (B - b_zp), accumulated exactly and wrapped to int32.
inline std::vector<std::int32_t> matmul_accumulate(const Node& n, const MatMulGeom& g, const Tensor& a,
                                                   const Tensor& a_zp, const Tensor& b, const Tensor& b_zp) {
  std::vector<int64_t> av = a.to_int64s(), bv = b.to_int64s();
  if (!a_zp.empty()) {
    std::vector<int64_t> z = zero_points(n, a_zp, a, "a_zero_point"), map = param_map(n, a_zp, g.ad, true, "a_zero_point");
    for (std::size_t i = 0; i < av.size(); ++i) av[i] -= z[static_cast<std::size_t>(map[i])];
  }
  if (!b_zp.empty()) {
    std::vector<int64_t> z = zero_points(n, b_zp, b, "b_zero_point"), map = param_map(n, b_zp, g.bd, false, "b_zero_point");
    for (std::size_t i = 0; i < bv.size(); ++i) bv[i] -= z[static_cast<std::size_t>(map[i])];
  }
  std::vector<std::int32_t> out(static_cast<std::size_t>(g.batches * g.m * g.nn));
  std::vector<int64_t> row(static_cast<std::size_t>(g.nn));
  for (int64_t bi = 0; bi < g.batches; ++bi) {
    const int64_t* pa = av.data() + g.a_map[static_cast<std::size_t>(bi)] * g.m * g.k;
    const int64_t* pb = bv.data() + g.b_map[static_cast<std::size_t>(bi)] * g.k * g.nn;
    for (int64_t i = 0; i < g.m; ++i) {
      std::fill(row.begin(), row.end(), 0);
      for (int64_t p = 0; p < g.k; ++p) {
        int64_t x = pa[i * g.k + p];
        for (int64_t j = 0; j < g.nn; ++j) row[static_cast<std::size_t>(j)] += x * pb[p * g.nn + j];
      }
      for (int64_t j = 0; j < g.nn; ++j) out[static_cast<std::size_t>((bi * g.m + i) * g.nn + j)] = wrap_int32(row[static_cast<std::size_t>(j)]);
    }
  }
  return out;
}

inline std::vector<Tensor> matmul_integer(const Node& n, const std::vector<Tensor>& in) {
  const Tensor &a = required(n, in, 0), &b = required(n, in, 1);
  require_q8(n, a, "A");
  require_q8(n, b, "B");
  MatMulGeom g = matmul_geom(n, a, b);
  std::vector<std::int32_t> acc = matmul_accumulate(n, g, a, input_or_empty(in, 2), b, input_or_empty(in, 3));
  return {Tensor::from_vector(g.out_dims, acc)};
}

inline std::vector<Tensor> qlinear_matmul(const Node& n, const std::vector<Tensor>& in) {
  const Tensor &a = required(n, in, 0), &a_scale = required(n, in, 1), &a_zp = required(n, in, 2);
  const Tensor &b = required(n, in, 3), &b_scale = required(n, in, 4), &b_zp = required(n, in, 5);
  const Tensor &y_scale = required(n, in, 6), &y_zp = required(n, in, 7);
  require_q8(n, a, "a");
  require_q8(n, b, "b");
  require_q8(n, y_zp, "y_zero_point");
  std::vector<float> as = scales(n, a_scale, "a_scale"), bs = scales(n, b_scale, "b_scale"),
                     ys = scales(n, y_scale, "y_scale");
  std::vector<int64_t> yz = zero_points(n, y_zp, y_zp, "y_zero_point");
  require_count(n, ys.size(), 1, "y_scale");
  require_count(n, yz.size(), 1, "y_zero_point");
  MatMulGeom g = matmul_geom(n, a, b);
  std::vector<std::int32_t> acc = matmul_accumulate(n, g, a, a_zp, b, b_zp);
  std::vector<int64_t> a_map = param_map(n, a_scale, g.ad, true, "a_scale"),
                       b_map = param_map(n, b_scale, g.bd, false, "b_scale");
  Tensor y(y_zp.dtype(), g.out_dims);
  dispatch_dtype(y.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>) {
      T* py = y.data<T>();
      for (int64_t bi = 0; bi < g.batches; ++bi) {
        int64_t a0 = g.a_map[static_cast<std::size_t>(bi)] * g.m * g.k, b0 = g.b_map[static_cast<std::size_t>(bi)] * g.k * g.nn;
        for (int64_t i = 0; i < g.m; ++i)
          for (int64_t j = 0; j < g.nn; ++j) {
            float sa = as[static_cast<std::size_t>(a_map[static_cast<std::size_t>(a0 + i * g.k)])];
            float sb = bs[static_cast<std::size_t>(b_map[static_cast<std::size_t>(b0 + j)])];
            std::size_t o = static_cast<std::size_t>((bi * g.m + i) * g.nn + j);
            py[o] = requantize<T>(static_cast<float>(acc[o]) * (sa * sb / ys[0]), yz[0]);
          }
      }
    }
  });
  return {y};
}

// --- DynamicQuantizeLinear ------------------------------------------------------------------------

// uint8 over the range of x widened to include 0: scale = (max - min) / 255, zero point =
// saturate(round(0 - min / scale)), y = saturate(round(x / scale) + zero point), all in float32. An
// all-zero x has no range: scale 1, zero point 0 (as ONNX Runtime does; 0 / 0 would be NaN).
inline std::vector<Tensor> dynamic_quantize(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = required(n, in, 0);
  if (x.dtype() != DType::Float32)
    throw n.error("x has element type " + std::string(dtype_name(x.dtype())) + "; DynamicQuantizeLinear takes float32");
  const float* px = x.data<float>();
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!std::isfinite(px[i]))
      throw n.error("x holds " + std::to_string(px[i]) + " at index " + std::to_string(i) +
                    ": no quantization range can include it");
    lo = std::min(lo, px[i]);
    hi = std::max(hi, px[i]);
  }
  float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  float zp = std::nearbyint(std::clamp(0.0f - lo / scale, 0.0f, 255.0f));
  Tensor y(DType::UInt8, x.dims());
  std::uint8_t* py = y.data<std::uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) py[i] = requantize<std::uint8_t>(px[i] / scale, static_cast<int64_t>(zp));
  return {y, Tensor::scalar<float>(scale), Tensor::scalar<std::uint8_t>(static_cast<std::uint8_t>(zp))};
}

}  // namespace detail::qop

inline void register_qoperator_kernels(KernelTable& table) {
  namespace k = detail::qop;
  table["QLinearConv"] = k::qlinear_conv;
  table["ConvInteger"] = k::conv_integer;
  table["QLinearMatMul"] = k::qlinear_matmul;
  table["MatMulInteger"] = k::matmul_integer;
  table["DynamicQuantizeLinear"] = k::dynamic_quantize;
}

}  // namespace ondine::reference
