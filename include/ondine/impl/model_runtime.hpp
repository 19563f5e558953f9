// SPDX-License-Identifier: Apache-2.0
// ondine/impl/model_runtime.hpp - the definitions behind ondine/model.hpp but Model::compile: compiled once per
// program, in one source file (the library ondine::runtime is that file: src/runtime.cpp; header-only,
// ondine/model_impl.hpp). It holds the whole lowering, which is why ondine/model.hpp does not.
#pragma once

#include <omp.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ondine/ir/graph.hpp"
#include "ondine/lower/artifact.hpp"
#include "ondine/lower/shape_cache.hpp"
#include "ondine/model.hpp"

namespace ondine {

struct Model::Impl {
  Impl(Graph graph, lower::CompileOptions options) : cache(std::move(graph), std::move(options)) {}
  lower::ShapeCache cache;
  std::vector<std::string> inputs, outputs, input_shapes;
  bool compile_now = false;  // static shapes: lowered at once, errors from compile/load

  // The plans for runs of `threads` threads (PlanCache::for_threads), with a static shape compiled at once.
  lower::PlanCache& cache_for(int threads) {
    lower::PlanCache& c = cache.for_threads(threads);
    if (compile_now) c.get(lower::PlanCache::Binding{});
    return c;
  }
};


// A graph whose inputs all have static shapes (and whose input values decide no shape) is lowered now, so that
// its errors come from compile/load rather than from the first run.
Model Model::from_graph(Graph graph, const lower::CompileOptions& options) {
  std::vector<std::string> inputs, outputs, shapes;
  bool fixed = true;
  for (const Value* v : graph.inputs()) {
    inputs.push_back(v->name());
    shapes.push_back(v->shape().str());
    fixed = fixed && v->is_tensor() && v->shape().is_static();
  }
  for (const Value* v : graph.outputs()) outputs.push_back(v->name());
  lower::CompileOptions resolved = options;
  if (resolved.threads <= 0) resolved.threads = omp_get_max_threads();  // what "OpenMP's default" is now
  auto impl = std::make_shared<Impl>(std::move(graph), std::move(resolved));
  impl->inputs = std::move(inputs);
  impl->outputs = std::move(outputs);
  impl->input_shapes = std::move(shapes);
  impl->compile_now = fixed && !impl->cache.shape_free() && impl->cache.shape_input_names().empty();
  if (impl->compile_now) impl->cache.get(lower::ShapeCache::Binding{});
  return Model(std::move(impl));
}

namespace {
// Compiles an artifact's graph while its weights' checksum is computed, then waits for that: a damaged file
// is reported as such, even where the damage made the compile fail first.
Model compile_checked(artifact::Artifact& a, const lower::CompileOptions& options) {
  const lower::CompileOptions resolved = lower::artifact_options(options, a);
  try {
    Model m = Model::from_graph(std::move(a.graph), resolved);
    a.wait_checked();
    return m;
  } catch (...) {
    a.wait_checked();
    throw;
  }
}
}  // namespace

Model Model::load(const std::string& artifact_path, const lower::CompileOptions& options) {
  artifact::Artifact a = lower::load_artifact(artifact_path, artifact::WeightCheck::Background);
  return compile_checked(a, options);
}

Model Model::load_memory(const void* data, std::size_t size, const std::string& name,
                         const lower::CompileOptions& options) {
  artifact::Artifact a = lower::load_artifact_memory(data, size, name, artifact::WeightCheck::Background);
  return compile_checked(a, options);
}

std::map<std::string, Tensor> Model::run(const std::map<std::string, Tensor>& inputs) const {
  return impl_->cache.run(inputs);
}

std::vector<std::map<std::string, Tensor>> Model::run_many(const std::vector<std::map<std::string, Tensor>>& feeds,
                                                         const runtime::StreamOptions& options) const {
  const runtime::StreamPlan plan = runtime::plan_streams(options, feeds.size());
  lower::PlanCache& cache = impl_->cache_for(plan.threads_per_stream);
  return runtime::run_streams<std::map<std::string, Tensor>>(feeds.size(), plan, [&](std::size_t i, int) {
    try {
      return cache.run(feeds[i]);
    } catch (const Error& e) {
      throw runtime::request_error(e, i, feeds.size());
    }
  });
}

Streams::Streams(const Model& model, const runtime::StreamOptions& options)
    : impl_(model.impl_),
      cache_(nullptr),
      pool_(std::make_unique<runtime::StreamPool>(runtime::plan_streams(options, static_cast<std::size_t>(-1)))) {
  cache_ = &impl_->cache_for(pool_->plan().threads_per_stream);
}

Streams::~Streams() = default;

std::future<std::map<std::string, Tensor>> Streams::submit(std::map<std::string, Tensor> inputs) {
  lower::PlanCache* cache = cache_;
  return pool_->submit([cache, inputs = std::move(inputs)](int) { return cache->run(inputs); });
}

int Streams::streams() const { return pool_->plan().streams; }
int Streams::threads_per_stream() const { return pool_->plan().threads_per_stream; }

std::vector<std::string> Model::input_names() const { return impl_->inputs; }
std::vector<std::string> Model::output_names() const { return impl_->outputs; }
std::vector<std::string> Model::input_shapes() const { return impl_->input_shapes; }
std::size_t Model::compilations() const { return impl_->cache.compilations(); }

}  // namespace ondine
