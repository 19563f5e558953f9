// SPDX-License-Identifier: Apache-2.0
// ondine/passes/remove_identity.hpp - remove-identity: removes nodes that pass their input through.
//
// Rewrites (x is input 0, y output 0; every reader of y then reads x):
//   Identity(x)                          -> x
//   Dropout(x)                           -> x   inference mode: before opset 12 always (as the reference
//                                               executor runs it), from opset 12 when training_mode is
//                                               absent or a constant false; the mask output is unused
//   Cast(x, to = dtype(x))               -> x
//   Reshape/Flatten/Squeeze/Unsqueeze/Expand(x) -> x   when x has a static shape and y's shape is the same
//                                               (an Expand to x's own shape: PyTorch's `+=` into a slice)
// Preconditions: x and y have the same dtype and shape as inferred (a Cast: the dtype); y is not a graph output that x
// could not stand in for. A graph output keeps its name (rewrite::replace_value renames x to it), so
// when x is itself a graph input or another graph output the node stays: x cannot take a second
// name, and the output needs a producer of its own (an Identity from an input to an output is the
// model's interface, not dead weight).
#pragma once

#include <string>
#include <vector>

#include "ondine/ir/dropout.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::remove_identity {

inline bool unread(const Value* v) { return !v || (!v->has_uses() && !v->is_graph_output()); }

// The value n's output 0 always equals, or nullptr when n is not a pass-through.
inline Value* passed_through(const Node& n) {
  if (!n.domain().empty() || n.num_outputs() == 0) return nullptr;
  Value* x = n.input(0);
  Value* y = n.output(0);
  if (!x || !y) return nullptr;
  const std::string& op = n.op_type();
  bool same_type = x->dtype() != DType::Undefined && x->dtype() == y->dtype();
  if (op == "Identity") return x;
  if (op == "Dropout") {
    // Dropout(x) = x in inference mode; the mask (output 1) would still need computing.
    for (std::size_t i = 1; i < n.num_outputs(); ++i)
      if (!unread(n.output(i))) return nullptr;
    if (!dropout_is_identity(n)) return nullptr;
    return x;
  }
  // A Cast to its own dtype (its output's shape is its input's, however each was written: a declared
  // output shape may name a dim the inferred one writes as an expression).
  if (op == "Cast") return same_type ? x : nullptr;
  if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Expand")
    // A reshape to the shape it already has: the same elements in the same order.
    return same_type && x->shape().is_static() && x->shape() == y->shape() ? x : nullptr;
  return nullptr;
}

// Whether every reader of y (and y's role as a graph output) can move to x.
inline bool can_replace(const Value* y, const Value* x) {
  if (!y->is_graph_output()) return true;
  return !x->is_graph_input() && !x->is_graph_output() && !x->is_capture();
}

}  // namespace detail::remove_identity

struct RemoveIdentity {
  static constexpr const char* name = "remove-identity";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::remove_identity;
    std::vector<Node*> removed;
    for (Node* n : g.topo_order()) {
      Value* x = d::passed_through(*n);
      if (!x || !d::can_replace(n->output(0), x)) continue;
      Value* y = n->output(0);
      ctx.rewrite("removed '" + (n->name().empty() ? y->name() : n->name()) + "' (" + n->op_type() + ")");
      rewrite::replace_value(g, y, x);
      removed.push_back(n);
    }
    if (removed.empty()) return false;
    g.remove_nodes(removed);
    g.remove_dead_values();
    return true;
  }
};

}  // namespace ondine
