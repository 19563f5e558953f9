// ondine/passes/fuse_dynamic_qmatmul.hpp - fuse-dynamic-qmatmul: the dynamically quantized matrix
// product (the form quantize-dynamic and ONNX Runtime's quantize_dynamic write) as one
// ondine.DynQMatMul (definition: ir/infer/quantized.hpp), which lowers to one int8 oneDNN matmul with
// the activation's scale and zero point read at run time.
//
//   (a, a_scale, a_zp) = DynamicQuantizeLinear(x)
//   act*(Add?(Mul(Cast<float>(MatMulInteger(a, W, a_zp, W_zp?)), Mul(a_scale, w_scale)), B))
//     -> ondine.DynQMatMul(a, a_scale, a_zp, W, B?)   w_scale and the activations act as attributes
//
// act: the activations of ir/fused_ops.hpp (Relu, Clip, ondine.Gelu, ...; fused::as_activation), so
// it runs after fuse-gelu in the default pipeline and BERT's FFN MatMul + bias + Gelu is one primitive.
//
// Preconditions (else nothing changes): W an int8 constant of rank 2 with no zero point or an all-zero
// one; w_scale a float32 constant with 1 or N values; B a float32 constant [N]; the Mul and Add
// operands either way round; every intermediate result read only by the next op of the chain and not
// a graph output. The DynamicQuantizeLinear stays: the readers of one x share it.
// Uint8 weights (ONNX Runtime's weight_type=QUInt8) are left as they are and run on the reference kernels.
#pragma once

#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"

namespace ondine {

namespace detail::dynq {

inline Node* only_reader(const Value* v, const char* op) {
  if (!v || v->is_graph_output() || v->uses().size() != 1) return nullptr;
  Node* n = v->uses()[0].node;
  return n->domain().empty() && n->op_type() == op ? n : nullptr;
}

// The operand of a two-input node other than `v`.
inline Value* other_input(const Node* n, const Value* v) {
  if (n->num_inputs() != 2) return nullptr;
  return n->input(0) == v ? n->input(1) : n->input(1) == v ? n->input(0) : nullptr;
}

inline bool all_zero(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (t.at_double(static_cast<std::size_t>(i)) != 0.0) return false;
  return true;
}

inline bool f32_constant(const Value* v) { return v && v->is_constant() && v->dtype() == DType::Float32; }

struct Match {
  Node *dql = nullptr, *mmi = nullptr, *cast = nullptr, *mul = nullptr, *scale = nullptr, *add = nullptr;
  Value* bias = nullptr;
  std::vector<float> w_scale;
  std::vector<Node*> activation_nodes;
  std::vector<fused::Activation> activations;
  Value* result = nullptr;  // the value the fused node replaces
};

inline bool match(Node* mmi, Match& m) {
  m.mmi = mmi;
  Value *a = mmi->input(0), *w = mmi->input(1), *a_zp = mmi->num_inputs() > 2 ? mmi->input(2) : nullptr,
        *w_zp = mmi->num_inputs() > 3 ? mmi->input(3) : nullptr;
  if (!a || !a->producer() || !w || !a_zp) return false;
  m.dql = a->producer();
  if (!m.dql->domain().empty() || m.dql->op_type() != "DynamicQuantizeLinear" || m.dql->output(0) != a ||
      m.dql->output(2) != a_zp)
    return false;
  if (!w->is_constant() || w->dtype() != DType::Int8 || w->constant().rank() != 2) return false;
  if (w_zp && (!w_zp->is_constant() || !all_zero(w_zp->constant()))) return false;
  std::int64_t cols = w->constant().dims()[1];

  m.cast = only_reader(mmi->output(0), "Cast");
  if (!m.cast || m.cast->attr_int("to", 0) != 1) return false;  // 1: FLOAT
  m.mul = only_reader(m.cast->output(0), "Mul");
  if (!m.mul) return false;
  Value* s = other_input(m.mul, m.cast->output(0));
  if (!s || !s->producer()) return false;
  m.scale = s->producer();
  if (!m.scale->domain().empty() || m.scale->op_type() != "Mul") return false;
  Value* ws = other_input(m.scale, m.dql->output(1));
  if (!f32_constant(ws)) return false;
  const Tensor& wst = ws->constant();
  if (wst.numel() != 1 && !(wst.rank() == 1 && wst.numel() == cols)) return false;
  for (std::int64_t i = 0; i < wst.numel(); ++i) {
    float v = wst.data<float>()[i];
    if (!(v > 0)) return false;
    m.w_scale.push_back(v);
  }
  if (Node* add = only_reader(m.mul->output(0), "Add")) {
    Value* b = other_input(add, m.mul->output(0));
    if (f32_constant(b) && b->constant().rank() == 1 && b->constant().numel() == cols) {
      m.add = add;
      m.bias = b;
    }
  }
  m.result = (m.add ? m.add : m.mul)->output(0);
  while (!m.result->is_graph_output() && m.result->uses().size() == 1) {
    Node* next = m.result->uses()[0].node;
    auto act = fused::as_activation(*next);
    if (!act || next->input(0) != m.result || next->output(0)->dtype() != DType::Float32 ||
        !(next->output(0)->shape() == m.result->shape()))
      break;
    m.activations.push_back(*act);
    m.activation_nodes.push_back(next);
    m.result = next->output(0);
  }
  return true;
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
      if (!detail::dynq::match(n, m)) continue;
      const std::string name = n->name();  // n is erased below
      std::vector<Value*> inputs{m.dql->output(0), m.dql->output(1), m.dql->output(2), n->input(1)};
      if (m.bias) inputs.push_back(m.bias);
      g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
      Node* f = detail::fusion::add_replacement(g, m.result, "DynQMatMul", inputs, {{"w_scale", m.w_scale}}, name,
                                                fused::kDomain, fused::kDomainVersion);
      fused::write_activations(*f, m.activations);
      std::vector<Node*> dead = m.activation_nodes;
      for (Node* d : {m.add, m.mul, m.cast, n, m.scale})
        if (d) dead.push_back(d);
      detail::fusion::erase_unused(g, dead);
      ctx.rewrite("'" + name + "' MatMulInteger -> Cast -> Mul" + (m.add ? " -> Add" : "") +
                  " -> ondine.DynQMatMul" +
                  (m.activations.empty() ? "" : " [" + fused::activations_str(m.activations) + "]"));
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
