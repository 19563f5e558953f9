// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/activation.hpp - an activation (a unary op or a fused one) as the oneDNN eltwise
// algorithms that compute it, shared by the standalone eltwise steps and the post-ops of a producer.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/lower/detail/context.hpp"

namespace ondine::lower::detail {

// One activation as up to two oneDNN eltwise algorithms applied in order, or (a post-op chain only, no ops)
// a PRelu with one slope per channel, the constant `prelu_slope` (Ondine's kernel: take_trailing_prelu).
struct EltwiseSpec {
  struct Op {
    dnnl::algorithm alg;
    float alpha = 0, beta = 0;
  };
  std::vector<Op> ops;
  const Value* prelu_slope = nullptr;
};

inline bool is_f32(const Value* v) { return v && v->dtype() == DType::Float32 && v->shape().is_static(); }

// A constant scalar input (Clip's min/max since opset 11), or `fallback` when the input is omitted.
// nullopt when it is present but not a constant f32 scalar.
inline std::optional<float> constant_scalar(const Node& n, std::size_t i, float fallback) {
  const Value* v = n.input(i);
  if (!v) return fallback;
  if (!v->is_constant() || v->dtype() != DType::Float32 || v->constant().numel() != 1) return std::nullopt;
  return v->constant().data<float>()[0];
}

// The oneDNN algorithms computing one activation of a fused op's chain (ondine/ir/fused_ops.hpp).
inline EltwiseSpec eltwise_of(const fused::Activation& a) {
  using A = dnnl::algorithm;
  EltwiseSpec s;
  auto one = [&](A alg, float alpha = 0, float beta = 0) {
    s.ops.push_back({alg, alpha, beta});
    return s;
  };
  const std::string& op = a.op;
  if (op == "Relu") return one(A::eltwise_relu);
  if (op == "LeakyRelu") return one(A::eltwise_relu, a.alpha);
  if (op == "Sigmoid") return one(A::eltwise_logistic);
  if (op == "Tanh") return one(A::eltwise_tanh);
  if (op == "Elu") return one(A::eltwise_elu, a.alpha);
  if (op == "HardSwish") return one(A::eltwise_hardswish);
  if (op == "Gelu") return one(A::eltwise_gelu_erf);
  if (op == "GeluTanh") return one(A::eltwise_gelu_tanh);
  if (op == "Swish") return one(A::eltwise_swish, a.alpha);  // x * logistic(alpha * x)
  if (op == "HardSigmoid") {  // max(0, min(1, alpha * x + beta))
    s.ops.push_back({A::eltwise_linear, a.alpha, a.beta});
    return one(A::eltwise_clip_v2, 0.0f, 1.0f);
  }
  if (op == "FakeQuantU8" || op == "FakeQuantS8") {
    // clamp(round(x / scale), qmin - zp, qmax - zp) * scale: algorithms no other activation uses (eltwise_clip,
    // pow with exponent 1 for the final scale), so a chain with a Clip (clip_v2) or HardSigmoid (linear) never
    // repeats one with other parameters (repeats_eltwise_alg). x * (1 / scale) is x / scale but in rare ties.
    const auto [qmin, qmax] = fused::fake_quant_range(a);
    s.ops.push_back({A::eltwise_linear, 1.0f / a.alpha, 0.0f});
    s.ops.push_back({A::eltwise_round});
    s.ops.push_back({A::eltwise_clip, qmin - a.beta, qmax - a.beta});
    return one(A::eltwise_pow, a.alpha, 1.0f);
  }
  if (op == "Clip") {  // min(max(x, lo), hi); unbounded sides as the float range, lo > hi gives hi
    const float big = std::numeric_limits<float>::max();
    float lo = std::max(a.alpha, -big), hi = std::min(a.beta, big);
    if (lo > hi) lo = hi;
    if (lo == 0 && hi == big) return one(A::eltwise_relu);
    return one(A::eltwise_clip_v2, lo, hi);
  }
  throw Error("internal: no oneDNN algorithm for activation '" + op + "'");
}

// A FakeQuant activation as eltwise_of writes it, for Ondine's kernels that compute it themselves (the
// Winograd output transform): y = clamp(round(x * inv_scale), lo, hi) * scale; nullopt for anything else.
struct FakeQuantParams {
  float inv_scale = 1, lo = 0, hi = 0, scale = 1;
};
inline std::optional<FakeQuantParams> fake_quant_params(const EltwiseSpec& e) {
  using A = dnnl::algorithm;
  if (e.prelu_slope || e.ops.size() != 4 || e.ops[0].alg != A::eltwise_linear || e.ops[0].beta != 0 ||
      e.ops[1].alg != A::eltwise_round || e.ops[2].alg != A::eltwise_clip || e.ops[3].alg != A::eltwise_pow ||
      e.ops[3].beta != 1.0f)
    return std::nullopt;
  return FakeQuantParams{e.ops[0].alpha, e.ops[2].alpha, e.ops[2].beta, e.ops[3].alpha};
}

// The oneDNN algorithms computing node `n` (a unary op on f32), or nullopt.
// Whatever the shapes (the shape-free kernels, lower/detail/dynamic_kernels.hpp): float32 in and out.
inline std::optional<EltwiseSpec> eltwise_algorithms(const Node& n) {
  using A = dnnl::algorithm;
  const std::string& op = n.op_type();
  auto f32 = [](const Value* v) { return v && v->dtype() == DType::Float32; };
  if (n.num_outputs() != 1 || !f32(n.input(0)) || !f32(n.output(0))) return std::nullopt;
  if (!n.domain().empty() || op == "Gelu") {  // ondine.Gelu or FakeQuant, or ONNX Gelu (opset 20)
    auto act = op == "Gelu" || op == "FakeQuant" ? fused::as_activation(n) : std::nullopt;
    if (!act) return std::nullopt;
    return eltwise_of(*act);
  }
  EltwiseSpec s;
  auto one = [&](A alg, float alpha = 0, float beta = 0) {
    s.ops.push_back({alg, alpha, beta});
    return std::optional<EltwiseSpec>(s);
  };
  if (op == "Relu") return one(A::eltwise_relu);
  if (op == "LeakyRelu") return one(A::eltwise_relu, n.attr_float("alpha", 0.01f));
  if (op == "Sigmoid") return one(A::eltwise_logistic);
  if (op == "Tanh") return one(A::eltwise_tanh);
  if (op == "Elu") return one(A::eltwise_elu, n.attr_float("alpha", 1.0f));
  if (op == "Exp") return one(A::eltwise_exp);
  if (op == "Log") return one(A::eltwise_log);
  if (op == "Sqrt") return one(A::eltwise_sqrt);
  if (op == "Abs") return one(A::eltwise_abs);
  if (op == "Neg") return one(A::eltwise_linear, -1.0f, 0.0f);
  if (op == "Softplus") return one(A::eltwise_soft_relu);
  if (op == "HardSwish") return one(A::eltwise_hardswish);
  if (op == "Reciprocal") return one(A::eltwise_pow, 1.0f, -1.0f);
  if (op == "Pow") {  // x ^ e with a constant scalar exponent e
    const Value* e = n.input(1);
    if (!e || !e->is_constant() || e->constant().numel() != 1 || !is_floating(e->dtype())) return std::nullopt;
    float exponent = static_cast<float>(e->constant().at_double(0));
    if (exponent == 2.0f) return one(A::eltwise_square);
    if (exponent == 0.5f) return one(A::eltwise_sqrt);
    return one(A::eltwise_pow, 1.0f, exponent);
  }
  if (op == "HardSigmoid") {  // max(0, min(1, alpha * x + beta))
    s.ops.push_back({A::eltwise_linear, n.attr_float("alpha", 0.2f), n.attr_float("beta", 0.5f)});
    return one(A::eltwise_clip_v2, 0.0f, 1.0f);
  }
  if (op == "Clip") {
    float lo = -std::numeric_limits<float>::max(), hi = std::numeric_limits<float>::max();
    if (n.opset() < 11) {
      lo = n.attr_float("min", lo);
      hi = n.attr_float("max", hi);
    } else {
      auto a = constant_scalar(n, 1, lo), b = constant_scalar(n, 2, hi);
      if (!a || !b) return std::nullopt;
      lo = *a;
      hi = *b;
    }
    if (std::isnan(lo) || std::isnan(hi)) return std::nullopt;
    // ONNX: min(max(x, lo), hi), so lo > hi gives hi everywhere; clip_v2 needs lo <= hi.
    if (lo > hi) lo = hi;
    if (lo == 0 && hi == std::numeric_limits<float>::max()) return one(A::eltwise_relu);
    return one(A::eltwise_clip_v2, lo, hi);
  }
  return std::nullopt;
}

// The oneDNN algorithms computing node `n` (a unary op on f32 with static shapes), or nullopt.
inline std::optional<EltwiseSpec> eltwise_spec(const Node& n) {
  if (!is_f32(n.input(0)) || !is_f32(n.output(0))) return std::nullopt;
  return eltwise_algorithms(n);
}

inline const char* alg_name(dnnl::algorithm a) {
  return dnnl_alg_kind2str(static_cast<dnnl_alg_kind_t>(a));
}

inline std::string eltwise_detail(const EltwiseSpec& s) {
  if (s.prelu_slope) return "prelu('" + s.prelu_slope->name() + "')";
  std::string d;
  for (auto& op : s.ops) d += (d.empty() ? "" : "+") + std::string(alg_name(op.alg));
  return d;
}

}  // namespace ondine::lower::detail
