// ondine/ir/infer/nn.hpp - shape and type inference for the nn ops.
#pragma once

#include "ondine/ir/infer/common.hpp"

namespace ondine::infer {

inline void register_nn_infer(InferTable& table) { (void)table; }

}  // namespace ondine::infer
