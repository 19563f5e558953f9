// SPDX-License-Identifier: Apache-2.0
// ondine/passes/cancel_transposes.hpp - cancel-transposes: merges consecutive Transposes and removes
// those that compose to the identity.
//
// Rewrites, with ONNX's Transpose semantics (output axis i is input axis perm[i]; no perm attribute:
// the axes reversed):
//   Transpose(Transpose(x, p1), p2) -> Transpose(x, p), p[i] = p1[p2[i]]
//   Transpose(x, p) with p[i] == i   -> x
// Preconditions: the perms are valid permutations of the input's (known) rank; a Transpose of a
// constant is left alone (fold-constants computes it). The first Transpose stays when something else
// reads its output (the second one then reads x directly), and goes when nothing does.
// Names: the second Transpose keeps its node and output value. An identity Transpose whose output is a
// graph output hands that name to its input (rewrite::replace_value), except when the input is
// itself a graph input or output, whose name must not change: then the Transpose stays.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::transposes {

using Perm = std::vector<std::int64_t>;

// The permutation of Transpose `n`, or nullopt when it cannot be known or is not a permutation
// (shape inference reports those; this pass just leaves the node alone).
inline std::optional<Perm> perm_of(const Node& n) {
  const Value* x = n.input(0);
  if (!x) return std::nullopt;
  Perm perm;
  if (n.has_attr("perm")) {
    if (!std::holds_alternative<std::vector<std::int64_t>>(n.attrs().at("perm"))) return std::nullopt;
    perm = n.attr_ints("perm");
  } else {
    if (!x->shape().rank_known()) return std::nullopt;
    for (auto i = static_cast<std::int64_t>(x->shape().rank()); i-- > 0;) perm.push_back(i);
  }
  if (x->shape().rank_known() && perm.size() != x->shape().rank()) return std::nullopt;
  std::vector<bool> seen(perm.size(), false);
  for (auto p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(perm.size()) || seen[static_cast<std::size_t>(p)]) return std::nullopt;
    seen[static_cast<std::size_t>(p)] = true;
  }
  return perm;
}

// Transpose by p1, then by p2, is one Transpose by compose(p1, p2):
// z axis i = y axis p2[i] = x axis p1[p2[i]].
inline Perm compose(const Perm& p1, const Perm& p2) {
  Perm p(p2.size());
  for (std::size_t i = 0; i < p2.size(); ++i) p[i] = p1[static_cast<std::size_t>(p2[i])];
  return p;
}

inline bool is_identity(const Perm& p) {
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<std::int64_t>(i)) return false;
  return true;
}

inline bool is_transpose(const Node* n) { return n && n->domain().empty() && n->op_type() == "Transpose"; }

}  // namespace detail::transposes

struct CancelTransposes {
  static constexpr const char* name = "cancel-transposes";

  bool run(Graph& g, PassContext& ctx) {
    namespace t = detail::transposes;
    bool changed = false;
    std::vector<Node*> maybe_dead;
    for (Node* n : g.topo_order()) {
      if (!t::is_transpose(n) || n->num_outputs() != 1 || !n->input(0) || n->input(0)->is_constant()) continue;
      // Earlier rewrites in this loop may have emptied a Transpose we still visit: skip those.
      if (!n->output(0)->has_uses() && !n->output(0)->is_graph_output()) continue;
      std::optional<t::Perm> perm = t::perm_of(*n);
      if (!perm) continue;

      // Transpose(Transpose(x, p1), p2) -> Transpose(x, p1[p2[i]])
      Node* first = n->input(0)->producer();
      if (t::is_transpose(first) && first->input(0) && !first->input(0)->is_constant()) {
        std::optional<t::Perm> p1 = t::perm_of(*first);
        if (p1 && p1->size() == perm->size()) {
          *perm = t::compose(*p1, *perm);
          n->set_attr("perm", *perm);
          n->set_input(0, first->input(0));
          maybe_dead.push_back(first);
          ctx.rewrite("merged Transpose '" + first->name() + "' into '" + n->name() + "' (perm " +
                      dims_str(*perm) + ")");
          changed = true;
        }
      }

      // Transpose(x, identity) -> x
      if (t::is_identity(*perm)) {
        Value* x = n->input(0);
        Value* y = n->output(0);
        if (y->is_graph_output() && (x->is_graph_input() || x->is_graph_output())) continue;
        rewrite::replace_value(g, y, x);
        maybe_dead.push_back(n);
        ctx.rewrite("removed identity Transpose '" + n->name() + "'");
        changed = true;
      }
    }
    rewrite::erase_if_dead(g, maybe_dead);
    return changed;
  }
};

}  // namespace ondine
