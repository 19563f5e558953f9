// SPDX-License-Identifier: Apache-2.0
// ondine/model.hpp - a model compiled for this CPU, behind a header that declares and does not define: a host
// file that includes it compiles in about a second. The compiler itself is compiled once, in the libraries the
// CMake package offers (ondine::compiled for Model::compile, ondine::runtime for Model::load: no ONNX or
// protobuf), or, header-only, in one file of the host that includes ondine/model_impl.hpp.
//
//   ondine::Model m = ondine::Model::compile("model.onnx", options);   // or ondine::Model::load("model.ondine")
//   auto outputs = m.run({{"input", ondine::load_npy("input.npy")}});
//
// A Model runs every input shape its graph allows (lower/shape_cache.hpp: one shape-free plan, or one plan per
// shape compiled at its first run) and may run from several threads at once; copies share it.
#pragma once

#include <cstddef>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/npy.hpp"
#include "ondine/ir/tensor.hpp"
#include "ondine/lower/options.hpp"
#include "ondine/runtime/streams.hpp"

namespace ondine {

namespace lower {
class PlanCache;
}

class Model {
 public:
  // Imports the ONNX file, runs options.passes and compiles it for this CPU. A graph with static input shapes
  // is lowered now (its errors are thrown here); symbolic dims compile at the first run of each shape.
  // Defined in ondine::compiled (ondine/impl/model_compile.hpp).
  static Model compile(const std::string& onnx_path, const lower::CompileOptions& options = {});
  // A Model over a graph imported or built by the caller (ir/graph.hpp, onnx/import.hpp; a custom pass may have
  // run on it), as Model::compile makes one: options.passes run, then the lowering. Defined in ondine::runtime.
  static Model from_graph(Graph graph, const lower::CompileOptions& options = {});

  // Loads an artifact (`ondine compile MODEL.onnx -o MODEL.ondine`), checked for this CPU and oneDNN: no ONNX,
  // no passes. From `options` it takes the threads and the callbacks; the passes ran when the artifact was
  // written, its precision and packed weights are the artifact's. Defined in ondine::runtime
  // (ondine/impl/model_runtime.hpp), as are the members below.
  static Model load(const std::string& artifact_path, const lower::CompileOptions& options = {});
  // The same for an artifact in memory (linked into the program); `name` names it in errors.
  static Model load_memory(const void* data, std::size_t size, const std::string& name,
                           const lower::CompileOptions& options = {});

  // The outputs for `inputs` by name (checked: names, dtypes, ranks, one size per symbolic dim).
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const;
  // The outputs of every feed, in order, run from several streams at once (runtime/streams.hpp: threads of their
  // own, each with its share of `options.threads`, pinned where the CPU set allows). Each stream runs plans
  // compiled for its share of the threads: the model's own where CompileOptions::threads is that share, else a
  // second set compiled at the first run_many (sharing the packed weights). A request that fails stops the
  // others and its error is thrown, naming the request ("request 3 of 10: ..."); ondine::Streams answers each
  // request on its own.
  std::vector<std::map<std::string, Tensor>> run_many(const std::vector<std::map<std::string, Tensor>>& feeds,
                                                      const runtime::StreamOptions& options = {}) const;

  std::vector<std::string> input_names() const;
  std::vector<std::string> output_names() const;
  // Each input's dims as text ("[batch, 3, 224, 224]"), in input order.
  std::vector<std::string> input_shapes() const;
  // The plans compiled so far (one per input shape, or 0 with the shape-free plan).
  std::size_t compilations() const;

  struct Impl;  // the compiled model (impl/model_runtime.hpp)
  explicit Model(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  friend class Streams;
  std::shared_ptr<Impl> impl_;
};

// A model served by N streams that stay up (a server's request queue; OpenVINO's asynchronous infer requests):
// each submitted request runs on the first stream free and is answered by its future, which carries the outputs
// or the request's own error; the other requests go on. Streams and threads as for Model::run_many. The
// destructor answers what was submitted, then stops the streams.
//
//   ondine::Streams streams(model, runtime::options_for_hint(runtime::Hint::Throughput, 0));
//   auto outputs = streams.submit({{"input", x}});   // std::future; outputs.get() waits
class Streams {
 public:
  explicit Streams(const Model& model, const runtime::StreamOptions& options = {});
  ~Streams();
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;

  std::future<std::map<std::string, Tensor>> submit(std::map<std::string, Tensor> inputs);
  int streams() const;
  int threads_per_stream() const;

 private:
  std::shared_ptr<Model::Impl> impl_;
  lower::PlanCache* cache_;  // the plans its streams run (owned by impl_)
  std::unique_ptr<runtime::StreamPool> pool_;
};

}  // namespace ondine
