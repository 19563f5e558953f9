// SPDX-License-Identifier: Apache-2.0
// ondine/reference/quantized.hpp - reference kernels for Ondine's quantized ops (definition:
// ir/infer/quantized.hpp): integer accumulation (exact: the integer operands are summed in double),
// rescaling and the post-ops in double, then round-half-even and saturation into the output type.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ondine/ir/infer/quantized.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::quantized {

namespace nn = ::ondine::reference::detail::nn;

inline void require_int8(const Node& n, const Tensor& t, const char* what) {
  if (t.dtype() != DType::UInt8 && t.dtype() != DType::Int8)
    throw n.error(std::string(what) + " must be uint8 or int8, not " + std::string(dtype_name(t.dtype())));
}

// q - zero_point as exact Float64 values (optionally times scale).
inline Tensor centered(const Tensor& q, std::int32_t zero_point, double scale = 1.0) {
  std::vector<double> v = nn::to_doubles(q);
  for (double& e : v) e = (e - zero_point) * scale;
  return nn::from_doubles(DType::Float64, q.dims(), v);
}

inline double round_half_even(double x) { return std::nearbyint(x); }  // default rounding mode: ties to even

inline double quantize(double r, const qops::QParam& p) {
  double lo = p.type == DType::UInt8 ? 0 : -128, hi = p.type == DType::UInt8 ? 255 : 127;
  double q = round_half_even(r / p.scale) + p.zero_point;
  return std::isnan(q) ? p.zero_point : std::min(hi, std::max(lo, q));
}

// The post-op tail shared by QConv and QMatMul: r = acc * x_scale * w_scale[c] + B[c], then mid, Sum,
// activations and the output quantization. `acc` is laid out [outer, channels, inner].
inline Tensor finish(const Node& n, const qops::QAttrs& a, const std::vector<std::int64_t>& dims,
                     const std::vector<double>& acc, std::int64_t channels, std::int64_t inner, const Tensor& bias,
                     const Tensor& sum) {
  std::vector<double> b = bias.empty() ? std::vector<double>() : nn::to_doubles(bias);
  std::vector<double> s;
  if (!sum.empty()) {
    require_int8(n, sum, "Sum");
    if (sum.dims() != dims) throw n.error("Sum has shape " + dims_str(sum.dims()) + ", expected " + dims_str(dims));
    s = nn::to_doubles(sum);
  }
  if (!b.empty() && static_cast<std::int64_t>(b.size()) != channels) throw n.error("bias has the wrong length");
  std::vector<double> y(acc.size());
  for (std::size_t i = 0; i < acc.size(); ++i) {
    auto c = static_cast<std::int64_t>(i / static_cast<std::size_t>(inner)) % channels;
    double r = acc[i] * static_cast<double>(a.x.scale) * static_cast<double>(a.w_scale_at(c));
    if (!b.empty()) r += b[static_cast<std::size_t>(c)];
    if (a.has_mid) r = (quantize(r, a.mid) - a.mid.zero_point) * static_cast<double>(a.mid.scale);
    if (!s.empty()) r += (s[i] - a.sum.zero_point) * static_cast<double>(a.sum.scale);
    r = fused::apply(a.activations, r);
    y[i] = a.output_type == DType::Float32 ? r : quantize(r, a.y);
  }
  return nn::from_doubles(a.output_type, dims, y);
}

inline std::vector<Tensor> qconv(const Node& n, const std::vector<Tensor>& inputs) {
  qops::QAttrs a = qops::read_attrs(n);
  const Tensor& x = nn::required(n, inputs, 0);
  const Tensor& w = nn::required(n, inputs, 1);
  require_int8(n, x, "X");
  if (w.dtype() != DType::Int8) throw n.error("W must be int8");
  Tensor acc = nn::conv(n, {centered(x, a.x.zero_point), centered(w, 0)}).at(0);
  std::int64_t channels = acc.dims()[1], inner = 1;
  for (std::size_t i = 2; i < acc.rank(); ++i) inner *= acc.dims()[i];
  return {finish(n, a, acc.dims(), nn::to_doubles(acc), channels, inner, nn::input_or_empty(inputs, 2),
                 nn::input_or_empty(inputs, 3))};
}

inline std::vector<Tensor> qmatmul(const Node& n, const std::vector<Tensor>& inputs) {
  qops::QAttrs a = qops::read_attrs(n);
  const Tensor& x = nn::required(n, inputs, 0);
  const Tensor& w = nn::required(n, inputs, 1);
  require_int8(n, x, "A");
  if (w.dtype() != DType::Int8 || w.rank() != 2) throw n.error("W must be int8 of rank 2");
  Tensor acc = nn::matmul(n, {centered(x, a.x.zero_point), centered(w, 0)}).at(0);
  return {finish(n, a, acc.dims(), nn::to_doubles(acc), w.dims()[1], 1, nn::input_or_empty(inputs, 2), Tensor())};
}

// In float32 like the MatMulInteger/ConvInteger -> Cast -> Mul -> Add they stand for (so the two agree
// bit for bit). `acc`: the exact integer products, channels at `axis`.
inline Tensor dyn_finish(const Node& n, const std::vector<Tensor>& inputs, const Tensor& acc, std::size_t axis) {
  const Tensor& x_scale = nn::required(n, inputs, 1);
  const Tensor& bias = nn::input_or_empty(inputs, 4);
  std::vector<float> w_scale = n.attr_floats("w_scale", {1.0f});
  std::vector<fused::Activation> activations = fused::read_activations(n);
  const std::int64_t channels = acc.dims()[axis];
  std::int64_t inner = 1;
  for (std::size_t i = axis + 1; i < acc.rank(); ++i) inner *= acc.dims()[i];
  if (!bias.empty() && (bias.dtype() != DType::Float32 || bias.numel() != channels))
    throw n.error("bias must be float32 with one value per output channel");
  if (w_scale.size() != 1 && static_cast<std::int64_t>(w_scale.size()) != channels)
    throw n.error("w_scale must have 1 entry or one per output channel");
  const float a_scale = x_scale.data<float>()[0];
  std::vector<double> v = nn::to_doubles(acc);
  Tensor y(DType::Float32, acc.dims());
  float* out = y.data<float>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / inner) % channels);
    float scale = a_scale * w_scale[w_scale.size() == 1 ? 0 : c];
    float r = static_cast<float>(static_cast<std::int32_t>(v[i])) * scale;
    if (!bias.empty()) r += bias.data<float>()[c];
    out[i] = activations.empty() ? r : static_cast<float>(fused::apply(activations, r));
  }
  return y;
}

inline void check_dynamic_inputs(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = nn::required(n, inputs, 0);
  const Tensor& x_scale = nn::required(n, inputs, 1);
  const Tensor& x_zero = nn::required(n, inputs, 2);
  const Tensor& w = nn::required(n, inputs, 3);
  if (x.dtype() != DType::UInt8 || x_zero.dtype() != DType::UInt8 || x_scale.dtype() != DType::Float32 ||
      x_scale.numel() != 1 || x_zero.numel() != 1)
    throw n.error("A and A_zero_point must be uint8 and A_scale one float32");
  if (w.dtype() != DType::Int8 && w.dtype() != DType::Int16) throw n.error("W must be int8 or int16");
}

inline std::vector<Tensor> dyn_qmatmul(const Node& n, const std::vector<Tensor>& inputs) {
  check_dynamic_inputs(n, inputs);
  const Tensor& w = inputs[3];
  if (w.rank() != 2) throw n.error("W must have rank 2");
  Tensor acc = nn::matmul(n, {centered(inputs[0], inputs[2].data<std::uint8_t>()[0]), centered(w, 0)}).at(0);
  return {dyn_finish(n, inputs, acc, acc.rank() - 1)};
}

inline std::vector<Tensor> dyn_qconv(const Node& n, const std::vector<Tensor>& inputs) {
  check_dynamic_inputs(n, inputs);
  Tensor acc = nn::conv(n, {centered(inputs[0], inputs[2].data<std::uint8_t>()[0]), centered(inputs[3], 0)}).at(0);
  return {dyn_finish(n, inputs, acc, 1)};
}

inline std::vector<Tensor> qpool(const Node& n, const std::vector<Tensor>& inputs) {
  qops::QAttrs a = qops::read_attrs(n);
  const Tensor& x = nn::required(n, inputs, 0);
  require_int8(n, x, "X");
  std::string op = n.attr_string("pool_op");
  Tensor real = centered(x, a.x.zero_point, a.x.scale);
  bool is_max = op == "MaxPool" || op == "GlobalMaxPool";
  Tensor p = op.rfind("Global", 0) == 0 ? nn::global_pool(n, {real}, is_max).at(0) : nn::pool(n, {real}, is_max).at(0);
  std::vector<double> v = nn::to_doubles(p);
  for (double& e : v) {
    e = fused::apply(a.activations, e);
    if (a.output_type != DType::Float32) e = quantize(e, a.y);
  }
  return {nn::from_doubles(a.output_type, p.dims(), v)};
}

// The dequantized weights, in float32 as DequantizeLinear computes them, then MatMul's kernel.
inline std::vector<Tensor> weight_only_matmul(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& a = nn::required(n, inputs, 0);
  const Tensor& q = nn::required(n, inputs, 1);
  const Tensor& s = nn::required(n, inputs, 2);
  const Tensor& z = nn::input_or_empty(inputs, 3);
  const std::int64_t block = n.attr_int("block_size", 0);
  if (q.rank() != 2 || block <= 0 || s.dtype() != DType::Float32) throw n.error("Q must have rank 2, S be float32");
  const std::int64_t K = q.dims()[0], N = q.dims()[1], blocks = (K + block - 1) / block;
  if (s.dims() != std::vector<std::int64_t>{blocks, N} || (!z.empty() && z.dims() != s.dims()))
    throw n.error("S (and Z) must have shape [ceil(K / block_size), N]");
  if (n.attr_int("int8_activations", 0) != 0) {  // the definition's integer form, in double
    if (a.dtype() != DType::Float32 || a.rank() < 1 || a.dims().back() != K) throw n.error("A must be float32 [..., K]");
    std::vector<std::int64_t> dims = a.dims();
    dims.back() = N;
    Tensor y(DType::Float32, dims);
    const std::int64_t M = K ? a.numel() / K : 0;
    std::vector<double> qa(static_cast<std::size_t>(K));
    for (std::int64_t m = 0; m < M; ++m) {
      const float* row = a.data<float>() + m * K;
      std::vector<double> acc(static_cast<std::size_t>(N), 0.0);
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t k0 = b * block, k1 = std::min(K, k0 + block);
        float amax = 0;
        for (std::int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::abs(row[k]));
        const float inv = amax > 0 ? 127.0f / amax : 0.0f, sa = amax / 127.0f;
        for (std::int64_t k = k0; k < k1; ++k)
          qa[static_cast<std::size_t>(k)] = std::max(-127.0, std::min(127.0, static_cast<double>(std::nearbyint(row[k] * inv))));
        for (std::int64_t c = 0; c < N; ++c) {
          const auto j = static_cast<std::size_t>(b * N + c);
          const double zp = z.empty() ? 0.0 : z.at_double(j);
          double dot = 0;
          for (std::int64_t k = k0; k < k1; ++k)
            dot += qa[static_cast<std::size_t>(k)] * (q.at_double(static_cast<std::size_t>(k * N + c)) - zp);
          acc[static_cast<std::size_t>(c)] += dot * static_cast<double>(s.data<float>()[j]) * static_cast<double>(sa);
        }
      }
      for (std::int64_t c = 0; c < N; ++c) y.data<float>()[m * N + c] = static_cast<float>(acc[static_cast<std::size_t>(c)]);
    }
    return {y};
  }
  Tensor w(DType::Float32, {K, N});
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t c = 0; c < N; ++c) {
      const auto i = static_cast<std::size_t>(k * N + c), j = static_cast<std::size_t>((k / block) * N + c);
      const float zp = z.empty() ? 0.0f : static_cast<float>(z.at_double(j));
      w.data<float>()[i] = (static_cast<float>(q.at_double(i)) - zp) * s.data<float>()[j];
    }
  return nn::matmul(n, {a, w});
}

}  // namespace detail::quantized

inline void register_quantized_kernels(KernelTable& table) {
  namespace k = detail::quantized;
  const std::string d = std::string(fused::kDomain) + ".";
  table[d + "QConv"] = k::qconv;
  table[d + "QMatMul"] = k::qmatmul;
  table[d + "QPool"] = k::qpool;
  table[d + "DynQMatMul"] = k::dyn_qmatmul;
  table[d + "DynQConv"] = k::dyn_qconv;
  table[d + "WeightOnlyMatMul"] = k::weight_only_matmul;
}

}  // namespace ondine::reference
