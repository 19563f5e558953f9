// ondine/reference/tensor_ops.hpp - reference kernels for the tensor_ops ops.
#pragma once

#include "ondine/reference/common.hpp"

namespace ondine::reference {

inline void register_tensor_ops_kernels(KernelTable& table) { (void)table; }

}  // namespace ondine::reference
