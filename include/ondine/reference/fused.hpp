// ondine/reference/fused.hpp - reference kernels for Ondine's own ops (semantics: ir/fused_ops.hpp).
//
// Each fused op runs its base op's reference kernel (Conv, MatMul, Gemm) on the base inputs, then
// adds Bias and Sum and applies the activation chain in double, rounding once into the output type.
// Nothing here knows the passes or oneDNN: these kernels are the oracle for both, and the compiled
// runtime's fallback when oneDNN rejects a fused form.
#pragma once

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

}  // namespace detail::fused_ops

inline void register_fused_kernels(KernelTable& table) {
  namespace k = detail::fused_ops;
  const std::string d = std::string(fused::kDomain) + ".";
  table[d + "FusedConv"] = k::fused_conv;
  table[d + "FusedMatMul"] = k::fused_matmul;
  table[d + "FusedGemm"] = k::fused_gemm;
  table[d + "Gelu"] = k::gelu;
}

}  // namespace ondine::reference
