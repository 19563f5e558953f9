// ondine/ir/infer/selection.hpp - shape and type inference for the ops whose output size is data:
// NonMaxSuppression (the selected boxes, [?, 3]) and Unique (the distinct values or slices).
#pragma once

#include <cstdint>

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

}  // namespace detail_selection

inline void register_selection_infer(InferTable& t) {
  t["NonMaxSuppression"] = detail_selection::infer_non_max_suppression;
  t["Unique"] = detail_selection::infer_unique;
}

}  // namespace infer
}  // namespace ondine
