// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/random.hpp - shape and type inference for the random ops: RandomUniform,
// RandomNormal (shape from the `shape` attribute), RandomUniformLike, RandomNormalLike, Bernoulli (the
// input's shape) and Multinomial ([batch, sample_size]).
//
// The output type is the `dtype` attribute: a floating type for the distributions (float32 without
// the attribute for RandomUniform / RandomNormal, the input's type for the *Like ops and Bernoulli),
// int32 (the default) or int64 for Multinomial's class indices; Bernoulli may also give integers or bool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/math.hpp"

namespace ondine::infer {
namespace detail_random {

// The output type: the `dtype` attribute when present, else `fallback`; checked against what the op
// can produce.
inline DType random_dtype(const Node& n, DType fallback) {
  const DType t = n.has_attr("dtype") ? detail_math::dtype_from_onnx_code(n, n.attr_int("dtype")) : fallback;
  if (t == DType::Undefined) return t;
  const std::string& op = n.op_type();
  const bool ok = op == "Multinomial" ? (t == DType::Int32 || t == DType::Int64)
                  : op == "Bernoulli" ? (is_floating(t) || is_integer(t) || t == DType::Bool)
                                      : is_floating(t);
  if (!ok) throw n.error("dtype " + std::string(dtype_name(t)) + " is not one " + op + " can produce");
  return t;
}

inline void infer_random(Node& n) {
  std::vector<Dim> dims;
  for (std::int64_t d : n.attr_ints("shape")) {
    if (d < 0) throw n.error("shape " + dims_str(n.attr_ints("shape")) + " has a negative dim");
    dims.emplace_back(d);
  }
  set_output(n, 0, random_dtype(n, DType::Float32), Shape(dims));
}

inline void infer_random_like(Node& n) {
  const Value& x = required_input(n, 0);
  if (n.op_type() == "Bernoulli") detail_math::check_input_type(n, 0, x.dtype(), detail_math::kFloatTypes);
  set_output(n, 0, random_dtype(n, x.dtype()), x.shape());
}

inline void infer_multinomial(Node& n) {
  const Value& x = required_input(n, 0);
  detail_math::check_input_type(n, 0, x.dtype(), detail_math::kFloatTypes);
  const std::int64_t samples = n.attr_int("sample_size", 1);
  if (samples <= 0) throw n.error("sample_size must be positive, got " + std::to_string(samples));
  const Shape& xs = x.shape();
  if (xs.rank_known() && xs.rank() != 2) throw n.error("input must be [batch_size, class_size], got " + xs.str());
  set_output(n, 0, random_dtype(n, DType::Int32), Shape{xs.rank_known() ? xs[0] : Dim(), samples});
}

}  // namespace detail_random

inline void register_random_infer(InferTable& t) {
  t["RandomUniform"] = detail_random::infer_random;
  t["RandomNormal"] = detail_random::infer_random;
  t["RandomUniformLike"] = detail_random::infer_random_like;
  t["RandomNormalLike"] = detail_random::infer_random_like;
  t["Bernoulli"] = detail_random::infer_random_like;
  t["Multinomial"] = detail_random::infer_multinomial;
}

}  // namespace ondine::infer
