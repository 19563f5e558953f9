// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_rotary.hpp - fuse-rotary: rotary position embeddings as Hugging Face's
// apply_rotary_pos_emb exports them (Llama, Mistral, Qwen, Phi) become one ondine.Rotary (semantics:
// ir/fused_ops.hpp): one pass over the heads in place of two Slices, a Neg, a Concat, two Muls and an
// Add, for each of Q and K of every layer.
//
// Rewrite, with D = x's last dim (static, even) and h = D / 2:
//   Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h:)), Slice(x, :h), axis -1), sin))
//     -> ondine.Rotary(x, cos, sin)
// Add and the Muls take their operands either way round. The Slices are over the last axis only, step 1,
// [0, h) and [h, end) (any end >= D, as `x[..., h:]` exports INT64_MAX); their starts, ends, axes and
// steps are constants (inputs, or attributes before opset 10).
// Preconditions: x, cos, sin float32; cos and sin of one shape whose last dim is D, broadcasting to x's
// shape without changing it (both Muls and the Add have x's shape); the Slices, Neg, Concat and both Muls
// read only inside the pattern and are not graph outputs. Otherwise nothing changes. The fused node
// keeps the name of the value it replaces.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/pattern.hpp"

namespace ondine {

namespace detail::rotary {

// A Slice node's starts, ends, axes and steps (inputs from opset 10, attributes before), when constant.
struct SliceParams {
  std::vector<std::int64_t> starts, ends, axes, steps;
};
inline std::optional<SliceParams> slice_params(const Node& n) {
  SliceParams p;
  if (n.opset() != 0 && n.opset() < 10) {
    if (!n.has_attr("starts") || !n.has_attr("ends")) return std::nullopt;
    p.starts = n.attr_ints("starts");
    p.ends = n.attr_ints("ends");
    if (n.has_attr("axes")) p.axes = n.attr_ints("axes");
    return p;
  }
  auto ints = [&](std::size_t i, std::vector<std::int64_t>& out) {
    const Value* v = i < n.num_inputs() ? n.input(i) : nullptr;
    if (!v) return true;  // absent: the default
    if (!v->is_constant() || v->constant().rank() != 1) return false;
    out = v->constant().to_int64s();
    return true;
  };
  if (n.num_inputs() < 3 || !ints(1, p.starts) || !ints(2, p.ends) || !ints(3, p.axes) || !ints(4, p.steps))
    return std::nullopt;
  return p;
}

// `n` slices [from, to) of the last axis (of rank `rank`, size `d`) and nothing else; `to` at d takes
// any end >= d.
inline bool slices_last(const Node& n, std::int64_t rank, std::int64_t d, std::int64_t from, std::int64_t to) {
  auto p = slice_params(n);
  if (!p || p->starts.size() != 1 || p->ends.size() != 1) return false;
  if (p->axes.size() > 1 || (p->axes.empty() && rank != 1)) return false;
  if (!p->axes.empty() && p->axes[0] != rank - 1 && p->axes[0] != -1) return false;
  if (!p->steps.empty() && (p->steps.size() != 1 || p->steps[0] != 1)) return false;
  const std::int64_t start = p->starts[0] < 0 ? p->starts[0] + d : p->starts[0];
  const std::int64_t end = p->ends[0] < 0 ? p->ends[0] + d : p->ends[0];
  return start == from && (to == d ? end >= d : end == to);
}

inline pattern::Pattern rule() {
  using namespace pattern;
  Pattern rotated = op("Concat", op("Neg", op("Slice", any("x")).bind("hi")), op("Slice", any("x")).bind("lo"))
                        .bind("rotated");
  return op("Add", op("Mul", any("x"), any("cos")).commutative().bind("xc"),
            op("Mul", rotated, any("sin")).commutative().bind("rs"))
      .commutative();
}

}  // namespace detail::rotary

struct FuseRotary {
  static constexpr const char* name = "fuse-rotary";

  bool run(Graph& g, PassContext& ctx) {
    static const pattern::Pattern rule = detail::rotary::rule();
    std::unordered_set<const Node*> erased;
    bool changed = false;
    for (Node* n : g.topo_order()) {
      if (erased.count(n) || !n->domain().empty() || n->op_type() != "Add") continue;
      auto m = pattern::match(n, rule);
      if (!m || !fuse(g, ctx, *n, *m)) continue;
      erased.insert(m->matched_nodes().begin(), m->matched_nodes().end());
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }

 private:
  static bool fuse(Graph& g, PassContext& ctx, Node& root, const pattern::Match& m) {
    using detail::fusion::is_f32;
    Value *x = m.value("x"), *cos = m.value("cos"), *sin = m.value("sin"), *y = root.output(0);
    if (!is_f32(x) || !is_f32(cos) || !is_f32(sin) || !is_f32(y)) return false;
    const Shape &xs = x->shape(), &cs = cos->shape();
    if (!xs.rank_known() || xs.rank() == 0 || !cs.rank_known() || cs.rank() == 0 || !(cs == sin->shape())) return false;
    const Dim& last = xs[xs.rank() - 1];
    if (!last.is_static() || last.value == 0 || last.value % 2 != 0 || !(cs[cs.rank() - 1] == last)) return false;
    if (cos == x || sin == x) return false;
    for (const char* v : {"xc", "rs"})
      if (!(m.value(v)->shape() == xs)) return false;  // cos / sin broadcast x up
    if (!(y->shape() == xs)) return false;
    const auto rank = static_cast<std::int64_t>(xs.rank());
    const std::int64_t d = last.value, h = d / 2;
    if (!detail::rotary::slices_last(*m.node("hi"), rank, d, h, d) ||
        !detail::rotary::slices_last(*m.node("lo"), rank, d, 0, h))
      return false;
    const Node* concat = m.node("rotated");
    const std::int64_t axis = concat->attr_int("axis", 0);
    if (axis != rank - 1 && axis != -1) return false;
    if (!detail::fusion::is_closed(m.matched_nodes(), &root)) return false;

    // Checked: from here on the graph changes.
    const std::string root_name = root.name();
    g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
    detail::fusion::add_replacement(g, y, "Rotary", {x, cos, sin}, {}, root_name, fused::kDomain,
                                    fused::kDomainVersion);
    const std::size_t count =
        std::unordered_set<Node*>(m.matched_nodes().begin(), m.matched_nodes().end()).size();
    detail::fusion::erase_unused(g, m.matched_nodes());
    ctx.rewrite("'" + root_name + "': " + std::to_string(count) + " ops -> ondine.Rotary of '" + x->name() + "'");
    return true;
  }
};

}  // namespace ondine
