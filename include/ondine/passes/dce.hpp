// ondine/passes/dce.hpp - dce: removes nodes whose outputs nothing reads (graph outputs are read) and unused constants.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct DeadCodeElimination {
  static constexpr const char* name = "dce";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
