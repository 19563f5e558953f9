// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/math.hpp - shape and type inference for the math ops: elementwise arithmetic,
// activations, comparisons and logic, Cast and CastLike, reductions, ArgMax/ArgMin, Det and
// (de)quantization.
//
// The type constraints live here (detail_math::op_types) so that the reference kernels check exactly
// the same sets of element types as inference does.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "ondine/ir/infer/common.hpp"

namespace ondine::infer {
namespace detail_math {

// Element-type sets of the ONNX type constraints, as bit masks.
enum TypeSet : unsigned {
  kFloatTypes = 1u,
  kSignedIntTypes = 2u,
  kUnsignedIntTypes = 4u,
  kBoolType = 8u,
  kInt4Types = 16u,  // int4 / uint4: quantization, casts and data movement only
  kIntTypes = kSignedIntTypes | kUnsignedIntTypes,
  kSignedNumericTypes = kFloatTypes | kSignedIntTypes,
  kNumericTypes = kFloatTypes | kIntTypes,
  kAllTypes = kNumericTypes | kBoolType,
};

inline unsigned type_class(DType t) {
  if (is_floating(t)) return kFloatTypes;
  switch (t) {
    case DType::Int8: case DType::Int16: case DType::Int32: case DType::Int64: return kSignedIntTypes;
    case DType::UInt8: case DType::UInt16: case DType::UInt32: case DType::UInt64: return kUnsignedIntTypes;
    case DType::Bool: return kBoolType;
    case DType::Int4: case DType::UInt4: return kInt4Types;
    default: return 0;
  }
}
inline bool in_type_set(DType t, unsigned set) { return (type_class(t) & set) != 0; }

inline std::string type_set_str(unsigned set) {
  if (set == kAllTypes) return "numeric or bool";
  if (set == kNumericTypes) return "numeric";
  std::string s;
  auto add = [&](unsigned bit, const char* name) {
    if (set & bit) s += (s.empty() ? "" : " or ") + std::string(name);
  };
  add(kFloatTypes, "floating-point");
  add(kSignedIntTypes, "signed integer");
  add(kUnsignedIntTypes, "unsigned integer");
  add(kBoolType, "bool");
  add(kInt4Types, "4-bit integer");
  return s;
}

// Throws naming the node when input #i's element type is outside `set`. An unknown type passes.
inline void check_input_type(const Node& n, std::size_t i, DType t, unsigned set) {
  if (t == DType::Undefined || in_type_set(t, set)) return;
  throw n.error("input #" + std::to_string(i) + " has element type " + std::string(dtype_name(t)) + "; " +
                n.op_type() + " takes " + type_set_str(set) + " tensors");
}

// Throws naming the node when two inputs that must share a type (ONNX's `T`) do not.
inline void check_same_type(const Node& n, std::size_t i, DType a, std::size_t j, DType b) {
  if (a == DType::Undefined || b == DType::Undefined || a == b) return;
  throw n.error("inputs #" + std::to_string(i) + " and #" + std::to_string(j) + " have different element types (" +
                std::string(dtype_name(a)) + " and " + std::string(dtype_name(b)) + "); " + n.op_type() +
                " needs them equal");
}

// The element types each op accepts for its main input(s) (ONNX's `T`, at the newest opset <= 17,
// a little wider where the computation is well defined for more types).
inline unsigned op_types(const std::string& op) {
  static const std::set<std::string> float_only = {
      "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Sqrt", "Exp", "Log", "Reciprocal", "Floor",
      "Ceil", "Round", "Elu", "Selu", "Softplus", "Softsign", "ThresholdedRelu", "Celu", "LeakyRelu",
      "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN", "IsInf",
      "Mean"};
  if (float_only.count(op)) return kFloatTypes;
  if (op == "Relu" || op == "Neg") return kSignedNumericTypes;
  if (op == "Equal" || op == "Where" || op == "Cast") return kAllTypes;
  if (op == "Not" || op == "And" || op == "Or" || op == "Xor") return kBoolType;
  if (op == "BitShift") return kUnsignedIntTypes;
  return kNumericTypes;
}

// ONNX TensorProto.DataType codes (Cast's `to`) to DType; String and unknown codes are errors here.
inline DType dtype_from_onnx_code(const Node& n, std::int64_t code) {
  switch (code) {
    case 1: return DType::Float32;
    case 2: return DType::UInt8;
    case 3: return DType::Int8;
    case 4: return DType::UInt16;
    case 5: return DType::Int16;
    case 6: return DType::Int32;
    case 7: return DType::Int64;
    case 9: return DType::Bool;
    case 10: return DType::Float16;
    case 11: return DType::Float64;
    case 12: return DType::UInt32;
    case 13: return DType::UInt64;
    case 16: return DType::BFloat16;
    case 8: throw n.error("casting to string is not supported");
    case 21: case 22: throw n.error(std::string("unsupported target element type ") + (code == 21 ? "UINT4" : "INT4") +
                                     ": 4-bit tensors come only from QuantizeLinear");
    default: break;
  }
  if (auto name = onnx_unsupported_type_name(code); !name.empty())
    throw n.error("unsupported target element type " + std::string(name) + " (code " + std::to_string(code) +
                  "): Ondine has no " + std::string(name) + " tensors");
  throw n.error("unsupported target element type code " + std::to_string(code));
}

// Cast's target type: the `to` attribute, an int code (opset >= 6) or a type name (opset 1).
inline DType cast_target(const Node& n) {
  auto it = n.attrs().find("to");
  if (it == n.attrs().end()) throw n.error("missing required attribute 'to'");
  if (auto* s = std::get_if<std::string>(&it->second)) {
    static const std::map<std::string, std::int64_t> codes = {
        {"FLOAT", 1}, {"UINT8", 2}, {"INT8", 3}, {"UINT16", 4}, {"INT16", 5}, {"INT32", 6}, {"INT64", 7},
        {"STRING", 8}, {"BOOL", 9}, {"FLOAT16", 10}, {"DOUBLE", 11}, {"UINT32", 12}, {"UINT64", 13},
        {"BFLOAT16", 16}};
    auto c = codes.find(*s);
    if (c == codes.end()) throw n.error("unsupported target element type '" + *s + "'");
    return c->second == 8 ? DType::String : dtype_from_onnx_code(n, c->second);
  }
  const std::int64_t code = n.attr_int("to");
  return code == 8 ? DType::String : dtype_from_onnx_code(n, code);  // Cast is the one op that makes strings
}

// Before opset 7 the binary ops broadcast only with broadcast=1, aligning B at `axis` of A. With an
// axis, B's shape gets trailing 1s so that numpy broadcasting gives the legacy result.
inline bool has_legacy_axis(const Node& n) {
  return n.opset() > 0 && n.opset() < 7 && n.attr_int("broadcast", 0) != 0 && n.has_attr("axis");
}
inline std::size_t legacy_trailing_ones(const Node& n, std::size_t rank_a, std::size_t rank_b) {
  auto ra = static_cast<std::int64_t>(rank_a);
  std::int64_t axis = n.attr_int("axis");
  if (axis < 0) axis += ra;
  if (axis < 0 || axis + static_cast<std::int64_t>(rank_b) > ra)
    throw n.error("broadcast axis " + std::to_string(n.attr_int("axis")) + " does not fit a rank-" +
                  std::to_string(rank_b) + " B into a rank-" + std::to_string(rank_a) + " A");
  return static_cast<std::size_t>(ra - axis) - rank_b;
}
inline Shape legacy_broadcast_b(const Node& n, const Shape& a, Shape b) {
  if (!has_legacy_axis(n) || !a.rank_known() || !b.rank_known()) return b;
  std::size_t ones = legacy_trailing_ones(n, a.rank(), b.rank());
  for (std::size_t i = 0; i < ones; ++i) b.dims().push_back(Dim(1));
  return b;
}

// Before opset 7, PRelu's slope of size C applies per channel (axis 1); express it as [C,1,...,1].
inline bool prelu_legacy_channels(const Node& n, std::size_t x_rank, std::size_t slope_rank) {
  return n.opset() > 0 && n.opset() < 7 && slope_rank == 1 && x_rank >= 2;
}

// Shape/type rules ------------------------------------------------------------------------------

inline void infer_unary(Node& n, DType out_type = DType::Undefined) {
  Value& x = required_input(n, 0);
  check_input_type(n, 0, x.dtype(), op_types(n.op_type()));
  set_output(n, 0, out_type == DType::Undefined ? x.dtype() : out_type, x.shape());
}

// Two inputs of one type T, numpy broadcast; the output is T, or bool for comparisons and logic.
inline void infer_binary(Node& n, bool bool_output) {
  Value& a = required_input(n, 0);
  Value& b = required_input(n, 1);
  unsigned types = op_types(n.op_type());
  check_input_type(n, 0, a.dtype(), types);
  check_input_type(n, 1, b.dtype(), types);
  check_same_type(n, 0, a.dtype(), 1, b.dtype());
  if (n.op_type() == "BitShift") {
    std::string dir = n.attr_string("direction");
    if (dir != "LEFT" && dir != "RIGHT") throw n.error("direction must be \"LEFT\" or \"RIGHT\", not \"" + dir + "\"");
  }
  if (n.op_type() == "Mod" && is_floating(a.dtype()) && n.attr_int("fmod", 0) == 0)
    throw n.error("fmod must be 1 for floating-point inputs");
  Shape out = broadcast(n, a.shape(), legacy_broadcast_b(n, a.shape(), b.shape()));
  set_output(n, 0, bool_output ? DType::Bool : a.dtype(), std::move(out));
}

// Pow: the base and the exponent have their own types (opset >= 12); the output has the base's.
inline void infer_pow(Node& n) {
  Value& a = required_input(n, 0);
  Value& b = required_input(n, 1);
  check_input_type(n, 0, a.dtype(), kNumericTypes);
  check_input_type(n, 1, b.dtype(), kNumericTypes);
  if (n.opset() > 0 && n.opset() < 12) check_same_type(n, 0, a.dtype(), 1, b.dtype());
  set_output(n, 0, a.dtype(), broadcast(n, a.shape(), legacy_broadcast_b(n, a.shape(), b.shape())));
}

// PRelu: the slope broadcasts to X (one way); the output has X's shape.
inline void infer_prelu(Node& n) {
  Value& x = required_input(n, 0);
  Value& slope = required_input(n, 1);
  check_input_type(n, 0, x.dtype(), kNumericTypes);
  check_same_type(n, 0, x.dtype(), 1, slope.dtype());
  Shape s = slope.shape();
  if (x.shape().rank_known() && s.rank_known() && prelu_legacy_channels(n, x.shape().rank(), s.rank()))
    for (std::size_t i = 2; i < x.shape().rank(); ++i) s.dims().push_back(Dim(1));
  Shape b = broadcast(n, x.shape(), s);
  if (b.rank_known() && x.shape().rank_known()) {
    bool ok = b.rank() == x.shape().rank();
    for (std::size_t i = 0; ok && i < b.rank(); ++i)
      ok = !(b[i].is_static() && x.shape()[i].is_static()) || b[i].value == x.shape()[i].value;
    if (!ok) throw n.error("slope of shape " + slope.shape().str() + " does not broadcast to X of shape " + x.shape().str());
  }
  set_output(n, 0, x.dtype(), x.shape().rank_known() ? x.shape() : b);
}

// Min, Max, Sum, Mean: any number (>= 1) of inputs of one type, broadcast together.
inline void infer_variadic(Node& n) {
  if (n.num_inputs() == 0) throw n.error("needs at least one input");
  Value& first = required_input(n, 0);
  unsigned types = op_types(n.op_type());
  Shape out = first.shape();
  for (std::size_t i = 0; i < n.num_inputs(); ++i) {
    Value& v = required_input(n, i);
    check_input_type(n, i, v.dtype(), types);
    check_same_type(n, 0, first.dtype(), i, v.dtype());
    if (i > 0) out = broadcast(n, out, v.shape());
  }
  set_output(n, 0, first.dtype(), std::move(out));
}

inline void infer_where(Node& n) {
  Value& c = required_input(n, 0);
  Value& x = required_input(n, 1);
  Value& y = required_input(n, 2);
  check_input_type(n, 0, c.dtype(), kBoolType);
  check_same_type(n, 1, x.dtype(), 2, y.dtype());
  set_output(n, 0, x.dtype() != DType::Undefined ? x.dtype() : y.dtype(),
             broadcast(n, broadcast(n, c.shape(), x.shape()), y.shape()));
}

inline void infer_clip(Node& n) {
  Value& x = required_input(n, 0);
  check_input_type(n, 0, x.dtype(), kNumericTypes);
  for (std::size_t i = 1; i <= 2; ++i) {
    Value* bound = n.input(i);
    if (!bound) continue;
    check_same_type(n, 0, x.dtype(), i, bound->dtype());
    if (auto numel = bound->shape().numel(); numel && *numel != 1)
      throw n.error(std::string(i == 1 ? "min" : "max") + " must be a scalar, got shape " + bound->shape().str());
  }
  set_output(n, 0, x.dtype(), x.shape());
}

inline void infer_cast(Node& n) {
  Value& x = required_input(n, 0);
  set_output(n, 0, cast_target(n), x.shape());
}

// CastLike: input 0 converted to the element type of input 1 (whose values are not read).
inline void infer_cast_like(Node& n) {
  Value& x = required_input(n, 0);
  Value& like = required_input(n, 1);
  set_output(n, 0, like.dtype(), x.shape());
}

// Det: [*, M, M] -> [*].
inline void infer_det(Node& n) {
  Value& x = required_input(n, 0);
  check_input_type(n, 0, x.dtype(), kFloatTypes);
  const Shape& s = x.shape();
  if (!s.rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  const std::size_t r = s.rank();
  if (r < 2 || (s[r - 1].is_static() && s[r - 2].is_static() && s[r - 1].value != s[r - 2].value))
    throw n.error("input must be [*, M, M], got " + s.str());
  set_output(n, 0, x.dtype(), Shape(std::vector<Dim>(s.dims().begin(), s.dims().end() - 2)));
}

// The axes of a Reduce* node: the `axes` attribute before ReduceSum-13 / the others' opset 18, the
// optional second input after. `known` is false when that input is not a compile-time constant.
struct ReduceAxes {
  std::vector<std::int64_t> axes;
  bool known = true;
};
inline bool reduce_axes_are_input(const Node& n) {
  return n.op_type() == "ReduceSum" ? n.opset() >= 13 : n.opset() >= 18;
}
inline ReduceAxes reduce_axes(const Node& n) {
  ReduceAxes r;
  if (reduce_axes_are_input(n)) {
    if (n.input(1)) {
      if (const Tensor* c = constant_input(n, 1)) r.axes = c->to_int64s();
      else r.known = false;
    }
  } else {
    r.axes = n.attr_ints("axes", {});
  }
  return r;
}
// For each dim of a rank-`rank` input, whether it is reduced (empty axes: all of them).
inline std::vector<bool> reduced_dims_mask(const Node& n, const std::vector<std::int64_t>& axes, std::size_t rank) {
  std::vector<bool> mask(rank, axes.empty());
  for (std::int64_t a : axes) mask[static_cast<std::size_t>(normalize_axis(n, a, static_cast<std::int64_t>(rank)))] = true;
  return mask;
}

// ReduceMax and ReduceMin take bool from opset 20.
inline bool reduce_takes_bool(const Node& n) {
  return (n.op_type() == "ReduceMax" || n.op_type() == "ReduceMin") && (n.opset() == 0 || n.opset() >= 20);
}

inline void infer_reduce(Node& n) {
  Value& x = required_input(n, 0);
  check_input_type(n, 0, x.dtype(), reduce_takes_bool(n) ? kAllTypes : kNumericTypes);
  if (Value* axes = n.input(1); axes && reduce_axes_are_input(n))
    check_input_type(n, 1, axes->dtype(), kSignedIntTypes);
  bool keepdims = n.attr_int("keepdims", 1) != 0;
  bool noop = n.attr_int("noop_with_empty_axes", 0) != 0;
  ReduceAxes ra = reduce_axes(n);
  const Shape& in = x.shape();
  if (!ra.known) {  // which dims go is unknown; with keepdims the rank stays
    set_output(n, 0, x.dtype(), keepdims && in.rank_known() ? Shape(std::vector<Dim>(in.rank())) : Shape::unknown());
    return;
  }
  if (ra.axes.empty() && noop) {
    set_output(n, 0, x.dtype(), in);
    return;
  }
  if (!in.rank_known()) {
    set_output(n, 0, x.dtype(), Shape::unknown());
    return;
  }
  std::vector<bool> mask = reduced_dims_mask(n, ra.axes, in.rank());
  std::vector<Dim> out;
  for (std::size_t i = 0; i < in.rank(); ++i) {
    if (!mask[i]) out.push_back(in[i]);
    else if (keepdims) out.push_back(Dim(1));
  }
  set_output(n, 0, x.dtype(), Shape(std::move(out)));
}

inline void infer_arg_reduce(Node& n) {
  Value& x = required_input(n, 0);
  check_input_type(n, 0, x.dtype(), kNumericTypes);
  const Shape& in = x.shape();
  bool keepdims = n.attr_int("keepdims", 1) != 0;
  if (!in.rank_known()) {
    set_output(n, 0, DType::Int64, Shape::unknown());
    return;
  }
  auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", 0), static_cast<std::int64_t>(in.rank())));
  std::vector<Dim> out;
  for (std::size_t i = 0; i < in.rank(); ++i) {
    if (i != axis) out.push_back(in[i]);
    else if (keepdims) out.push_back(Dim(1));
  }
  set_output(n, 0, DType::Int64, Shape(std::move(out)));
}

// Checks the scale / zero-point shapes of QuantizeLinear and DequantizeLinear against X: per tensor
// (one element), from opset 13 per axis (1-D of X's size along `axis`), from opset 21 blocked
// (block_size B > 0: the scale has X's rank and shape except ceil(D / B) along `axis`).
inline void check_quant_params(const Node& n, const Shape& x, const Shape& scale, const Shape* zero_point) {
  if (zero_point && zero_point->rank_known() && scale.rank_known() && zero_point->numel() &&
      zero_point->numel() != scale.numel())
    throw n.error("zero point of shape " + zero_point->str() + " does not match scale of shape " + scale.str());
  const std::int64_t block = n.attr_int("block_size", 0);
  if (block < 0) throw n.error("block_size must be positive, got " + std::to_string(block));
  if (block > 0) {
    if (!scale.rank_known() || !x.rank_known()) return;
    if (scale.rank() != x.rank())
      throw n.error("blocked quantization (block_size " + std::to_string(block) + ") needs a scale of X's rank " +
                    std::to_string(x.rank()) + ", got shape " + scale.str());
    auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", 1), static_cast<std::int64_t>(x.rank())));
    for (std::size_t i = 0; i < x.rank(); ++i) {
      if (!x[i].is_static() || !scale[i].is_static()) continue;
      const std::int64_t want = i == axis ? (x[i].value + block - 1) / block : x[i].value;
      if (scale[i].value != want)
        throw n.error("blocked scale of shape " + scale.str() + " does not match X of shape " + x.str() + " with block_size " +
                      std::to_string(block) + " along axis " + std::to_string(axis) + " (axis " + std::to_string(i) +
                      " should be " + std::to_string(want) + ")");
    }
    return;
  }
  auto numel = scale.numel();
  if (!numel || *numel == 1) return;
  if (n.opset() > 0 && n.opset() < 13)
    throw n.error("y_scale/x_scale must be a scalar before opset 13, got shape " + scale.str());
  if (scale.rank() != 1) throw n.error("per-axis scale must be 1-D, got shape " + scale.str());
  if (x.rank_known()) {
    auto axis = static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis", 1), static_cast<std::int64_t>(x.rank())));
    if (x[axis].is_static() && x[axis].value != *numel)
      throw n.error("per-axis scale of shape " + scale.str() + " does not match X of shape " + x.str() + " along axis " +
                    std::to_string(axis));
  }
}

// QuantizeLinear's output type: the zero point's, else opset 21's output_dtype attribute, else uint8.
// 8-bit and 4-bit integers are computed (the 16-bit and float8 outputs of opsets 19-21 are refused by
// name; `saturate` only concerns float8 outputs, so it never applies).
inline DType quantize_output_type(const Node& n, DType zero_point) {
  const std::int64_t code = n.attr_int("output_dtype", 0);
  const DType want = code == 0    ? DType::Undefined
                     : code == 21 ? DType::UInt4
                     : code == 22 ? DType::Int4
                                  : dtype_from_onnx_code(n, code);
  auto quantized = [](DType t) { return t == DType::UInt8 || t == DType::Int8 || is_int4(t); };
  if (want != DType::Undefined && !quantized(want))
    throw n.error("output_dtype " + std::string(dtype_name(want)) + " is not supported; uint8, int8, uint4 or int4 expected");
  if (zero_point == DType::Undefined) return want != DType::Undefined ? want : DType::UInt8;
  if (!quantized(zero_point))
    throw n.error("zero point has element type " + std::string(dtype_name(zero_point)) +
                  "; uint8, int8, uint4 or int4 expected");
  if (want != DType::Undefined && want != zero_point)
    throw n.error("output_dtype " + std::string(dtype_name(want)) + " disagrees with the zero point's element type " +
                  std::string(dtype_name(zero_point)));
  return zero_point;
}

inline void infer_quantize(Node& n) {
  Value& x = required_input(n, 0);
  Value& scale = required_input(n, 1);
  Value* zp = n.input(2);
  if (x.dtype() != DType::Undefined && x.dtype() != DType::Int32) check_input_type(n, 0, x.dtype(), kFloatTypes);
  check_input_type(n, 1, scale.dtype(), kFloatTypes);
  const DType out = quantize_output_type(n, zp ? zp->dtype() : DType::Undefined);
  check_quant_params(n, x.shape(), scale.shape(), zp ? &zp->shape() : nullptr);
  set_output(n, 0, out, x.shape());
}

inline void infer_dequantize(Node& n) {
  Value& x = required_input(n, 0);
  Value& scale = required_input(n, 1);
  Value* zp = n.input(2);
  check_input_type(n, 0, x.dtype(), kIntTypes | kInt4Types);
  check_input_type(n, 1, scale.dtype(), kFloatTypes);
  if (zp) check_same_type(n, 0, x.dtype(), 2, zp->dtype());
  check_quant_params(n, x.shape(), scale.shape(), zp ? &zp->shape() : nullptr);
  set_output(n, 0, scale.dtype() != DType::Undefined ? scale.dtype() : DType::Float32, x.shape());
}

}  // namespace detail_math

inline void register_math_infer(InferTable& table) {
  using namespace detail_math;
  for (const char* op : {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Sqrt", "Neg",
                         "Exp", "Log", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Not", "Elu", "Selu",
                         "Softplus", "Softsign", "ThresholdedRelu", "Celu", "Sin", "Cos", "Tan", "Asin", "Acos",
                         "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Shrink"})
    table[op] = [](Node& n) { infer_unary(n); };
  for (const char* op : {"IsNaN", "IsInf"}) table[op] = [](Node& n) { infer_unary(n, DType::Bool); };
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Mod", "BitShift"})
    table[op] = [](Node& n) { infer_binary(n, false); };
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"})
    table[op] = [](Node& n) { infer_binary(n, true); };
  for (const char* op : {"Min", "Max", "Sum", "Mean"}) table[op] = infer_variadic;
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                         "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"})
    table[op] = infer_reduce;
  table["ArgMax"] = infer_arg_reduce;
  table["ArgMin"] = infer_arg_reduce;
  table["Pow"] = infer_pow;
  table["PRelu"] = infer_prelu;
  table["Where"] = infer_where;
  table["Clip"] = infer_clip;
  table["Cast"] = infer_cast;
  table["CastLike"] = infer_cast_like;
  table["Det"] = infer_det;
  table["QuantizeLinear"] = infer_quantize;
  table["DequantizeLinear"] = infer_dequantize;
}

}  // namespace ondine::infer
