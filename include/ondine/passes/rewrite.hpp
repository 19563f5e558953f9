// SPDX-License-Identifier: Apache-2.0
// ondine/passes/rewrite.hpp - the graph edits that rewrites share: redirecting a value's readers while
// keeping the model's interface (graph input and output names) unchanged, and erasing nodes left unused.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ondine/ir/graph.hpp"

namespace ondine::rewrite {

// True when `v` has exactly one reader and is not a graph output: a rewrite may make it disappear.
inline bool single_use(const Value* v) { return v && v->uses().size() == 1 && !v->is_graph_output(); }

// True when `n` lacks the ints attribute `attr`, or has `count` values all equal to `want` (pads all 0,
// dilations all 1: the preconditions rewrites of convolutions check).
inline bool ints_attr_all(const Node& n, const char* attr, std::int64_t want, std::size_t count) {
  if (!n.has_attr(attr)) return true;
  const std::vector<std::int64_t> v = n.attr_ints(attr);
  if (v.size() != count) return false;
  for (std::int64_t e : v)
    if (e != want) return false;
  return true;
}

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

// Copies the nodes of `sub`, a subgraph of node `n` (an If branch, a Loop body), into `g`, where `n` is:
// `map` holds the g values that stand for sub's formal inputs; sub's captures read n's implicit inputs,
// its constants are copied (the tensors shared), and every node is added under a fresh name with fresh
// output names (`tag` appended, "" for none), dtype and shape as sub inferred them. A copied node's own
// subgraphs are deep copies: they still name their captures by the names sub used, which the copy's
// captured_names keep. Returns `map` extended by every value of sub (sub value -> g value).
inline std::unordered_map<const Value*, Value*> splice_subgraph(Graph& g, const Node& n, const Graph& sub,
                                                                std::unordered_map<const Value*, Value*> map,
                                                                const std::string& tag = "") {
  const auto& names = n.captured_names();
  for (Value* c : sub.captures()) {
    auto it = std::find(names.begin(), names.end(), c->name());
    if (it == names.end()) throw n.error("its subgraph reads '" + c->name() + "', which the node does not pass in");
    map[c] = n.input(n.num_formal_inputs() + static_cast<std::size_t>(it - names.begin()));
  }
  for (Value* v : sub.values())
    if (v->is_constant()) map[v] = g.add_constant(g.unique_name(v->name() + tag), v->constant());
  auto lookup = [&](const Value* v) -> Value* {
    auto it = map.find(v);
    if (it == map.end()) throw n.error("its subgraph reads '" + v->name() + "', which nothing defines");
    return it->second;
  };
  for (Node* b : sub.topo_order()) {
    std::vector<Value*> inputs;
    for (std::size_t i = 0; i < b->num_formal_inputs(); ++i) inputs.push_back(b->input(i) ? lookup(b->input(i)) : nullptr);
    std::vector<std::string> outputs;
    for (Value* out : b->outputs()) outputs.push_back(g.unique_name(out->name() + tag));
    std::map<std::string, Attribute> attrs = b->attrs();
    for (auto& [k, a] : attrs)
      if (auto* graph = std::get_if<GraphAttr>(&a); graph && *graph) *graph = std::make_shared<Graph>((*graph)->clone());
    const std::string base = b->name().empty() ? n.name() : b->name();
    Node* c = g.add_node(b->op_type(), inputs, outputs, std::move(attrs), g.unique_name(base + tag), b->domain());
    c->set_opset(b->opset());
    for (std::size_t k = 0; k < b->captured_names().size(); ++k)
      c->add_implicit_input(lookup(b->input(b->num_formal_inputs() + k)), b->captured_names()[k]);
    for (std::size_t i = 0; i < b->num_outputs(); ++i) {
      c->output(i)->set_dtype(b->output(i)->dtype());
      c->output(i)->set_shape(b->output(i)->shape());
      c->output(i)->set_kind(b->output(i)->kind());
      map[b->output(i)] = c->output(i);
    }
  }
  return map;
}

}  // namespace ondine::rewrite
