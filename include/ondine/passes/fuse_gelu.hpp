// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_gelu.hpp - fuse-gelu: replaces Gelu written out in primitive ops by one ondine.Gelu.
//
// Rewrites (x is any floating value; every other intermediate has exactly one reader and is not a
// graph output; the constants are one-element constants within 1e-4 of the value shown):
//   0.5 * x * (1 + Erf(x / 1.41421))                     -> ondine.Gelu(x)                      (exact)
//   0.5 * x * (1 + Tanh(0.79788 * (x + 0.044715 x^3)))   -> ondine.Gelu(x, approximate="tanh")
// in the orders exporters write them: x / sqrt(2) as Div(x, 1.41421) or Mul(x, 0.70711); the 0.5
// applied last, to (1 + ...), or to x first, or as a Div by 2; x^3 as Pow(x, 3) or x * x * x; Add
// and Mul with their operands either way round. The result keeps the name of the value it replaces
// (a graph output keeps its name). Anything else (another constant, a shared intermediate, an output
// shape that differs from x's through broadcasting) is left as it is.
#pragma once

#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/pattern.hpp"

namespace ondine {

namespace detail::gelu {

struct Rule {
  pattern::Pattern pattern;
  bool tanh = false;
};

inline std::vector<Rule> rules() {
  using namespace pattern;
  constexpr double kTol = 1e-4;
  const double sqrt2 = 1.41421356237309504880, sqrt_2_over_pi = 0.79788456080286535588;
  auto x = [] { return any("x"); };
  auto mul = [](Pattern a, Pattern b) { return op("Mul", std::move(a), std::move(b)).commutative().one_use(); };
  auto add = [](Pattern a, Pattern b) { return op("Add", std::move(a), std::move(b)).commutative().one_use(); };

  // Phi(x) * 2 = 1 + erf(x / sqrt 2), with x / sqrt 2 as a Div or as a Mul by 1 / sqrt 2.
  std::vector<Pattern> erf_forms;
  for (Pattern arg : {op("Div", x(), scalar(sqrt2, kTol)).one_use(), mul(x(), scalar(1.0 / sqrt2, kTol))})
    erf_forms.push_back(add(op("Erf", arg).one_use(), scalar(1.0)));

  // 1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)), with x^3 as Pow(x, 3) or (x * x) * x.
  std::vector<Pattern> tanh_forms;
  for (Pattern cube : {op("Pow", x(), scalar(3.0)).one_use(), mul(mul(x(), x()), x())}) {
    Pattern inner = add(x(), mul(cube, scalar(0.044715, kTol)));
    tanh_forms.push_back(add(op("Tanh", mul(inner, scalar(sqrt_2_over_pi, kTol))).one_use(), scalar(1.0)));
  }

  // 0.5 * x * P in the orders exporters write; the outermost op is the value replaced, so it may
  // have any number of readers (and be a graph output).
  auto outer_forms = [&](const Pattern& p) {
    return std::vector<Pattern>{
        op("Mul", mul(x(), p), scalar(0.5)).commutative(),   // (x * P) * 0.5
        op("Mul", x(), mul(p, scalar(0.5))).commutative(),   // x * (P * 0.5)
        op("Mul", mul(x(), scalar(0.5)), p).commutative(),   // (x * 0.5) * P
        op("Div", mul(x(), p), scalar(2.0)),                 // (x * P) / 2
    };
  };
  std::vector<Rule> out;
  for (const Pattern& p : erf_forms)
    for (Pattern& r : outer_forms(p)) out.push_back({std::move(r), false});
  for (const Pattern& p : tanh_forms)
    for (Pattern& r : outer_forms(p)) out.push_back({std::move(r), true});
  return out;
}

}  // namespace detail::gelu

struct FuseGelu {
  static constexpr const char* name = "fuse-gelu";

  bool run(Graph& g, PassContext& ctx) {
    static const std::vector<detail::gelu::Rule> rules = detail::gelu::rules();
    std::unordered_set<const Node*> erased;
    bool changed = false;
    for (Node* n : g.topo_order()) {
      if (erased.count(n) || !n->domain().empty() || (n->op_type() != "Mul" && n->op_type() != "Div")) continue;
      for (const auto& rule : rules) {
        auto m = pattern::match(n, rule.pattern);
        if (!m) continue;
        Value* x = m->value("x");
        Value* y = n->output(0);
        // Gelu is elementwise on floats: the result must have x's type and shape (no broadcast).
        if (!is_floating(x->dtype()) || y->dtype() != x->dtype() || !(y->shape() == x->shape())) continue;
        g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
        std::string approximate = rule.tanh ? "tanh" : "none", root = n->name();
        detail::fusion::add_replacement(g, y, "Gelu", {x}, {{"approximate", approximate}}, root, fused::kDomain,
                                        fused::kDomainVersion);
        const std::vector<Node*>& matched = m->matched_nodes();
        erased.insert(matched.begin(), matched.end());
        detail::fusion::erase_unused(g, matched);
        ctx.rewrite("'" + root + "': " + std::to_string(matched.size()) + " ops -> ondine.Gelu" +
                    (rule.tanh ? " (tanh)" : "") + " of '" + x->name() + "'");
        changed = true;
        break;
      }
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
