// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/selection.hpp - shape and type inference for the ops whose output size is data:
// NonMaxSuppression (the selected boxes, [?, 3]), Unique (the distinct values or slices) and Compress
// (the slices a bool condition selects; their count is known when the condition is a constant).
#pragma once

#include <cstdint>
#include <optional>

#include "ondine/ir/infer/common.hpp"

namespace ondine {
namespace infer {
namespace detail_selection {

inline void infer_non_max_suppression(Node& n) {
  const Value& boxes = required_input(n, 0);
  const Value& scores = required_input(n, 1);
  if (boxes.dtype() != DType::Float32 && boxes.dtype() != DType::Undefined)
    throw n.error("boxes must be float32, got " + std::string(dtype_name(boxes.dtype())));
  if (boxes.shape().rank_known() && (boxes.shape().rank() != 3 || (boxes.shape()[2].is_static() && boxes.shape()[2].value != 4)))
    throw n.error("boxes must be [batches, boxes, 4], got " + boxes.shape().str());
  if (scores.shape().rank_known() && scores.shape().rank() != 3)
    throw n.error("scores must be [batches, classes, boxes], got " + scores.shape().str());
  std::int64_t center = n.attr_int("center_point_box", 0);
  if (center != 0 && center != 1) throw n.error("center_point_box must be 0 or 1, got " + std::to_string(center));
  set_output(n, 0, DType::Int64, Shape{Dim(), 3});
}

inline void infer_unique(Node& n) {
  const Value& x = required_input(n, 0);
  Shape y = Shape::unknown(), inverse = Shape{Dim()};
  if (x.shape().rank_known()) {
    if (n.has_attr("axis")) {
      auto axis = static_cast<std::size_t>(
          normalize_axis(n, n.attr_int("axis"), static_cast<std::int64_t>(x.shape().rank())));
      std::vector<Dim> d = x.shape().dims();
      inverse = Shape{d[axis]};
      d[axis] = Dim();
      y = Shape(d);
    } else {
      y = Shape{Dim()};
      if (auto numel = x.shape().numel()) inverse = Shape{*numel};
    }
  }
  set_output(n, 0, x.dtype(), y);
  set_output(n, 1, DType::Int64, Shape{Dim()});
  set_output(n, 2, DType::Int64, inverse);
  set_output(n, 3, DType::Int64, Shape{Dim()});
}

// Compress's axis (normalised), or nullopt without the attribute: the input flattened.
inline std::optional<std::size_t> compress_axis(const Node& n, std::int64_t rank) {
  if (!n.has_attr("axis")) return std::nullopt;
  return static_cast<std::size_t>(normalize_axis(n, n.attr_int("axis"), rank));
}

// The condition may be shorter than the selected dim (what lies past it is dropped), never longer.
inline void check_condition_length(const Node& n, std::int64_t condition, std::int64_t dim) {
  if (condition > dim)
    throw n.error("condition has " + std::to_string(condition) + " entries, more than the " + std::to_string(dim) +
                  " it selects from");
}

inline void infer_compress(Node& n) {
  const Value& x = required_input(n, 0);
  const Value& condition = required_input(n, 1);
  if (x.dtype() == DType::String) throw n.error("string tensors are not supported");
  if (condition.dtype() != DType::Bool && condition.dtype() != DType::Undefined)
    throw n.error("condition must be a bool tensor, got " + std::string(dtype_name(condition.dtype())));
  if (condition.shape().rank_known() && condition.shape().rank() != 1)
    throw n.error("condition must be 1-D, got " + condition.shape().str());
  Dim count;  // the number of true entries, when the condition is known at compile time
  if (const Tensor* c = constant_input(n, 1)) {
    std::int64_t k = 0;
    for (auto v : c->to_int64s()) k += v != 0;
    count = Dim(k);
  }
  if (!n.has_attr("axis")) {
    if (auto numel = x.shape().numel(); numel && condition.shape().rank_known() && condition.shape()[0].is_static())
      check_condition_length(n, condition.shape()[0].value, *numel);
    return set_output(n, 0, x.dtype(), Shape{count});
  }
  if (!x.shape().rank_known()) return set_output(n, 0, x.dtype(), Shape::unknown());
  const std::size_t axis = *compress_axis(n, static_cast<std::int64_t>(x.shape().rank()));
  std::vector<Dim> out = x.shape().dims();
  if (out[axis].is_static() && condition.shape().rank_known() && condition.shape()[0].is_static())
    check_condition_length(n, condition.shape()[0].value, out[axis].value);
  out[axis] = count;
  set_output(n, 0, x.dtype(), Shape(out));
}

}  // namespace detail_selection

inline void register_selection_infer(InferTable& t) {
  t["NonMaxSuppression"] = detail_selection::infer_non_max_suppression;
  t["Unique"] = detail_selection::infer_unique;
  t["Compress"] = detail_selection::infer_compress;
}

}  // namespace infer
}  // namespace ondine
