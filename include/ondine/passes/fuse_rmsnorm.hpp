// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_rmsnorm.hpp - fuse-rmsnorm: replaces RMSNorm written out in primitive ops (Llama's
// LlamaRMSNorm, T5's LayerNorm, as exported) by one ondine.RMSNorm (semantics: ir/fused_ops.hpp), a
// single pass over each row in place of six ops and their intermediates.
//
// Rewrite, with both forms of the square and the reduction over the trailing axes [r-k, r):
//   Mul(Div(x, Sqrt(Add(ReduceMean(Pow(x, 2)), eps))), gamma)
//     -> ondine.RMSNorm(x, scale = gamma) {axis = -k, epsilon = eps}
// Pow(x, 2) may be Mul(x, x); Div(x, s) may be Mul(x, Div(1, s)) or Mul(x, Reciprocal(s)) (rsqrt as
// exporters write it); Add and Mul take their operands either way round; the Mul by gamma is optional
// (scale = ones). gamma becomes a constant of the normalised shape x.shape[r-k:].
// Preconditions: x is float32 with a known rank; the ReduceMean keeps dims and has its axes as the
// attribute (opset < 18) or a constant input; eps and gamma are float32 constants, eps a scalar, gamma
// broadcasting only along the normalised axes; every intermediate is read only inside the pattern and is
// not a graph output. The fused node keeps the name of the value it replaces.
#pragma once

#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/fuse_layernorm.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/pattern.hpp"

namespace ondine {

namespace detail::rmsnorm {

// The rules, longest first: with gamma, bare; each square and each division form.
inline std::vector<pattern::Pattern> rules() {
  using namespace pattern;
  std::vector<Pattern> with_gamma, bare;
  for (Pattern square : {op("Pow", any("x"), scalar(2.0)), op("Mul", any("x"), any("x"))}) {
    Pattern mean_square = op("ReduceMean", square).where(layernorm::reduces_trailing).bind("var");
    Pattern rms = op("Sqrt", op("Add", mean_square, constant("eps")).commutative());
    for (Pattern normalized : {op("Div", any("x"), rms), op("Mul", any("x"), op("Div", scalar(1.0), rms)).commutative(),
                               op("Mul", any("x"), op("Reciprocal", rms)).commutative()}) {
      with_gamma.push_back(op("Mul", normalized, constant("gamma")).commutative());
      bare.push_back(normalized);
    }
  }
  with_gamma.insert(with_gamma.end(), bare.begin(), bare.end());
  return with_gamma;
}

}  // namespace detail::rmsnorm

struct FuseRmsNorm {
  static constexpr const char* name = "fuse-rmsnorm";

  bool run(Graph& g, PassContext& ctx) {
    static const std::vector<pattern::Pattern> rules = detail::rmsnorm::rules();
    std::unordered_set<const Node*> erased;
    bool changed = false;
    std::vector<Node*> order = g.topo_order();
    // Consumers first, so the form with gamma is tried before the normalisation under it.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = *it;
      if (erased.count(n) || !n->domain().empty() || (n->op_type() != "Mul" && n->op_type() != "Div")) continue;
      for (const auto& rule : rules) {
        auto m = pattern::match(n, rule);
        if (!m || !fuse(g, ctx, *n, *m)) continue;
        erased.insert(m->matched_nodes().begin(), m->matched_nodes().end());
        changed = true;
        break;
      }
    }
    if (changed) g.remove_dead_values();
    return changed;
  }

 private:
  static bool fuse(Graph& g, PassContext& ctx, Node& root, const pattern::Match& m) {
    namespace ln = detail::layernorm;
    Value* x = m.value("x");
    Value* y = root.output(0);
    if (!detail::fusion::is_f32(x) || !x->shape().rank_known() || !detail::fusion::is_f32(y)) return false;
    if (!(y->shape() == x->shape())) return false;  // gamma must not broadcast the result larger
    auto k = ln::trailing_axes(*m.node("var"));
    if (!k || !detail::fusion::is_closed(m.matched_nodes(), &root)) return false;
    const Tensor& eps = m.constant("eps");
    if (eps.numel() != 1 || !is_floating(eps.dtype())) return false;
    Value* gamma = m.has("gamma") ? m.value("gamma") : nullptr;
    if (gamma ? !ln::param_fits(gamma, x->shape(), *k) : !ln::normalized_shape(x->shape(), *k).is_static()) return false;

    // Checked: from here on the graph changes.
    Value* scale = gamma ? ln::normalized_param(g, gamma, x->shape(), *k) : ln::ones(g, x->name(), x->shape(), *k);
    const std::string root_name = root.name();
    const float epsilon = static_cast<float>(eps.at_double(0));
    g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
    detail::fusion::add_replacement(g, y, "RMSNorm", {x, scale}, {{"axis", -*k}, {"epsilon", epsilon}}, root_name,
                                    fused::kDomain, fused::kDomainVersion);
    const std::size_t count =
        std::unordered_set<Node*>(m.matched_nodes().begin(), m.matched_nodes().end()).size();
    detail::fusion::erase_unused(g, m.matched_nodes());
    char eps_text[32];
    std::snprintf(eps_text, sizeof eps_text, "%g", static_cast<double>(epsilon));
    ctx.rewrite("'" + root_name + "': " + std::to_string(count) + " ops -> ondine.RMSNorm of '" + x->name() +
                "' (axis " + std::to_string(-*k) + ", epsilon " + eps_text + ")");
    return true;
  }
};

}  // namespace ondine
