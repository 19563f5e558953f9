// SPDX-License-Identifier: Apache-2.0
// ondine/passes/fuse_qdq.hpp - fuse-qdq: turns the QuantizeLinear/DequantizeLinear pairs around float
// ops of a QDQ model (ONNX Runtime's quantizer, quant/qdq.hpp) into Ondine's quantized ops
// (ir/infer/quantized.hpp), which lower to oneDNN int8 primitives.
//
// Rewrites (dq(v) is DequantizeLinear of a runtime u8/s8 tensor with scalar scale and zero point;
// dqw(w) of a constant int8 weight, scale per tensor or per output channel, zero point 0):
//   Q(act*(Add(dq(s), [dq(Q(Conv(dq(x), dqw(w), b)))])))  -> QConv(x, w, b, s)  every part after the
//                                          Conv optional; without the final Q the output is float32
//   Q(act*([Add(MatMul(dq(a), dqw(w)), b)]))               -> QMatMul(a, w, b)
//   Q(act*(Gemm(dq(a), dqw(w), b)))                        -> QMatMul(a, w^T or w, b)  alpha = beta = 1
//   Q(pool(dq(x))), Q(view(pool(dq(x))))                  -> QPool(x), view(QPool(x))  MaxPool, AveragePool,
//                                                             Global*
//   Q(view(dq(x))), Q(Concat(dq(x1), dq(x2), ...))         -> view(x), Concat(x1, ...)  same parameters
// where act is Relu, LeakyRelu or Clip (constant bounds), b a float32 constant [C] or dq of an int32
// constant (computed now), view Reshape, Flatten, Squeeze, Unsqueeze or Transpose.
// Preconditions: each absorbed intermediate has one reader and is not a graph output; activation
// zero points are scalars; weights are int8 with zero point 0 and per-channel scales along the
// output-channel axis (0 for Conv and Gemm with transB, 1 for MatMul). Anything else (a weight zero
// point, per-channel activations, uint8 weights) is left as it is and runs in float32 after
// fold-constants dequantizes the weights. Names: the new node keeps the Conv/MatMul/pool's name; its
// output keeps the name of the last value absorbed. Runs before fold-constants (which would fold the
// weights' DequantizeLinear into float32 constants).
//
// Options (PassContext): "fuse-qdq.max-abs-weight" = N leaves in float a Conv/MatMul/Gemm whose int8
// weights exceed N in magnitude; "fuse-qdq.u8-only" = "1" also one that reads s8 activations. The
// compiler sets 64 and 1 on CPUs without VNNI (lower/lower.hpp, set_isa_pass_options): there oneDNN's int8 kernels add u8 x s8
// products in pairs into int16 (vpmaddubsw), which saturates past 255 * 64 * 2, and halve the weights of
// an s8 source, so an unbounded layer would silently compute something else.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/ir/infer/quantized.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"
#include "ondine/passes/rewrite.hpp"

namespace ondine {

namespace detail::qdq {

using qops::QParam;

inline bool is_op(const Node* n, const char* op) { return n && n->domain().empty() && n->op_type() == op; }
inline bool is_f32(const Value* v) { return v && v->dtype() == DType::Float32; }

// The only reader of `v`, when `v` may disappear.
inline Node* sole_reader(Value* v) { return rewrite::single_use(v) ? v->uses()[0].node : nullptr; }

inline bool scalar_const(const Value* v) { return v && v->is_constant() && v->constant().numel() == 1; }

// Scale and zero point of a QuantizeLinear / DequantizeLinear with per-tensor constants.
inline std::optional<QParam> scalar_params(const Node* n, DType type) {
  const Value* s = n->input(1);
  const Value* z = n->input(2);
  if (!scalar_const(s) || s->dtype() != DType::Float32) return std::nullopt;
  if (z && !scalar_const(z)) return std::nullopt;
  QParam p;
  p.scale = static_cast<float>(s->constant().at_double(0));
  p.zero_point = z ? static_cast<std::int32_t>(z->constant().at_double(0)) : 0;
  p.type = z ? z->dtype() : type;
  if (p.type != DType::UInt8 && p.type != DType::Int8) return std::nullopt;
  if (!(p.scale > 0) || !std::isfinite(p.scale)) return std::nullopt;
  return p;
}

inline bool same(const QParam& a, const QParam& b) {
  return a.scale == b.scale && a.zero_point == b.zero_point && a.type == b.type;
}

// A QuantizeLinear with per-tensor parameters (its output type from the zero point; without one, the
// inferred output type: uint8, or opset 21's output_dtype).
inline std::optional<QParam> q_params(const Node* q) {
  if (!is_op(q, "QuantizeLinear") || q->num_outputs() != 1 || !q->input(0) || q->input(0)->dtype() != DType::Float32)
    return std::nullopt;
  return scalar_params(q, q->output(0) ? q->output(0)->dtype() : DType::UInt8);
}

// dq(x): a DequantizeLinear to float32 of a runtime u8/s8 tensor with per-tensor parameters.
struct Act {
  Value* q = nullptr;
  QParam p;
  Node* dq = nullptr;
};
inline std::optional<Act> dq_act(Value* v) {
  Node* dq = v ? v->producer() : nullptr;
  if (!is_op(dq, "DequantizeLinear") || !is_f32(v)) return std::nullopt;
  Value* q = dq->input(0);
  if (!q || q->is_constant() || (q->dtype() != DType::UInt8 && q->dtype() != DType::Int8)) return std::nullopt;
  auto p = scalar_params(dq, q->dtype());
  if (!p || p->type != q->dtype()) return std::nullopt;
  return Act{q, *p, dq};
}

// dqw(w): DequantizeLinear of a constant int8 tensor, zero point 0, scale per tensor or along `axis`.
struct Weights {
  Value* w = nullptr;
  std::vector<float> scale;
  Node* dq = nullptr;
};
inline std::optional<Weights> dq_weights(Value* v, std::int64_t axis) {
  Node* dq = v ? v->producer() : nullptr;
  if (!is_op(dq, "DequantizeLinear") || !is_f32(v)) return std::nullopt;
  Value* w = dq->input(0);
  const Value* s = dq->input(1);
  const Value* z = dq->input(2);
  if (!w || !w->is_constant() || w->dtype() != DType::Int8) return std::nullopt;
  if (!s || !s->is_constant() || s->dtype() != DType::Float32) return std::nullopt;
  const Tensor& wt = w->constant();
  std::int64_t channels = wt.rank() > static_cast<std::size_t>(axis) ? wt.dims()[static_cast<std::size_t>(axis)] : -1;
  std::int64_t count = s->constant().numel();
  if (count != 1) {
    auto rank = static_cast<std::int64_t>(wt.rank());
    std::int64_t a = dq->attr_int("axis", 1);
    if (a < 0) a += rank;
    if (a != axis || count != channels) return std::nullopt;
  }
  if (z) {  // a weight zero point must be 0: oneDNN int8 weights have none
    if (!z->is_constant() || z->dtype() != DType::Int8) return std::nullopt;
    for (std::int64_t i = 0; i < z->constant().numel(); ++i)
      if (z->constant().at_double(static_cast<std::size_t>(i)) != 0) return std::nullopt;
  }
  Weights out{w, {}, dq};
  for (std::int64_t i = 0; i < count; ++i) {
    float sc = static_cast<float>(s->constant().at_double(static_cast<std::size_t>(i)));
    if (!(sc > 0) || !std::isfinite(sc)) return std::nullopt;
    out.scale.push_back(sc);
  }
  return out;
}

// A bias of `channels` floats: a float32 constant (any shape of that many elements with all other
// dims 1), or DequantizeLinear of an int32 constant. `ok` is false when v is present but neither.
inline std::optional<Tensor> float_bias(const Value* v, std::int64_t channels, bool& ok) {
  ok = true;
  if (!v) return std::nullopt;
  ok = false;
  const Node* dq = v->producer();
  if (v->is_constant() && v->dtype() == DType::Float32 && v->constant().numel() == channels) {
    ok = true;
    return v->constant().reshaped({channels});
  }
  if (!is_op(dq, "DequantizeLinear") || !is_f32(v)) return std::nullopt;
  const Value* b = dq->input(0);
  const Value* s = dq->input(1);
  const Value* z = dq->input(2);
  if (!b || !b->is_constant() || b->dtype() != DType::Int32 || b->constant().numel() != channels) return std::nullopt;
  if (!s || !s->is_constant() || s->dtype() != DType::Float32) return std::nullopt;
  std::int64_t count = s->constant().numel();
  if (count != 1 && count != channels) return std::nullopt;
  if (z && (!z->is_constant() || z->constant().numel() != count)) return std::nullopt;
  std::vector<float> out(static_cast<std::size_t>(channels));
  for (std::int64_t c = 0; c < channels; ++c) {
    auto i = static_cast<std::size_t>(count == 1 ? 0 : c);
    double zp = z ? z->constant().at_double(i) : 0.0;
    // float32 arithmetic, as DequantizeLinear computes it
    out[static_cast<std::size_t>(c)] = (static_cast<float>(b->constant().at_double(static_cast<std::size_t>(c))) -
                                        static_cast<float>(zp)) * static_cast<float>(s->constant().at_double(i));
  }
  ok = true;
  return Tensor::from_vector<float>({channels}, out);
}

inline bool is_view(const Node* n) {
  return is_op(n, "Flatten") || is_op(n, "Reshape") || is_op(n, "Squeeze") || is_op(n, "Unsqueeze");
}

// The activations whose int8 lowering is exact (they commute with a positive rescale).
inline std::optional<fused::Activation> int8_activation(const Node& n) {
  auto a = fused::as_activation(n);
  if (!a || (a->op != "Relu" && a->op != "LeakyRelu" && a->op != "Clip")) return std::nullopt;
  if (!is_f32(n.output(0))) return std::nullopt;
  return a;
}

// Add(v, dq(s)) reading `v` as its only reader, s of v's shape.
inline Node* residual_add(Value* v, std::optional<Act>& other) {
  Node* add = sole_reader(v);
  if (!is_op(add, "Add") || add->num_inputs() != 2 || add->input(0) == add->input(1)) return nullptr;
  Value* o = add->input(0) == v ? add->input(1) : add->input(0);
  other = dq_act(o);
  if (!other || !(o->shape() == v->shape()) || !o->shape().is_static() || !(add->output(0)->shape() == v->shape()))
    return nullptr;
  return add;
}

// What follows a Conv/MatMul: the parts the quantized op takes over.
struct Tail {
  std::vector<Node*> absorbed;
  Value* result = nullptr;
  std::optional<QParam> mid, y;
  std::optional<Act> sum;
  std::vector<fused::Activation> acts;
};

inline Tail read_tail(Value* cur, bool allow_sum) {
  Tail t;
  // Q -> DQ (mid) when an Add or an activation follows it, as ONNX Runtime writes Conv -> Q -> DQ -> Add.
  if (Node* q = sole_reader(cur); allow_sum && q && q_params(q)) {
    Node* dq = sole_reader(q->output(0));
    auto pq = q_params(q);
    std::optional<Act> dq_in = dq ? dq_act(dq->output(0)) : std::nullopt;
    if (dq_in && dq_in->q == q->output(0) && same(dq_in->p, *pq)) {
      std::optional<Act> other;
      Node* next = sole_reader(dq->output(0));
      if (next && (residual_add(dq->output(0), other) || int8_activation(*next))) {
        t.mid = pq;
        t.absorbed.push_back(q);
        t.absorbed.push_back(dq);
        cur = dq->output(0);
      }
    }
  }
  if (allow_sum) {
    std::optional<Act> other;
    if (Node* add = residual_add(cur, other)) {
      t.sum = other;
      t.absorbed.push_back(add);
      cur = add->output(0);
    }
  }
  while (Node* next = sole_reader(cur)) {
    auto act = int8_activation(*next);
    if (!act || next->input(0) != cur) break;
    t.acts.push_back(*act);
    t.absorbed.push_back(next);
    cur = next->output(0);
  }
  if (Node* q = sole_reader(cur)) {
    if (auto p = q_params(q)) {
      t.y = p;
      t.absorbed.push_back(q);
      cur = q->output(0);
    }
  }
  t.result = cur;
  return t;
}

inline void set_quant_attrs(Node& n, const QParam& x, const std::vector<float>* w_scale, const Tail& t) {
  n.set_attr("x_scale", x.scale);
  n.set_attr("x_zero_point", static_cast<std::int64_t>(x.zero_point));
  if (w_scale) n.set_attr("w_scale", *w_scale);
  if (t.y) {
    n.set_attr("y_scale", t.y->scale);
    n.set_attr("y_zero_point", static_cast<std::int64_t>(t.y->zero_point));
  }
  n.set_attr("output_type", std::string(qops::type_str(t.y ? t.y->type : DType::Float32)));
  if (t.mid) qops::write_param(n, "mid", *t.mid, true);
  if (t.sum) qops::write_param(n, "sum", t.sum->p, false);
  fused::write_activations(n, t.acts);
}

}  // namespace detail::qdq

struct FuseQdq {
  static constexpr const char* name = "fuse-qdq";

  // The float ops this pass turns into int8 kernels when a QDQ model surrounds them, and what they become
  // (`ondine ops` prints it). LSTM is quantized by quant/qlstm.hpp, MatMul with dynamic activations by
  // passes/fuse_dynamic_qmatmul.hpp; both are listed so the table covers every int8 kernel.
  static const std::map<std::string, const char*>& int8_ops() {
    static const std::map<std::string, const char*> ops = [] {
      std::map<std::string, const char*> t;
      t["Conv"] = "ondine.QConv (with Relu/Clip and a residual Add fused)";
      t["MatMul"] = "ondine.QMatMul; ondine.DynQMatMul for dynamic quantization";
      t["Gemm"] = "ondine.QMatMul";
      for (const char* op : {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}) t[op] = "ondine.QPool";
      for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"}) t[op] = "stays int8 (a view or reorder)";
      t["Concat"] = "stays int8 (oneDNN concat)";
      t["LSTM"] = "ondine.QLSTM (oneDNN int8 LSTM, no peepholes)";
      return t;
    }();
    return ops;
  }

  bool run(Graph& g, PassContext& ctx) {
    std::unordered_set<const Node*> erased;
    bool changed = false;
    const int max_abs_weight = max_abs_weight_option(ctx);
    const bool u8_only = ctx.option("fuse-qdq.u8-only") == "1";
    const bool halve = ctx.option("fuse-qdq.halve-weights") == "1";
    std::size_t halved = 0;
    for (Node* n : g.topo_order()) {
      if (erased.count(n) || !n->domain().empty() || !int8_ops().count(n->op_type())) continue;
      std::vector<Node*> gone;
      std::string what, name = n->name();  // n is erased when it is rewritten
      const std::string& op = n->op_type();
      if (op == "Conv" || op == "MatMul" || op == "Gemm") {
        std::string why = beyond_limits(*n, max_abs_weight, u8_only);
        if (!why.empty() && halve && beyond_limits(*n, 128, u8_only).empty() && halve_weights(g, *n, max_abs_weight)) {
          ++halved;
          why = beyond_limits(*n, max_abs_weight, u8_only);
        }
        if (!why.empty()) {
          ctx.remark("'" + name + "' stays float: " + why);
          continue;
        }
      }
      if (op == "Conv") what = conv(g, n, gone);
      else if (op == "MatMul" || op == "Gemm") what = matmul(g, n, gone);
      else if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool")
        what = pool(g, n, gone);
      else if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Transpose" ||
               op == "Concat")
        what = data_movement(g, n, gone);
      if (what.empty()) continue;
      erased.insert(gone.begin(), gone.end());
      changed = true;
      ctx.rewrite("'" + name + "': " + what);
    }
    if (halved)
      ctx.remark(std::to_string(halved) + " layer(s) with 8-bit weights requantized to 7 bits (w/2 rounded to even, "
                 "scales doubled: up to half an 8-bit step more error per weight), as this CPU's int8 kernels "
                 "(no VNNI) saturate past " + std::to_string(max_abs_weight) + "; fuse-qdq.halve-weights=0 keeps them "
                 "float instead");
    if (changed) g.remove_dead_values();
    return changed;
  }

 private:
  static Value* add_const(Graph& g, const std::string& base, Tensor t) { return g.add_constant(g.unique_name(base), std::move(t)); }

  static Node* replace(Graph& g, const detail::qdq::Tail& t, const std::string& op, std::vector<Value*> inputs,
                       std::map<std::string, Attribute> attrs, const std::string& name) {
    while (!inputs.empty() && !inputs.back()) inputs.pop_back();
    g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
    return detail::fusion::add_replacement(g, t.result, op, inputs, std::move(attrs), name, fused::kDomain,
                                           fused::kDomainVersion);
  }

  static void finish(Graph& g, Node* n, std::vector<Node*> dead, std::vector<Node*>& gone) {
    dead.push_back(n);
    gone = dead;
    detail::fusion::erase_unused(g, dead);
  }

  static std::string describe(const std::string& from, const detail::qdq::Tail& t, const std::string& to) {
    std::string s = from;
    for (const Node* a : t.absorbed) s += " +" + a->op_type();
    return s + " -> ondine." + to + " (" + (t.y ? qops::type_str(t.y->type) : "float32") + " out)";
  }

  // Q(act*(Add(dq(s), [dq(Q(Conv(dq(x), dqw(w), b)))]))) -> QConv(x, w, b, s)
  static std::string conv(Graph& g, Node* n, std::vector<Node*>& gone) {
    using namespace detail::qdq;
    auto x = dq_act(n->input(0));
    auto w = dq_weights(n->input(1), 0);
    if (!x || !w || !is_f32(n->output(0)) || n->num_outputs() != 1) return "";
    std::int64_t oc = w->w->constant().dims()[0];
    bool ok = false;
    auto bias = float_bias(n->input(2), oc, ok);
    if (!ok) return "";
    Tail t = read_tail(n->output(0), true);
    Value* b = bias ? add_const(g, n->name() + ".bias", *bias) : nullptr;
    std::vector<Node*> dead = t.absorbed;
    dead.push_back(x->dq);
    dead.push_back(w->dq);
    if (n->input(2) && n->input(2)->producer()) dead.push_back(n->input(2)->producer());
    Node* f = replace(g, t, "QConv", {x->q, w->w, b, t.sum ? t.sum->q : nullptr}, n->attrs(), n->name());
    set_quant_attrs(*f, x->p, &w->scale, t);
    if (t.sum) dead.push_back(t.sum->dq);
    std::string what = describe("Conv", t, "QConv");
    finish(g, n, dead, gone);
    return what;
  }

  // fuse-qdq.max-abs-weight: 0 to 127 (128 when unset: no limit).
  static int max_abs_weight_option(const PassContext& ctx) {
    std::string s = ctx.option("fuse-qdq.max-abs-weight");
    if (s.empty()) return 128;
    try {
      std::size_t used = 0;
      int v = std::stoi(s, &used);
      if (used == s.size() && v >= 0 && v <= 127) return v;
    } catch (const std::exception&) {
    }
    throw Error("fuse-qdq: option fuse-qdq.max-abs-weight='" + s + "' is not a weight magnitude (0 to 127)");
  }

  // Why a Conv/MatMul/Gemm must not become int8 under the options' limits ("" when it may).
  static std::string beyond_limits(const Node& n, int max_abs_weight, bool u8_only) {
    const Node* x = n.input(0) ? n.input(0)->producer() : nullptr;
    const Node* w = n.input(1) ? n.input(1)->producer() : nullptr;
    if (u8_only && detail::qdq::is_op(x, "DequantizeLinear") && x->input(0) && x->input(0)->dtype() == DType::Int8)
      return "it reads s8 activations, which this CPU's int8 kernels compute with halved weights";
    if (max_abs_weight < 128 && detail::qdq::is_op(w, "DequantizeLinear") && w->input(0) && w->input(0)->is_constant() &&
        w->input(0)->dtype() == DType::Int8) {
      const Tensor& t = w->input(0)->constant();
      int worst = 0;
      for (std::int64_t i = 0; i < t.numel(); ++i) worst = std::max(worst, std::abs(int{t.data<std::int8_t>()[i]}));
      if (worst > max_abs_weight)
        return "int8 weights up to " + std::to_string(worst) + " in magnitude, and this CPU's int8 kernels (no VNNI) " +
               "saturate past " + std::to_string(max_abs_weight) + " (quantize with 7-bit weights to run it in int8 here)";
    }
    return "";
  }

  // fuse-qdq.halve-weights: the weights of `n` (int8 constants, zero point 0, through a DequantizeLinear)
  // requantized to fit `limit`: w' = w/2 rounded half to even, its scale doubled (new constants: the file's
  // stay as they are). False when they are not such weights, or when `n` is no int8 layer: its activations
  // not dequantized (a weight-only MatMul, which fuse-weight-only runs on its own kernel, exactly).
  static bool halve_weights(Graph& g, Node& n, int limit) {
    Node* act = n.input(0) ? n.input(0)->producer() : nullptr;
    if (!detail::qdq::is_op(act, "DequantizeLinear")) return false;
    Node* dq = n.input(1) ? n.input(1)->producer() : nullptr;
    if (!detail::qdq::is_op(dq, "DequantizeLinear") || dq->attr_int("block_size", 0) != 0 || dq->num_inputs() < 2 || !dq->input(0) ||
        !dq->input(0)->is_constant() || dq->input(0)->dtype() != DType::Int8 || !dq->input(1) ||
        !dq->input(1)->is_constant() || dq->input(1)->dtype() != DType::Float32 || dq->output(0)->uses().size() != 1)
      return false;
    if (dq->num_inputs() > 2 && dq->input(2)) {  // a zero point: 0 everywhere only
      if (!dq->input(2)->is_constant()) return false;
      const Tensor& zp = dq->input(2)->constant();
      for (std::int64_t i = 0; i < zp.numel(); ++i)
        if (zp.at_double(static_cast<std::size_t>(i)) != 0) return false;
    }
    const Tensor& w = dq->input(0)->constant();
    Tensor half = Tensor::uninitialized(DType::Int8, w.dims());
    const std::int8_t* src = w.data<std::int8_t>();
    std::int8_t* dst = half.data<std::int8_t>();
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      int v = src[i];
      int h = v / 2;                              // towards zero
      if (v % 2 != 0 && (h % 2 != 0)) h += v > 0 ? 1 : -1;  // .5 cases to the even neighbour
      dst[i] = static_cast<std::int8_t>(std::clamp(h, -limit, limit));
    }
    Tensor scale = dq->input(1)->constant().clone();
    float* sp = scale.data<float>();
    for (std::int64_t i = 0; i < scale.numel(); ++i) sp[i] *= 2.0f;
    dq->set_input(0, add_const(g, dq->input(0)->name() + ".7bit", std::move(half)));
    dq->set_input(1, add_const(g, dq->input(1)->name() + ".7bit", std::move(scale)));
    return true;
  }

  // Q(act*([Add(MatMul(dq(a), dqw(w)), b)])) and Q(act*(Gemm(dq(a), dqw(w), b))) -> QMatMul(a, w, b)
  static std::string matmul(Graph& g, Node* n, std::vector<Node*>& gone) {
    using namespace detail::qdq;
    bool gemm = n->op_type() == "Gemm";
    if (!is_f32(n->output(0)) || n->num_outputs() != 1) return "";
    auto x = dq_act(n->input(0));
    if (!x || !x->q->shape().rank_known() || x->q->shape().rank() < 2) return "";
    bool trans_b = gemm && n->attr_int("transB", 0) != 0;
    if (gemm && (n->attr_int("transA", 0) != 0 || n->attr_float("alpha", 1.0f) != 1.0f ||
                 (n->input(2) && n->attr_float("beta", 1.0f) != 1.0f)))
      return "";
    auto w = dq_weights(n->input(1), trans_b ? 0 : 1);
    if (!w || w->w->constant().rank() != 2) return "";
    Tensor wt = w->w->constant();
    std::int64_t channels = wt.dims()[trans_b ? 0 : 1];
    std::vector<Node*> dead;
    bool ok = false;
    std::optional<Tensor> bias;
    Value* cur = n->output(0);
    if (gemm) {
      bias = float_bias(n->input(2), channels, ok);
      if (!ok) return "";
      if (n->input(2) && n->input(2)->producer()) dead.push_back(n->input(2)->producer());
    } else if (Node* add = sole_reader(cur); is_op(add, "Add") && add->num_inputs() == 2) {
      Value* c = add->input(0) == cur ? add->input(1) : add->input(0);
      auto b = c != cur ? float_bias(c, channels, ok) : std::nullopt;
      if (ok && b && (add->output(0)->shape() == cur->shape())) {
        bias = b;
        dead.push_back(add);
        if (c->producer()) dead.push_back(c->producer());
        cur = add->output(0);
      }
    }
    Tail t = read_tail(cur, false);
    t.absorbed.insert(t.absorbed.begin(), dead.begin(), dead.end());
    if (trans_b) {  // [N, K] -> [K, N]
      std::int64_t nn = wt.dims()[0], k = wt.dims()[1];
      Tensor tr(DType::Int8, {k, nn});
      const auto* src = wt.data<std::int8_t>();
      auto* dst = tr.data<std::int8_t>();
      for (std::int64_t i = 0; i < nn; ++i)
        for (std::int64_t j = 0; j < k; ++j) dst[j * nn + i] = src[i * k + j];
      wt = tr;
    }
    Value* wv = trans_b ? add_const(g, n->name() + ".weight_kn", wt) : w->w;
    Value* b = bias ? add_const(g, n->name() + ".bias", *bias) : nullptr;
    t.absorbed.push_back(x->dq);
    t.absorbed.push_back(w->dq);
    Node* f = replace(g, t, "QMatMul", {x->q, wv, b}, {}, n->name());
    set_quant_attrs(*f, x->p, &w->scale, t);
    std::string what = describe(n->op_type(), t, "QMatMul");
    finish(g, n, t.absorbed, gone);
    return what;
  }

  // Q(pool(dq(x))) -> QPool(x)
  static std::string pool(Graph& g, Node* n, std::vector<Node*>& gone) {
    using namespace detail::qdq;
    auto x = dq_act(n->input(0));
    if (!x || !is_f32(n->output(0))) return "";
    for (std::size_t i = 1; i < n->num_outputs(); ++i)
      if (n->output(i) && (n->output(i)->has_uses() || n->output(i)->is_graph_output())) return "";
    Node* q = sole_reader(n->output(0));
    // Q(view(pool(dq(x)))) -> view(QPool(x)): quant/qdq.hpp quantizes GlobalAveragePool -> Flatten after the Flatten.
    Node* view = is_view(q) && q->input(0) == n->output(0) ? q : nullptr;
    if (view) q = sole_reader(view->output(0));
    auto y = q ? q_params(q) : std::nullopt;
    if (!y) return "";
    Tail t;
    t.y = y;
    t.absorbed = {q, x->dq};
    t.result = q->output(0);
    auto attrs = n->attrs();
    attrs["pool_op"] = Attribute(n->op_type());
    Node* f = nullptr;
    if (view) {
      g.opsets.emplace(fused::kDomain, fused::kDomainVersion);
      f = g.add_node("QPool", {x->q}, {g.unique_name(n->output(0)->name() + ".q")}, attrs, n->name(), fused::kDomain);
      f->set_opset(fused::kDomainVersion);
      f->output(0)->set_dtype(y->type);
      f->output(0)->set_shape(n->output(0)->shape());
      std::vector<Value*> ins = view->inputs();
      ins[0] = f->output(0);
      detail::fusion::add_replacement(g, q->output(0), view->op_type(), ins, view->attrs(), view->name(), "", view->opset());
      t.absorbed.push_back(view);
    } else {
      f = replace(g, t, "QPool", {x->q}, attrs, n->name());
    }
    set_quant_attrs(*f, x->p, nullptr, t);
    std::string what = "Q(" + std::string(view ? view->op_type() + "(" : "") + n->op_type() + "(DQ))" + (view ? ")" : "") +
                       " -> ondine.QPool";
    finish(g, n, t.absorbed, gone);
    return what;
  }

  // Q(view(dq(x))) -> view(x), Q(Concat(dq(x1), ...)) -> Concat(x1, ...): the same parameters throughout.
  static std::string data_movement(Graph& g, Node* n, std::vector<Node*>& gone) {
    using namespace detail::qdq;
    if (n->num_outputs() != 1 || !is_f32(n->output(0))) return "";
    Node* q = sole_reader(n->output(0));
    auto y = q ? q_params(q) : std::nullopt;
    if (!y) return "";
    bool concat = n->op_type() == "Concat";
    std::vector<Value*> inputs = n->inputs();
    std::vector<Node*> dead{q};
    for (std::size_t i = 0; i < (concat ? inputs.size() : 1); ++i) {
      auto x = dq_act(inputs[i]);
      if (!x || !same(x->p, *y)) return "";
      inputs[i] = x->q;
      dead.push_back(x->dq);
    }
    detail::fusion::add_replacement(g, q->output(0), n->op_type(), inputs, n->attrs(), n->name(), "", n->opset());
    std::string what = "Q(" + n->op_type() + "(DQ)) -> " + n->op_type() + " on " + qops::type_str(y->type);
    finish(g, n, dead, gone);
    return what;
  }
};

}  // namespace ondine
