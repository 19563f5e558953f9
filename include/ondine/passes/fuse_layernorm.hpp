// ondine/passes/fuse_layernorm.hpp - fuse-layernorm: replaces the decomposed ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div(/Mul/Add) by LayerNormalization.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct FuseLayerNorm {
  static constexpr const char* name = "fuse-layernorm";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
