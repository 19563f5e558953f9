// ondine/ir/infer/tensor_ops.hpp - shape and type inference for the tensor_ops ops.
#pragma once

#include "ondine/ir/infer/common.hpp"

namespace ondine::infer {

inline void register_tensor_ops_infer(InferTable& table) { (void)table; }

}  // namespace ondine::infer
