// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_post_ops.hpp - fuse: folds what follows a Conv, MatMul or Gemm into one
// ondine.FusedConv / FusedMatMul / FusedGemm (semantics: ondine/ir/fused_ops.hpp), which the
// lowering turns into one oneDNN primitive with post-ops.
//
// Rewrites, in this order after the producing op (each step optional):
//   MatMul(A, B) + c          -> FusedMatMul(A, B, Bias = c as [N])     c constant, only along the last axis
//   Conv/MatMul(...) + s      -> Fused*(..., Sum = s)                   s not constant, the output's shape
//   act(Fused*(...))          -> Fused* with act appended to "activations"
// where act is Relu, LeakyRelu, Clip (constant bounds), Sigmoid, Tanh, HardSwish, HardSigmoid, Elu,
// ondine.Gelu (fused::as_activation), or SiLU as exporters write it, Mul(y, Sigmoid(y)) with y read by
// those two nodes only (Swish with alpha 1). A Gemm takes only activations. A node fused already takes
// more: activations always, Bias and Sum while it has no activations yet (they come before them),
// so running the pass again, or after another pass exposed more, extends what is there.
// Preconditions: the producing op and every absorbed op compute float32; every intermediate value
// has exactly one reader (SiLU's y: the Sigmoid and the Mul) and is not a graph output (rewrite::single_use); the Add of a residual is
// not a broadcast (its operands have the same shape). Otherwise the graph is left as it is. The
// fused node keeps the producing node's name; its output keeps the name of the last value absorbed
// (a graph output keeps its name).
#pragma once

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::post_ops {

using fusion::is_f32;

// A node that can take post-ops, with what it has taken so far.
struct Producer {
  Node* node = nullptr;
  std::string fused_op;  // FusedConv, FusedMatMul or FusedGemm
  Value* bias = nullptr;  // FusedMatMul's Bias
  Value* sum = nullptr;
  std::vector<fused::Activation> activations;
  bool takes_bias() const { return fused_op == "FusedMatMul" && !bias && !sum && activations.empty(); }
  bool takes_sum() const { return fused_op != "FusedGemm" && !sum && activations.empty(); }
};

inline std::optional<Producer> producer_of(Node* n) {
  if (n->num_outputs() != 1 || !is_f32(n->output(0)) || !is_f32(n->input(0)) || !is_f32(n->input(1)))
    return std::nullopt;
  Producer p;
  p.node = n;
  const std::string& op = n->op_type();
  if (n->domain().empty()) {
    if (op != "Conv" && op != "MatMul" && op != "Gemm") return std::nullopt;
    p.fused_op = "Fused" + op;
    return p;
  }
  if (n->domain() != fused::kDomain || (op != "FusedConv" && op != "FusedMatMul" && op != "FusedGemm"))
    return std::nullopt;
  p.fused_op = op;
  if (op == "FusedMatMul") p.bias = n->input(2);
  if (op != "FusedGemm") p.sum = n->input(3);
  p.activations = fused::read_activations(*n);
  return p;
}

// The Add reading `v` as its only reader, with its other operand; nullptr when there is none.
inline Node* sole_add(Value* v, Value*& other) {
  if (!rewrite::single_use(v)) return nullptr;
  Node* add = v->uses()[0].node;
  if (add->op_type() != "Add" || !add->domain().empty() || add->num_inputs() != 2 || add->num_outputs() != 1)
    return nullptr;
  other = add->input(0) == v ? add->input(1) : add->input(0);
  if (!other || other == v || !is_f32(add->output(0)) || !(add->output(0)->shape() == v->shape())) return nullptr;
  return add;
}

// SiLU after `v`: the Mul(v, Sigmoid(v)) when v's readers are exactly that Sigmoid and that Mul (either
// operand order) and the Sigmoid's result has no other reader; nullptr otherwise. `sigmoid` gets the Sigmoid.
inline Node* silu_after(Value* v, Node*& sigmoid) {
  if (v->is_graph_output() || v->uses().size() != 2) return nullptr;
  Node* a = v->uses()[0].node;
  Node* b = v->uses()[1].node;
  if (a->op_type() != "Sigmoid") std::swap(a, b);
  if (a == b || a->op_type() != "Sigmoid" || !a->domain().empty() || a->num_outputs() != 1) return nullptr;
  if (b->op_type() != "Mul" || !b->domain().empty() || b->num_inputs() != 2 || b->num_outputs() != 1) return nullptr;
  Value* s = a->output(0);
  if (!rewrite::single_use(s) || s->uses()[0].node != b) return nullptr;
  if (!((b->input(0) == v && b->input(1) == s) || (b->input(0) == s && b->input(1) == v))) return nullptr;
  if (!is_f32(b->output(0)) || !(b->output(0)->shape() == v->shape())) return nullptr;
  sigmoid = a;
  return b;
}

// a and b have one shape, known to be equal: each dim the same size or the same named symbol.
inline bool same_shape(const Value* a, const Value* b) {
  const Shape &sa = a->shape(), &sb = b->shape();
  if (!sa.rank_known() || !(sa == sb)) return false;
  for (const Dim& d : sa.dims())
    if (!d.is_static() && d.symbol.empty()) return false;
  return true;
}

// c as a [N] bias of a matmul result `y` (N its last dim): a float32 constant whose dims are all 1
// but the last, which is N. nullptr otherwise; a new constant when c needs reshaping.
inline Value* as_bias(Graph& g, Value* c, const Value* y, bool create) {
  if (!c->is_constant() || c->dtype() != DType::Float32 || !y->shape().rank_known() || y->shape().rank() == 0)
    return nullptr;
  const Dim& last = y->shape()[y->shape().rank() - 1];
  const Tensor& t = c->constant();
  if (!last.is_static() || t.rank() == 0 || t.rank() > y->shape().rank() || t.dims().back() != last.value)
    return nullptr;
  for (std::size_t i = 0; i + 1 < t.rank(); ++i)
    if (t.dims()[i] != 1) return nullptr;
  if (t.rank() == 1 || !create) return c;
  return g.add_constant(g.unique_name(c->name() + ".bias"), t.reshaped({last.value}));
}

}  // namespace detail::post_ops

struct FusePostOps {
  static constexpr const char* name = "fuse";

  bool run(Graph& g, PassContext& ctx) {
    std::unordered_set<const Node*> erased;
    bool changed = false;
    for (Node* n : g.topo_order()) {
      if (erased.count(n)) continue;
      auto p = detail::post_ops::producer_of(n);
      if (!p) continue;
      std::vector<Node*> absorbed;
      if (!grow(g, *p, absorbed)) continue;
      erased.insert(n);
      erased.insert(absorbed.begin(), absorbed.end());
      changed = true;
      ctx.rewrite(rewrite_text(*p, absorbed));
      replace(g, *p, absorbed);
    }
    if (changed) g.remove_dead_values();
    return changed;
  }

 private:
  // Extends p with the ops after it; returns true when it absorbed any (listed in `absorbed`). Only
  // the Bias constant may be created here, after its Add is known to fold.
  static bool grow(Graph& g, detail::post_ops::Producer& p, std::vector<Node*>& absorbed) {
    using namespace detail::post_ops;
    Value* cur = p.node->output(0);
    Value* other = nullptr;
    // MatMul(A, B) + c -> FusedMatMul(A, B, Bias = c): c broadcasts along the last axis only.
    if (p.takes_bias()) {
      if (Node* add = sole_add(cur, other); add && as_bias(g, other, cur, false)) {
        p.bias = as_bias(g, other, cur, true);
        absorbed.push_back(add);
        cur = add->output(0);
      }
    }
    // Conv/MatMul(...) + s -> Fused*(..., Sum = s): s a runtime value of the output's shape, read
    // before the op writes its result (so it may not depend on it: cur has no other reader).
    if (p.takes_sum()) {
      if (Node* add = sole_add(cur, other); add && !other->is_constant() && is_f32(other) && same_shape(other, cur)) {
        p.sum = other;
        absorbed.push_back(add);
        cur = add->output(0);
      }
    }
    // act(Fused*(...)) -> Fused* with act appended to the chain.
    for (;;) {
      Node* sigmoid = nullptr;
      if (Node* mul = silu_after(cur, sigmoid)) {
        p.activations.push_back({"Swish", 1.0f, 0.0f});
        absorbed.push_back(sigmoid);
        absorbed.push_back(mul);
        cur = mul->output(0);
        continue;
      }
      if (!rewrite::single_use(cur)) break;
      Node* next = cur->uses()[0].node;
      auto act = fused::as_activation(*next);
      if (!act || next->input(0) != cur || !is_f32(next->output(0)) || !(next->output(0)->shape() == cur->shape()))
        break;
      p.activations.push_back(*act);
      absorbed.push_back(next);
      cur = next->output(0);
    }
    return !absorbed.empty();
  }

  // Puts the fused node in place of p's node and the absorbed ones.
  static void replace(Graph& g, const detail::post_ops::Producer& p, const std::vector<Node*>& absorbed) {
    Node* n = p.node;
    std::vector<Value*> inputs{n->input(0), n->input(1)};
    if (p.fused_op == "FusedConv" || p.fused_op == "FusedGemm") inputs.push_back(n->input(2));
    if (p.fused_op == "FusedMatMul") inputs.push_back(p.bias);
    if (p.fused_op != "FusedGemm") inputs.push_back(p.sum);
    while (!inputs.empty() && !inputs.back()) inputs.pop_back();
    Value* result = absorbed.back()->output(0);
    g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
    Node* f = detail::fusion::add_replacement(g, result, p.fused_op, inputs, n->attrs(), n->name(), fused::kDomain,
                                              fused::kDomainVersion);
    fused::write_activations(*f, p.activations);
    std::vector<Node*> dead = absorbed;
    dead.push_back(n);
    detail::fusion::erase_unused(g, dead);
  }

  static std::string rewrite_text(const detail::post_ops::Producer& p, const std::vector<Node*>& absorbed) {
    std::string what;
    for (const Node* a : absorbed) what += " +" + a->op_type();
    return "'" + p.node->name() + "': " + p.node->op_type() + what + " -> ondine." + p.fused_op +
           (p.activations.empty() ? "" : " [" + fused::activations_str(p.activations) + "]");
  }
};

}  // namespace ondine
