// SPDX-License-Identifier: Apache-2.0
// ondine/reference/layout.hpp - the reference kernel of ondine.Reorder (passes/layout.hpp): the
// identity on logical values. Reference tensors are always row-major, so it copies its input.
#pragma once

#include <vector>

#include "ondine/reference/common.hpp"

namespace ondine::reference {

inline std::vector<Tensor> reorder_kernel(const Node& n, const std::vector<Tensor>& in) {
  if (in.size() != 1 || in[0].empty()) throw n.error("Reorder takes one input");
  return {in[0].clone()};
}

inline void register_layout_kernels(KernelTable& table) { table["ondine.Reorder"] = reorder_kernel; }

}  // namespace ondine::reference
