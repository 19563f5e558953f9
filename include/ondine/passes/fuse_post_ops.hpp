// ondine/passes/fuse_post_ops.hpp - fuse: folds bias, residual Add and activations into ondine.FusedConv / FusedMatMul / FusedGemm.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct FusePostOps {
  static constexpr const char* name = "fuse";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
