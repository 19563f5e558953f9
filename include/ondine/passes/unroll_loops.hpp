// SPDX-License-Identifier: Apache-2.0
// ondine/passes/unroll_loops.hpp - unroll-loops: a Loop with a trip count known at compile time becomes its
// iterations, and a sequence built element by element at known positions becomes its elements.
//
// Rewrites:
//   Loop(M, cond, v...) {body}  -> M copies of body, chained   M a constant (or known) scalar, 1 <= M <=
//                                  unroll-loops.max-trips (default 64), M x body nodes <= unroll-loops.max-nodes
//                                  (default 4096); the loop provably runs all M iterations: cond absent or
//                                  a constant true, and the body's condition output true by construction
//                                  (a constant, the condition input passed through, or an Identity of one)
//        iteration i reads iteration_num = constant i, cond = constant true, the carried values of
//        iteration i-1 (the loop's inputs for i = 0); the loop's carried outputs become the last
//        iteration's, each scan output Concat(Unsqueeze(y_0, 0), ..., Unsqueeze(y_M-1, 0), axis 0).
//   SequenceAt(s, p)            -> the element at p          s built by SequenceEmpty / SequenceConstruct /
//   SequenceLength(s)           -> constant                  SequenceInsert / SequenceErase at constant
//   ConcatFromSequence(s)       -> Concat (Unsqueeze first    positions (absent: the end), p a constant
//                                  with new_axis = 1)
// Why: PyTorch exports list building (torch.split into a Python list, a comprehension over a fixed
// range) as SequenceEmpty + Loop { SequenceInsert } + SequenceAt. Neither a Loop's outputs nor a
// sequence's elements have shapes known before run time, so everything after them ran staged on the
// reference executor: torchvision's MViT-V2 (one such loop per pooled attention, 51 loops, 307 nodes)
// took minutes per image. Unrolled, the slices, Gathers of the iteration number and the elements fold
// into static shapes (fold-constants, which runs next) and the model compiles as one plan.
// Preconditions beyond the above: every body value defined (a read of a value nothing defines is the
// error it would be at run time, with the node named); nested subgraphs in the body are copied per
// iteration. A Loop that does not qualify stays and runs as before.
// Names: copied nodes and values take the body's names with "/iterI" appended (made unique); the loop's
// outputs keep their names (rewrite::replace_value).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::unroll_loops {

inline constexpr std::int64_t kDefaultMaxTrips = 64;
inline constexpr std::int64_t kDefaultMaxNodes = 4096;

inline std::int64_t int_option(const PassContext& ctx, const std::string& key, std::int64_t fallback) {
  std::string s = ctx.option(key);
  if (s.empty()) return fallback;
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    throw Error("unroll-loops: option " + key + "='" + s + "' is not a number");
  }
}

// The one element of a value known at compile time (a constant, or data known from shapes).
inline std::optional<std::int64_t> known_scalar(const Value* v) {
  const Tensor* t = v ? (v->is_constant() ? &v->constant() : v->known_data()) : nullptr;
  if (!t || t->numel() != 1 || t->dtype() == DType::String) return std::nullopt;
  return static_cast<std::int64_t>(t->at_double(0));
}

// Whether `v`, a value of the body `body` of loop `n`, is true in every iteration by construction.
inline bool true_by_construction(const Node& n, const Graph& body, const Value* v) {
  for (int hops = 0; v && hops < 16; ++hops) {
    if (v->is_constant() || v->known_data()) return known_scalar(v).value_or(0) != 0;
    if (body.inputs().size() > 1 && v == body.inputs()[1]) return true;  // cond in: true while the loop runs
    if (v->is_capture()) {
      const auto& names = n.captured_names();
      for (std::size_t k = 0; k < names.size(); ++k)
        if (names[k] == v->name()) return known_scalar(n.input(n.num_formal_inputs() + k)).value_or(0) != 0;
      return false;
    }
    const Node* p = v->producer();
    if (!p || p->op_type() != "Identity" || !p->domain().empty()) return false;
    v = p->input(0);
  }
  return false;
}

// The trip count of loop `n` when it is unrolled, or nullopt when the loop stays.
inline std::optional<std::int64_t> unrollable_trips(const Node& n, std::int64_t max_trips, std::int64_t max_nodes) {
  if (n.op_type() != "Loop" || !n.domain().empty() || !n.has_attr("body") || n.num_formal_inputs() < 2) return std::nullopt;
  const Graph& body = n.attr_graph("body");
  const std::size_t carried = n.num_formal_inputs() - 2;
  if (body.inputs().size() != 2 + carried || body.outputs().size() < 1 + carried) return std::nullopt;
  if (n.num_outputs() > body.outputs().size() - 1) return std::nullopt;
  for (std::size_t k = 0; k < carried; ++k)
    if (!n.input(2 + k)) return std::nullopt;  // a missing initial value: the run-time error stays
  const auto& names = n.captured_names();
  for (const Value* c : body.captures())  // one the node does not pass in: the loop's own error stays, nothing copied
    if (std::find(names.begin(), names.end(), c->name()) == names.end()) return std::nullopt;
  std::optional<std::int64_t> trips = known_scalar(n.input(0));
  if (!trips || *trips < 1 || *trips > max_trips) return std::nullopt;
  if (*trips * static_cast<std::int64_t>(body.num_nodes()) > max_nodes) return std::nullopt;
  if (const Value* cond = n.input(1)) {
    if (known_scalar(cond).value_or(0) == 0) return std::nullopt;
    if (*trips > 1 && !true_by_construction(n, body, body.outputs()[0])) return std::nullopt;
  }
  return trips;
}

inline Tensor int64_scalar(std::int64_t v) { return Tensor::scalar<std::int64_t>(v); }

// Splices the iterations of loop `n` (trip count `trips`) into `g`; n's readers then read their results.
inline void unroll(Graph& g, Node& n, std::int64_t trips) {
  const Graph& body = n.attr_graph("body");
  const std::size_t carried = n.num_formal_inputs() - 2;
  const std::size_t scans = body.outputs().size() - 1 - carried;
  std::vector<Value*> state;
  for (std::size_t k = 0; k < carried; ++k) state.push_back(n.input(2 + k));
  std::vector<std::vector<Value*>> stacked(scans);
  Value* cond_true = g.add_constant(g.unique_name(n.name() + "/cond_true"), Tensor::scalar<bool>(true));
  for (std::int64_t i = 0; i < trips; ++i) {
    const std::string tag = "/iter" + std::to_string(i);
    std::unordered_map<const Value*, Value*> map;
    map[body.inputs()[0]] = g.add_constant(g.unique_name(n.name() + tag + "/i"), int64_scalar(i));
    map[body.inputs()[1]] = cond_true;
    for (std::size_t k = 0; k < carried; ++k) map[body.inputs()[2 + k]] = state[k];
    map = rewrite::splice_subgraph(g, n, body, std::move(map), tag);
    for (std::size_t k = 0; k < carried; ++k) state[k] = map.at(body.outputs()[1 + k]);
    for (std::size_t k = 0; k < scans; ++k) stacked[k].push_back(map.at(body.outputs()[1 + carried + k]));
  }
  for (std::size_t k = 0; k < carried && k < n.num_outputs(); ++k)
    if (Value* y = n.output(k); y && (y->has_uses() || y->is_graph_output())) rewrite::replace_value(g, y, state[k]);
  Value* axis0 = nullptr;
  for (std::size_t k = 0; k < scans && carried + k < n.num_outputs(); ++k) {
    Value* y = n.output(carried + k);
    if (!y || !(y->has_uses() || y->is_graph_output())) continue;
    std::vector<Value*> parts;
    for (Value* part : stacked[k]) {
      Value* u;
      if (g.opset() >= 13) {
        if (!axis0) axis0 = g.add_constant(g.unique_name(n.name() + "/axis0"), Tensor::from_vector<std::int64_t>({1}, {0}));
        u = g.add_op("Unsqueeze", {part, axis0}, {}, g.unique_name(part->name() + "/stacked"));
      } else {
        u = g.add_op("Unsqueeze", {part}, {{"axes", std::vector<std::int64_t>{0}}}, g.unique_name(part->name() + "/stacked"));
      }
      u->set_dtype(part->dtype());
      parts.push_back(u);
    }
    Value* joined = parts.size() == 1 ? parts[0] : g.add_op("Concat", parts, {{"axis", std::int64_t{0}}}, g.unique_name(y->name() + "/stacked"));
    joined->set_dtype(y->dtype() != DType::Undefined ? y->dtype() : parts[0]->dtype());
    rewrite::replace_value(g, y, joined);
  }
}

// The elements of sequence `s` when its construction is known: the values, in order; nullopt otherwise.
inline std::optional<std::vector<Value*>> known_elements(const Value* s, int depth = 0) {
  if (!s || depth > 4096) return std::nullopt;
  const Node* p = s->producer();
  if (!p || !p->domain().empty()) return std::nullopt;
  const std::string& op = p->op_type();
  if (op == "SequenceEmpty") return std::vector<Value*>{};
  if (op == "SequenceConstruct") {
    std::vector<Value*> out;
    for (std::size_t i = 0; i < p->num_formal_inputs(); ++i) {
      if (!p->input(i)) return std::nullopt;
      out.push_back(p->input(i));
    }
    return out;
  }
  if (op != "SequenceInsert" && op != "SequenceErase") return std::nullopt;
  auto elements = known_elements(p->input(0), depth + 1);
  if (!elements) return std::nullopt;
  const auto size = static_cast<std::int64_t>(elements->size());
  const Value* position = p->input(op == "SequenceInsert" ? 2 : 1);
  std::int64_t at = op == "SequenceInsert" ? size : size - 1;  // the defaults: insert at the end, erase the last
  if (position) {
    auto known = known_scalar(position);
    if (!known) return std::nullopt;
    at = *known < 0 ? *known + size : *known;
  }
  if (op == "SequenceInsert") {
    if (at < 0 || at > size || !p->input(1)) return std::nullopt;  // out of range: the run-time error stays
    elements->insert(elements->begin() + at, p->input(1));
  } else {
    if (at < 0 || at >= size) return std::nullopt;
    elements->erase(elements->begin() + at);
  }
  return elements;
}

// Replaces the reads of a known sequence's elements by node `n`; true when n's output now stands elsewhere.
inline bool resolve_sequence_read(Graph& g, Node& n) {
  if (!n.domain().empty() || n.num_outputs() != 1 || !n.output(0)) return false;
  const std::string& op = n.op_type();
  if (op != "SequenceAt" && op != "SequenceLength" && op != "ConcatFromSequence") return false;
  auto elements = known_elements(n.input(0));
  if (!elements) return false;
  Value* y = n.output(0);
  const auto size = static_cast<std::int64_t>(elements->size());
  if (op == "SequenceLength") {
    rewrite::replace_value(g, y, g.add_constant(g.unique_name(y->name() + ".known"), int64_scalar(size)));
    return true;
  }
  if (op == "SequenceAt") {
    auto position = known_scalar(n.input(1));
    if (!position) return false;
    const std::int64_t at = *position < 0 ? *position + size : *position;
    if (at < 0 || at >= size) return false;  // the run-time error stays
    rewrite::replace_value(g, y, (*elements)[static_cast<std::size_t>(at)]);
    return true;
  }
  if (elements->empty() || !n.has_attr("axis")) return false;
  const std::int64_t axis = n.attr_int("axis");
  std::vector<Value*> parts = *elements;
  if (n.attr_int("new_axis", 0) == 1) {
    for (Value*& part : parts) {
      if (!part->shape().rank_known()) return false;
      const auto rank = static_cast<std::int64_t>(part->shape().rank()) + 1;
      if (axis < -rank || axis >= rank) return false;
      Value* axes = g.add_constant(g.unique_name(n.name() + "/axis"), Tensor::from_vector<std::int64_t>({1}, {axis}));
      Value* u = g.opset() >= 13 ? g.add_op("Unsqueeze", {part, axes}, {}, g.unique_name(part->name() + "/unsqueezed"))
                                 : g.add_op("Unsqueeze", {part}, {{"axes", std::vector<std::int64_t>{axis}}},
                                            g.unique_name(part->name() + "/unsqueezed"));
      u->set_dtype(part->dtype());
      part = u;
    }
  }
  Value* joined = g.add_op("Concat", parts, {{"axis", axis}}, g.unique_name(y->name() + ".known"));
  joined->set_dtype(y->dtype());
  rewrite::replace_value(g, y, joined);
  return true;
}

}  // namespace detail::unroll_loops

struct UnrollLoops {
  static constexpr const char* name = "unroll-loops";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::unroll_loops;
    const std::int64_t max_trips = d::int_option(ctx, "unroll-loops.max-trips", d::kDefaultMaxTrips);
    const std::int64_t max_nodes = d::int_option(ctx, "unroll-loops.max-nodes", d::kDefaultMaxNodes);
    std::vector<Node*> done;
    for (Node* n : g.topo_order()) {
      if (auto trips = d::unrollable_trips(*n, max_trips, max_nodes)) {
        d::unroll(g, *n, *trips);
        ctx.rewrite("unrolled '" + n->name() + "' (Loop, " + std::to_string(*trips) + " iterations)");
        done.push_back(n);
      }
    }
    // The sequences: after the loops, whose iterations build them.
    for (Node* n : g.topo_order()) {
      if (d::resolve_sequence_read(g, *n)) {
        ctx.rewrite("resolved '" + n->name() + "' (" + n->op_type() + ") to the sequence's elements");
        done.push_back(n);
      }
    }
    if (done.empty()) return false;
    // What is left without readers: the loops, the resolved reads, and the sequences' construction.
    for (Node* n : g.nodes())
      for (Value* out : n->outputs())
        if (out && is_sequence_kind(out->kind())) {
          done.push_back(n);
          break;
        }
    rewrite::erase_if_dead(g, done);
    return true;
  }
};

}  // namespace ondine
