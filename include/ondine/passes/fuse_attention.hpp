// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_attention.hpp - fuse-attention: scaled dot-product attention, as PyTorch and
// Hugging Face-style code export it, into one ondine.Attention (semantics: ondine/ir/fused_ops.hpp),
// which the lowering runs as matmul (scale and mask as its output scale and post-op), softmax in place,
// matmul.
//
// Matches, walking up from a Softmax over the last axis whose result is read only as the left operand
// of a MatMul(., V):
//   scores = MatMul(Q, K)                   Q and K each possibly Mul/Div by a scalar (folded into scale)
//            [Mul|Div by a scalar]*         folded into scale
//            [mask]                         Add(scores, M): M float, broadcasting to the scores;
//                                           Where(c, fill, scores) / Where(c, scores, fill) with a bool c
//                                           and fill -inf or <= -1e9: becomes the additive mask
//                                           Where(c, fill, 0) / Where(c, 0, fill) (a constant when c is);
//                                           M's own Mul/Div by exactly 1 (baddbmm's beta) is dropped
//            [Mul|Div by exactly 1]*        baddbmm's alpha after the mask
// on 3-D [B*H, S, D] (nn.MultiheadAttention) or 4-D [B, H, S, D] (Hugging Face) tensors alike.
// Preconditions: every value between the first MatMul and the second is float32, has exactly one
// reader and is not a graph output; Q, K, V and the scores have one rank and the same batch dims (no
// batch broadcasting); a scale before the mask is exactly 1 (a scaled mask is not rewritten); a
// finite fill differs from adding it only in rows where everything is masked (softmax of ~-1e9 + s
// and of ~-1e9 are both uniform there), which is why finite fills above -1e9 are left alone.
// Otherwise the graph is left as it is. The fused node takes the first MatMul's name; its output
// keeps the second MatMul's output name. The Reshape/Transpose of the heads stay graph ops.
// Grouped-query attention: K (before or under a Transpose that keeps the batch axes) and V made by
// Hugging Face's repeat_kv, Reshape(Expand(Unsqueeze(c, a))) repeating each of c's heads in place with
// static head counts, are read as c: the fused node's K/V have fewer heads (fused_ops.hpp), so the
// repeated copies are never made and a KV cache is read where it is.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::attention {

using fusion::is_f32;

// A one-element float constant's value.
inline std::optional<double> scalar_of(const Value* v) {
  if (!v || !v->is_constant() || v->constant().numel() != 1 || !is_floating(v->dtype())) return std::nullopt;
  return v->constant().at_double(0);
}

// n is Mul(x, c) / Mul(c, x) / Div(x, c) with a scalar c and an output of x's shape: x and the factor.
inline std::optional<std::pair<Value*, double>> scaled_input(const Node* n) {
  if (!n || !n->domain().empty() || n->num_inputs() != 2 || n->num_outputs() != 1) return std::nullopt;
  bool mul = n->op_type() == "Mul", div = n->op_type() == "Div";
  if (!mul && !div) return std::nullopt;
  for (std::size_t i = 0; i < 2; ++i) {
    if (div && i == 0) continue;  // c / x is not a scale
    std::optional<double> c = scalar_of(n->input(i));
    Value* x = n->input(1 - i);
    if (!c || !x || !std::isfinite(*c) || *c == 0 || !(n->output(0)->shape() == x->shape())) continue;
    return std::make_pair(x, div ? 1.0 / *c : *c);
  }
  return std::nullopt;
}

// What the walk found; `nodes` are the ops the fused node replaces.
struct Match {
  Node* scores_mm = nullptr;
  Value *q = nullptr, *k = nullptr, *mask = nullptr;
  double scale = 1.0;
  std::vector<Node*> nodes;
  // A boolean mask to turn additive: Where(cond, fill, 0) (fill_first) or Where(cond, 0, fill).
  Value* cond = nullptr;
  double fill = 0;
  bool fill_first = true;
  // Grouped-query attention: K and V as they were before repeat_kv, and K's Transpose to redo on them.
  Value *k_grouped = nullptr, *v_grouped = nullptr;
  std::vector<std::int64_t> k_perm;
};

// Dims a and b are the same (equal values, or the same named symbol).
inline bool same_dim(const Dim& a, const Dim& b) { return a == b && (a.is_static() || !a.symbol.empty()); }

// Hugging Face's repeat_kv: x = Reshape(Expand(Unsqueeze(c, axes [a]), shape), shape') repeats each head of
// c (axis a-1, a batch axis) `rep` times in place, [.., H, T, D] -> [.., H * rep, T, D]. Returns c when `x`
// is that, with H and rep static, and appends the three nodes to `nodes`; else null.
inline Value* unrepeated_heads(Value* x, std::vector<Node*>& nodes) {
  auto producer = [](Value* v, const char* op) -> Node* {
    if (!rewrite::single_use(v) || !v->producer() || !v->producer()->domain().empty() ||
        v->producer()->op_type() != op)
      return nullptr;
    return v->producer();
  };
  Node* reshape = producer(x, "Reshape");
  Node* expand = reshape ? producer(reshape->input(0), "Expand") : nullptr;
  Node* unsqueeze = expand ? producer(expand->input(0), "Unsqueeze") : nullptr;
  if (!unsqueeze) return nullptr;
  Value* c = unsqueeze->input(0);
  const Shape &cs = c->shape(), &us = unsqueeze->output(0)->shape(), &es = expand->output(0)->shape(),
              &xs = x->shape();
  if (!is_f32(c) || !cs.rank_known() || !us.rank_known() || !es.rank_known() || !xs.rank_known()) return nullptr;
  const std::size_t r = xs.rank();
  if (r < 3 || cs.rank() != r || us.rank() != r + 1 || es.rank() != r + 1) return nullptr;
  std::vector<std::int64_t> axes;
  if (unsqueeze->has_attr("axes")) axes = unsqueeze->attr_ints("axes");
  else if (const Value* a = unsqueeze->input(1); a && a->is_constant()) axes = a->constant().to_int64s();
  if (axes.size() != 1) return nullptr;
  std::int64_t a = axes[0] < 0 ? axes[0] + static_cast<std::int64_t>(r) + 1 : axes[0];
  if (a < 1 || a > static_cast<std::int64_t>(r) - 2) return nullptr;  // axis a-1 must be a batch axis
  const auto ua = static_cast<std::size_t>(a);
  if (!us[ua].is_static() || us[ua].value != 1 || !es[ua].is_static() || !es[ua - 1].is_static()) return nullptr;
  for (std::size_t i = 0; i <= r; ++i) {
    if (i == ua) continue;
    if (!same_dim(us[i], cs[i < ua ? i : i - 1]) || !same_dim(es[i], us[i])) return nullptr;
  }
  for (std::size_t i = 0; i < r; ++i) {
    if (i + 1 == ua) {
      if (!xs[i].is_static() || xs[i].value != es[ua - 1].value * es[ua].value) return nullptr;
    } else if (!same_dim(xs[i], es[i < ua ? i : i + 1])) {
      return nullptr;
    }
  }
  nodes.insert(nodes.end(), {reshape, expand, unsqueeze});
  return c;
}

// K (the scores' right operand) and V read through repeat_kv: m.k_grouped / m.v_grouped, the heads not
// repeated. K may be repeated before a Transpose that keeps the batch axes in place (key_states.transpose(2, 3)).
inline void take_groups(Match& m, Value* v) {
  const std::size_t r = m.q->shape().rank();
  Value* k = m.k;
  std::vector<Node*> nodes;
  if (Node* t = k->producer(); t && rewrite::single_use(k) && t->domain().empty() && t->op_type() == "Transpose" &&
                               t->has_attr("perm")) {
    std::vector<std::int64_t> perm = t->attr_ints("perm");
    bool keeps_batch = perm.size() == r;
    for (std::size_t i = 0; keeps_batch && i + 2 < r; ++i) keeps_batch = perm[i] == static_cast<std::int64_t>(i);
    std::vector<Node*> k_nodes{t};
    if (Value* c = keeps_batch ? unrepeated_heads(t->input(0), k_nodes) : nullptr) {
      m.k_grouped = c;
      m.k_perm = perm;
      nodes.insert(nodes.end(), k_nodes.begin(), k_nodes.end());
    }
  } else if (Value* c = unrepeated_heads(k, nodes)) {
    m.k_grouped = c;
  }
  if (Value* c = unrepeated_heads(v, nodes)) m.v_grouped = c;
  m.nodes.insert(m.nodes.end(), nodes.begin(), nodes.end());
}

// Follows `v` up through single-use scalar Mul/Div nodes (folding their factors into m.scale) to the
// first MatMul; `unit_only`: only factors of exactly 1 may be crossed.
inline bool walk_to_scores(Value* v, Match& m, bool unit_only) {
  for (;;) {
    if (!rewrite::single_use(v) || !is_f32(v)) return false;
    Node* p = v->producer();
    if (!p) return false;
    if (p->domain().empty() && p->op_type() == "MatMul" && p->num_inputs() == 2) {
      m.scores_mm = p;
      m.nodes.push_back(p);
      return true;
    }
    auto s = scaled_input(p);
    if (!s || (unit_only && s->second != 1.0)) return false;
    m.scale *= s->second;
    m.nodes.push_back(p);
    v = s->first;
  }
}

// Drops single-use multiplications/divisions by exactly 1 from a mask operand.
inline Value* strip_unit_scales(Value* v, std::vector<Node*>& nodes) {
  while (rewrite::single_use(v) && v->producer()) {
    auto s = scaled_input(v->producer());
    if (!s || s->second != 1.0) break;
    nodes.push_back(v->producer());
    v = s->first;
  }
  return v;
}

// A fill that may become an additive mask: -inf, or finite and <= -1e9.
inline bool is_mask_fill(std::optional<double> c) {
  return c && (std::isinf(*c) ? *c < 0 : *c <= -1e9);
}

// Mask operand below the scale chain: Add(scores, M) or Where(c, fill, scores)/Where(c, scores, fill).
inline bool take_mask(Node* p, Match& m) {
  if (!p->domain().empty() || p->num_outputs() != 1) return false;
  if (p->op_type() == "Add" && p->num_inputs() == 2) {
    for (std::size_t i = 0; i < 2; ++i) {
      Match attempt = m;
      attempt.nodes.push_back(p);
      if (!walk_to_scores(p->input(i), attempt, false)) continue;
      Value* mask = strip_unit_scales(p->input(1 - i), attempt.nodes);
      if (!is_f32(mask) || mask == p->input(i)) continue;
      attempt.mask = mask;
      m = std::move(attempt);
      return true;
    }
    return false;
  }
  if (p->op_type() == "Where" && p->num_inputs() == 3) {
    Value* cond = p->input(0);
    if (!cond || cond->dtype() != DType::Bool) return false;
    for (std::size_t i = 1; i <= 2; ++i) {
      std::optional<double> fill = scalar_of(p->input(i));
      if (!is_mask_fill(fill)) continue;
      Match attempt = m;
      attempt.nodes.push_back(p);
      if (!walk_to_scores(p->input(3 - i), attempt, false)) continue;
      attempt.cond = cond;
      attempt.fill = *fill;
      attempt.fill_first = i == 1;
      m = std::move(attempt);
      return true;
    }
  }
  return false;
}

// Dims [0, r-2) of `a` and `b` are the same (static values or the same symbol).
inline bool same_batch(const Shape& a, const Shape& b, std::size_t r) {
  if (!a.rank_known() || !b.rank_known() || a.rank() != r || b.rank() != r) return false;
  for (std::size_t i = 0; i + 2 < r; ++i)
    if (!(a[i] == b[i]) || (!a[i].is_static() && a[i].symbol.empty())) return false;
  return true;
}

// A mask of shape `ms` broadcasts to scores `ss` without changing them. Along the keys (the last axis) a
// mask dim that is not static may be any expression: the probabilities' last dim must equal V's rows,
// which are the scores' keys, so wherever the unfused ops run at all the mask's is 1 or the keys' count
// (a mask of Hugging Face's made from attention_mask's `total` against keys `past + seq`); elsewhere the
// fused kernels refuse it with an error naming the node.
inline bool broadcasts_to(const Shape& ms, const Shape& ss) {
  if (!ms.rank_known() || !ss.rank_known() || ms.rank() > ss.rank()) return false;
  for (std::size_t i = 0; i < ms.rank(); ++i) {
    const Dim& d = ms[i];
    const Dim& s = ss[ss.rank() - ms.rank() + i];
    if (d.is_static() && d.value == 1) continue;
    if (i + 1 == ms.rank() && !d.is_static()) continue;
    if (!(d == s) || (!d.is_static() && d.symbol.empty())) return false;
  }
  return true;
}

// The masked scores' shape `xs` is the scores' `ss`, but for a last dim left unknown by a mask's dim along
// the keys (broadcasts_to).
inline bool same_scores(const Shape& xs, const Shape& ss) {
  if (xs == ss) return true;
  if (!xs.rank_known() || !ss.rank_known() || xs.rank() != ss.rank()) return false;
  for (std::size_t i = 0; i + 1 < xs.rank(); ++i)
    if (!(xs[i] == ss[i])) return false;
  return !xs[xs.rank() - 1].is_static();
}

// The attention ending in Softmax `sm`, or nullopt.
inline std::optional<Match> match_softmax(Node* sm, Node*& out_mm) {
  if (!sm->domain().empty() || sm->op_type() != "Softmax" || sm->num_inputs() != 1 || sm->num_outputs() != 1)
    return std::nullopt;
  Value* x = sm->input(0);
  Value* probs = sm->output(0);
  if (!is_f32(x) || !is_f32(probs) || !x->shape().rank_known() || x->shape().rank() < 2) return std::nullopt;
  auto r = static_cast<std::int64_t>(x->shape().rank());
  std::int64_t axis = sm->attr_int("axis", sm->opset() != 0 && sm->opset() < 13 ? 1 : -1);
  if (axis != r - 1 && axis != -1) return std::nullopt;  // (before opset 13, axis r-1 flattens to the same)
  if (!rewrite::single_use(probs)) return std::nullopt;
  const Use& use = probs->uses()[0];
  Node* mm = use.node;
  if (!mm->domain().empty() || mm->op_type() != "MatMul" || use.index != 0 || mm->num_inputs() != 2 ||
      !is_f32(mm->output(0)))
    return std::nullopt;

  Match m;
  m.nodes = {mm, sm};
  // Unit scales, then the mask, then any scales, then the scores MatMul.
  Value* v = strip_unit_scales(x, m.nodes);
  if (!v) return std::nullopt;
  Node* p = v->producer();
  if (!p || !rewrite::single_use(v) || !is_f32(v)) return std::nullopt;
  if (!take_mask(p, m) && !walk_to_scores(v, m, false)) return std::nullopt;

  Node* scores_mm = m.scores_mm;
  Value* q = scores_mm->input(0);
  Value* k = scores_mm->input(1);
  for (Value** side : {&q, &k}) {
    if (!rewrite::single_use(*side) || !(*side)->producer()) continue;
    auto s = scaled_input((*side)->producer());
    if (!s) continue;
    m.nodes.push_back((*side)->producer());
    m.scale *= s->second;
    *side = s->first;
  }
  m.q = q;
  m.k = k;
  Value* vv = mm->input(1);
  const Shape& ss = scores_mm->output(0)->shape();
  std::size_t rank = static_cast<std::size_t>(r);
  if (!is_f32(q) || !is_f32(k) || !is_f32(vv) || !ss.rank_known() || ss.rank() != rank) return std::nullopt;
  if (!same_batch(q->shape(), ss, rank) || !same_batch(k->shape(), ss, rank) || !same_batch(vv->shape(), ss, rank) ||
      !same_batch(mm->output(0)->shape(), ss, rank))
    return std::nullopt;
  if (!same_scores(x->shape(), ss)) return std::nullopt;  // the mask did not broadcast the scores up
  if (m.mask && !broadcasts_to(m.mask->shape(), ss)) return std::nullopt;
  if (m.cond && !broadcasts_to(m.cond->shape(), ss)) return std::nullopt;
  take_groups(m, vv);
  out_mm = mm;
  return m;
}

// The additive mask for Where(cond, fill, scores) (fill_first) or Where(cond, scores, fill): a
// constant when cond is one, else a Where node computing it at run time.
inline Value* additive_mask(Graph& g, const Match& m, const std::string& name) {
  float fill = static_cast<float>(m.fill);
  Value* cond = m.cond;
  if (cond->is_constant()) {
    const Tensor& c = cond->constant();
    std::vector<float> values(static_cast<std::size_t>(c.numel()));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = (c.at_double(static_cast<std::int64_t>(i)) != 0) == m.fill_first ? fill : 0.0f;
    Value* mask = g.add_constant(g.unique_name(name + ".mask"), Tensor::from_vector<float>(c.dims(), values));
    return mask;
  }
  Value* fill_v = g.add_constant(g.unique_name(name + ".mask_fill"), Tensor::from_vector<float>({}, {fill}));
  Value* zero_v = g.add_constant(g.unique_name(name + ".mask_zero"), Tensor::from_vector<float>({}, {0.0f}));
  Node* where = g.add_node("Where", {cond, m.fill_first ? fill_v : zero_v, m.fill_first ? zero_v : fill_v},
                           {g.unique_name(name + ".mask")}, {}, g.unique_name(name + ".mask"));
  Value* mask = where->output(0);
  mask->set_dtype(DType::Float32);
  mask->set_shape(cond->shape());
  return mask;
}

}  // namespace detail::attention

struct FuseAttention {
  static constexpr const char* name = "fuse-attention";

  bool run(Graph& g, PassContext& ctx) {
    namespace a = detail::attention;
    std::unordered_set<const Node*> erased;
    bool changed = false;
    for (Node* sm : g.topo_order()) {
      if (erased.count(sm)) continue;
      Node* out_mm = nullptr;
      std::optional<a::Match> m = a::match_softmax(sm, out_mm);
      if (!m) continue;
      std::string root = m->scores_mm->name();
      Value* mask = m->cond ? a::additive_mask(g, *m, root) : m->mask;
      Value* k = m->k;
      if (m->k_grouped && m->k_perm.empty()) k = m->k_grouped;
      if (m->k_grouped && !m->k_perm.empty()) {  // the Transpose redone on the unrepeated keys
        Node* t = g.add_node("Transpose", {m->k_grouped}, {g.unique_name(root + ".keys")},
                             {{"perm", m->k_perm}}, g.unique_name(root + ".keys"));
        k = t->output(0);
        k->set_dtype(DType::Float32);
        const Shape& cs = m->k_grouped->shape();
        std::vector<Dim> dims;
        for (std::int64_t p : m->k_perm) dims.push_back(cs[static_cast<std::size_t>(p)]);
        k->set_shape(Shape(dims));
      }
      std::vector<Value*> inputs{m->q, k, m->v_grouped ? m->v_grouped : out_mm->input(1)};
      if (mask) inputs.push_back(mask);
      g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
      detail::fusion::add_replacement(g, out_mm->output(0), "Attention", inputs,
                                      {{"scale", static_cast<float>(m->scale)}}, root, fused::kDomain,
                                      fused::kDomainVersion);
      erased.insert(m->nodes.begin(), m->nodes.end());
      detail::fusion::erase_unused(g, m->nodes);
      ctx.rewrite("'" + root + "': " + std::to_string(m->nodes.size()) + " ops -> ondine.Attention (scale " +
                  std::to_string(m->scale) + (mask ? ", mask '" + mask->name() + "'" : "") +
                  (m->k_grouped || m->v_grouped ? ", grouped K/V heads" : "") + ")");
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
