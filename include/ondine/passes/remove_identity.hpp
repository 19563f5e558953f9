// ondine/passes/remove_identity.hpp - remove-identity: removes Identity, inference-mode Dropout and no-op casts/reshapes.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct RemoveIdentity {
  static constexpr const char* name = "remove-identity";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
