// SPDX-License-Identifier: Apache-2.0
// ondine/passes/qoperator_to_qdq.hpp - qoperator-to-qdq: rewrites the QOperator ops into the QDQ form,
// so that one int8 lowering (passes/fuse_qdq.hpp) handles pre-quantized models of both forms.
//
//   QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B)
//     -> QuantizeLinear(Conv(DQ(x, xs, xz), DQ(w, ws, wz, axis=0), DQ(B, xs * ws, axis=0)), ys, yz)
//   QLinearMatMul(a, as, az, b, bs, bz, ys, yz)
//     -> QuantizeLinear(MatMul(DQ(a, as, az, axis=0), DQ(b, bs, bz, axis=1)), ys, yz)
//
// Weights stay 8-bit constants behind a DequantizeLinear (per channel along axis 0 of a conv weight,
// along axis 1 of a 2-D MatMul B); the int32 bias becomes DQ(B, x_scale * w_scale), that scale folded
// into a constant when both scales are constants (else a Mul computes it). A per-tensor parameter of
// shape [1] or [] stays as it is; where a scale and its zero point differ in length (one per channel,
// one for all), the one-element constant is broadcast, since DequantizeLinear needs them alike.
// Preconditions (else the node is left as it is, with a remark): ONNX domain; QLinearMatMul's
// per-row / per-column parameters only on 2-D operands (DequantizeLinear takes 1-D scales only).
// The QDQ graph computes in float what the QOperator node computes in integers: on the reference
// executor they agree within one quantization step of y (float rounding of the rescale only).
// The output keeps its name (a graph output stays one); DQ/Q nodes that need per-axis scales are
// marked opset 13, the first that has them.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/shape_inference.hpp"
#include "ondine/passes/detail/fusion.hpp"
#include "ondine/passes/pass.hpp"

namespace ondine {

namespace detail::qop_to_qdq {

inline void infer_node(Node* n) {
  auto it = infer_table().find(n->op_key());
  if (it != infer_table().end()) it->second(*n);
}

inline std::optional<std::int64_t> numel_of(const Value* v) { return v ? v->shape().numel() : std::nullopt; }

// A scale and zero point DequantizeLinear accepts: equal lengths, 1-D when per channel. Broadcasts a
// one-element constant to the other's length; nullopt when that cannot be done.
struct Params {
  Value* scale;
  Value* zero_point;
  bool per_axis;
};
inline Value* broadcast_constant(Graph& g, Value* v, std::int64_t count) {
  const Tensor& t = v->constant();
  Tensor out(t.dtype(), {count});
  for (std::int64_t i = 0; i < count; ++i)
    std::memcpy(static_cast<char*>(out.raw()) + i * dtype_size(t.dtype()), t.raw(), dtype_size(t.dtype()));
  return g.add_constant(g.unique_name(v->name() + ".per_channel"), std::move(out));
}
inline std::optional<Params> dq_params(Graph& g, Value* scale, Value* zp) {
  auto ns = numel_of(scale), nz = numel_of(zp);
  if (!ns || !nz) return std::nullopt;
  if (*ns == 1 && *nz == 1) return Params{scale, zp, false};
  std::int64_t count = std::max(*ns, *nz);
  for (Value* v : {scale, zp})
    if (v->shape().numel() != 1 && v->shape().rank() != 1) return std::nullopt;
  if (*ns == 1) {
    if (!scale->is_constant()) return std::nullopt;
    scale = broadcast_constant(g, scale, count);
  }
  if (*nz == 1) {
    if (!zp->is_constant()) return std::nullopt;
    zp = broadcast_constant(g, zp, count);
  }
  if (numel_of(scale) != numel_of(zp)) return std::nullopt;
  return Params{scale, zp, true};
}

inline Value* add_dq(Graph& g, Node& origin, Value* x, const Params& p, std::int64_t axis, const std::string& tag) {
  std::map<std::string, Attribute> attrs;
  if (p.per_axis) attrs["axis"] = axis;
  Node* dq = g.add_node("DequantizeLinear", {x, p.scale, p.zero_point}, {g.unique_name(x->name() + ".dq")},
                        std::move(attrs), origin.name() + "/" + tag);
  if (p.per_axis) dq->set_opset(std::max(13, dq->opset()));
  infer_node(dq);
  return dq->output(0);
}

// Bias int32 [M] -> DQ(B, x_scale * w_scale, axis=0), the scale folded when both are constants.
inline Value* add_bias_dq(Graph& g, Node& origin, Value* bias, Value* x_scale, Value* w_scale) {
  Value* scale = nullptr;
  if (x_scale->is_constant() && w_scale->is_constant()) {
    const Tensor &xs = x_scale->constant(), &ws = w_scale->constant();
    std::vector<float> s(static_cast<std::size_t>(ws.numel()));
    for (std::size_t i = 0; i < s.size(); ++i)
      s[i] = static_cast<float>(xs.at_double(0)) * static_cast<float>(ws.at_double(i));  // float32, as ORT computes it
    scale = g.add_constant(g.unique_name(bias->name() + ".scale"),
                           Tensor::from_vector<float>({static_cast<std::int64_t>(s.size())}, s));
  } else {
    Node* mul = g.add_node("Mul", {x_scale, w_scale}, {g.unique_name(bias->name() + ".scale")}, {},
                           origin.name() + "/bias_scale");
    infer_node(mul);
    scale = mul->output(0);
  }
  bool per_axis = !(numel_of(scale) && *numel_of(scale) == 1);
  std::map<std::string, Attribute> attrs;
  if (per_axis) attrs["axis"] = std::int64_t{0};
  Node* dq = g.add_node("DequantizeLinear", {bias, scale}, {g.unique_name(bias->name() + ".dq")}, std::move(attrs),
                        origin.name() + "/bias_dq");
  if (per_axis) dq->set_opset(std::max(13, dq->opset()));
  infer_node(dq);
  return dq->output(0);
}

// The float op's result requantized in place of the QOperator node's output.
inline void finish(Graph& g, Node& n, Value* float_out, Value* y_scale, Value* y_zp) {
  Value* y = n.output(0);
  Node* q = detail::fusion::add_replacement(g, y, "QuantizeLinear", {float_out, y_scale, y_zp}, {}, n.name() + "/q", "",
                                            g.opset(""));
  infer_node(q);
  g.remove_node(&n);
}

inline std::map<std::string, Attribute> conv_attrs(const Node& n) {
  std::map<std::string, Attribute> attrs;
  for (const char* a : {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
    if (n.has_attr(a)) attrs[a] = n.attrs().at(a);
  return attrs;
}

// Returns a reason when the node cannot be rewritten (nothing changed then).
inline std::optional<std::string> rewrite_conv(Graph& g, Node& n) {
  Value *x = n.input(0), *xs = n.input(1), *xz = n.input(2), *w = n.input(3), *ws = n.input(4), *wz = n.input(5),
        *ys = n.input(6), *yz = n.input(7), *b = n.input(8);
  for (Value* v : {x, xs, xz, w, ws, wz, ys, yz})
    if (!v) return std::string("a required input is missing");
  if (numel_of(xs) != 1 || numel_of(xz) != 1) return std::string("x's scale/zero point are not known per-tensor");
  auto wp = dq_params(g, ws, wz);
  if (!wp) return std::string("w's scale and zero point have shapes DequantizeLinear cannot take");
  Value* xf = add_dq(g, n, x, {xs, xz, false}, 0, "x_dq");
  Value* wf = add_dq(g, n, w, *wp, 0, "w_dq");
  std::vector<Value*> conv_in{xf, wf};
  if (b) conv_in.push_back(add_bias_dq(g, n, b, xs, ws));
  Node* conv = g.add_node("Conv", conv_in, {g.unique_name(n.output(0)->name() + ".float")}, conv_attrs(n), n.name());
  infer_node(conv);
  finish(g, n, conv->output(0), ys, yz);
  return std::nullopt;
}

inline std::optional<std::string> rewrite_matmul(Graph& g, Node& n) {
  Value *a = n.input(0), *as = n.input(1), *az = n.input(2), *b = n.input(3), *bs = n.input(4), *bz = n.input(5),
        *ys = n.input(6), *yz = n.input(7);
  for (Value* v : {a, as, az, b, bs, bz, ys, yz})
    if (!v) return std::string("a required input is missing");
  // Per-row of A is A's axis 0 and per-column of B is B's axis 1, on 2-D operands only.
  auto per_tensor = [](const Value* s, const Value* z) { return numel_of(s) == 1 && numel_of(z) == 1; };
  auto rank = [](const Value* v) { return v->shape().rank_known() ? static_cast<int>(v->shape().rank()) : -1; };
  if ((!per_tensor(as, az) && rank(a) != 2) || (!per_tensor(bs, bz) && rank(b) != 2))
    return std::string("per-row/per-column parameters on operands that are not 2-D");
  auto ap = dq_params(g, as, az);
  auto bp = dq_params(g, bs, bz);
  if (!ap || !bp) return std::string("a scale/zero point pair has shapes DequantizeLinear cannot take");
  Value* af = add_dq(g, n, a, *ap, 0, "a_dq");
  Value* bf = add_dq(g, n, b, *bp, 1, "b_dq");
  Node* mm = g.add_node("MatMul", {af, bf}, {g.unique_name(n.output(0)->name() + ".float")}, {}, n.name());
  infer_node(mm);
  finish(g, n, mm->output(0), ys, yz);
  return std::nullopt;
}

}  // namespace detail::qop_to_qdq

struct QOperatorToQdq {
  static constexpr const char* name = "qoperator-to-qdq";

  bool run(Graph& g, PassContext& ctx) {
    namespace d = detail::qop_to_qdq;
    bool changed = false;
    for (Node* n : g.topo_order()) {
      if (!n->domain().empty() || (n->op_type() != "QLinearConv" && n->op_type() != "QLinearMatMul")) continue;
      std::string what = "'" + n->name() + "' (" + n->op_type() + ")";
      bool conv = n->op_type() == "QLinearConv";
      auto why_not = conv ? d::rewrite_conv(g, *n) : d::rewrite_matmul(g, *n);
      if (why_not) {
        ctx.remark(what + " left as it is: " + *why_not);
        continue;
      }
      ctx.rewrite(what + " -> DequantizeLinear, " + (conv ? "Conv" : "MatMul") + ", QuantizeLinear");
      changed = true;
    }
    if (changed) g.remove_dead_values();
    return changed;
  }
};

}  // namespace ondine
