// ondine/ir/infer/math.hpp - shape and type inference for the math ops.
#pragma once

#include "ondine/ir/infer/common.hpp"

namespace ondine::infer {

inline void register_math_infer(InferTable& table) { (void)table; }

}  // namespace ondine::infer
