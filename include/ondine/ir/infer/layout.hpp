// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/layout.hpp - shape and type inference for ondine.Reorder, the node the layout pass
// (passes/layout.hpp) places where a value changes memory layout.
//
// ondine.Reorder (X) -> Y: the identity on logical values (it changes bytes, not meaning); Y's layout
// (Value::layout) is the one it converts to. Y has X's dtype and shape.
#pragma once

#include "ondine/ir/infer/common.hpp"

namespace ondine::infer {

inline void infer_reorder(Node& n) {
  if (n.num_inputs() != 1 || n.num_outputs() != 1) throw n.error("Reorder takes one input and one output");
  Value& x = required_input(n, 0);
  set_output(n, 0, x.dtype(), x.shape());
}

inline void register_layout_infer(InferTable& table) { table["ondine.Reorder"] = infer_reorder; }

}  // namespace ondine::infer
