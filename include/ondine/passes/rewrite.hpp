// ondine/passes/rewrite.hpp - the graph edits that rewrites share: redirecting a value's readers while
// keeping the model's interface (graph output names) unchanged, and erasing nodes left unused.
#pragma once

#include <string>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine::rewrite {

// True when `v` has exactly one reader and is not a graph output: a rewrite may make it disappear.
inline bool single_use(const Value* v) { return v && v->uses().size() == 1 && !v->is_graph_output(); }

// Every reader of `from` reads `to` instead. When `from` was a graph output, `to` takes over its name,
// so callers still find the output under the name the model declared.
inline void replace_value(Graph& g, Value* from, Value* to) {
  if (from == to) return;
  bool was_output = from->is_graph_output();
  g.replace_all_uses(from, to);
  if (was_output) {
    std::string name = from->name();
    g.rename_value(from, g.unique_name(name + ".replaced"));
    g.rename_value(to, name);
  }
}

// Removes each node of `nodes` (in reverse order, so consumers go before their producers) whose
// outputs nothing reads any more; returns how many were removed. Then drops values left orphaned.
inline std::size_t erase_if_dead(Graph& g, std::vector<Node*> nodes) {
  std::size_t removed = 0;
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    bool dead = true;
    for (Value* out : n->outputs())
      if (out && (out->has_uses() || out->is_graph_output())) dead = false;
    if (!dead) continue;
    g.remove_node(n);
    ++removed;
  }
  if (removed) g.remove_dead_values();
  return removed;
}

}  // namespace ondine::rewrite
