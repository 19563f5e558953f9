// SPDX-License-Identifier: Apache-2.0
// ondine/lower/plan_cache.hpp - the machinery of ShapeCache (lower/shape_cache.hpp): a graph with symbolic dims,
// compiled per concrete shape by the compile function it is given, cached.
//
// The compiled runtime needs static shapes. A PlanCache keeps the graph with its symbolic dims, binds
// them from each call's input shapes (checked: one size per symbol), and compiles once per distinct
// binding. It holds at most `capacity` compiled models and evicts the least recently used one; models
// evicted while a call still runs them stay alive until that call returns (shared ownership). Safe to
// call from several threads: a new shape compiles outside the lock (runs of compiled shapes go on; a
// second caller of the same new shape waits for that compile), and running takes no lock but a moment's
// to borrow an execution context: each specialisation keeps the contexts of its finished runs (arena,
// scratchpad, step states), so a run does not allocate and fault in its arena again (a staged model's
// later stage runs through here once per call: gated_pt's 8 MB reorder destination cost 10 ms a run).
//
// Symbolic dims inside the model (derived ones such as "(H - 1)/2 + 1", shapes computed at run time
// through Shape -> Gather -> Concat -> Reshape) follow from the inputs' dims: compile() infers and
// folds them to numbers for each binding (lower/lowering.hpp, resolve_static_shapes). Inputs whose values decide
// shapes (a Reshape's shape passed as a graph input: ir/stats.hpp, shape_inputs) are part of the binding:
// one compile per value, the value baked in as a constant.
//
// The specialisations share their packed weights (lower/packed_weights.hpp): a constant packed into
// a oneDNN layout once is reused by every shape that wants the same layout, so a transformer's
// second sequence length adds no weight memory and compiles faster (it only builds primitives).
#pragma once

#include <cstddef>
#include <cstring>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>
#include <utility>

#include "ondine/ir/stats.hpp"
#include "ondine/lower/dynamic.hpp"
#include "ondine/lower/lowering.hpp"
#include "ondine/lower/options.hpp"
#include "ondine/lower/packed_weights.hpp"

namespace ondine::lower {

class PlanCache {
 public:
  using Binding = std::map<std::string, std::int64_t>;

  // `compile` compiles each binding's graph: lower::compile (ShapeCache), or the driver that made a staged
  // model's later stage.
  PlanCache(Graph graph, CompileOptions options, std::size_t capacity, CompileFn compile)
      : graph_(std::move(graph)), options_(std::move(options)), capacity_(capacity ? capacity : 1), compile_(compile) {
    check_supported(graph_);
    name_unknown_input_dims(graph_);  // `?` dims bind from the inputs like named ones
    for (const Value* in : shape_inputs(graph_)) shape_inputs_.push_back(in->name());
    if (!options_.packed_weights) options_.packed_weights = std::make_shared<PackedWeights>();
    choose_shape_free_plan();
  }

  // With `times` (a profiled run of a staged model, lower/staged.hpp), adds each step's time to it.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs, runtime::StageTimes* times = nullptr) {
    if (shape_free_) return shape_free_->run(inputs, times);  // checks the inputs as below
    check_inputs(graph_, inputs);  // names, dtypes, ranks, static dims and consistent symbols
    Key key{binding_of(inputs), {}};
    for (const std::string& name : shape_inputs_) {
      const Tensor& t = inputs.at(name);
      key.values[name].assign(static_cast<const char*>(t.raw()), static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
    }
    std::shared_ptr<Specialisation> spec = get(key);
    ExecContext ctx = spec->take();
    ctx.profile = times != nullptr;
    std::map<std::string, Tensor> outputs = spec->model.run(ctx, inputs);
    if (times) {
      const auto& steps = spec->model.steps();
      for (std::size_t i = 0; i < steps.size(); ++i)
        times->add(steps[i].op, steps[i].implementation, steps[i].name, ctx.step_seconds()[i]);
      times->merge(ctx.later_stage_times());
      ctx.reset_profile();
      ctx.profile = false;
    }
    spec->give_back(std::move(ctx));  // not after a failed run: its context is dropped
    return outputs;
  }

  // The same, with outputs written into the caller's buffers (ONNX Runtime's IOBinding; checked as
  // runtime/output_binding.hpp says): the shape-free plan writes a bound output where it is computed; a plan
  // per shape copies it there after the run.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    const std::map<std::string, Tensor>& bound, runtime::StageTimes* times = nullptr) {
    if (shape_free_) return shape_free_->run(inputs, bound, times);
    check_inputs(graph_, inputs);
    runtime::check_output_bindings(graph_, inputs, bound);
    std::map<std::string, Tensor> outputs = run(inputs, times);
    for (auto& [name, buffer] : bound) outputs[name] = runtime::write_output(outputs.at(name), buffer, name);
    return outputs;
  }

  // A KV cache for `capacity` positions (runtime/kv_cache.hpp; `dims`: sizes of the pasts' symbolic dims
  // such as the batch, else 1), and a run with it: the shape-free plan's (DynamicModel::make_kv_cache, run).
  // A model compiled per shape, or without past/present pairs the plan can share, is an Error saying why.
  runtime::KvCache make_kv_cache(std::int64_t capacity, const std::map<std::string, std::int64_t>& dims = {}) const {
    return shape_free_for_cache().make_kv_cache(capacity, dims);
  }
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    const std::map<std::string, Tensor>& bound, runtime::KvCache& cache,
                                    runtime::StageTimes* times = nullptr) {
    return shape_free_for_cache().run(inputs, bound, &cache, times);
  }

  // The compiled model for a binding of the symbolic dims (compiled now if not cached). The compile runs
  // outside the lock: runs of shapes already compiled never wait for it, and a second caller asking for
  // the same new binding waits for the first one's compile instead of compiling again.
  std::shared_ptr<const CompiledModel> get(const Binding& binding) {
    std::shared_ptr<Specialisation> spec = get(Key{binding, {}});
    return std::shared_ptr<const CompiledModel>(spec, &spec->model);
  }

  // The shape-free plan this cache runs every shape on (lower/dynamic.hpp), or null when it compiles one
  // plan per shape (CompileOptions::shape_plan; why: shape_plan_reason()).
  const DynamicModel* shape_free() const { return shape_free_.get(); }
  const std::string& shape_plan_reason() const { return shape_plan_reason_; }

  // The graph inputs whose values decide shapes (ir/stats.hpp, shape_inputs): run() compiles once per
  // value of these as well, as for a new input shape.
  const std::vector<std::string>& shape_input_names() const { return shape_inputs_; }

 private:
  const DynamicModel& shape_free_for_cache() const {
    if (!shape_free_)
      throw Error("a KV cache needs the shape-free plan, and this model compiles one plan per shape (" +
                  shape_plan_reason_ + ")");
    return *shape_free_;
  }

  // A specialisation: the dims' sizes and the values of the shape inputs.
  struct Key {
    Binding dims;
    std::map<std::string, std::string> values;  // their bytes
    bool operator==(const Key& o) const { return dims == o.dims && values == o.values; }
    bool operator<(const Key& o) const { return dims != o.dims ? dims < o.dims : values < o.values; }
  };

  // A compiled shape and the idle execution contexts of its runs (at most one per concurrent run).
  struct Specialisation {
    explicit Specialisation(CompiledModel m) : model(std::move(m)) {}
    const CompiledModel model;
    std::mutex mutex;
    std::vector<ExecContext> idle;

    ExecContext take() {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!idle.empty()) {
          ExecContext ctx = std::move(idle.back());
          idle.pop_back();
          return ctx;
        }
      }
      return model.make_context();
    }
    void give_back(ExecContext ctx) {
      std::lock_guard<std::mutex> lock(mutex);
      idle.push_back(std::move(ctx));
    }
  };

  std::shared_ptr<Specialisation> get(const Key& binding) {
    std::promise<std::shared_ptr<Specialisation>> promise;
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
    std::shared_ptr<Specialisation> model;
    try {
      Graph bound = graph_.clone();
      bind_dims(bound, binding.dims);
      if (!binding.values.empty()) {
        std::map<std::string, Tensor> values;
        for (auto& [name, v] : binding.values) {
          const Value* in = bound.find_value(name);
          Tensor t(in->dtype(), in->shape().sizes());
          std::memcpy(t.raw(), v.data(), v.size());
          values[name] = t;
        }
        bind_shape_inputs(bound, values);
      }
      model = std::make_shared<Specialisation>(compile_(std::move(bound), options_));
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


 public:
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  std::size_t capacity() const { return capacity_; }
  // Execution contexts kept for the next runs, over all cached shapes: at most one per concurrent run of
  // each shape.
  std::size_t idle_contexts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (auto& [key, spec] : entries_) {
      std::lock_guard<std::mutex> spec_lock(spec->mutex);
      n += spec->idle.size();
    }
    return n;
  }
  // The packed constants all shapes share (lower/packed_weights.hpp): bytes(), size(), hits().
  const PackedWeights& packed_weights() const { return *options_.packed_weights; }
  const CompileOptions& options() const { return options_; }

  // The same model's plans for runs of `threads` threads: this cache where it compiles for that many (or
  // `threads` is 0), else a cache of its own over the same graph, options and packed weights, made at the
  // first call and kept. A plan's kernels split their work for the threads they were created with (oneDNN
  // sizes its parallel regions when a primitive is created), so runs from streams of another thread count
  // (runtime/streams.hpp) run plans made for it; the weights stay packed once.
  PlanCache& for_threads(int threads) {
    if (threads <= 0 || threads == options_.threads) return *this;
    std::lock_guard<std::mutex> lock(siblings_mutex_);
    std::unique_ptr<PlanCache>& sibling = siblings_[threads];
    if (!sibling) {
      CompileOptions options = options_;
      options.threads = threads;
      options.plan_threads = 0;  // a tuned split was measured at options_.threads
      sibling = std::make_unique<PlanCache>(graph_.clone(), std::move(options), capacity_, compile_);
    }
    return *sibling;
  }
  std::size_t compilations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return compilations_;
  }

 private:
  // Takes the shape-free plan for a graph with symbolic input dims when options_.shape_plan says so (Auto:
  // when it covers the model's work at fp32). Nothing changes for a graph whose shapes are all static, or
  // whose input values decide shapes (compiled per value, as bind_shape_inputs bakes them in).
  void choose_shape_free_plan() {
    const ShapePlan mode = options_.shape_plan;
    auto decline = [&](std::string why) {
      shape_plan_reason_ = "one plan per shape: " + why;
      if (options_.log) options_.log("shapes: " + shape_plan_reason_);
    };
    bool symbolic = false;
    for (const Value* in : graph_.inputs())
      if (detail::in_plan(in) && !in->shape().is_static()) symbolic = true;
    if (!symbolic) return decline("the input shapes are static");
    if (!shape_inputs_.empty()) return decline("input values decide shapes ('" + shape_inputs_.front() + "')");
    if (mode == ShapePlan::PerShape) return decline("CompileOptions::shape_plan is per-shape");
    if (mode == ShapePlan::Auto) {
      if (resolved_precision(options_.precision) != Precision::Fp32)
        return decline(std::string("precision ") + precision_name(resolved_precision(options_.precision)) +
                       " (the shape-free plan computes in fp32)");
      std::set<std::string> ops;
      for (const Node* n : graph_.nodes()) {
        bool constant = true;  // folded, or fused into its reader (a weight's DequantizeLinear), by the passes
        for (const Value* in : n->inputs()) constant = constant && (!in || in->is_constant());
        if (!constant && !detail::dynamic_kernel_table().count(n->op_key()) && !detail::cheap_on_reference(n->op_key()))
          ops.insert(n->op_key());
      }
      if (!ops.empty()) return decline("the shape-free plan has no fast kernel for " + join_names(ops));
    }
    try {
      auto model = std::make_shared<DynamicModel>(graph_.clone(), options_);
      if (mode == ShapePlan::Auto && !model->covers())
        return decline("after the passes, no fast shape-free kernel for " + join_names(model->uncovered_ops()));
      shape_free_ = std::move(model);
      shape_plan_reason_ = "shape-free: compiled once for any shape";
      if (options_.log) {
        options_.log("shapes: " + shape_plan_reason_);
        std::istringstream text(shape_free_->to_text());
        for (std::string line; std::getline(text, line);) options_.log(line);
      }
    } catch (const Error& e) {
      if (mode == ShapePlan::ShapeFree) throw;
      decline(std::string("the shape-free plan failed: ") + e.what());
    }
  }
  static std::string join_names(const std::set<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  }

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
  CompileFn compile_;
  mutable std::mutex mutex_;
  std::vector<std::string> shape_inputs_;
  std::list<std::pair<Key, std::shared_ptr<Specialisation>>> entries_;
  std::map<Key, std::shared_future<std::shared_ptr<Specialisation>>> in_flight_;
  std::size_t compilations_ = 0;
  std::shared_ptr<const DynamicModel> shape_free_;
  std::string shape_plan_reason_;
  std::mutex siblings_mutex_;
  std::map<int, std::unique_ptr<PlanCache>> siblings_;  // for_threads
};

}  // namespace ondine::lower
