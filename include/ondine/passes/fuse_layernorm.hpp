// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_layernorm.hpp - fuse-layernorm: replaces LayerNorm written out in primitive ops
// (as exporters write it before opset 17) by one LayerNormalization.
//
// Rewrite, with d = Sub(x, ReduceMean(x)) and both ReduceMeans over the same trailing axes [r-k, r):
//   Add(Mul(Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))), gamma), beta)
//     -> LayerNormalization(x, Scale = gamma, B = beta) {axis = -k, epsilon = eps}       (opset 17)
// Pow(d, 2) may be Mul(d, d); Add and Mul take their operands either way round; the Mul by gamma and
// the Add of beta are optional (Scale = ones, B absent). k is 1 for the usual LayerNorm over the last
// axis. gamma and beta become constants of the normalised shape x.shape[r-k:] (reused as they are
// when they already have it).
// Preconditions: x is float32 with a known rank; the ReduceMeans keep dims and have their axes as the
// attribute (opset < 18) or as a constant input (opset 18); eps, gamma and beta are float32 constants
// that do not broadcast x to a larger shape, gamma and beta only along the normalised axes; every
// intermediate is read only inside the pattern and is not a graph output. The node that results
// keeps the name of the value it replaces; the graph's default opset is raised to 17 when lower.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/pattern.hpp"

namespace ondine {

namespace detail::layernorm {

// The number k of trailing axes a ReduceMean node averages over (it keeps dims), or nullopt when it
// reduces anything else or its axes are unknown.
inline std::optional<std::int64_t> trailing_axes(const Node& r) {
  const Value* x = r.input(0);
  if (!x || !x->shape().rank_known() || r.attr_int("keepdims", 1) != 1) return std::nullopt;
  auto rank = static_cast<std::int64_t>(x->shape().rank());
  std::vector<std::int64_t> axes;
  if (r.opset() >= 18) {
    const Value* a = r.input(1);
    if (!a) return std::nullopt;  // all axes, or none with noop_with_empty_axes: not a LayerNorm we take
    if (!a->is_constant() || a->constant().rank() != 1) return std::nullopt;
    axes = a->constant().to_int64s();
  } else {
    if (!r.has_attr("axes")) return std::nullopt;
    axes = r.attr_ints("axes");
  }
  if (axes.empty()) return std::nullopt;
  for (auto& a : axes) {
    if (a < -rank || a >= rank) return std::nullopt;
    if (a < 0) a += rank;
  }
  std::sort(axes.begin(), axes.end());
  auto k = static_cast<std::int64_t>(axes.size());
  for (std::int64_t i = 0; i < k; ++i)
    if (axes[static_cast<std::size_t>(i)] != rank - k + i) return std::nullopt;
  return k;
}

// x.shape[r-k:]
inline Shape normalized_shape(const Shape& x_shape, std::int64_t k) {
  return Shape(std::vector<Dim>(x_shape.dims().end() - static_cast<std::ptrdiff_t>(k), x_shape.dims().end()));
}

inline bool reduces_trailing(const Value* v) { return v->producer() && trailing_axes(*v->producer()).has_value(); }

// The rules, longest first: with gamma and beta, with gamma, bare. Each in the Pow and the Mul form.
inline std::vector<pattern::Pattern> rules() {
  using namespace pattern;
  std::vector<Pattern> out;
  Pattern mean = op("ReduceMean", any("x")).where(reduces_trailing).bind("mean");
  Pattern d = op("Sub", any("x"), mean).bind("d");
  for (Pattern square : {op("Pow", d, scalar(2.0)), op("Mul", d, d)}) {
    Pattern var = op("ReduceMean", square).where(reduces_trailing).bind("var");
    Pattern stddev = op("Sqrt", op("Add", var, constant("eps")).commutative());
    Pattern normalized = op("Div", d, stddev);
    Pattern scaled = op("Mul", normalized, constant("gamma")).commutative();
    out.push_back(op("Add", scaled, constant("beta")).commutative());
    out.push_back(scaled);
    out.push_back(normalized);
  }
  return out;
}

// True when constant `param` (gamma or beta) broadcasts against x only along its trailing k dims:
// right-aligned, each of its dims is 1 outside them and 1 or x's dim inside them.
inline bool param_fits(const Value* param, const Shape& x_shape, std::int64_t k) {
  const Tensor& t = param->constant();
  std::size_t rank = x_shape.rank(), nk = static_cast<std::size_t>(k);
  if (t.dtype() != DType::Float32 || t.rank() > rank) return false;
  std::size_t offset = rank - t.rank();
  for (std::size_t i = 0; i < t.rank(); ++i) {
    std::int64_t d = t.dims()[i];
    std::size_t axis = offset + i;
    bool normalized_axis = axis >= rank - nk;
    if (d != 1 && !(normalized_axis && x_shape[axis].is_static() && x_shape[axis].value == d)) return false;
  }
  // A broadcast one is expanded to the normalised shape, which must then be static.
  return Shape::from(t.dims()) == normalized_shape(x_shape, k) || normalized_shape(x_shape, k).is_static();
}

// `param` as a constant of the normalised shape (itself when it has that shape already).
inline Value* normalized_param(Graph& g, Value* param, const Shape& x_shape, std::int64_t k) {
  const Tensor& t = param->constant();
  Shape norm = normalized_shape(x_shape, k);
  if (Shape::from(t.dims()) == norm) return param;
  std::vector<std::int64_t> nd = norm.sizes();
  std::size_t nk = nd.size();
  std::vector<std::int64_t> td(nk, 1);  // t's dims right-aligned to the normalised rank
  for (std::size_t i = 0; i < std::min(nk, t.rank()); ++i) td[nk - 1 - i] = t.dims()[t.rank() - 1 - i];
  Tensor out(DType::Float32, nd);
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (std::int64_t flat = 0; flat < out.numel(); ++flat) {
    std::int64_t rem = flat, src_index = 0, src_stride = 1;
    for (std::size_t i = nk; i-- > 0;) {
      std::int64_t coord = rem % nd[i];
      rem /= nd[i];
      if (td[i] != 1) src_index += coord * src_stride;
      src_stride *= td[i];
    }
    dst[flat] = src[src_index];
  }
  return g.add_constant(g.unique_name(param->name() + ".normalized"), out);
}

inline Value* ones(Graph& g, const std::string& base, const Shape& x_shape, std::int64_t k) {
  Tensor t(DType::Float32, normalized_shape(x_shape, k).sizes());
  std::fill(t.data<float>(), t.data<float>() + t.numel(), 1.0f);
  return g.add_constant(g.unique_name(base + ".scale"), t);
}

}  // namespace detail::layernorm

struct FuseLayerNorm {
  static constexpr const char* name = "fuse-layernorm";

  bool run(Graph& g, PassContext& ctx) {
    static const std::vector<pattern::Pattern> rules = detail::layernorm::rules();
    std::unordered_set<const Node*> erased;
    bool changed = false;
    std::vector<Node*> order = g.topo_order();
    // Consumers first, so the longest form (with gamma and beta) is tried before its Div.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = *it;
      if (erased.count(n) || !n->domain().empty()) continue;
      const std::string& op = n->op_type();
      if (op != "Add" && op != "Mul" && op != "Div") continue;
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
    // The result replaces y: same shape as x (gamma/beta must not broadcast it larger).
    if (!(y->shape() == x->shape())) return false;
    auto k_mean = ln::trailing_axes(*m.node("mean")), k_var = ln::trailing_axes(*m.node("var"));
    if (!k_mean || !k_var || *k_mean != *k_var) return false;
    std::int64_t k = *k_mean;
    if (!detail::fusion::is_closed(m.matched_nodes(), &root)) return false;
    const Tensor& eps = m.constant("eps");
    if (eps.numel() != 1 || !is_floating(eps.dtype())) return false;
    Value* gamma = m.has("gamma") ? m.value("gamma") : nullptr;
    Value* beta = m.has("beta") ? m.value("beta") : nullptr;
    if (gamma ? !ln::param_fits(gamma, x->shape(), k) : !ln::normalized_shape(x->shape(), k).is_static()) return false;
    if (beta && !ln::param_fits(beta, x->shape(), k)) return false;

    // Checked: from here on the graph changes.
    Value* scale = gamma ? ln::normalized_param(g, gamma, x->shape(), k) : ln::ones(g, x->name(), x->shape(), k);
    Value* bias = beta ? ln::normalized_param(g, beta, x->shape(), k) : nullptr;
    std::vector<Value*> inputs{x, scale};
    if (bias) inputs.push_back(bias);
    std::string root_name = root.name();
    float epsilon = static_cast<float>(eps.at_double(0));
    detail::fusion::add_replacement(g, y, "LayerNormalization", inputs, {{"axis", -k}, {"epsilon", epsilon}},
                                    root_name, "", 17);
    if (g.opset() < 17) g.opsets[""] = 17;
    std::size_t count = std::unordered_set<Node*>(m.matched_nodes().begin(), m.matched_nodes().end()).size();
    detail::fusion::erase_unused(g, m.matched_nodes());
    char eps_text[32];
    std::snprintf(eps_text, sizeof eps_text, "%g", static_cast<double>(epsilon));
    ctx.rewrite("'" + root_name + "': " + std::to_string(count) + " ops -> LayerNormalization of '" + x->name() +
                "' (axis " + std::to_string(-k) + ", epsilon " + eps_text + ")");
    return true;
  }
};

}  // namespace ondine
