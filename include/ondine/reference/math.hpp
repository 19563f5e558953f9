// ondine/reference/math.hpp - reference kernels for the math ops.
#pragma once

#include "ondine/reference/common.hpp"

namespace ondine::reference {

inline void register_math_kernels(KernelTable& table) { (void)table; }

}  // namespace ondine::reference
