// SPDX-License-Identifier: Apache-2.0
// ondine/reference/fused.hpp - reference kernels for Ondine's own ops (semantics: ir/fused_ops.hpp).
//
// Each fused op runs its base op's reference kernel (Conv, MatMul, Gemm) on the base inputs, then
// adds Bias and Sum and applies the activation chain in double, rounding once into the output type.
// Nothing here knows the passes or oneDNN: these kernels are the oracle for both, and the compiled
// runtime's fallback when oneDNN rejects a fused form.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/reference/common.hpp"
#include "ondine/reference/nn.hpp"

namespace ondine::reference {
namespace detail::fused_ops {

namespace nn = ::ondine::reference::detail::nn;

// y[i] = chain(y[i] + bias[i % bias.numel()] + sum[i]) over the base op's result `base`.
inline Tensor finish(const Node& n, const Tensor& base, const Tensor& bias, const Tensor& sum) {
  std::vector<fused::Activation> chain = fused::read_activations(n);
  if (!is_floating(base.dtype()))
    throw n.error("output has element type " + std::string(dtype_name(base.dtype())) + "; expected a floating-point type");
  std::vector<double> y = nn::to_doubles(base);
  if (!bias.empty()) {
    nn::require_same_dtype(n, base, bias, "Bias");
    std::int64_t last = base.rank() ? base.dims().back() : 1;
    nn::require_vector(n, bias, last, "Bias");
    std::vector<double> b = nn::to_doubles(bias);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += b[i % b.size()];
  }
  if (!sum.empty()) {
    nn::require_same_dtype(n, base, sum, "Sum");
    if (sum.dims() != base.dims())
      throw n.error("Sum has shape " + dims_str(sum.dims()) + ", expected the output's " + dims_str(base.dims()));
    std::vector<double> s = nn::to_doubles(sum);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += s[i];
  }
  if (!chain.empty())
    for (double& v : y) v = fused::apply(chain, v);
  return nn::from_doubles(base.dtype(), base.dims(), y);
}

inline std::vector<Tensor> base_inputs(const std::vector<Tensor>& inputs, std::size_t count) {
  return std::vector<Tensor>(inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(std::min(count, inputs.size())));
}

inline std::vector<Tensor> fused_conv(const Node& n, const std::vector<Tensor>& inputs) {
  Tensor y = nn::conv(n, base_inputs(inputs, 3)).at(0);
  return {finish(n, y, Tensor(), nn::input_or_empty(inputs, 3))};
}

inline std::vector<Tensor> fused_matmul(const Node& n, const std::vector<Tensor>& inputs) {
  nn::require_floating(n, nn::required(n, inputs, 0), "A");
  Tensor y = nn::matmul(n, base_inputs(inputs, 2)).at(0);
  return {finish(n, y, nn::input_or_empty(inputs, 2), nn::input_or_empty(inputs, 3))};
}

inline std::vector<Tensor> fused_gemm(const Node& n, const std::vector<Tensor>& inputs) {
  nn::require_floating(n, nn::required(n, inputs, 0), "A");
  Tensor y = nn::gemm(n, base_inputs(inputs, 3)).at(0);
  return {finish(n, y, Tensor(), Tensor())};
}

inline std::vector<Tensor> gelu(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = nn::required(n, inputs, 0);
  nn::require_floating(n, x, "X");
  std::string approximate = n.attr_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    throw n.error("approximate must be \"none\" or \"tanh\", not \"" + approximate + "\"");
  fused::Activation a{approximate == "tanh" ? "GeluTanh" : "Gelu"};
  std::vector<double> v = nn::to_doubles(x);
  for (double& e : v) e = fused::apply(a, e);
  return {nn::from_doubles(x.dtype(), x.dims(), v)};
}

// ondine.FakeQuant: QuantizeLinear then DequantizeLinear, in float32 as those kernels compute (fused::apply).
inline std::vector<Tensor> fake_quant(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& x = nn::required(n, inputs, 0);
  if (x.dtype() != DType::Float32)
    throw n.error("X has element type " + std::string(dtype_name(x.dtype())) + "; FakeQuant takes float32");
  std::optional<fused::Activation> a = fused::fake_quant_of(n);
  if (!a) throw n.error("needs a positive finite 'scale', 'to' \"uint8\" or \"int8\" and a 'zero_point' of that type");
  Tensor y(DType::Float32, x.dims());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) py[i] = static_cast<float>(fused::apply(*a, px[i]));
  return {y};
}

// ondine.Attention: every step in double, rounded once into Q's type. The two products reuse the
// MatMul kernel on float64 copies (so batch dims and errors read as MatMul's).
inline std::vector<Tensor> attention(const Node& n, const std::vector<Tensor>& inputs) {
  const Tensor& q = nn::required(n, inputs, 0);
  const Tensor& k = nn::required(n, inputs, 1);
  const Tensor& v = nn::required(n, inputs, 2);
  nn::require_floating(n, q, "Q");
  nn::require_same_dtype(n, q, k, "K");
  nn::require_same_dtype(n, q, v, "V");
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank())
    throw n.error("Q, K and V must have one rank >= 2, got " + dims_str(q.dims()) + ", " + dims_str(k.dims()) +
                  " and " + dims_str(v.dims()));
  auto f64 = [](const Tensor& t) { return nn::from_doubles(DType::Float64, t.dims(), nn::to_doubles(t)); };
  // Grouped-query attention: K and V repeated to Q's heads (query index i reads i / group).
  auto ungrouped = [&](const Tensor& t, const char* what) {
    Tensor d = f64(t);
    const std::vector<std::int64_t> qb(q.dims().begin(), q.dims().end() - 2), tb(t.dims().begin(), t.dims().end() - 2);
    if (qb == tb) return d;
    std::optional<std::vector<std::int64_t>> g = fused::attention_groups(qb, tb);
    if (!g)
      throw n.error(std::string(what) + " " + dims_str(t.dims()) + " has batch dims that neither equal nor divide Q's " +
                    dims_str(q.dims()));
    std::vector<std::int64_t> out = qb;
    out.push_back(t.dims()[t.rank() - 2]);
    out.push_back(t.dims()[t.rank() - 1]);
    const std::int64_t mat = out[out.size() - 2] * out.back(), batches = nn::product(qb);
    std::vector<double> src = nn::to_doubles(d), dst(static_cast<std::size_t>(batches * mat));
    for (std::int64_t b = 0; b < batches; ++b) {
      std::int64_t rest = b, from = 0, stride = 1;
      for (std::size_t i = qb.size(); i-- > 0;) {
        const std::int64_t idx = rest % qb[i];
        rest /= qb[i];
        from += idx / (*g)[i] * stride;
        stride *= tb[i];
      }
      std::copy_n(src.begin() + from * mat, mat, dst.begin() + b * mat);
    }
    return nn::from_doubles(DType::Float64, out, dst);
  };
  Tensor scores = nn::matmul(n, {f64(q), ungrouped(k, "K")}).at(0);
  const std::vector<std::int64_t> sd = scores.dims();
  std::vector<double> s = nn::to_doubles(scores);
  double scale = n.attr_float("scale", 1.0f);
  for (double& e : s) e *= scale;
  if (inputs.size() > 3 && !inputs[3].empty()) {
    const Tensor& mask = inputs[3];
    nn::require_same_dtype(n, q, mask, "Mask");
    if (detail::broadcast_dims(n, sd, mask.dims()) != sd)
      throw n.error("Mask " + dims_str(mask.dims()) + " does not broadcast to the scores " + dims_str(sd));
    std::vector<double> m = nn::to_doubles(mask);
    std::vector<std::int64_t> at = detail::broadcast_index_map(mask.dims(), sd);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += m[static_cast<std::size_t>(at[i])];
  }
  // Softmax over the last axis; a row of -inf (fully masked) gives NaN, as the unfused ops do.
  std::int64_t len = sd.back();
  for (std::size_t row = 0; len > 0 && row < s.size(); row += static_cast<std::size_t>(len)) {
    double* x = s.data() + row;
    double mx = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < len; ++j) mx = std::max(mx, x[j]);
    if (std::isinf(mx)) mx = 0;
    double sum = 0;
    for (std::int64_t j = 0; j < len; ++j) sum += (x[j] = std::exp(x[j] - mx));
    for (std::int64_t j = 0; j < len; ++j) x[j] /= sum;
  }
  Tensor y = nn::matmul(n, {nn::from_doubles(DType::Float64, sd, s), ungrouped(v, "V")}).at(0);
  return {nn::from_doubles(q.dtype(), y.dims(), nn::to_doubles(y))};
}

}  // namespace detail::fused_ops

inline void register_fused_kernels(KernelTable& table) {
  namespace k = detail::fused_ops;
  const std::string d = std::string(fused::kDomain) + ".";
  table[d + "FusedConv"] = k::fused_conv;
  table[d + "FusedMatMul"] = k::fused_matmul;
  table[d + "FusedGemm"] = k::fused_gemm;
  table[d + "Gelu"] = k::gelu;
  table["Gelu"] = k::gelu;  // ONNX Gelu (opset 20) is ondine.Gelu: approximate "none" (erf) or "tanh"
  table[d + "Attention"] = k::attention;
  table[d + "FakeQuant"] = k::fake_quant;
}

}  // namespace ondine::reference
