// ondine/passes/layout.hpp - layout: decides each activation's memory layout and places ondine.Reorder only where layouts differ.
// (stub: being written)
#pragma once

#include "ondine/passes/pass.hpp"

namespace ondine {

struct AssignLayouts {
  static constexpr const char* name = "layout";
  bool run(Graph&, PassContext&) { return false; }
};

}  // namespace ondine
