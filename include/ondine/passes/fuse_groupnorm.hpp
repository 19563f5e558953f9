// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_groupnorm.hpp - fuse-groupnorm: GroupNorm as PyTorch exports it (torch.nn.GroupNorm
// before ONNX had GroupNormalization) -> one ondine.GroupNorm.
//
// Rewrite (X float32 [N, C, d...] with C static; G divides C):
//   Add(Mul(Reshape(InstanceNormalization(Reshape(X, [0|N, G, -1]), s, b), Shape(X)), gamma), beta)
//     -> ondine.GroupNorm(X, scale, bias) {num_groups = G, epsilon = InstanceNormalization's}
// with, per channel c of group g, scale[c] = s[g] * gamma[c] and bias[c] = b[g] * gamma[c] + beta[c].
// The Mul and the Add are optional (gamma = 1, beta = 0) and take their operands either way round;
// gamma and beta are float32 constants that are per channel (dims 1 except C at X's axis 1) or scalars.
// The second Reshape's shape is Shape(X) or a constant equal to X's static dims. s and b are float32
// constants of [G] (torch writes ones and zeros).
// Why: InstanceNormalization over the [N, G, K] view has no oneDNN primitive (it ran on the reference
// kernel, 16% of FCOS ResNet-50 FPN), and the affine Mul/Add are two more passes over the activation;
// ondine.GroupNorm runs Ondine's kernel (lower/detail/group_norm.hpp): two reads of each group in cache
// and one write, the affine and a following Relu/Clip/LeakyRelu/SiLU folded in.
// Preconditions: every intermediate is read only inside the pattern and is not a graph output; the
// shapes on the way agree with the rule (the first Reshape's output [N, G, K] with K = C / G * prod(d)).
// Anything else is left alone. The new node keeps the name of the value it replaces.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::groupnorm {

// The sole reader of `v` when `v` may disappear into the fusion (rewrite::single_use).
inline Node* sole_reader(const Value* v) { return rewrite::single_use(v) ? v->uses().front().node : nullptr; }

inline bool is_onnx(const Node* n, const char* op) { return n && n->domain().empty() && n->op_type() == op; }

// A float32 constant of `count` values (or one, broadcast): the values as floats, else nullopt.
inline std::optional<std::vector<float>> constant_vector(const Value* v, std::int64_t count) {
  if (!v || !v->is_constant() || v->dtype() != DType::Float32) return std::nullopt;
  const Tensor& t = v->constant();
  if (t.numel() != count && t.numel() != 1) return std::nullopt;
  std::vector<float> out(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = t.data<float>()[t.numel() == 1 ? 0 : i];
  return out;
}

// The C per-channel values of a constant that broadcasts against X [N, C, d...] without growing it and
// varies along axis 1 only (a scalar too), else nullopt.
inline std::optional<std::vector<float>> per_channel(const Value* p, std::size_t x_rank, std::int64_t channels) {
  if (!p || !p->is_constant() || p->dtype() != DType::Float32) return std::nullopt;
  const std::vector<std::int64_t>& pd = p->constant().dims();
  if (pd.size() > x_rank) return std::nullopt;
  const std::size_t offset = x_rank - pd.size();
  for (std::size_t i = 0; i < pd.size(); ++i) {
    const bool channel_axis = i + offset == 1;
    if (pd[i] != 1 && !(channel_axis && pd[i] == channels)) return std::nullopt;
  }
  return constant_vector(p, channels);
}

// The constant or Shape(x) that makes the second Reshape restore X's dims.
inline bool restores_dims(const Value* shape, const Value* x) {
  if (!shape) return false;
  if (shape->is_constant()) {
    if (!x->shape().is_static() || shape->constant().rank() != 1) return false;
    return shape->constant().to_int64s() == x->shape().sizes();
  }
  const Node* s = shape->producer();
  return is_onnx(s, "Shape") && s->input(0) == x && !s->has_attr("start") && !s->has_attr("end");
}

// What a match found: the nodes it replaces, X, the group count and the folded per-channel parameters.
struct Found {
  Value* x = nullptr;
  Value* result = nullptr;  // the value ondine.GroupNorm replaces
  std::vector<Node*> nodes;
  std::int64_t groups = 0;
  float epsilon = 1e-5f;
  std::vector<float> scale, bias;
};

// Matches the rule from its InstanceNormalization node.
inline std::optional<Found> match(Node& norm) {
  if (!is_onnx(&norm, "InstanceNormalization") || norm.num_inputs() != 3) return std::nullopt;
  Node* flatten = norm.input(0) ? norm.input(0)->producer() : nullptr;
  if (!is_onnx(flatten, "Reshape") || sole_reader(flatten->output(0)) != &norm) return std::nullopt;
  if (flatten->attr_int("allowzero", 0) != 0) return std::nullopt;
  Found f;
  f.x = flatten->input(0);
  const Value* x = f.x;
  if (!fusion::is_f32(x) || !x->shape().rank_known() || x->shape().rank() < 3 || !x->shape()[1].is_static())
    return std::nullopt;
  const std::size_t rank = x->shape().rank();
  const std::int64_t channels = x->shape()[1].value;

  // Reshape(X, [0 | N, G, -1 | K]) -> [N, G, K].
  const Value* target = flatten->input(1);
  if (!target || !target->is_constant() || target->constant().rank() != 1 || target->constant().numel() != 3)
    return std::nullopt;
  const std::vector<std::int64_t> t = target->constant().to_int64s();
  const Shape& grouped = flatten->output(0)->shape();
  if (!grouped.rank_known() || grouped.rank() != 3 || !(grouped[0] == x->shape()[0])) return std::nullopt;
  if (t[0] != 0 && !(x->shape()[0].is_static() && t[0] == x->shape()[0].value)) return std::nullopt;
  f.groups = t[1];
  if (f.groups <= 0 || channels % f.groups != 0) return std::nullopt;
  if (t[2] != -1) {
    std::optional<std::int64_t> rest = Shape(std::vector<Dim>(x->shape().dims().begin() + 2, x->shape().dims().end())).numel();
    if (!rest || t[2] != channels / f.groups * *rest) return std::nullopt;
  }

  // InstanceNormalization with per-group constants s, b.
  std::optional<std::vector<float>> s = constant_vector(norm.input(1), f.groups);
  std::optional<std::vector<float>> b = constant_vector(norm.input(2), f.groups);
  if (!s || !b || norm.input(1)->constant().numel() != f.groups || norm.input(2)->constant().numel() != f.groups)
    return std::nullopt;
  f.epsilon = norm.attr_float("epsilon", 1e-5f);

  // Reshape back to X's dims.
  Node* restore = sole_reader(norm.output(0));
  if (!is_onnx(restore, "Reshape") || restore->input(0) != norm.output(0) || !restores_dims(restore->input(1), x) ||
      !(restore->output(0)->shape() == x->shape()))
    return std::nullopt;
  f.nodes = {flatten, &norm, restore};
  if (const Value* shape = restore->input(1); !shape->is_constant()) f.nodes.push_back(shape->producer());

  // Optional Mul(gamma), then optional Add(beta), each per channel.
  const std::int64_t per_group = channels / f.groups;
  f.scale.resize(static_cast<std::size_t>(channels));
  f.bias.resize(static_cast<std::size_t>(channels));
  for (std::int64_t c = 0; c < channels; ++c) {
    f.scale[static_cast<std::size_t>(c)] = (*s)[static_cast<std::size_t>(c / per_group)];
    f.bias[static_cast<std::size_t>(c)] = (*b)[static_cast<std::size_t>(c / per_group)];
  }
  f.result = restore->output(0);
  for (const char* op : {"Mul", "Add"}) {
    Node* next = sole_reader(f.result);
    if (!is_onnx(next, op) || next->num_inputs() != 2 || next->input(0) == next->input(1)) break;
    const Value* other = next->input(0) == f.result ? next->input(1) : next->input(0);
    std::optional<std::vector<float>> p = per_channel(other, rank, channels);
    if (!p || !(next->output(0)->shape() == x->shape()) || !fusion::is_f32(next->output(0))) break;
    for (std::size_t c = 0; c < p->size(); ++c) {
      if (op[0] == 'M') {
        f.scale[c] *= (*p)[c];
        f.bias[c] *= (*p)[c];
      } else {
        f.bias[c] += (*p)[c];
      }
    }
    f.nodes.push_back(next);
    f.result = next->output(0);
  }
  return f;
}

}  // namespace detail::groupnorm

struct FuseGroupNorm {
  static constexpr const char* name = "fuse-groupnorm";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::groupnorm;
    bool changed = false;
    std::unordered_set<const Node*> erased;  // nodes of earlier matches (later in the order), not to be read
    for (Node* n : g.topo_order()) {
      if (erased.count(n) || !d::is_onnx(n, "InstanceNormalization")) continue;
      std::optional<d::Found> f = d::match(*n);
      if (!f) continue;
      const std::string base = f->result->name();
      const auto channels = static_cast<std::int64_t>(f->scale.size());
      Value* scale = g.add_constant(g.unique_name(base + ".gn_scale"), Tensor::from_vector<float>({channels}, f->scale));
      Value* bias = g.add_constant(g.unique_name(base + ".gn_bias"), Tensor::from_vector<float>({channels}, f->bias));
      const std::string name = f->nodes.back()->name();
      const std::size_t count = f->nodes.size();
      detail::fusion::add_replacement(g, f->result, "GroupNorm", {f->x, scale, bias},
                                      {{"num_groups", f->groups}, {"epsilon", f->epsilon}}, name, fused::kDomain,
                                      fused::kDomainVersion);
      erased.insert(f->nodes.begin(), f->nodes.end());
      detail::fusion::erase_unused(g, f->nodes);
      ctx.rewrite("'" + name + "': " + std::to_string(count) + " ops -> ondine.GroupNorm of '" + f->x->name() + "' (" +
                  std::to_string(f->groups) + " groups of " + std::to_string(channels / f->groups) + " channels)");
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
