// ondine/passes/rewrite.hpp - the graph edits that rewrites share: redirecting a value's readers while
// keeping the model's interface (graph input and output names) unchanged, and erasing nodes left unused.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine::rewrite {

// True when `v` has exactly one reader and is not a graph output: a rewrite may make it disappear.
inline bool single_use(const Value* v) { return v && v->uses().size() == 1 && !v->is_graph_output(); }

// Every reader of `from` reads `to` instead. When `from` was a graph output, the output keeps its
// name: `to` is renamed to it, or, when `to`'s own name is part of the interface too (a graph input,
// a subgraph's capture, or already another graph output), the output becomes Identity(to) under the
// old name.
inline void replace_value(Graph& g, Value* from, Value* to) {
  if (from == to) return;
  if (!from->is_graph_output()) {
    g.replace_all_uses(from, to);
    return;
  }
  const std::string name = from->name();
  if (!to->is_graph_input() && !to->is_graph_output() && !to->is_capture()) {
    g.replace_all_uses(from, to);
    g.rename_value(from, g.unique_name(name + ".replaced"));
    g.rename_value(to, name);
    return;
  }
  // Node readers go straight to `to`; only the graph output slots need the named copy.
  auto uses = from->uses();
  for (const Use& u : uses) u.node->set_input(u.index, to);
  g.rename_value(from, g.unique_name(name + ".replaced"));
  Node* copy = g.add_node("Identity", {to}, {name}, {}, name);
  Value* out = copy->output(0);
  out->set_dtype(to->dtype());
  out->set_shape(to->shape());
  out->set_layout(to->layout());
  g.replace_all_uses(from, out);
}

// `to` takes over `from`'s readers and its name (a graph output keeps its name either way); `from` is
// renamed NAME.<suffix>.
inline void take_over(Graph& g, Value* from, Value* to, const std::string& suffix = "replaced") {
  if (from->is_graph_output()) {
    replace_value(g, from, to);
    return;
  }
  const std::string name = from->name();
  g.replace_all_uses(from, to);
  g.rename_value(from, g.unique_name(name + "." + suffix));
  g.rename_value(to, name);
}

// Removes the nodes of `nodes` whose outputs nothing reads any more (graph outputs are read), in any
// order given: a node becomes removable once its readers among `nodes` are gone. Returns how many
// were removed; then drops the values left orphaned (e.g. a folded weight).
inline std::size_t erase_if_dead(Graph& g, const std::vector<Node*>& nodes) {
  std::unordered_set<Node*> pending(nodes.begin(), nodes.end());
  auto dead = [](const Node* n) {
    for (Value* out : n->outputs())
      if (out && (out->has_uses() || out->is_graph_output())) return false;
    return true;
  };
  std::vector<Node*> work(nodes.rbegin(), nodes.rend());
  std::size_t removed = 0;
  while (!work.empty()) {
    Node* n = work.back();
    work.pop_back();
    if (!pending.count(n) || !dead(n)) continue;
    pending.erase(n);
    std::vector<Node*> producers;
    for (Value* in : n->inputs())
      if (in && in->producer() && pending.count(in->producer())) producers.push_back(in->producer());
    g.remove_node(n);
    ++removed;
    // Its producers may have lost their last reader.
    work.insert(work.end(), producers.begin(), producers.end());
  }
  if (removed) g.remove_dead_values();
  return removed;
}

}  // namespace ondine::rewrite
