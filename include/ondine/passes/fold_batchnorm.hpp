// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fold_batchnorm.hpp - fold-bn: folds an inference-mode BatchNormalization into the op
// that produces its input, or rewrites it as a per-channel Mul and Add.
//
// In inference mode BN is a per-channel affine map: BN(y)[c] = y[c] * s[c] + t[c] with
//   s = gamma / sqrt(var + eps),  t = beta - mean * s.
// Rewrites (c is the BN channel: dim 1 of its input):
//   BN(Conv(x, W, B))          -> Conv(x, W * s[m], B * s + t)       m = W's dim 0 (any group count)
//   BN(ConvTranspose(x, W, B)) -> ConvTranspose(x, W', B * s + t)    W [Cin, M/g, k...]: output channel
//                                                                    of W[i, j] is (i / (Cin/g)) * M/g + j
//   BN(Gemm(A, B, C))          -> Gemm(A, B * s[col], beta*C*s + t)  s along the output columns (B's dim
//                                                                    1, or dim 0 with transB); beta := 1
//   BN(MatMul(A, W))           -> MatMul(A, W * s[col]) + t          A and W 2-D: the output is [N, C],
//                                                                    so its last axis is the BN channel
//   BN(x) otherwise            -> x * s' + t'                        s', t' shaped [C, 1, ...] to
//                                                                    broadcast over x's spatial dims
// And a per-channel affine map by constants right after a Conv, one op after the other:
//   Mul/Add(Conv(x, W, B), k), Sub/Div(Conv(...), k) -> Conv(x, W * s[m], B * s + t)   k float32, one value
//                                                       or one per output channel (C or 1 at the channel
//                                                       axis, 1 elsewhere: [C, 1, 1], [1, C, 1, 1], [1])
// (ConvNeXt's layer scale, a normalising Sub/Div, a BN already rewritten as Mul + Add), on the same terms:
// the Conv's output read by that op only, its weights constant.
// Preconditions for any rewrite: BN in inference mode (no training_mode, or 0; spatial before opset
// 9), its scale/bias/mean/var constant float32 with one value per channel, X float32, and nothing
// reading BN's outputs other than output 0. For a fold into the producer, also: the producer's
// output has the BN as its only reader and is not a graph output (rewrite::single_use), and its
// weights (and bias, when present) are constant float32. Otherwise that BN is left as it is.
// Arithmetic is in double; a weight is scaled in place only when no one else can see it (see
// scale_weight), else into a new constant; biases are new constants.
// Names: the value that replaces BN's output takes its name (a graph
// output keeps its name); node names stay.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::fold_bn {

// BN's per-channel affine form: y = x * scale[c] + shift[c].
struct Affine {
  std::vector<double> scale, shift;
  std::int64_t channels() const { return static_cast<std::int64_t>(scale.size()); }
};

inline bool unread(const Value* v) { return !v || (!v->has_uses() && !v->is_graph_output()); }

// The constant float32 tensor of `v`, or nullptr.
inline const Tensor* f32_constant(const Value* v) {
  return v && v->is_constant() && v->constant().dtype() == DType::Float32 ? &v->constant() : nullptr;
}

inline std::vector<double> doubles(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  const float* p = t.data<float>();
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  return out;
}

// The affine map of an inference-mode BN, or nullopt when `bn` is not one (see the preconditions).
inline std::optional<Affine> inference_affine(const Node& bn) {
  if (!bn.domain().empty() || bn.op_type() != "BatchNormalization") return std::nullopt;
  if (!bn.input(0) || bn.input(0)->dtype() != DType::Float32) return std::nullopt;
  if (bn.opset() >= 14 && bn.attr_int("training_mode", 0) != 0) return std::nullopt;
  if (bn.opset() < 9 && bn.attr_int("spatial", 1) == 0) return std::nullopt;  // per position, not channel
  for (std::size_t i = 1; i < bn.num_outputs(); ++i)
    if (!unread(bn.output(i))) return std::nullopt;  // running statistics are read
  const Tensor* p[5] = {};
  for (std::size_t i = 1; i < 5; ++i)
    if (!(p[i] = f32_constant(bn.input(i))) || p[i]->rank() > 1 || p[i]->numel() != p[1]->numel())
      return std::nullopt;
  std::vector<double> gamma = doubles(*p[1]), beta = doubles(*p[2]), mean = doubles(*p[3]), var = doubles(*p[4]);
  if (p[1]->numel() == 0) return std::nullopt;
  double eps = bn.attr_float("epsilon", 1e-5f);
  Affine a;
  for (std::size_t c = 0; c < gamma.size(); ++c) {
    if (!(var[c] + eps > 0)) return std::nullopt;  // NaN or no real square root: leave it to run time
    double s = gamma[c] / std::sqrt(var[c] + eps);
    a.scale.push_back(s);
    a.shift.push_back(beta[c] - mean[c] * s);
  }
  const Shape& xs = bn.input(0)->shape();
  if (xs.rank_known() && (xs.rank() < 2 || (xs[1].is_static() && xs[1].value != a.channels()))) return std::nullopt;
  return a;
}

// Multiplies node's constant input `input`, viewed as [outer, mid, inner], block (o, j) by
// scale[channel_of(o, j)]. In place when nobody else can see the tensor (Value::constant_for_update:
// the usual case for an imported model), else into a new constant, so a shared weight never changes.
// In place matters: a fresh copy of ResNet-50's 100 MB of weights costs ~0.5 s of page faults here.
// Blocks of `inner` contiguous elements keep the loop vectorisable.
template <typename ChannelOf>
void scale_weight(Graph& g, Node& node, std::size_t input, const std::vector<double>& scale,
                  std::size_t outer, std::size_t mid, std::size_t inner, ChannelOf channel_of) {
  Value* v = node.input(input);
  Tensor* own = v->constant_for_update(&node);
  Tensor copy = own ? Tensor() : Tensor(DType::Float32, v->constant().dims());
  const float* src = v->constant().data<float>();
  float* dst = own ? own->data<float>() : copy.data<float>();
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t j = 0; j < mid; ++j) {
      const double s = scale[channel_of(o, j)];
      const std::size_t at = (o * mid + j) * inner;
      for (std::size_t i = 0; i < inner; ++i) dst[at + i] = static_cast<float>(src[at + i] * s);
    }
  if (!own) node.set_input(input, g.add_constant(g.unique_name(v->name() + ".bn"), std::move(copy)));
}

// bias * s + t per channel; an absent bias is zero. nullopt when the bias is not a constant f32 [C].
inline std::optional<Tensor> folded_bias(const Value* bias, const Affine& a) {
  std::vector<double> b(a.scale.size(), 0.0);
  if (bias) {
    const Tensor* t = f32_constant(bias);
    if (!t || t->rank() != 1 || t->numel() != a.channels()) return std::nullopt;
    b = doubles(*t);
  }
  std::vector<float> out(b.size());
  for (std::size_t c = 0; c < b.size(); ++c) out[c] = static_cast<float>(b[c] * a.scale[c] + a.shift[c]);
  return Tensor::from_vector<float>({a.channels()}, out);
}

inline std::string label(const Node& n) {
  return n.name().empty() && n.num_outputs() ? n.output(0)->name() : n.name();
}

inline void take_over(Graph& g, Value* from, Value* to) { rewrite::take_over(g, from, to, "unfolded"); }

// Gives `node` a new constant as input i (the old one may be shared; it is never written).
inline void set_constant_input(Graph& g, Node& node, std::size_t i, const std::string& base, Tensor t) {
  node.set_input(i, g.add_constant(g.unique_name(base), std::move(t)));
}

inline std::string base_name(const Value* old, const Node& owner, const char* what) {
  return old ? old->name() + ".bn" : label(owner) + "." + what;
}

// BN(Conv(x, W, B)) -> Conv(x, W * s[m], B * s + t); W is [M, C/g, k...] whatever the group count.
inline bool fold_into_conv(Graph& g, Node& conv, const Affine& a) {
  const Tensor* w = f32_constant(conv.input(1));
  if (!w || w->rank() < 3 || w->dims()[0] != a.channels()) return false;
  auto bias = folded_bias(conv.input(2), a);
  if (!bias) return false;
  auto m = static_cast<std::size_t>(a.channels()), per_channel = static_cast<std::size_t>(w->numel()) / m;
  scale_weight(g, conv, 1, a.scale, 1, m, per_channel, [](std::size_t, std::size_t c) { return c; });
  set_constant_input(g, conv, 2, base_name(conv.input(2), conv, "B"), std::move(*bias));
  return true;
}

// BN(ConvTranspose(x, W, B)): W is [Cin, M/g, k...]; W[i, j, ...] feeds output channel
// (i / (Cin/g)) * (M/g) + j, so that channel's scale multiplies it.
inline bool fold_into_conv_transpose(Graph& g, Node& deconv, const Affine& a) {
  const Tensor* w = f32_constant(deconv.input(1));
  std::int64_t group = deconv.attr_int("group", 1);
  if (!w || w->rank() < 3 || w->numel() == 0 || group <= 0 || w->dims()[0] % group != 0) return false;
  std::int64_t cin_per_group = w->dims()[0] / group, cout_per_group = w->dims()[1];
  if (cout_per_group * group != a.channels()) return false;
  auto bias = folded_bias(deconv.input(2), a);
  if (!bias) return false;
  auto kernel = static_cast<std::size_t>(w->numel() / (w->dims()[0] * cout_per_group));
  auto cin_g = static_cast<std::size_t>(cin_per_group), cout_g = static_cast<std::size_t>(cout_per_group);
  scale_weight(g, deconv, 1, a.scale, static_cast<std::size_t>(w->dims()[0]), cout_g, kernel,
               [&](std::size_t in_channel, std::size_t j) { return (in_channel / cin_g) * cout_g + j; });
  set_constant_input(g, deconv, 2, base_name(deconv.input(2), deconv, "B"), std::move(*bias));
  return true;
}

// BN(Gemm(A, B, C)) with the output [N, M]: column m scales by s[m], so B's column m (row m with
// transB) does; alpha stays; the new C is beta*C*s + t broadcast to [rows of C, M], and beta = 1.
inline bool fold_into_gemm(Graph& g, Node& gemm, const Affine& a) {
  const Tensor* b = f32_constant(gemm.input(1));
  bool trans_b = gemm.attr_int("transB", 0) != 0;
  if (!b || b->rank() != 2) return false;
  std::int64_t m = trans_b ? b->dims()[0] : b->dims()[1];
  if (m != a.channels()) return false;
  auto cols = static_cast<std::size_t>(m), k = static_cast<std::size_t>(trans_b ? b->dims()[1] : b->dims()[0]);
  std::int64_t c_rows = 1;
  bool c_per_column = true;  // C varies along the columns (else one value per row, or a scalar)
  std::vector<double> c_values{0.0};
  if (!gemm.input(2)) c_per_column = false;
  if (Value* cv = gemm.input(2)) {
    const Tensor* c = f32_constant(cv);
    if (!c || c->rank() > 2) return false;
    std::int64_t c_cols = c->rank() == 0 ? 1 : c->dims().back();
    if (c_cols != 1 && c_cols != m) return false;
    if (c->rank() == 2) c_rows = c->dims()[0];
    c_per_column = c_cols == m;
    c_values = doubles(*c);
  }
  double beta = gemm.input(2) ? gemm.attr_float("beta", 1.0f) : 0.0;
  Tensor c2(DType::Float32, {c_rows, m});
  float* out = c2.data<float>();
  for (std::size_t r = 0; r < static_cast<std::size_t>(c_rows); ++r)
    for (std::size_t col = 0; col < cols; ++col) {
      double c = c_values[c_per_column ? r * cols + col : r];
      out[r * cols + col] = static_cast<float>(beta * c * a.scale[col] + a.shift[col]);
    }
  if (c_rows == 1) c2 = c2.reshaped({m});
  // B [M, K] (transB): row m scales by s[m]; B [K, M]: column m does.
  auto column = [](std::size_t, std::size_t c) { return c; };
  if (trans_b) scale_weight(g, gemm, 1, a.scale, 1, cols, k, column);
  else scale_weight(g, gemm, 1, a.scale, k, cols, 1, column);
  set_constant_input(g, gemm, 2, base_name(gemm.input(2), gemm, "C"), std::move(c2));
  gemm.set_attr("beta", 1.0f);
  return true;
}

// The per-channel affine map that Mul/Add/Sub/Div `op` applies to `y` (a Conv's output [N, C, d...]) with
// a float32 constant k of one value or one per channel (dims right-aligned to y's: `channels` or 1 at the
// channel axis, 1 elsewhere): y * k, y + k, y - k, y / k (y first for Sub and Div); nullopt otherwise.
inline std::optional<Affine> channel_affine(const Node& op, const Value* y, std::int64_t channels) {
  const std::string& type = op.op_type();
  const bool scales = type == "Mul" || type == "Div", shifts = type == "Add" || type == "Sub";
  if (!op.domain().empty() || (!scales && !shifts) || op.num_inputs() != 2 || op.num_outputs() != 1) return std::nullopt;
  const Value* k = op.input(0) == y ? op.input(1) : op.input(1) == y ? op.input(0) : nullptr;
  if (!k || k == y || ((type == "Sub" || type == "Div") && op.input(0) != y)) return std::nullopt;
  const Tensor* kt = f32_constant(k);
  const Shape& ys = y->shape();
  if (!kt || !ys.rank_known() || ys.rank() < 3 || kt->rank() > ys.rank() || !(op.output(0)->shape() == ys))
    return std::nullopt;
  bool per_channel = false;
  for (std::size_t j = 0; j < kt->rank(); ++j) {
    const std::int64_t d = kt->dims()[j];
    if (d == 1) continue;
    if (ys.rank() - kt->rank() + j != 1 || d != channels) return std::nullopt;
    per_channel = true;
  }
  const std::vector<double> v = doubles(*kt);
  Affine a;
  for (std::int64_t c = 0; c < channels; ++c) {
    double x = v[per_channel ? static_cast<std::size_t>(c) : 0];
    if (type == "Div") {
      if (x == 0 || !std::isfinite(1 / x)) return std::nullopt;
      x = 1 / x;
    }
    if (type == "Sub") x = -x;
    a.scale.push_back(scales ? x : 1.0);
    a.shift.push_back(scales ? 0.0 : x);
  }
  return a;
}

// Folds the per-channel Mul/Add/Sub/Div by constants that follow Conv `conv` (each the only reader of the
// value before it) into its weights and bias, one after the other; the ops folded go to `folded` (their
// inputs detached) and their names are returned.
inline std::vector<std::string> fold_channel_affines(Graph& g, Node& conv, std::vector<Node*>& folded) {
  std::vector<std::string> names;
  while (conv.domain().empty() && conv.op_type() == "Conv" && conv.num_outputs() == 1) {
    Value* y = conv.output(0);
    const Tensor* w = f32_constant(conv.input(1));
    if (!w || w->rank() < 3 || y->dtype() != DType::Float32 || !rewrite::single_use(y)) break;
    Node* op = y->uses()[0].node;
    std::optional<Affine> a = channel_affine(*op, y, w->dims()[0]);
    if (!a || !fold_into_conv(g, conv, *a)) break;
    take_over(g, op->output(0), y);
    for (std::size_t i = 0; i < op->num_inputs(); ++i) op->set_input(i, nullptr);
    folded.push_back(op);
    names.push_back(label(*op));
  }
  return names;
}

// A new one-output node whose output takes `replaced`'s place, dtype, shape and name.
inline Node* add_replacing_node(Graph& g, Value* replaced, const std::string& op, const std::vector<Value*>& inputs,
                                const std::string& node_name) {
  Node* n = g.add_node(op, inputs, {""}, {}, node_name);
  n->output(0)->set_dtype(replaced->dtype());
  n->output(0)->set_shape(replaced->shape());
  take_over(g, replaced, n->output(0));
  return n;
}

// BN(MatMul(A, W)) with A [N, K] and W [K, C]: the output is [N, C], so column c scales by s[c]:
// MatMul(A, W * s[col]) + t (fuse turns the Add into FusedMatMul's bias).
inline bool fold_into_matmul(Graph& g, Node& matmul, Node& bn, const Affine& a) {
  const Tensor* w = f32_constant(matmul.input(1));
  const Value* x = matmul.input(0);
  const Shape& ys = matmul.output(0)->shape();
  if (!w || w->rank() != 2 || w->dims()[1] != a.channels()) return false;
  if (!x || !x->shape().rank_known() || x->shape().rank() != 2 || !ys.rank_known() || ys.rank() != 2) return false;
  auto cols = static_cast<std::size_t>(a.channels());
  scale_weight(g, matmul, 1, a.scale, static_cast<std::size_t>(w->dims()[0]), cols, 1,
               [](std::size_t, std::size_t c) { return c; });
  std::vector<float> shift(a.shift.begin(), a.shift.end());
  Value* t = g.add_constant(g.unique_name(label(bn) + ".shift"), Tensor::from_vector<float>({a.channels()}, shift));
  add_replacing_node(g, bn.output(0), "Add", {matmul.output(0), t}, label(bn) + ".add");
  return true;
}

// BN(x) -> x * s' + t' with s', t' shaped [C, 1, ...] (rank of x minus 1), broadcasting over
// x's spatial dims.
inline bool rewrite_as_mul_add(Graph& g, Node& bn, const Affine& a) {
  Value* x = bn.input(0);
  if (!x->shape().rank_known() || x->shape().rank() < 2) return false;
  std::vector<std::int64_t> dims(x->shape().rank() - 1, 1);
  dims[0] = a.channels();
  std::vector<float> scale(a.scale.begin(), a.scale.end()), shift(a.shift.begin(), a.shift.end());
  std::string base = label(bn);
  Value* s = g.add_constant(g.unique_name(base + ".scale"), Tensor::from_vector<float>(dims, scale));
  Value* t = g.add_constant(g.unique_name(base + ".shift"), Tensor::from_vector<float>(dims, shift));
  Node* mul = g.add_node("Mul", {x, s}, {g.unique_name(base + ".scaled")}, {}, base + ".mul");
  mul->output(0)->set_dtype(x->dtype());
  mul->output(0)->set_shape(x->shape());
  add_replacing_node(g, bn.output(0), "Add", {mul->output(0), t}, base + ".add");
  return true;
}

// Folds `bn` into its producer when the preconditions hold; returns the producer's name, or nullopt.
inline std::optional<std::string> fold_into_producer(Graph& g, Node& bn, const Affine& a) {
  Value* y = bn.input(0);
  Node* p = y->producer();
  if (!p || y->producer_output() != 0 || !rewrite::single_use(y) || !p->domain().empty()) return std::nullopt;
  if (y->dtype() != DType::Float32) return std::nullopt;
  const std::string& op = p->op_type();
  std::string producer = label(*p);  // before its output takes BN's name
  bool folded = false;
  if (op == "Conv") folded = fold_into_conv(g, *p, a);
  else if (op == "ConvTranspose") folded = fold_into_conv_transpose(g, *p, a);
  else if (op == "Gemm") folded = fold_into_gemm(g, *p, a);
  else if (op == "MatMul") return fold_into_matmul(g, *p, bn, a) ? std::optional<std::string>(producer) : std::nullopt;
  if (!folded) return std::nullopt;
  take_over(g, bn.output(0), y);  // the producer now computes BN's output
  return producer;
}

}  // namespace detail::fold_bn

struct FoldBatchNorm {
  static constexpr const char* name = "fold-bn";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::fold_bn;
    std::vector<Node*> replaced;
    for (Node* n : g.topo_order()) {
      if (n->op_type() != "BatchNormalization" || !n->domain().empty()) continue;
      auto affine = d::inference_affine(*n);
      if (!affine) continue;
      std::string bn = d::label(*n);
      if (auto producer = d::fold_into_producer(g, *n, *affine)) {
        ctx.rewrite("folded '" + bn + "' into '" + *producer + "'");
      } else if (d::rewrite_as_mul_add(g, *n, *affine)) {
        ctx.rewrite("rewrote '" + bn + "' as Mul + Add");
      } else {
        continue;
      }
      // Detach it now, so a BN right after it sees the producer with one reader again.
      for (std::size_t i = 0; i < n->num_inputs(); ++i) n->set_input(i, nullptr);
      replaced.push_back(n);
    }
    for (Node* n : g.topo_order())
      if (n->domain().empty() && n->op_type() == "Conv" && n->num_inputs() >= 2)
        for (const std::string& op : d::fold_channel_affines(g, *n, replaced))
          ctx.rewrite("folded '" + op + "' into '" + d::label(*n) + "'");
    if (replaced.empty()) return false;
    g.remove_nodes(replaced);
    g.remove_dead_values();
    return true;
  }
};

}  // namespace ondine
