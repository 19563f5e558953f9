// SPDX-License-Identifier: Apache-2.0
// ondine/ir/fused_ops.hpp - Ondine's own ops (domain "ondine"): the one definition of their semantics.
//
//   ondine.FusedConv    (X, W, B?, Sum?)   Y = act_k(...act_1(Conv(X, W, B) + Sum))   Conv's attributes
//   ondine.FusedMatMul  (A, B, Bias?, Sum?) Y = act(MatMul(A, B) + Bias + Sum)        Bias [N], Sum Y's shape
//   ondine.FusedGemm    (A, B, C?)          Y = act(Gemm(A, B, C))                    Gemm's attributes
//   ondine.Gelu         (X)                 Y = Gelu(X), approximate = "none" | "tanh" (ONNX opset-20 Gelu)
//   ondine.Attention    (Q, K, V, Mask?)    Y = MatMul(Softmax(scale * MatMul(Q, K) + Mask, axis = -1), V)
//       Q [..., Sq, D], K [..., D, Sk] (the keys already transposed, as the first MatMul reads them),
//       V [..., Sk, Dv], Y [..., Sq, Dv]: one rank >= 2; Mask float, broadcasting to the scores
//       [..., Sq, Sk] without changing them; "scale" a float (1). K and V have Q's batch dims, or
//       fewer heads (grouped-query attention): a batch dim of K (and V) may be a static divisor g of
//       Q's, and query index i along it reads key/value index i / (Q's dim / g), the head order of
//       Hugging Face's repeat_kv (attention_groups() below).
//   ondine.RMSNorm      (X, scale)         Y = X / sqrt(ReduceMean(X^2 over axes [axis, rank)) + epsilon) * scale:
//       ONNX opset 23's RMSNormalization (Llama's RMSNorm); "axis" (-1), "epsilon" (1e-5); scale the
//       normalised shape X.shape[axis:]. Made by fuse-rmsnorm from the ops exporters write.
//   ondine.Rotary       (X, cos, sin)      Y = X * cos + rotate_half(X) * sin, rotate_half(X) = Concat(-X[..., D/2:],
//       X[..., :D/2], axis -1): rotary position embeddings as Hugging Face's apply_rotary_pos_emb writes them.
//       X [..., D] with D even; cos and sin one shape, broadcasting to X's without changing it, last dim D.
//       Made by fuse-rotary.
//   ondine.GroupNorm    (X, scale, bias)    Y = GroupNormalization(X, scale, bias) as of opset 21: X [N, C, ...],
//       scale and bias [C] (one value per channel), "num_groups" dividing C, "epsilon" (1e-5). Made by
//       fuse-groupnorm from the InstanceNormalization form PyTorch exports; shape inference and the
//       reference kernel are GroupNormalization's (ir/infer/nn_extra.hpp, reference/nn_extra.hpp).
//   ondine.ChannelLayerNorm (X, scale, bias?)  X [N, C, ...]: at every position (n, d...) the C values
//       X[n, :, d...] are normalised as LayerNormalization normalises a last axis, then
//       Y = (X - mean) / sqrt(var + epsilon) * scale[c] + bias[c]; scale and bias [C], "epsilon" (1e-5).
//       LayerNormalization(axis -1) read through Transpose(perm [0, 2, ..., 1]) and written back; made by
//       pointwise-as-conv (ConvNeXt's LayerNorm, LayerNorm2d), so a channel-blocked activation is
//       normalised in place of its layout, without the two transposes.
//   ondine.FakeQuant    (X)                Y = DequantizeLinear(QuantizeLinear(X, scale, zero_point), scale, zero_point):
//       X float32; "scale" a positive float, "zero_point" an integer, "to" the quantized type ("uint8" or
//       "int8"). Elementwise: y = (clamp(round_half_even(x / scale), qmin - zp, qmax - zp)) * scale, bit for bit
//       what the two ONNX ops compute in float32 (the rounding is of x / scale, before the zero point is added).
//       Made by fake-quant from the QuantizeLinear/DequantizeLinear pairs a QDQ model keeps in float, so they
//       run as post-ops of the op before them.
//
// The activation chain `act` is three attributes of equal length: "activations" (names, applied in
// order), "activation_alpha" and "activation_beta" (one float each, 0 when the activation has no
// parameter). The names and their parameters:
//   Relu, LeakyRelu(alpha), Clip(alpha = min, beta = max), Sigmoid, Tanh, HardSwish,
//   HardSigmoid(alpha, beta), Elu(alpha), Gelu (erf form), GeluTanh (tanh approximation),
//   Swish(alpha) = x * Sigmoid(alpha * x) (SiLU at alpha 1, as exporters write it: Mul(x, Sigmoid(x))),
//   FakeQuantU8(alpha = scale, beta = zero point), FakeQuantS8(alpha, beta): ondine.FakeQuant to uint8 / int8.
//
// Shape inference (ir/infer/fused.hpp), the reference kernels (reference/fused.hpp), the passes that
// create these ops (passes/fuse_*.hpp) and the oneDNN lowering (lower/) all read the chain through
// the functions here, and the reference kernels compute it with apply().
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine::fused {

inline constexpr const char* kDomain = "ondine";
inline constexpr int kDomainVersion = 1;

// One activation of a post-op chain.
struct Activation {
  std::string op;  // one of activation_names()
  float alpha = 0, beta = 0;
  bool operator==(const Activation& o) const { return op == o.op && alpha == o.alpha && beta == o.beta; }
};

inline const std::vector<std::string>& activation_names() {
  static const std::vector<std::string> names{"Relu",      "LeakyRelu",   "Clip", "Sigmoid", "Tanh",
                                              "HardSwish", "HardSigmoid", "Elu",  "Gelu",    "GeluTanh",
                                              "Swish",     "FakeQuantU8", "FakeQuantS8"};
  return names;
}
inline bool is_activation_name(const std::string& op) {
  const auto& names = activation_names();
  return std::find(names.begin(), names.end(), op) != names.end();
}

// The chain of `n` (empty when it has none). Throws naming the node when the three attributes
// disagree in length or name an unknown activation.
inline std::vector<Activation> read_activations(const Node& n) {
  if (!n.has_attr("activations")) {
    if (n.has_attr("activation_alpha") || n.has_attr("activation_beta"))
      throw n.error("activation_alpha/activation_beta without 'activations'");
    return {};
  }
  std::vector<std::string> ops = n.attr_strings("activations");
  std::vector<float> alpha = n.attr_floats("activation_alpha", std::vector<float>(ops.size(), 0.0f));
  std::vector<float> beta = n.attr_floats("activation_beta", std::vector<float>(ops.size(), 0.0f));
  if (alpha.size() != ops.size() || beta.size() != ops.size())
    throw n.error("'activations' has " + std::to_string(ops.size()) + " entries but activation_alpha has " +
                  std::to_string(alpha.size()) + " and activation_beta " + std::to_string(beta.size()));
  std::vector<Activation> out;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!is_activation_name(ops[i])) throw n.error("unknown activation '" + ops[i] + "' in 'activations'");
    out.push_back({ops[i], alpha[i], beta[i]});
  }
  return out;
}

// Sets the chain attributes of `n` (removes them for an empty chain).
inline void write_activations(Node& n, const std::vector<Activation>& chain) {
  if (chain.empty()) {
    n.remove_attr("activations");
    n.remove_attr("activation_alpha");
    n.remove_attr("activation_beta");
    return;
  }
  std::vector<std::string> ops;
  std::vector<float> alpha, beta;
  for (const Activation& a : chain) {
    ops.push_back(a.op);
    alpha.push_back(a.alpha);
    beta.push_back(a.beta);
  }
  n.set_attr("activations", ops);
  n.set_attr("activation_alpha", alpha);
  n.set_attr("activation_beta", beta);
}

inline std::string activations_str(const std::vector<Activation>& chain) {
  std::string s;
  for (const Activation& a : chain) s += (s.empty() ? "" : "+") + a.op;
  return s;
}

namespace detail {
// A constant one-element floating input (Clip's min/max since opset 11); `fallback` when omitted.
inline std::optional<double> constant_bound(const Node& n, std::size_t i, double fallback) {
  const Value* v = n.input(i);
  if (!v) return fallback;
  if (!v->is_constant() || !is_floating(v->dtype()) || v->constant().numel() != 1) return std::nullopt;
  return v->constant().at_double(0);
}
}  // namespace detail

// ondine.FakeQuant's attributes as an activation of the chain; nullopt when they are not valid (a scale that
// is not positive and finite, a zero point outside the type, another type).
inline std::optional<Activation> fake_quant_of(const Node& n) {
  const float scale = n.attr_float("scale", 0.0f);
  const std::int64_t zp = n.attr_int("zero_point", 0);
  const std::string to = n.attr_string("to", "uint8");
  if (!(scale > 0) || !std::isfinite(scale) || (to != "uint8" && to != "int8")) return std::nullopt;
  if (to == "uint8" ? (zp < 0 || zp > 255) : (zp < -128 || zp > 127)) return std::nullopt;
  return Activation{to == "uint8" ? "FakeQuantU8" : "FakeQuantS8", scale, static_cast<float>(zp)};
}

// The integer range of a FakeQuant activation.
inline std::pair<float, float> fake_quant_range(const Activation& a) {
  return a.op == "FakeQuantU8" ? std::pair<float, float>{0.0f, 255.0f} : std::pair<float, float>{-128.0f, 127.0f};
}

// The activation node `n` computes, when it is one that can join a post-op chain: a unary op of
// the list above on a floating input, with constant parameters (Clip's bounds: constant scalars at
// opset >= 11, attributes before). nullopt for anything else.
inline std::optional<Activation> as_activation(const Node& n) {
  const std::string& op = n.op_type();
  if (n.num_outputs() != 1 || !n.input(0) || !is_floating(n.input(0)->dtype())) return std::nullopt;
  if (n.domain() == kDomain && op == "FakeQuant") {
    std::optional<Activation> a = fake_quant_of(n);
    if (!a || n.num_inputs() != 1 || n.input(0)->dtype() != DType::Float32) return std::nullopt;
    return a;
  }
  // ondine.Gelu, and ONNX's own Gelu (opset 20), which has the same approximate attribute.
  if (n.domain() == kDomain || (n.domain().empty() && op == "Gelu")) {
    if (op != "Gelu" || n.num_inputs() != 1) return std::nullopt;
    std::string approximate = n.attr_string("approximate", "none");
    if (approximate == "none") return Activation{"Gelu"};
    if (approximate == "tanh") return Activation{"GeluTanh"};
    return std::nullopt;
  }
  if (!n.domain().empty()) return std::nullopt;
  if (op == "Clip") {
    // ONNX: min(max(x, lo), hi) with an omitted bound unbounded.
    constexpr double inf = std::numeric_limits<double>::infinity();
    std::optional<double> lo, hi;
    if (n.opset() != 0 && n.opset() < 11) {
      lo = n.attr_float("min", std::numeric_limits<float>::lowest());
      hi = n.attr_float("max", std::numeric_limits<float>::max());
    } else {
      lo = detail::constant_bound(n, 1, -inf);
      hi = detail::constant_bound(n, 2, inf);
    }
    if (!lo || !hi || std::isnan(*lo) || std::isnan(*hi)) return std::nullopt;
    return Activation{"Clip", static_cast<float>(*lo), static_cast<float>(*hi)};
  }
  if (n.num_inputs() != 1) return std::nullopt;
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish") return Activation{op};
  if (op == "LeakyRelu") return Activation{op, n.attr_float("alpha", 0.01f)};
  if (op == "Elu") return Activation{op, n.attr_float("alpha", 1.0f)};
  if (op == "HardSigmoid") return Activation{op, n.attr_float("alpha", 0.2f), n.attr_float("beta", 0.5f)};
  return std::nullopt;
}

// The scalar function of one activation (the reference semantics, computed in double).
inline double apply(const Activation& a, double x) {
  const std::string& op = a.op;
  if (op == "Relu") return x < 0 ? 0.0 : x;
  if (op == "LeakyRelu") return x < 0 ? a.alpha * x : x;
  if (op == "Clip") return std::min(std::max(x, static_cast<double>(a.alpha)), static_cast<double>(a.beta));
  if (op == "Sigmoid") return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
  if (op == "Tanh") return std::tanh(x);
  if (op == "HardSwish") return x * std::max(0.0, std::min(1.0, x / 6.0 + 0.5));
  if (op == "HardSigmoid") return std::max(0.0, std::min(1.0, a.alpha * x + static_cast<double>(a.beta)));
  if (op == "Elu") return x < 0 ? a.alpha * std::expm1(x) : x;
  if (op == "Swish") return x * apply(Activation{"Sigmoid"}, a.alpha * x);
  if (op == "FakeQuantU8" || op == "FakeQuantS8") {  // in float32, as QuantizeLinear and DequantizeLinear compute
    const auto [qmin, qmax] = fake_quant_range(a);
    const float q = std::nearbyint(static_cast<float>(x) / a.alpha);  // ties to even
    const float clamped = std::min(std::max(q, qmin - a.beta), qmax - a.beta) + 0.0f;  // -0 as DequantizeLinear: +0
    return static_cast<double>(clamped * a.alpha);
  }
  // Gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); the tanh form approximates Phi.
  if (op == "Gelu") return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  if (op == "GeluTanh") {
    const double k = std::sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }
  throw Error("unknown activation '" + op + "'");
}

inline double apply(const std::vector<Activation>& chain, double x) {
  for (const Activation& a : chain) x = apply(a, x);
  return x;
}

// Grouped-query attention: for each batch dim of Q (`q`, without the two matrix dims), how many query
// indices share one index of K/V (`kv`): 1 where the dims are equal, Q's / K's where K's is a static
// divisor of it. Nullopt when the ranks differ or a dim neither equals nor divides.
inline std::optional<std::vector<std::int64_t>> attention_groups(const std::vector<std::int64_t>& q,
                                                                 const std::vector<std::int64_t>& kv) {
  if (q.size() != kv.size()) return std::nullopt;
  std::vector<std::int64_t> g(q.size(), 1);
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (q[i] == kv[i]) continue;
    if (kv[i] <= 0 || q[i] % kv[i] != 0) return std::nullopt;
    g[i] = q[i] / kv[i];
  }
  return g;
}

}  // namespace ondine::fused
