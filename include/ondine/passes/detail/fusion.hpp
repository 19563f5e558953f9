// SPDX-License-Identifier: Apache-2.0
// ondine/passes/detail/fusion.hpp - what the fusion passes (fuse-gelu, fuse-layernorm, fuse) share:
// putting one new node in place of a matched subgraph, under the name of the value it replaces, and
// erasing the nodes the match left unused.
#pragma once

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine::detail::fusion {

// Adds a one-output node computing what `replaced` held, and redirects every reader of `replaced`
// to it. The new output takes over `replaced`'s name, dtype and shape (a graph output keeps its
// name through rewrite::replace_value), so dumps before and after a pass read alike.
inline Node* add_replacement(Graph& g, Value* replaced, const std::string& op_type, const std::vector<Value*>& inputs,
                             std::map<std::string, Attribute> attrs, const std::string& name,
                             const std::string& domain, int opset) {
  std::string keep = replaced->name();
  bool is_output = replaced->is_graph_output();
  if (!is_output) g.rename_value(replaced, g.unique_name(keep + ".unfused"));
  Node* n = g.add_node(op_type, inputs, {is_output ? g.unique_name(keep + ".fused") : keep}, std::move(attrs), name,
                       domain);
  n->set_opset(opset);
  Value* out = n->output(0);
  out->set_dtype(replaced->dtype());
  out->set_shape(replaced->shape());
  out->set_layout(replaced->layout());
  rewrite::replace_value(g, replaced, out);
  return n;
}

// Removes the nodes of `nodes` whose outputs nobody reads any more, in whatever order that takes
// (a node listed twice, or a producer listed before its consumer, is fine). Values left orphaned
// stay until Graph::remove_dead_values(), which a pass calls once at its end.
inline std::size_t erase_unused(Graph& g, std::vector<Node*> nodes) {
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  auto dead = [](const Node* n) {
    for (const Value* out : n->outputs())
      if (out && (out->has_uses() || out->is_graph_output())) return false;
    return true;
  };
  std::size_t removed = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (Node*& n : nodes) {
      if (!n || !dead(n)) continue;
      g.remove_node(n);
      n = nullptr;
      ++removed;
      progress = true;
    }
  }
  return removed;
}

// True when every value the nodes of `matched` other than `root` produce is read only inside
// `matched` and is not a graph output: replacing `root`'s result makes all of them dead.
inline bool is_closed(const std::vector<Node*>& matched, const Node* root) {
  std::set<const Node*> inside(matched.begin(), matched.end());
  for (const Node* n : inside) {
    if (n == root) continue;
    for (const Value* out : n->outputs()) {
      if (!out) continue;
      if (out->is_graph_output()) return false;
      for (const Use& u : out->uses())
        if (!inside.count(u.node)) return false;
    }
  }
  return true;
}

// A floating-point value whose dtype is float32 (what the passes fold weights in and what the
// fused kernels are compiled for).
inline bool is_f32(const Value* v) { return v && v->dtype() == DType::Float32; }

}  // namespace ondine::detail::fusion
