// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/loss.hpp - shape and type inference for the loss ops NegativeLogLikelihoodLoss and
// SoftmaxCrossEntropyLoss (opsets 12 and 13).
//
// Both take scores [N, C, d1, ..., dk] (k >= 0) of a floating type, class labels [N, d1, ..., dk] of
// int32 or int64 and an optional per-class weight [C] of the scores' type. The loss is [N, d1, ..., dk]
// with reduction "none", a scalar with "sum" or "mean" (the default). SoftmaxCrossEntropyLoss's optional
// second output is the log-probabilities, the scores' shape. The attribute rules (reduction,
// ignore_index) are read here once and shared with the reference kernels (reference/loss.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/math.hpp"

namespace ondine::infer {
namespace detail_loss {

enum class Reduction { None, Sum, Mean };

struct LossSpec {
  Reduction reduction = Reduction::Mean;
  bool has_ignore_index = false;  // ignore_index is an optional attribute with no default
  std::int64_t ignore_index = 0;
};

inline LossSpec loss_spec(const Node& n) {
  LossSpec s;
  const std::string r = n.attr_string("reduction", "mean");
  if (r == "none") s.reduction = Reduction::None;
  else if (r == "sum") s.reduction = Reduction::Sum;
  else if (r == "mean") s.reduction = Reduction::Mean;
  else throw n.error("invalid reduction '" + r + "' (expected none, sum or mean)");
  s.has_ignore_index = n.has_attr("ignore_index");
  if (s.has_ignore_index) s.ignore_index = n.attr_int("ignore_index");
  return s;
}

// Checks scores, labels and weight against each other and sets the loss output (and, for
// SoftmaxCrossEntropyLoss, the log-probabilities).
inline void infer_loss(Node& n) {
  const Value& scores = required_input(n, 0);
  const Value& labels = required_input(n, 1);
  const Value* weight = n.input(2);
  detail_math::check_input_type(n, 0, scores.dtype(), detail_math::kFloatTypes);
  if (labels.dtype() != DType::Undefined && labels.dtype() != DType::Int32 && labels.dtype() != DType::Int64)
    throw n.error("target has element type " + std::string(dtype_name(labels.dtype())) + "; expected int32 or int64");
  if (weight) detail_math::check_same_type(n, 0, scores.dtype(), 2, weight->dtype());
  const LossSpec spec = loss_spec(n);
  const Shape& xs = scores.shape();
  const Shape& ts = labels.shape();
  if (xs.rank_known() && xs.rank() < 2) throw n.error("input must be [N, C, d1, ..., dk], got " + xs.str());
  if (xs.rank_known() && ts.rank_known()) {
    if (ts.rank() + 1 != xs.rank())
      throw n.error("target " + ts.str() + " does not match input " + xs.str() + ": expected [N, d1, ..., dk]");
    for (std::size_t i = 0; i < ts.rank(); ++i) {
      const Dim& a = xs[i == 0 ? 0 : i + 1];
      const Dim& b = ts[i];
      if (a.is_static() && b.is_static() && a.value != b.value)
        throw n.error("target " + ts.str() + " does not match input " + xs.str() + ": expected [N, d1, ..., dk]");
    }
  }
  if (weight && weight->shape().rank_known()) {
    const Shape& ws = weight->shape();
    if (ws.rank() != 1) throw n.error("weight must be [C], got " + ws.str());
    if (xs.rank_known() && xs[1].is_static() && ws[0].is_static() && xs[1].value != ws[0].value)
      throw n.error("weight " + ws.str() + " does not match the " + std::to_string(xs[1].value) + " classes of input " +
                    xs.str());
  }
  Shape loss = Shape{};
  if (spec.reduction == Reduction::None) {
    if (ts.rank_known()) {
      loss = ts;
    } else if (xs.rank_known()) {
      std::vector<Dim> d = xs.dims();
      d.erase(d.begin() + 1);
      loss = Shape(d);
    } else {
      loss = Shape::unknown();
    }
  }
  set_output(n, 0, scores.dtype(), loss);
  if (n.op_type() == "SoftmaxCrossEntropyLoss") set_output(n, 1, scores.dtype(), xs);
}

}  // namespace detail_loss

inline void register_loss_infer(InferTable& t) {
  t["NegativeLogLikelihoodLoss"] = detail_loss::infer_loss;
  t["SoftmaxCrossEntropyLoss"] = detail_loss::infer_loss;
}

}  // namespace ondine::infer
