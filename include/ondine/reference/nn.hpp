// ondine/reference/nn.hpp - reference kernels for the nn ops.
#pragma once

#include "ondine/reference/common.hpp"

namespace ondine::reference {

inline void register_nn_kernels(KernelTable& table) { (void)table; }

}  // namespace ondine::reference
