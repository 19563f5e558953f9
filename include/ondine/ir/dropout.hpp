// SPDX-License-Identifier: Apache-2.0
// ondine/ir/dropout.hpp - when a Dropout node is the identity on its data.
//
// In inference mode (no training_mode input, or a constant false) Dropout passes its input through; in
// training mode it drops at random, except with a ratio that is a constant 0, where it keeps every
// element. PyTorch exports that case from code calling F.dropout(x, p=0.0) without `training=`
// (torchvision's Swin attention): training_mode true, ratio 0. ONNX Runtime runs it as the identity.
#pragma once

#include "ondine/ir/graph.hpp"

namespace ondine {

// The constant scalar value of an optional input `v`, when it has one.
inline std::optional<double> constant_scalar(const Value* v) {
  if (!v || !v->is_constant() || v->constant().numel() != 1) return std::nullopt;
  return v->constant().at_double(0);
}

// Whether Dropout node `n`'s output 0 equals its input 0 (the mask, output 1, aside).
inline bool dropout_is_identity(const Node& n) {
  if (n.opset() < 12) return true;  // no training mode before opset 12 (inference)
  if (!n.input(2)) return true;
  const std::optional<double> training = constant_scalar(n.input(2));
  if (training && *training == 0) return true;
  if (!n.input(1)) return false;  // training with the default ratio 0.5
  const std::optional<double> ratio = constant_scalar(n.input(1));
  return training && ratio && *ratio == 0;
}

}  // namespace ondine
