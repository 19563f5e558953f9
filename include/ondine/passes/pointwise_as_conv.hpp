// SPDX-License-Identifier: Apache-2.0
// ondine/passes/pointwise_as_conv.hpp - pointwise-as-conv: a channels-last detour of per-position ops runs
// on the channels-first tensor instead. PyTorch models write per-pixel MLPs and LayerNorms over channels as
// permute(0, 2, 3, 1) -> LayerNorm / Linear / GELU ... -> permute(0, 3, 1, 2) (ConvNeXt's blocks, its
// LayerNorm2d); run as written, that is two transposes, matrix products on row-major activations and a
// separate pass for every per-channel scale. As 1x1 convolutions between channel-blocked activations
// (layout) they take oneDNN's 1x1 kernels, their bias and activations as post-ops, and the scales fold
// into their weights.
//
// Rewrites, with X [N, C, d...] (rank r >= 3, C static), P = Transpose(X, perm [0, 2, ..., r-1, 1]) and
// Q = Transpose(., perm [0, r-1, 1, ..., r-2]):
//   Q(f_k(...f_1(P(X))...)) -> g_k(...g_1(X)...)
// where each f_i reads the value before it as its data input and maps it position by position:
//   LayerNormalization(v, scale, bias?), axis -1    -> ondine.ChannelLayerNorm(v, scale, bias?) (fused_ops.hpp)
//   MatMul(v, W), W a float32 constant [C, C']      -> Conv(v, W^T as [C', C, 1, ...])
//   Add/Sub/Mul/Div(v, k) or (k, v), k a constant   -> the same op with k as [C', 1, ...] (one value:
//     of one value or of C' values along the last     as it is)
//     axis
//   a unary elementwise op (Relu, Gelu, Sigmoid,    -> the same op
//     Tanh, Erf, Clip with constant bounds, ...)
// then every Conv made folds the per-channel Add/Mul by constants right after it (the Linear's bias, the
// layer scale after Q) into its weights and bias (fold-bn's fold_channel_affines).
// Preconditions: float32 throughout; every value from P's output to Q's input has one reader (the next
// op) and is not a graph output; LayerNormalization's Mean/InvStdDev are not read. Otherwise nothing
// changes. A detour that ends anywhere but in Q (a Reshape to tokens, as in ViT or Swin) stays as it is.
// Names: each new node takes the name of the node it replaces; the result takes Q's output name.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/passes/cancel_transposes.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/fold_batchnorm.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::pointwise {

enum class Kind { Norm, Linear, Binary, Unary };

// One op of the detour, and the constant operand it carries (LayerNorm: none; MatMul: W; binary: k).
struct Op {
  Node* node = nullptr;
  Kind kind = Kind::Unary;
  Value* constant = nullptr;
};

using fusion::is_f32;

inline bool is_unary_elementwise(const Node& n) {
  static const std::set<std::string> ops{"Relu",     "LeakyRelu", "Sigmoid", "Tanh",        "Elu",     "Erf",
                                         "Gelu",     "HardSwish", "Softplus", "HardSigmoid", "Clip",    "Abs",
                                         "Neg",      "Exp",       "Sqrt",    "Reciprocal",  "Identity", "Mish"};
  if (n.domain() == fused::kDomain) return n.op_type() == "Gelu";
  if (!n.domain().empty() || !ops.count(n.op_type())) return false;
  for (std::size_t i = 1; i < n.num_inputs(); ++i)  // Clip's bounds
    if (n.input(i) && !n.input(i)->is_constant()) return false;
  return true;
}

// `n` reading `v` as an op of the detour whose channels-last values have `channels` channels, or nullopt.
// `channels` becomes the channel count of its output.
inline std::optional<Op> classify(Node& n, const Value* v, std::int64_t& channels, std::size_t rank) {
  if (n.num_outputs() < 1 || !is_f32(n.output(0)) || n.input(0) == nullptr) return std::nullopt;
  const Shape& out = n.output(0)->shape();
  if (!out.rank_known() || out.rank() != rank) return std::nullopt;  // no broadcast to a larger rank
  for (std::size_t i = 1; i < n.num_outputs(); ++i)
    if (n.output(i) && (n.output(i)->has_uses() || n.output(i)->is_graph_output())) return std::nullopt;
  const std::string& type = n.op_type();
  Op op;
  op.node = &n;
  if (n.domain().empty() && type == "LayerNormalization" && n.input(0) == v) {
    const std::int64_t axis = n.attr_int("axis", -1);
    if (axis != -1 && axis != static_cast<std::int64_t>(rank) - 1) return std::nullopt;
    const Value* scale = n.input(1);
    const Value* bias = n.num_inputs() > 2 ? n.input(2) : nullptr;
    for (const Value* p : {scale, bias})
      if (p && (!is_f32(p) || !p->shape().rank_known() || p->shape().rank() != 1 || !p->shape()[0].is_static() ||
                p->shape()[0].value != channels))
        return std::nullopt;
    if (!scale) return std::nullopt;
    op.kind = Kind::Norm;
    return op;
  }
  if (n.domain().empty() && type == "MatMul" && n.input(0) == v && n.num_inputs() == 2) {
    Value* w = n.input(1);
    if (!is_f32(w) || !w->is_constant() || w->constant().rank() != 2 || w->constant().dims()[0] != channels)
      return std::nullopt;
    op.kind = Kind::Linear;
    op.constant = w;
    channels = w->constant().dims()[1];
    return op;
  }
  if (n.domain().empty() && (type == "Add" || type == "Sub" || type == "Mul" || type == "Div") && n.num_inputs() == 2) {
    Value* k = n.input(0) == v ? n.input(1) : n.input(1) == v ? n.input(0) : nullptr;
    if (!k || k == v || !is_f32(k) || !k->is_constant() || k->constant().rank() > rank) return std::nullopt;
    const std::vector<std::int64_t>& kd = k->constant().dims();
    for (std::size_t j = 0; j < kd.size(); ++j)
      if (kd[j] != 1 && !(j + 1 == kd.size() && kd[j] == channels)) return std::nullopt;
    op.kind = Kind::Binary;
    op.constant = k;
    return op;
  }
  if (is_unary_elementwise(n) && n.input(0) == v) {
    op.kind = Kind::Unary;
    return op;
  }
  return std::nullopt;
}

// Channels-last [N, d..., C] -> channels-first [N, C, d...].
inline Shape channels_first(const Shape& s) {
  std::vector<Dim> d = s.dims();
  Dim c = d.back();
  d.pop_back();
  d.insert(d.begin() + 1, c);
  return Shape(std::move(d));
}

inline bool is_perm(const Node& n, const transposes::Perm& want) {
  if (!transposes::is_transpose(&n)) return false;
  std::optional<transposes::Perm> p = transposes::perm_of(n);
  return p && *p == want;
}

// The detour starting at Transpose `p` (already checked to move the channels last): its ops and the
// Transpose back, or nullopt.
struct Detour {
  std::vector<Op> ops;
  Node* back = nullptr;
};

inline std::optional<Detour> find_detour(Node& p, std::size_t rank, std::int64_t channels) {
  transposes::Perm inverse{0, static_cast<std::int64_t>(rank) - 1};
  for (std::int64_t i = 1; i + 1 < static_cast<std::int64_t>(rank); ++i) inverse.push_back(i);
  Detour d;
  Value* v = p.output(0);
  for (;;) {
    if (!rewrite::single_use(v) || !is_f32(v)) return std::nullopt;
    Node& next = *v->uses()[0].node;
    if (is_perm(next, inverse)) {
      if (d.ops.empty()) return std::nullopt;  // a transpose pair alone: cancel-transposes' case
      d.back = &next;
      return d;
    }
    std::optional<Op> op = classify(next, v, channels, rank);
    if (!op) return std::nullopt;
    d.ops.push_back(*op);
    v = next.output(0);
  }
}

// The constant `k` (dims [..., C'] or one value) as [C', 1, ...] for a channels-first value of `rank`.
inline Value* channels_first_constant(Graph& g, Value* k, std::size_t rank) {
  const Tensor& t = k->constant();
  if (t.numel() == 1) return k;
  std::vector<std::int64_t> dims(rank - 1, 1);
  dims[0] = t.numel();
  return g.add_constant(g.unique_name(k->name() + ".channels_first"), t.reshaped(dims));
}

// W [C, C'] as a 1x1 convolution's weight [C', C, 1, ...].
inline Value* conv_weight(Graph& g, Value* w, std::size_t rank) {
  const Tensor& t = w->constant();
  const std::int64_t in = t.dims()[0], out = t.dims()[1];
  std::vector<std::int64_t> dims(rank, 1);
  dims[0] = out;
  dims[1] = in;
  Tensor wt(DType::Float32, dims);
  const float* src = t.data<float>();
  float* dst = wt.data<float>();
  for (std::int64_t i = 0; i < in; ++i)
    for (std::int64_t o = 0; o < out; ++o) dst[o * in + i] = src[i * out + o];
  return g.add_constant(g.unique_name(w->name() + ".conv"), std::move(wt));
}

// Builds the channels-first ops of `d` on `x`; returns the last value and the Convs made.
inline Value* rebuild(Graph& g, const Detour& d, Value* x, std::size_t rank, std::vector<Node*>& convs) {
  Value* cur = x;
  for (const Op& op : d.ops) {
    Node& old = *op.node;
    Value* out = old.output(0);
    std::vector<Value*> inputs;
    std::string type = old.op_type(), domain = old.domain();
    std::map<std::string, Attribute> attrs;
    switch (op.kind) {
      case Kind::Norm:
        type = "ChannelLayerNorm";
        domain = fused::kDomain;
        inputs = {cur, old.input(1)};
        if (old.num_inputs() > 2 && old.input(2)) inputs.push_back(old.input(2));
        attrs["epsilon"] = old.attr_float("epsilon", 1e-5f);
        break;
      case Kind::Linear:
        type = "Conv";
        inputs = {cur, conv_weight(g, op.constant, rank)};
        break;
      case Kind::Binary:
        inputs = {old.input(0), old.input(1)};
        for (Value*& in : inputs) in = in == op.constant ? channels_first_constant(g, in, rank) : cur;
        attrs = old.attrs();
        break;
      case Kind::Unary:
        inputs.assign(old.inputs().begin(), old.inputs().end());
        inputs[0] = cur;
        attrs = old.attrs();
        break;
    }
    Node* n = g.add_node(type, inputs, {g.unique_name(out->name() + ".channels_first")}, std::move(attrs), old.name(),
                         domain);
    n->set_opset(domain == fused::kDomain ? fused::kDomainVersion : old.opset());
    n->output(0)->set_dtype(DType::Float32);
    n->output(0)->set_shape(channels_first(out->shape()));
    if (op.kind == Kind::Linear) convs.push_back(n);
    cur = n->output(0);
  }
  return cur;
}

}  // namespace detail::pointwise

struct PointwiseAsConv {
  static constexpr const char* name = "pointwise-as-conv";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::pointwise;
    bool changed = false;
    std::vector<Node*> dead, folded;
    for (Node* p : g.topo_order()) {
      if (!detail::transposes::is_transpose(p) || p->num_outputs() != 1) continue;
      Value* x = p->input(0);
      if (!d::is_f32(x) || x->is_constant() || !x->shape().rank_known() || x->shape().rank() < 3) continue;
      const std::size_t rank = x->shape().rank();
      const Dim& c = x->shape()[1];
      if (!c.is_static()) continue;
      detail::transposes::Perm last{0};
      for (std::int64_t i = 2; i < static_cast<std::int64_t>(rank); ++i) last.push_back(i);
      last.push_back(1);
      if (!d::is_perm(*p, last)) continue;
      std::optional<d::Detour> detour = d::find_detour(*p, rank, c.value);
      if (!detour) continue;
      std::vector<Node*> convs;
      Value* result = d::rebuild(g, *detour, x, rank, convs);
      rewrite::take_over(g, detour->back->output(0), result, "channels_last");
      std::string what;
      for (const d::Op& op : detour->ops) what += (what.empty() ? "" : ", ") + op.node->op_type();
      ctx.rewrite("'" + p->name() + "' .. '" + detour->back->name() + "': " + what + " on channels-first data");
      for (Node* conv : convs)
        for (const std::string& op : detail::fold_bn::fold_channel_affines(g, *conv, folded))
          ctx.rewrite("folded '" + op + "' into '" + conv->name() + "'");
      dead.push_back(p);
      for (const d::Op& op : detour->ops) dead.push_back(op.node);
      dead.push_back(detour->back);
      changed = true;
    }
    if (!folded.empty()) g.remove_nodes(folded);
    rewrite::erase_if_dead(g, dead);
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
