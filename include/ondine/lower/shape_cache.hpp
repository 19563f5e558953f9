// SPDX-License-Identifier: Apache-2.0
// ondine/lower/shape_cache.hpp - run a model with symbolic dims: compile per concrete shape, cached.
//
//   ondine::lower::ShapeCache model(std::move(graph), {/*threads*/ 2}, /*capacity*/ 8);
//   auto out = model.run({{"input", batch_of_8}});   // compiles for batch=8 on first use
//
// A ShapeCache is a PlanCache (lower/plan_cache.hpp: binding, caching, eviction, threads, the shape-free plan)
// that compiles each shape with lower::compile, passes included.
#pragma once

#include <cstddef>
#include <utility>

#include "ondine/lower/compiler.hpp"
#include "ondine/lower/plan_cache.hpp"

namespace ondine::lower {

class ShapeCache : public PlanCache {
 public:
  explicit ShapeCache(Graph graph, CompileOptions options = {}, std::size_t capacity = 8)
      : PlanCache(std::move(graph), std::move(options), capacity, &detail::compile_graph) {}
};

}  // namespace ondine::lower
