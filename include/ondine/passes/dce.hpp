// SPDX-License-Identifier: Apache-2.0
// ondine/passes/dce.hpp - dce: removes nodes whose outputs nothing reads, and unused constants.
//
// A node is live when one of its outputs is a graph output or is read by a live node. One sweep over
// the nodes in reverse topological order decides that (every reader is decided before its
// producers), so a whole dead chain goes in one run; the dead nodes are removed together and values
// left without producer, reader or interface role (unused initializers) are dropped. Graph inputs
// and outputs are never touched, so the model's interface stays as it is.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/passes/pass.hpp"

namespace ondine {

struct DeadCodeElimination {
  static constexpr const char* name = "dce";

  bool run(Graph& g, PassContext& ctx) {
    std::vector<Node*> order = g.topo_order();
    std::unordered_set<const Node*> live;
    std::vector<Node*> dead;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = *it;
      if (is_live(n, live)) live.insert(n);
      else dead.push_back(n);
    }
    for (Node* n : dead) ctx.rewrite("removed '" + label(n) + "' (" + n->op_type() + "), nothing reads it");
    g.remove_nodes(dead);
    std::size_t values_before = g.values().size();
    g.remove_dead_values();
    return !dead.empty() || g.values().size() != values_before;
  }

 private:
  // Live: an output is exported, or read by a node already known to be live.
  static bool is_live(const Node* n, const std::unordered_set<const Node*>& live) {
    for (const Value* out : n->outputs()) {
      if (out->is_graph_output()) return true;
      for (const Use& u : out->uses())
        if (live.count(u.node)) return true;
    }
    return false;
  }
  static std::string label(const Node* n) {
    return n->name().empty() && n->num_outputs() ? n->output(0)->name() : n->name();
  }
};

}  // namespace ondine
