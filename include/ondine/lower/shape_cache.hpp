// ondine/lower/shape_cache.hpp - run a model with symbolic dims: compile per concrete shape, cached.
//
//   ondine::lower::ShapeCache model(std::move(graph), {/*threads*/ 2}, /*capacity*/ 8);
//   auto out = model.run({{"input", batch_of_8}});   // compiles for batch=8 on first use
//
// The compiled runtime needs static shapes. A ShapeCache keeps the graph with its symbolic dims, binds
// them from each call's input shapes (checked: one size per symbol), and compiles once per distinct
// binding. It holds at most `capacity` compiled models and evicts the least recently used one; models
// evicted while a call still runs them stay alive until that call returns (shared ownership). Safe to
// call from several threads: a new shape compiles outside the lock (runs of compiled shapes go on; a
// second caller of the same new shape waits for that compile), and running takes no lock at all.
//
// Symbolic dims inside the model (derived ones such as "(H - 1)/2 + 1", shapes computed at run time
// through Shape -> Gather -> Concat -> Reshape) follow from the inputs' dims: compile() infers and
// folds them to numbers for each binding (lower.hpp, resolve_static_shapes).
//
// The specialisations share their packed weights (lower/packed_weights.hpp): a constant packed into
// a oneDNN layout once is reused by every shape that wants the same layout, so a transformer's
// second sequence length adds no weight memory and compiles faster (it only builds primitives).
#pragma once

#include <cstddef>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "ondine/ir/stats.hpp"
#include "ondine/lower/lower.hpp"

namespace ondine::lower {

class ShapeCache {
 public:
  using Binding = std::map<std::string, std::int64_t>;

  explicit ShapeCache(Graph graph, CompileOptions options = {}, std::size_t capacity = 8)
      : graph_(std::move(graph)), options_(std::move(options)), capacity_(capacity ? capacity : 1) {
    check_supported(graph_);
    if (!options_.packed_weights) options_.packed_weights = std::make_shared<PackedWeights>();
  }

  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) {
    check_inputs(graph_, inputs);  // names, dtypes, ranks, static dims and consistent symbols
    std::shared_ptr<const CompiledModel> model = get(binding_of(inputs));
    return model->run(inputs);
  }

  // The compiled model for a binding (compiled now if not cached). The compile runs outside the lock:
  // runs of shapes already compiled never wait for it, and a second caller asking for the same new
  // binding waits for the first one's compile instead of compiling again.
  std::shared_ptr<const CompiledModel> get(const Binding& binding) {
    std::promise<std::shared_ptr<const CompiledModel>> promise;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (it->first == binding) {
          entries_.splice(entries_.begin(), entries_, it);  // most recently used first
          return entries_.front().second;
        }
      if (auto it = in_flight_.find(binding); it != in_flight_.end()) {
        auto pending = it->second;
        lock.unlock();
        return pending.get();  // rethrows the compile's error
      }
      in_flight_.emplace(binding, promise.get_future().share());
    }
    std::shared_ptr<const CompiledModel> model;
    try {
      Graph bound = graph_.clone();
      bind_dims(bound, binding);
      model = std::make_shared<const CompiledModel>(compile(std::move(bound), options_));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      promise.set_exception(std::current_exception());
      in_flight_.erase(binding);
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    promise.set_value(model);
    in_flight_.erase(binding);
    ++compilations_;
    entries_.emplace_front(binding, model);
    if (entries_.size() > capacity_) entries_.pop_back();
    return model;
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  std::size_t capacity() const { return capacity_; }
  // The packed constants all shapes share (lower/packed_weights.hpp): bytes(), size(), hits().
  const PackedWeights& packed_weights() const { return *options_.packed_weights; }
  std::size_t compilations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return compilations_;
  }

 private:
  Binding binding_of(const std::map<std::string, Tensor>& inputs) const {
    Binding b;
    for (Value* in : graph_.inputs()) {
      if (!in->shape().rank_known()) continue;
      const Tensor& t = inputs.at(in->name());
      for (std::size_t d = 0; d < in->shape().rank(); ++d)
        if (!in->shape()[d].is_static() && !in->shape()[d].symbol.empty()) b[in->shape()[d].symbol] = t.dims()[d];
    }
    return b;
  }

  Graph graph_;
  CompileOptions options_;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::list<std::pair<Binding, std::shared_ptr<const CompiledModel>>> entries_;
  std::map<Binding, std::shared_future<std::shared_ptr<const CompiledModel>>> in_flight_;
  std::size_t compilations_ = 0;
};

}  // namespace ondine::lower
