// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_dynamic_qmatmul.hpp - fuse-dynamic-qmatmul: the dynamically quantized matrix
// product (the form quantize-dynamic and ONNX Runtime's quantize_dynamic write) as one
// ondine.DynQMatMul (definition: ir/infer/quantized.hpp), which lowers to one oneDNN matmul with the
// activation's scale and zero point read at run time.
//
//   (a, a_scale, a_zp) = DynamicQuantizeLinear(x)
//   act*(Add?(Mul(Cast<float>(MatMulInteger(a, W, a_zp, W_zp?)), Mul(a_scale, w_scale)), B))
//     -> ondine.DynQMatMul(a, a_scale, a_zp, W - W_zp, B?)   w_scale and the activations as attributes
//
// act: the activations of ir/fused_ops.hpp (Relu, Clip, ondine.Gelu, ...; fused::as_activation), so
// it runs after fuse-gelu in the default pipeline and BERT's FFN MatMul + bias + Gelu is one primitive.
//
// Preconditions (else nothing changes): W an int8 or uint8 constant of rank 2 with no zero point, one,
// or one per column; w_scale and B float32 constants with 1 or N values (passes/detail/dynamic_quant.hpp).
// W - W_zp is int8 when it fits (symmetric int8 weights, ONNX Runtime's default), else int16.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/dynamic_quant.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"

namespace ondine {

namespace detail::dynq {

// Replaces a matched chain with one `op_type` node: (a, a_scale, a_zp, W - W_zp, B?) with `attrs`,
// w_scale and the activations. Returns the rewrite's description.
inline std::string fuse(Graph& g, Match& m, const std::string& op_type, std::map<std::string, Attribute> attrs) {
  const std::string name = m.op->name();  // m.op is erased below
  Value* w = g.add_constant(g.unique_name(name + ".centred_weights"), std::move(m.weights));
  std::vector<Value*> inputs{m.dql->output(0), m.dql->output(1), m.dql->output(2), w};
  if (!m.bias.empty())
    inputs.push_back(g.add_constant(g.unique_name(name + ".bias"),
                                    Tensor::from_vector<float>({static_cast<std::int64_t>(m.bias.size())}, m.bias)));
  attrs["w_scale"] = m.w_scale;
  g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
  Node* f = detail::fusion::add_replacement(g, m.result, op_type, inputs, std::move(attrs), name, fused::kDomain,
                                            fused::kDomainVersion);
  fused::write_activations(*f, m.activations);
  std::vector<Node*> dead = m.activation_nodes;
  for (Node* d : {m.add, m.mul, m.cast, m.op, m.scale})
    if (d) dead.push_back(d);
  const std::string from = m.op->op_type();
  detail::fusion::erase_unused(g, dead);
  return "'" + name + "' " + from + " -> Cast -> Mul" + (m.add ? " -> Add" : "") + " -> ondine." + op_type +
         (m.activations.empty() ? "" : " [" + fused::activations_str(m.activations) + "]") +
         (w->dtype() == DType::Int8 ? "" : " (W - W_zp beyond int8: float32 kernels)");
}

}  // namespace detail::dynq

struct FuseDynamicQMatMul {
  static constexpr const char* name = "fuse-dynamic-qmatmul";

  bool run(Graph& g, PassContext& ctx) {
    bool changed = false;
    std::vector<Node*> candidates;  // first: a fusion erases Cast/Mul/Add nodes a later visit would see
    for (Node* n : g.topo_order())
      if (n->domain().empty() && n->op_type() == "MatMulInteger") candidates.push_back(n);
    for (Node* n : candidates) {
      detail::dynq::Match m;
      const Value* w = n->num_inputs() > 1 ? n->input(1) : nullptr;
      if (!w || !w->shape().rank_known() || w->shape().rank() != 2 || !n->output(0)->shape().rank_known() ||
          !detail::dynq::match(n, 1, n->output(0)->shape().rank() - 1, m))
        continue;
      ctx.rewrite(detail::dynq::fuse(g, m, "DynQMatMul", {}));
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
