// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/qoperator.hpp - shape and type inference for the QOperator ops and dynamic quantization:
// QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and DynamicQuantizeLinear.
//
// The checks a quantized model can fail at compile time live here once and the reference kernels
// (ondine/reference/qoperator.hpp) reuse them: 8-bit data, each zero point of its tensor's type,
// float32 scales that are positive and finite when known, per-tensor or per-channel parameter shapes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/nn.hpp"

namespace ondine::infer {
namespace detail_qop {

namespace nn = detail_nn;

inline bool is_q8(DType t) { return t == DType::Int8 || t == DType::UInt8; }

// `role` ("x", "w_zero_point") names the input in messages; an unknown type passes.
inline void require_q8(const Node& n, const Value& v, const std::string& role) {
  if (v.dtype() != DType::Undefined && !is_q8(v.dtype()))
    throw n.error(role + " '" + v.name() + "' has element type " + std::string(dtype_name(v.dtype())) + "; " +
                  n.op_type() + " takes uint8 or int8");
}

// A zero point must be 8-bit and of its tensor's type (ONNX: "each input and its zero point have the same type").
inline void require_zero_point(const Node& n, const Value* zp, const Value& data, const std::string& role) {
  if (!zp) return;
  require_q8(n, *zp, role);
  if (zp->dtype() != DType::Undefined && data.dtype() != DType::Undefined && zp->dtype() != data.dtype())
    throw n.error(role + " '" + zp->name() + "' has element type " + std::string(dtype_name(zp->dtype())) + " but '" +
                  data.name() + "' is " + std::string(dtype_name(data.dtype())) + "; they must match");
}

// Positive and finite, the only scales that define a quantization (0 would divide by zero).
inline void check_scale_values(const Node& n, const Tensor& s, const std::string& role, const std::string& name) {
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    double v = s.at_double(static_cast<std::size_t>(i));
    if (!(v > 0.0) || !std::isfinite(v))
      throw n.error(role + " '" + name + "' holds " + std::to_string(v) +
                    (s.numel() > 1 ? " at index " + std::to_string(i) : std::string()) +
                    ": a scale must be positive and finite");
  }
}

inline void require_scale(const Node& n, const Value& s, const std::string& role) {
  if (s.dtype() != DType::Undefined && s.dtype() != DType::Float32)
    throw n.error(role + " '" + s.name() + "' has element type " + std::string(dtype_name(s.dtype())) +
                  "; scales are float32");
  if (s.is_constant()) check_scale_values(n, s.constant(), role, s.name());
}

// A per-tensor parameter: exactly one element (any rank: exporters write [] and [1]).
inline void require_one_element(const Node& n, const Value* v, const std::string& role) {
  if (!v) return;
  auto numel = v->shape().numel();
  if (numel && *numel != 1)
    throw n.error(role + " '" + v->name() + "' has shape " + v->shape().str() + "; it must hold one element (per tensor)");
}

// One element, or a 1-D vector of `count` (per output channel).
inline void require_per_channel(const Node& n, const Value* v, const Dim& count, const std::string& role) {
  if (!v || !v->shape().rank_known()) return;
  auto numel = v->shape().numel();
  if (numel && *numel == 1) return;
  if (v->shape().rank() != 1)
    throw n.error(role + " '" + v->name() + "' has shape " + v->shape().str() +
                  "; it must hold one element (per tensor) or one per output channel");
  nn::unify(n, v->shape()[0], count, role + " '" + v->name() + "' must have one element per output channel");
}

// The output shape of a convolution of x by w (bias checked when given); unknown when x's rank is.
inline Shape conv_shape(const Node& n, const Value& x, const Value& w, const Value* bias) {
  std::int64_t rank = nn::rank_of(&x) >= 0 ? nn::rank_of(&x) : nn::rank_of(&w);
  if (rank < 0) return Shape::unknown();
  if (rank < 3) throw n.error("input '" + x.name() + "' has rank " + std::to_string(rank) + ", expected >= 3 (N, C, spatial...)");
  nn::require_rank(n, x, static_cast<std::size_t>(rank));
  nn::require_rank(n, w, static_cast<std::size_t>(rank));
  std::size_t spatial = static_cast<std::size_t>(rank) - 2;
  std::int64_t group = n.attr_int("group", 1);
  if (group <= 0) throw n.error("group " + std::to_string(group) + " must be positive");
  auto dims_of = [&](const Value& v) {
    return v.shape().rank_known() ? v.shape() : Shape(std::vector<Dim>(static_cast<std::size_t>(rank)));
  };
  Shape xs = dims_of(x), ws = dims_of(w);
  if (xs[1].is_static() && ws[1].is_static() && xs[1].value != ws[1].value * group)
    throw n.error("input '" + x.name() + "' has " + std::to_string(xs[1].value) + " channels but weight '" + w.name() +
                  "' expects " + std::to_string(ws[1].value) + " x group " + std::to_string(group));
  if (ws[0].is_static() && ws[0].value % group != 0)
    throw n.error("weight '" + w.name() + "' has " + std::to_string(ws[0].value) +
                  " output channels, not a multiple of group " + std::to_string(group));
  nn::check_vector(n, bias, ws[0], "bias");
  std::vector<std::int64_t> kernel(spatial, -1);
  if (n.has_attr("kernel_shape")) kernel = nn::pool_kernel(n, spatial);
  for (std::size_t i = 0; i < spatial; ++i) {
    const Dim& d = ws[i + 2];
    if (d.is_static() && kernel[i] >= 0 && d.value != kernel[i])
      throw n.error("kernel_shape " + nn::ints_str(kernel) + " does not match weight shape " + ws.str());
    if (d.is_static()) kernel[i] = d.value;
  }
  std::vector<Dim> out{xs[0], ws[0]};
  if (std::all_of(kernel.begin(), kernel.end(), [](std::int64_t k) { return k >= 0; })) {
    nn::Window win = nn::read_window(n, kernel);
    for (std::size_t i = 0; i < spatial; ++i) out.push_back(nn::window_output_dim(n, win, i, xs[i + 2]));
  } else {
    out.resize(spatial + 2);
  }
  return Shape(out);
}

// numpy.matmul's output shape.
inline Shape matmul_shape(const Node& n, const Value& a, const Value& b) {
  if (!a.shape().rank_known() || !b.shape().rank_known()) return Shape::unknown();
  Shape as = a.shape(), bs = b.shape();
  if (as.rank() == 0 || bs.rank() == 0)
    throw n.error("matrix operands must have rank >= 1, got " + as.str() + " and " + bs.str());
  bool a_vec = as.rank() == 1, b_vec = bs.rank() == 1;
  if (a_vec) as.dims().insert(as.dims().begin(), Dim(1));
  if (b_vec) bs.dims().push_back(Dim(1));
  nn::unify(n, as[as.rank() - 1], bs[bs.rank() - 2],
            "inner dimensions of " + a.shape().str() + " x " + b.shape().str() + " differ");
  Shape out = broadcast(n, Shape(std::vector<Dim>(as.dims().begin(), as.dims().end() - 2)),
                        Shape(std::vector<Dim>(bs.dims().begin(), bs.dims().end() - 2)));
  if (!a_vec) out.dims().push_back(as[as.rank() - 2]);
  if (!b_vec) out.dims().push_back(bs[bs.rank() - 1]);
  return out;
}

// QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B?)
inline void infer_qlinear_conv(Node& n) {
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 3);
  Value& y_zp = required_input(n, 7);
  require_q8(n, x, "x");
  require_q8(n, w, "w");
  require_zero_point(n, &required_input(n, 2), x, "x_zero_point");
  require_zero_point(n, &required_input(n, 5), w, "w_zero_point");
  require_q8(n, y_zp, "y_zero_point");
  require_scale(n, required_input(n, 1), "x_scale");
  require_scale(n, required_input(n, 4), "w_scale");
  require_scale(n, required_input(n, 6), "y_scale");
  require_one_element(n, n.input(1), "x_scale");
  require_one_element(n, n.input(2), "x_zero_point");
  require_one_element(n, n.input(6), "y_scale");
  require_one_element(n, n.input(7), "y_zero_point");
  Dim m = w.shape().rank_known() && w.shape().rank() > 0 ? w.shape()[0] : Dim();
  require_per_channel(n, n.input(4), m, "w_scale");
  require_per_channel(n, n.input(5), m, "w_zero_point");
  if (Value* b = n.input(8); b && b->dtype() != DType::Undefined && b->dtype() != DType::Int32)
    throw n.error("bias '" + b->name() + "' has element type " + std::string(dtype_name(b->dtype())) + "; int32 expected");
  set_output(n, 0, y_zp.dtype(), conv_shape(n, x, w, n.input(8)));
}

// ConvInteger(x, w, x_zero_point?, w_zero_point?) -> int32
inline void infer_conv_integer(Node& n) {
  Value& x = required_input(n, 0);
  Value& w = required_input(n, 1);
  require_q8(n, x, "x");
  require_q8(n, w, "w");
  require_zero_point(n, n.input(2), x, "x_zero_point");
  require_zero_point(n, n.input(3), w, "w_zero_point");
  require_one_element(n, n.input(2), "x_zero_point");
  Dim m = w.shape().rank_known() && w.shape().rank() > 0 ? w.shape()[0] : Dim();
  require_per_channel(n, n.input(3), m, "w_zero_point");
  set_output(n, 0, DType::Int32, conv_shape(n, x, w, nullptr));
}

// QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
inline void infer_qlinear_matmul(Node& n) {
  Value& a = required_input(n, 0);
  Value& b = required_input(n, 3);
  Value& y_zp = required_input(n, 7);
  require_q8(n, a, "a");
  require_q8(n, b, "b");
  require_zero_point(n, &required_input(n, 2), a, "a_zero_point");
  require_zero_point(n, &required_input(n, 5), b, "b_zero_point");
  require_q8(n, y_zp, "y_zero_point");
  require_scale(n, required_input(n, 1), "a_scale");
  require_scale(n, required_input(n, 4), "b_scale");
  require_scale(n, required_input(n, 6), "y_scale");
  require_one_element(n, n.input(6), "y_scale");
  require_one_element(n, n.input(7), "y_zero_point");
  set_output(n, 0, y_zp.dtype(), matmul_shape(n, a, b));
}

// MatMulInteger(A, B, a_zero_point?, b_zero_point?) -> int32
inline void infer_matmul_integer(Node& n) {
  Value& a = required_input(n, 0);
  Value& b = required_input(n, 1);
  require_q8(n, a, "A");
  require_q8(n, b, "B");
  require_zero_point(n, n.input(2), a, "a_zero_point");
  require_zero_point(n, n.input(3), b, "b_zero_point");
  set_output(n, 0, DType::Int32, matmul_shape(n, a, b));
}

// DynamicQuantizeLinear(x: float32) -> (y: uint8, y_scale: float32 scalar, y_zero_point: uint8 scalar)
inline void infer_dynamic_quantize(Node& n) {
  Value& x = required_input(n, 0);
  if (x.dtype() != DType::Undefined && x.dtype() != DType::Float32)
    throw n.error("x '" + x.name() + "' has element type " + std::string(dtype_name(x.dtype())) +
                  "; DynamicQuantizeLinear takes float32");
  set_output(n, 0, DType::UInt8, x.shape());
  set_output(n, 1, DType::Float32, Shape());
  set_output(n, 2, DType::UInt8, Shape());
}

}  // namespace detail_qop

inline void register_qoperator_infer(InferTable& table) {
  using namespace detail_qop;
  table["QLinearConv"] = infer_qlinear_conv;
  table["ConvInteger"] = infer_conv_integer;
  table["QLinearMatMul"] = infer_qlinear_matmul;
  table["MatMulInteger"] = infer_matmul_integer;
  table["DynamicQuantizeLinear"] = infer_dynamic_quantize;
}

}  // namespace ondine::infer
