// ondine/passes/cancel_transposes.hpp - cancel-transposes: merges consecutive Transposes and removes those that compose to the identity.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct CancelTransposes {
  static constexpr const char* name = "cancel-transposes";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
