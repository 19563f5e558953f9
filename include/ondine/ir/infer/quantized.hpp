// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/quantized.hpp - Ondine's quantized ops (domain "ondine", made by passes/fuse_qdq.hpp
// from QDQ graphs): their one definition, the attribute readers everyone shares, and shape inference.
//
//   ondine.QConv   (X, W, B?, Sum?)  Conv's attributes; X u8/s8, W s8 constant, B float [OC], Sum u8/s8
//   ondine.QMatMul (A, W, B?)        A u8/s8 [..., K], W s8 [K, N], B float [N]
//   ondine.QPool   (X)               pool_op = MaxPool | AveragePool | GlobalAveragePool | GlobalMaxPool
//                                    (and that op's attributes), X u8/s8
// Attributes: x_scale, x_zero_point (X/A), w_scale (1 or one per output channel: W's axis 0 for QConv,
// its axis 1 for QMatMul; weight zero points are 0), y_scale, y_zero_point, output_type ("uint8",
// "int8" or "float32"), the activation chain of ir/fused_ops.hpp; QConv also mid_scale, mid_zero_point,
// mid_type (optional) and sum_scale, sum_zero_point (with Sum).
// Meaning, per output element of channel c, in real numbers:
//   r = sum((x - x_zero_point) * w) * x_scale * w_scale[c] + B[c]     (integer accumulation)
//   r = dq(q(r, mid))                                                 (when mid_scale is set)
//   r = r + (sum - sum_zero_point) * sum_scale                        (with Sum)
//   r = act(r)
//   y = output_type float32 ? r : saturate(round_half_even(r / y_scale) + y_zero_point)
// QPool: y = q(pool(dq(x))).
//
//   ondine.DynQMatMul (A, A_scale, A_zero_point, W, B?)   A u8 [..., K] with its runtime scale (float
//                    scalar) and zero point (u8 scalar), as DynamicQuantizeLinear writes them; W the
//                    centred weights (their zero point subtracted) [K, N], int8, or int16 when they do
//                    not fit int8; B float [N]. Attributes w_scale (1 or N) and the activation chain.
//   ondine.DynQConv  (A, A_scale, A_zero_point, W, B?)   the same for a convolution: Conv's attributes,
//                    A u8 [N, C, ...], W int8 or int16 [M, C/group, k...], B float [M], w_scale 1 or M.
//   y = act(float(sum((a - A_zero_point) * w)) * (A_scale * w_scale[c]) + B[c])   Output float32
//       (float32 products, as the MatMulInteger/ConvInteger -> Cast -> Mul(A_scale * w_scale) -> Add it
//       replaces computes them; padding adds nothing, as ConvInteger's; act as the FusedMatMul's)
//   ondine.QLSTM: the int8 LSTM, defined with LSTM in ir/infer/rnn.hpp.
//
//   ondine.WeightOnlyMatMul (A, Q, S, Z?)   weight-only quantization (passes/fuse_weight_only.hpp): A float32
//                    [..., K]; Q the constant weights [K, N], int4 / uint4 / int8 / uint8; S float32
//                    [ceil(K / block_size), N]; Z Q's type, S's shape (absent: 0). Attribute block_size.
//                    Attributes block_size, int8_activations (0 or 1, default 0).
//   int8_activations 0: y = A W with W[k, n] = (float(Q[k, n]) - float(Z[k / block_size, n])) * S[k / block_size,
//       n]: exactly MatMul(A, DequantizeLinear(Q, S, Z, axis 0, block_size)), which it replaces.
//   int8_activations 1: each row of A quantized per block b of K: s_a = max |a| / 127, qa = round_half_even(a / s_a)
//       (round(a * (127 / max |a|)) in float32, within [-127, 127]); y[n] = sum over b of
//       S[b, n] * s_a[b] * sum over k in b of qa[k] * (Q[k, n] - Z[b, n]) (an exact integer sum). Output float32.
// The reference kernels (reference/quantized.hpp) compute exactly this; the
// oneDNN lowering (lower/detail/quantized.hpp) computes it with float rescaling (within 1 step).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/fused_ops.hpp"
#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/nn.hpp"

namespace ondine::qops {

// A per-tensor quantization: real = (q - zero_point) * scale.
struct QParam {
  float scale = 1.0f;
  std::int32_t zero_point = 0;
  DType type = DType::UInt8;
};

inline DType parse_type(const Node& n, const std::string& s) {
  if (s == "uint8") return DType::UInt8;
  if (s == "int8") return DType::Int8;
  if (s == "float32") return DType::Float32;
  throw n.error("output_type must be uint8, int8 or float32, not '" + s + "'");
}
inline const char* type_str(DType t) { return t == DType::UInt8 ? "uint8" : t == DType::Int8 ? "int8" : "float32"; }

// The attributes of one quantized op, read once.
struct QAttrs {
  QParam x, y, mid, sum;
  bool has_mid = false, has_sum = false;
  std::vector<float> w_scale;
  DType output_type = DType::UInt8;
  std::vector<fused::Activation> activations;

  float w_scale_at(std::int64_t c) const { return w_scale.size() == 1 ? w_scale[0] : w_scale[static_cast<std::size_t>(c)]; }
};

inline QAttrs read_attrs(const Node& n) {
  QAttrs a;
  a.x.scale = n.attr_float("x_scale", 1.0f);
  a.x.zero_point = static_cast<std::int32_t>(n.attr_int("x_zero_point", 0));
  a.w_scale = n.attr_floats("w_scale", {1.0f});
  a.output_type = parse_type(n, n.attr_string("output_type", "uint8"));
  a.y.type = a.output_type;
  a.y.scale = n.attr_float("y_scale", 1.0f);
  a.y.zero_point = static_cast<std::int32_t>(n.attr_int("y_zero_point", 0));
  if (n.has_attr("mid_scale")) {
    a.has_mid = true;
    a.mid.scale = n.attr_float("mid_scale");
    a.mid.zero_point = static_cast<std::int32_t>(n.attr_int("mid_zero_point", 0));
    a.mid.type = parse_type(n, n.attr_string("mid_type", "uint8"));
  }
  if (n.has_attr("sum_scale")) {
    a.has_sum = true;
    a.sum.scale = n.attr_float("sum_scale");
    a.sum.zero_point = static_cast<std::int32_t>(n.attr_int("sum_zero_point", 0));
  }
  a.activations = fused::read_activations(n);
  for (float s : a.w_scale)
    if (!(s > 0)) throw n.error("w_scale must be positive");
  if (!(a.x.scale > 0) || (a.output_type != DType::Float32 && !(a.y.scale > 0)))
    throw n.error("x_scale and y_scale must be positive");
  return a;
}

inline void write_param(Node& n, const std::string& prefix, const QParam& p, bool with_type) {
  n.set_attr(prefix + "_scale", p.scale);
  n.set_attr(prefix + "_zero_point", static_cast<std::int64_t>(p.zero_point));
  if (with_type) n.set_attr(prefix + "_type", std::string(type_str(p.type)));
}

}  // namespace ondine::qops

namespace ondine::infer {
namespace detail_quantized {

inline void require_int8(const Node& n, const Value& v, const char* what) {
  if (v.dtype() != DType::Undefined && v.dtype() != DType::UInt8 && v.dtype() != DType::Int8)
    throw n.error(std::string(what) + " '" + v.name() + "' must be uint8 or int8, not " + std::string(dtype_name(v.dtype())));
}

inline void infer_qconv(Node& n) {
  qops::QAttrs a = qops::read_attrs(n);
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 1);
  require_int8(n, x, "X");
  if (w.dtype() != DType::Undefined && w.dtype() != DType::Int8) throw n.error("W must be int8");
  if (!x.shape().rank_known() || !w.shape().rank_known()) return set_output(n, 0, a.output_type, Shape::unknown());
  const Shape &xs = x.shape(), &ws = w.shape();
  if (xs.rank() < 3 || ws.rank() != xs.rank()) throw n.error("X and W must have one rank >= 3");
  std::size_t spatial = xs.rank() - 2;
  std::vector<std::int64_t> kernel(spatial, -1);
  for (std::size_t i = 0; i < spatial; ++i)
    if (ws[i + 2].is_static()) kernel[i] = ws[i + 2].value;
    else return set_output(n, 0, a.output_type, Shape::unknown());
  std::vector<Dim> out{xs[0], ws[0]};
  detail_nn::Window win = detail_nn::read_window(n, kernel);
  for (std::size_t i = 0; i < spatial; ++i) out.push_back(detail_nn::window_output_dim(n, win, i, xs[i + 2]));
  if (ws[0].is_static() && a.w_scale.size() != 1 && static_cast<std::int64_t>(a.w_scale.size()) != ws[0].value)
    throw n.error("w_scale has " + std::to_string(a.w_scale.size()) + " entries for " + std::to_string(ws[0].value) +
                  " output channels");
  detail_nn::check_vector(n, n.input(2), ws[0], "bias");
  if (const Value* s = n.input(3)) require_int8(n, *s, "Sum");
  set_output(n, 0, a.output_type, Shape(out));
}

inline void infer_qmatmul(Node& n) {
  qops::QAttrs a = qops::read_attrs(n);
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 1);
  require_int8(n, x, "A");
  if (w.dtype() != DType::Undefined && w.dtype() != DType::Int8) throw n.error("W must be int8");
  if (!x.shape().rank_known() || !w.shape().rank_known()) return set_output(n, 0, a.output_type, Shape::unknown());
  if (x.shape().rank() < 2 || w.shape().rank() != 2) throw n.error("A must have rank >= 2 and W rank 2");
  std::vector<Dim> out = x.shape().dims();
  detail_nn::unify(n, out.back(), w.shape()[0], "inner dimensions of A and W differ");
  out.back() = w.shape()[1];
  detail_nn::check_vector(n, n.input(2), w.shape()[1], "bias");
  set_output(n, 0, a.output_type, Shape(out));
}

// The operands DynQMatMul and DynQConv share; returns w_scale.
inline std::vector<float> check_dynamic_operands(Node& n) {
  fused::read_activations(n);  // checks the chain
  std::vector<float> w_scale = n.attr_floats("w_scale", {1.0f});
  for (float s : w_scale)
    if (!(s > 0)) throw n.error("w_scale must be positive");
  Value& x = required_input(n, 0);
  Value& x_scale = required_input(n, 1);
  Value& x_zero = required_input(n, 2);
  Value& w = required_input(n, 3);
  if (x.dtype() != DType::Undefined && x.dtype() != DType::UInt8) throw n.error("A must be uint8");
  if (x_scale.dtype() != DType::Undefined && x_scale.dtype() != DType::Float32) throw n.error("A_scale must be float32");
  if (x_zero.dtype() != DType::Undefined && x_zero.dtype() != DType::UInt8) throw n.error("A_zero_point must be uint8");
  if (w.dtype() != DType::Undefined && w.dtype() != DType::Int8 && w.dtype() != DType::Int16)
    throw n.error("W must be int8 or int16");
  for (const Value* v : {&x_scale, &x_zero})
    if (v->shape().rank_known() && v->shape().numel().value_or(1) != 1)
      throw n.error("'" + v->name() + "' must hold one value, not " + v->shape().str());
  return w_scale;
}

inline void infer_dyn_qconv(Node& n) {
  std::vector<float> w_scale = check_dynamic_operands(n);
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 3);
  if (!x.shape().rank_known() || !w.shape().rank_known()) return set_output(n, 0, DType::Float32, Shape::unknown());
  const Shape &xs = x.shape(), &ws = w.shape();
  if (xs.rank() < 3 || ws.rank() != xs.rank()) throw n.error("A and W must have one rank >= 3");
  std::size_t spatial = xs.rank() - 2;
  std::vector<std::int64_t> kernel(spatial, -1);
  for (std::size_t i = 0; i < spatial; ++i)
    if (ws[i + 2].is_static()) kernel[i] = ws[i + 2].value;
    else return set_output(n, 0, DType::Float32, Shape::unknown());
  std::int64_t group = n.attr_int("group", 1);
  if (group <= 0) throw n.error("group must be positive");
  if (xs[1].is_static() && ws[1].is_static() && xs[1].value != ws[1].value * group)
    throw n.error("A has " + std::to_string(xs[1].value) + " channels; W wants " + std::to_string(ws[1].value) + " x group " +
                  std::to_string(group));
  std::vector<Dim> out{xs[0], ws[0]};
  detail_nn::Window win = detail_nn::read_window(n, kernel);
  for (std::size_t i = 0; i < spatial; ++i) out.push_back(detail_nn::window_output_dim(n, win, i, xs[i + 2]));
  if (ws[0].is_static() && w_scale.size() != 1 && static_cast<std::int64_t>(w_scale.size()) != ws[0].value)
    throw n.error("w_scale has " + std::to_string(w_scale.size()) + " entries for " + std::to_string(ws[0].value) +
                  " output channels");
  detail_nn::check_vector(n, n.input(4), ws[0], "bias");
  set_output(n, 0, DType::Float32, Shape(out));
}

inline void infer_dyn_qmatmul(Node& n) {
  std::vector<float> w_scale = check_dynamic_operands(n);
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 3);
  if (!x.shape().rank_known() || !w.shape().rank_known()) return set_output(n, 0, DType::Float32, Shape::unknown());
  if (x.shape().rank() < 2 || w.shape().rank() != 2) throw n.error("A must have rank >= 2 and W rank 2");
  std::vector<Dim> out = x.shape().dims();
  detail_nn::unify(n, out.back(), w.shape()[0], "inner dimensions of A and W differ");
  out.back() = w.shape()[1];
  if (w.shape()[1].is_static() && w_scale.size() != 1 && static_cast<std::int64_t>(w_scale.size()) != w.shape()[1].value)
    throw n.error("w_scale has " + std::to_string(w_scale.size()) + " entries for " + std::to_string(w.shape()[1].value) +
                  " output columns");
  detail_nn::check_vector(n, n.input(4), w.shape()[1], "bias");
  set_output(n, 0, DType::Float32, Shape(out));
}

inline void infer_weight_only_matmul(Node& n) {
  Value& a = required_input(n, 0);
  Value& q = required_input(n, 1);
  Value& s = required_input(n, 2);
  Value* z = n.input(3);
  const std::int64_t block = n.attr_int("block_size", 0);
  if (block <= 0) throw n.error("block_size must be positive");
  if (a.dtype() != DType::Undefined && a.dtype() != DType::Float32) throw n.error("A must be float32");
  const DType qt = q.dtype();
  if (qt != DType::Undefined && qt != DType::Int4 && qt != DType::UInt4 && qt != DType::Int8 && qt != DType::UInt8)
    throw n.error("Q must be int4, uint4, int8 or uint8, not " + std::string(dtype_name(qt)));
  if (s.dtype() != DType::Undefined && s.dtype() != DType::Float32) throw n.error("S must be float32");
  if (z && z->dtype() != DType::Undefined && z->dtype() != qt) throw n.error("Z must have Q's element type");
  if (!a.shape().rank_known() || !q.shape().rank_known()) return set_output(n, 0, DType::Float32, Shape::unknown());
  if (a.shape().rank() < 1 || q.shape().rank() != 2) throw n.error("A must have rank >= 1 and Q rank 2");
  if (q.shape()[0].is_static() && q.shape()[1].is_static() && s.shape().rank_known()) {
    const std::int64_t K = q.shape()[0].value, N = q.shape()[1].value;
    if (s.shape() != Shape({Dim((K + block - 1) / block), Dim(N)}))
      throw n.error("S has shape " + s.shape().str() + "; Q " + q.shape().str() + " with block_size " +
                    std::to_string(block) + " wants [" + std::to_string((K + block - 1) / block) + "," + std::to_string(N) + "]");
    if (z && z->shape().rank_known() && z->shape() != s.shape()) throw n.error("Z must have S's shape");
  }
  std::vector<Dim> out = a.shape().dims();
  detail_nn::unify(n, out.back(), q.shape()[0], "inner dimensions of A and Q differ");
  out.back() = q.shape()[1];
  set_output(n, 0, DType::Float32, Shape(out));
}

inline void infer_qpool(Node& n) {
  qops::QAttrs a = qops::read_attrs(n);
  Value& x = required_input(n, 0);
  require_int8(n, x, "X");
  std::string op = n.attr_string("pool_op");
  if (!x.shape().rank_known()) return set_output(n, 0, a.output_type, Shape::unknown());
  const Shape& xs = x.shape();
  if (xs.rank() < 3) throw n.error("X must have rank >= 3");
  std::vector<Dim> out{xs[0], xs[1]};
  std::size_t spatial = xs.rank() - 2;
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    out.resize(xs.rank(), Dim(1));
  } else if (op == "MaxPool" || op == "AveragePool") {
    detail_nn::Window win = detail_nn::read_window(n, detail_nn::pool_kernel(n, spatial));
    for (std::size_t i = 0; i < spatial; ++i) out.push_back(detail_nn::window_output_dim(n, win, i, xs[i + 2]));
  } else {
    throw n.error("pool_op must be MaxPool, AveragePool, GlobalAveragePool or GlobalMaxPool, not '" + op + "'");
  }
  set_output(n, 0, a.output_type, Shape(out));
}

}  // namespace detail_quantized

inline void register_quantized_infer(InferTable& table) {
  using namespace detail_quantized;
  const std::string d = std::string(fused::kDomain) + ".";
  table[d + "QConv"] = infer_qconv;
  table[d + "QMatMul"] = infer_qmatmul;
  table[d + "QPool"] = infer_qpool;
  table[d + "DynQMatMul"] = infer_dyn_qmatmul;
  table[d + "DynQConv"] = infer_dyn_qconv;
  table[d + "WeightOnlyMatMul"] = infer_weight_only_matmul;
}

}  // namespace ondine::infer
