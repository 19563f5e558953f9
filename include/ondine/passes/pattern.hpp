// SPDX-License-Identifier: Apache-2.0
// ondine/passes/pattern.hpp - a small declarative matcher over the IR, so a rewrite reads like its rule.
//
//   using namespace ondine::pattern;
//   // Relu(Conv(x, w)) with a constant weight and a conv result nobody else reads
//   Pattern rule = op("Relu", op("Conv", any("x"), constant("w")).one_use().bind("conv"));
//   if (auto m = match(node, rule)) { Node* conv = m->node("conv"); const Tensor& w = m->constant("w"); ... }
//
// A pattern matches a Value: any() matches every value, constant() a value with a constant tensor,
// scalar(c) a one-element constant equal to c, op("T", p0, p1, ...) a value produced (as output 0)
// by a node whose Node::op_key() is T ("Conv"; "ondine.FusedConv" for Ondine's own ops) and whose
// first inputs match p0, p1, ... (further inputs are not looked at; use where() to constrain them).
// commutative() tries both operand orders, backtracking through everything matched after it. Names given to bind()/any("x")/constant("w") record what matched; a name
// bound twice must match the same value both times, which expresses shared operands
// (Sub(x, ReduceMean(x)) is op("Sub", any("x"), op("ReduceMean", any("x")))).
#pragma once

#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"

namespace ondine::pattern {

// What a successful match bound.
class Match {
 public:
  Node* node(const std::string& name) const {
    auto it = nodes_.find(name);
    if (it == nodes_.end()) throw Error("pattern: no node bound to '" + name + "'");
    return it->second;
  }
  Value* value(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw Error("pattern: no value bound to '" + name + "'");
    return it->second;
  }
  const Tensor& constant(const std::string& name) const { return value(name)->constant(); }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // Every node an op() pattern matched, outermost first (the nodes a fusion replaces).
  const std::vector<Node*>& matched_nodes() const { return matched_; }

 private:
  friend class Pattern;
  // A name already bound must be bound to the same value again.
  bool bind(const std::string& name, Value* v) {
    if (name.empty()) return true;
    auto [it, fresh] = values_.emplace(name, v);
    if (!fresh && it->second != v) return false;
    if (v && v->producer()) nodes_[name] = v->producer();
    return true;
  }
  std::map<std::string, Node*> nodes_;
  std::map<std::string, Value*> values_;
  std::vector<Node*> matched_;
};

class Pattern {
 public:
  // The value is bound to `name` (and its producer, for node(name)).
  Pattern bind(const std::string& name) const { return with([&](Impl& i) { i.name = name; }); }
  // The value has exactly one reader and is not a graph output: it may be fused away.
  Pattern one_use() const { return with([](Impl& i) { i.one_use = true; }); }
  // Also requires pred(value) to hold.
  Pattern where(std::function<bool(const Value*)> pred) const {
    return with([&](Impl& i) { i.preds.push_back(std::move(pred)); });
  }
  // A two-input op pattern that also matches with its two inputs swapped (Add, Mul).
  Pattern commutative() const { return with([](Impl& i) { i.commutative = true; }); }

  // Matches `v`, extending `m` with what the pattern binds; on failure `m` is unchanged.
  bool match(Value* v, Match& m) const {
    return match_then(v, m, [](Match&) { return true; });
  }

 private:
  // Continuation-passing matching: `next` matches the rest of the enclosing pattern. Trying both
  // orders of a commutative op together with everything after it is what makes bindings such as
  // op("Mul", op("Add", any("x"), any("y")).commutative(), any("x")) find x on either side.
  using Next = std::function<bool(Match&)>;

  bool match_then(Value* v, Match& m, const Next& next) const {
    const Impl& p = *impl_;
    if (!v || !matches_here(v)) return false;
    if (p.kind != Kind::Op) {
      Match attempt = m;
      if (!attempt.bind(p.name, v) || !next(attempt)) return false;
      m = std::move(attempt);
      return true;
    }
    Node* n = v->producer();
    for (bool swapped : {false, true}) {
      if (swapped && !(p.commutative && p.inputs.size() == 2)) break;
      Match attempt = m;
      attempt.matched_.push_back(n);
      if (!attempt.bind(p.name, v)) return false;
      if (match_inputs(n, 0, swapped, attempt, next)) {
        m = std::move(attempt);
        return true;
      }
    }
    return false;
  }

  // The checks on `v` alone (kind, one_use, predicates): no bindings involved.
  bool matches_here(Value* v) const {
    const Impl& p = *impl_;
    if (p.one_use && (v->uses().size() != 1 || v->is_graph_output())) return false;
    switch (p.kind) {
      case Kind::Any:
        break;
      case Kind::Constant:
        if (!v->is_constant()) return false;
        break;
      case Kind::Scalar: {
        if (!v->is_constant() || v->constant().numel() != 1 || !is_floating_or_int(v)) return false;
        double c = v->constant().at_double(0);
        if (!(std::fabs(c - p.scalar) <= p.tolerance)) return false;
        break;
      }
      case Kind::Op: {
        Node* n = v->producer();
        if (!n || v->producer_output() != 0 || n->num_inputs() < p.inputs.size()) return false;
        // "Conv" names the ONNX op, "ondine.FusedConv" Ondine's own (Node::op_key()).
        bool type_ok = false;
        for (auto& t : p.op_types) type_ok = type_ok || op_key_is(*n, t);
        if (!type_ok) return false;
        break;
      }
    }
    for (auto& pred : p.preds)
      if (!pred(v)) return false;
    return true;
  }

  bool match_inputs(Node* n, std::size_t i, bool swapped, Match& m, const Next& next) const {
    const auto& ins = impl_->inputs;
    if (i == ins.size()) return next(m);
    std::size_t k = swapped ? 1 - i : i;
    return ins[i].match_then(n->input(k), m,
                             [&](Match& rest) { return match_inputs(n, i + 1, swapped, rest, next); });
  }

  static bool op_key_is(const Node& n, const std::string& key) {
    if (n.domain().empty()) return n.op_type() == key;
    const std::string& d = n.domain();
    return key.size() == d.size() + 1 + n.op_type().size() && key.compare(0, d.size(), d) == 0 &&
           key[d.size()] == '.' && key.compare(d.size() + 1, std::string::npos, n.op_type()) == 0;
  }

  enum class Kind { Any, Constant, Scalar, Op };
  struct Impl {
    Kind kind = Kind::Any;
    std::vector<std::string> op_types;
    std::vector<Pattern> inputs;
    std::string name;
    bool one_use = false, commutative = false;
    double scalar = 0, tolerance = 0;
    std::vector<std::function<bool(const Value*)>> preds;
  };
  explicit Pattern(Impl impl) : impl_(std::make_shared<const Impl>(std::move(impl))) {}
  template <typename F>
  Pattern with(F edit) const {
    Impl copy = *impl_;
    edit(copy);
    return Pattern(std::move(copy));
  }
  static bool is_floating_or_int(const Value* v) { return v->dtype() != DType::String && v->dtype() != DType::Bool; }

  std::shared_ptr<const Impl> impl_;

  friend Pattern any(const std::string&);
  friend Pattern constant(const std::string&);
  friend Pattern scalar(double, double);
  friend Pattern op_of(std::vector<std::string>, std::vector<Pattern>);
};

// Any value (a producer, an input or a constant).
inline Pattern any(const std::string& name = "") {
  Pattern::Impl i;
  i.name = name;
  return Pattern(std::move(i));
}
// A value with a constant tensor (an initializer or a folded result).
inline Pattern constant(const std::string& name = "") {
  Pattern::Impl i;
  i.kind = Pattern::Kind::Constant;
  i.name = name;
  return Pattern(std::move(i));
}
// A one-element constant within `tolerance` of `c` (e.g. the 0.5 in Gelu, the 2 of Pow(x, 2)).
inline Pattern scalar(double c, double tolerance = 1e-6) {
  Pattern::Impl i;
  i.kind = Pattern::Kind::Scalar;
  i.scalar = c;
  i.tolerance = tolerance;
  return Pattern(std::move(i));
}
// A value produced by a node of one of `op_types` whose first inputs match `inputs`.
inline Pattern op_of(std::vector<std::string> op_types, std::vector<Pattern> inputs) {
  Pattern::Impl i;
  i.kind = Pattern::Kind::Op;
  i.op_types = std::move(op_types);
  i.inputs = std::move(inputs);
  return Pattern(std::move(i));
}
template <typename... Inputs>
Pattern op(const std::string& op_type, Inputs... inputs) {
  return op_of({op_type}, std::vector<Pattern>{std::move(inputs)...});
}

// Matches `p` against the first output of `n` (so the pattern's outermost op must be n's).
inline std::optional<Match> match(const Node* n, const Pattern& p) {
  if (!n || n->num_outputs() == 0) return std::nullopt;
  Match m;
  if (!p.match(n->output(0), m)) return std::nullopt;
  return m;
}

}  // namespace ondine::pattern
