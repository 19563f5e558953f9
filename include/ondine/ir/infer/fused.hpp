// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/fused.hpp - shape and type inference for Ondine's own ops (ir/fused_ops.hpp):
// ondine.FusedConv, ondine.FusedMatMul, ondine.FusedGemm, ondine.Gelu, ondine.Attention.
//
// A fused op's output is its base op's (Conv, MatMul, Gemm: the same functions infer them); the
// operands it adds are checked against that output: Bias is [N] (MatMul's last output dim), Sum has
// exactly the output's shape (a fused sum does not broadcast), and the activation chain is well formed.
#pragma once

#include <string>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/nn.hpp"

namespace ondine::infer {
namespace detail_fused {

// The Sum operand (input `i`) must have the output's dtype and shape.
inline void check_sum_operand(const Node& n, std::size_t i) {
  const Value* sum = n.input(i);
  const Value* y = n.output(0);
  if (!sum || !y) return;
  detail_nn::require_same_dtype(n, required_input(n, 0), *sum);
  if (!sum->shape().rank_known() || !y->shape().rank_known()) return;
  const Shape &ss = sum->shape(), &ys = y->shape();
  if (ss.rank() != ys.rank())
    throw n.error("Sum '" + sum->name() + "' has shape " + ss.str() + ", expected the output's " + ys.str());
  for (std::size_t d = 0; d < ss.rank(); ++d)
    detail_nn::unify(n, ss[d], ys[d], "Sum '" + sum->name() + "' has shape " + ss.str() + ", not the output's " + ys.str());
}

inline void infer_fused_conv(Node& n) {
  fused::read_activations(n);
  detail_nn::infer_conv(n);
  check_sum_operand(n, 3);
}

inline void infer_fused_matmul(Node& n) {
  fused::read_activations(n);
  detail_nn::require_floating(n, required_input(n, 0));
  detail_nn::infer_matmul(n);
  const Value* y = n.output(0);
  if (const Value* bias = n.input(2)) {
    detail_nn::require_same_dtype(n, required_input(n, 0), *bias);
    if (y && y->shape().rank_known()) {
      if (y->shape().rank() == 0) throw n.error("a Bias needs an output of rank >= 1");
      detail_nn::check_vector(n, bias, y->shape()[y->shape().rank() - 1], "Bias");
    }
  }
  check_sum_operand(n, 3);
}

inline void infer_fused_gemm(Node& n) {
  fused::read_activations(n);
  detail_nn::require_floating(n, required_input(n, 0));
  detail_nn::infer_gemm(n);
}

inline void infer_fake_quant(Node& n) {
  Value& x = required_input(n, 0);
  if (x.dtype() != DType::Float32)
    throw n.error("X has element type " + std::string(dtype_name(x.dtype())) + "; FakeQuant takes float32");
  if (!fused::fake_quant_of(n))
    throw n.error("needs a positive finite 'scale', 'to' \"uint8\" or \"int8\" and a 'zero_point' of that type");
  set_output(n, 0, x.dtype(), x.shape());
}

inline void infer_gelu(Node& n) {
  Value& x = required_input(n, 0);
  detail_nn::require_floating(n, x);
  std::string approximate = n.attr_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    throw n.error("approximate must be \"none\" or \"tanh\", not \"" + approximate + "\"");
  set_output(n, 0, x.dtype(), x.shape());
}

// ondine.Attention: Q [..., Sq, D] x K [..., D, Sk] -> scores, x V [..., Sk, Dv] -> Y [..., Sq, Dv]; K and V
// may have fewer heads (a static divisor of Q's batch dim: grouped-query attention).
inline void infer_attention(Node& n) {
  Value& q = required_input(n, 0);
  Value& k = required_input(n, 1);
  Value& v = required_input(n, 2);
  detail_nn::require_floating(n, q);
  detail_nn::require_same_dtype(n, q, k);
  detail_nn::require_same_dtype(n, q, v);
  if (!q.shape().rank_known() || !k.shape().rank_known() || !v.shape().rank_known())
    return set_output(n, 0, q.dtype(), Shape::unknown());
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  std::size_t r = qs.rank();
  if (r < 2 || ks.rank() != r || vs.rank() != r)
    throw n.error("Q, K and V must have one rank >= 2, got " + qs.str() + ", " + ks.str() + " and " + vs.str());
  std::string shapes = "Q " + qs.str() + ", K " + ks.str() + ", V " + vs.str();
  for (std::size_t i = 0; i + 2 < r; ++i) {
    // Grouped-query attention: K and V with a static divisor of Q's heads (fused_ops.hpp).
    const bool grouped = qs[i].is_static() && ks[i].is_static() && ks[i].value > 0 && ks[i].value != qs[i].value &&
                         qs[i].value % ks[i].value == 0;
    if (grouped) {
      detail_nn::unify(n, ks[i], vs[i], "K and V are grouped differently: " + shapes);
      continue;
    }
    detail_nn::unify(n, qs[i], ks[i], "batch dims differ: " + shapes);
    detail_nn::unify(n, qs[i], vs[i], "batch dims differ: " + shapes);
  }
  detail_nn::unify(n, qs[r - 1], ks[r - 2], "Q's last dim is not K's rows: " + shapes);
  detail_nn::unify(n, ks[r - 1], vs[r - 2], "K's last dim is not V's rows: " + shapes);
  if (const Value* mask = n.input(3)) {
    detail_nn::require_same_dtype(n, q, *mask);
    if (mask->shape().rank_known()) {
      const Shape& ms = mask->shape();
      std::vector<Dim> scores(qs.dims().begin(), qs.dims().end() - 1);
      scores.push_back(ks[r - 1]);
      if (ms.rank() > r) throw n.error("Mask " + ms.str() + " has a higher rank than the scores (" + shapes + ")");
      for (std::size_t i = 0; i < ms.rank(); ++i) {
        const Dim& m = ms[i];
        const Dim& s = scores[r - ms.rank() + i];
        if (m.is_static() && m.value == 1) continue;
        detail_nn::unify(n, m, s, "Mask " + ms.str() + " does not broadcast to the scores of " + shapes);
      }
    }
  }
  std::vector<Dim> out(qs.dims().begin(), qs.dims().end() - 1);
  out.push_back(vs[r - 1]);
  set_output(n, 0, q.dtype(), Shape(out));
}

}  // namespace detail_fused

inline void register_fused_infer(InferTable& table) {
  using namespace detail_fused;
  const std::string d = std::string(fused::kDomain) + ".";
  table[d + "FusedConv"] = infer_fused_conv;
  table[d + "FusedMatMul"] = infer_fused_matmul;
  table[d + "FusedGemm"] = infer_fused_gemm;
  table[d + "Gelu"] = infer_gelu;
  table["Gelu"] = infer_gelu;  // ONNX Gelu (opset 20), the same op
  table[d + "Attention"] = infer_attention;
  table[d + "FakeQuant"] = infer_fake_quant;
}

}  // namespace ondine::infer
