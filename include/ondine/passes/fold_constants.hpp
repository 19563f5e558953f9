// ondine/passes/fold_constants.hpp - fold-constants: evaluates nodes whose inputs are all constants (Shape of a static value too) with the reference kernels.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct FoldConstants {
  static constexpr const char* name = "fold-constants";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
