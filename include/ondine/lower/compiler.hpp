// SPDX-License-Identifier: Apache-2.0
// ondine/lower/compiler.hpp - the compile driver: a Graph into a CompiledModel that runs on oneDNN 2.6
// primitives and Ondine's kernels.
//
//   ondine::bind_dims(graph, {{"batch", 1}});          // shapes must be static
//   ondine::CompiledModel model = ondine::lower::compile(graph, {/*threads*/ 4});
//   auto outputs = model.run({{"input", tensor}});      // any number of threads at once
//
// One direction, each step once: resolve the precision; check the graph and infer its shapes; fold the
// values that shapes depend on (when some are not static yet); run CompileOptions::passes (the pass layer,
// lower/pass_pipeline.hpp) and infer again where they changed the graph; lower (lower/lowering.hpp). A graph
// whose shapes depend on data compiles in stages (lower/staged.hpp), its later stages through a PlanCache.
// The parts that compile graphs of their own (control-flow bodies, later stages) get this driver as a
// CompileFn instead of including it, so the headers include each other one way.
//
// Threads: oneDNN here is built on OpenMP (libdnnl links libgomp). CompileOptions::threads (or
// ExecContext::threads) sets omp_set_num_threads for the calling thread during compile and during each
// run and restores it afterwards; 0 keeps OpenMP's default (OMP_NUM_THREADS, else one per core).
// Several threads running one model each get their own OpenMP team, so give each a share of the cores.
// Only lower/ includes oneDNN's headers.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "ondine/ir/graph.hpp"
#include "ondine/ir/shape_inference.hpp"
#include "ondine/lower/isa.hpp"
#include "ondine/lower/lowering.hpp"
#include "ondine/lower/options.hpp"
#include "ondine/lower/staged.hpp"
#include "ondine/runtime/compiled_model.hpp"

namespace ondine::lower {

namespace detail {

// CompileOptions with Precision::Auto resolved for this CPU, and where that choice came from.
inline CompileOptions with_resolved_precision(const CompileOptions& options) {
  CompileOptions resolved = options;
  if (options.precision == Precision::Auto) {
    resolved.precision = resolved_precision(options.precision);
    resolved.choice_origins.emplace("precision", "heuristic");  // unless a tuner's or an artifact's already
  }
  return resolved;
}

inline CompiledModel compile_graph(Graph&& graph, const CompileOptions& given);

}  // namespace detail

// Compiles `graph` (moved into the model, which runs options.passes on it first; pass a clone to keep
// yours: compile(g.clone()) shares g's weights, so the passes that rewrite weights copy them then).
// Throws an Error naming the input when a graph input has symbolic dims, naming the node for an
// unsupported op or a value without a static shape, naming the pass for a pass that fails.
inline CompiledModel compile(Graph&& graph, const CompileOptions& options = {}) {
  return detail::compile_graph(std::move(graph), options);
}

// Compiles a copy of `graph`, which stays unchanged.
inline CompiledModel compile(const Graph& graph, const CompileOptions& options = {}) {
  return detail::compile_graph(graph.clone(), options);
}

namespace detail {

inline CompiledModel compile_graph(Graph&& graph, const CompileOptions& given) {
  const CompileOptions options = with_resolved_precision(given);
  check_precision(options);
  check_static_shapes(graph);
  auto g = std::make_shared<Graph>(std::move(graph));
  g->verify();
  check_ops(*g);
  infer_shapes(*g);
  resolve_static_shapes(*g, options);
  inline_constant_captures(*g);
  if (!all_shapes_static(*g)) return compile_staged(*g, options, &compile_graph);  // shapes that depend on data
  run_passes(*g, options);
  return lower_static(g, options, &compile_graph);
}

}  // namespace detail
}  // namespace ondine::lower
