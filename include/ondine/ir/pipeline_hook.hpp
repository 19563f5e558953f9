// SPDX-License-Identifier: Apache-2.0
// ondine/ir/pipeline_hook.hpp - how the compiler runs a pass pipeline without including the pass layer.
//
// The lowering (lower/compiler.hpp) sits below nothing that would let it include passes/, and a program that
// only runs compiled artifacts (ondine/runtime.hpp) must not carry the passes. So the pass layer registers a
// runner here (passes/pipeline.hpp, which ondine.hpp and lower/lower.hpp include) and the compiler calls it;
// without one, compiling with a pipeline other than "none" is an error that says which header to include.
#pragma once

#include <functional>
#include <string>

#include "ondine/ir/graph.hpp"

namespace ondine {

struct PipelineHook {
  using Log = std::function<void(const std::string&)>;
  // Runs `pipeline` on `g`; `limit_int8`: the CPU has no VNNI, so fuse-qdq keeps 8-bit-weight int8 layers in
  // float (passes/fuse_qdq.hpp), or with `halve_weights` requantizes those weights to 7 bits; logs what
  // the passes did through `log` (may be empty).
  void (*run)(Graph& g, const std::string& pipeline, bool limit_int8, bool halve_weights, const Log& log) = nullptr;
};

inline PipelineHook& pipeline_hook() {
  static PipelineHook hook;
  return hook;
}

}  // namespace ondine
