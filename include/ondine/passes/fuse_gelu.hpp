// ondine/passes/fuse_gelu.hpp - fuse-gelu: replaces the Erf form 0.5*x*(1+erf(x/sqrt2)) by one ondine.Gelu.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct FuseGelu {
  static constexpr const char* name = "fuse-gelu";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
