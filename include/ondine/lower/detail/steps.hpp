// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/steps.hpp - what a compiled plan runs: the oneDNN library objects (engine, a stream per
// context, the OpenMP thread count), and the step types the lowerings emit (a oneDNN primitive, primitives
// run side by side, a copy, a reference kernel, a view).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/lower/detail/descriptors.hpp"
#include "ondine/reference/executor.hpp"
#include "ondine/runtime/compiled_model.hpp"

namespace ondine::lower {
namespace detail {

using dnnl::memory;
using runtime::SlotId;
using runtime::SlotKind;
using Dims = std::vector<std::int64_t>;

// --- library objects shared by all contexts, and per context --------------------------------------

struct Library {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
};

class DnnlBackend : public runtime::ContextBackend {
 public:
  explicit DnnlBackend(const dnnl::engine& engine) : stream(engine) {}
  void enter(int threads) override {
    if (threads > 0) {
      saved_threads_ = omp_get_max_threads();
      omp_set_num_threads(threads);
    }
  }
  void leave() override {
    if (saved_threads_ > 0) omp_set_num_threads(saved_threads_);
    saved_threads_ = 0;
  }
  void wait() override { stream.wait(); }
  dnnl::stream stream;

 private:
  int saved_threads_ = 0;
};

// Sets the calling thread's OpenMP thread count for a scope (compile time).
class ThreadCountScope {
 public:
  explicit ThreadCountScope(int threads) {
    if (threads > 0) {
      saved_ = omp_get_max_threads();
      omp_set_num_threads(threads);
    }
  }
  ~ThreadCountScope() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  ThreadCountScope(const ThreadCountScope&) = delete;
  ThreadCountScope& operator=(const ThreadCountScope&) = delete;

 private:
  int saved_ = 0;
};

// --- steps ----------------------------------------------------------------------------------------

// An argument of a primitive that lives in a slot: the memory object is made per context.
struct SlotArg {
  int arg;
  SlotId slot;
  memory::desc md;
  bool read_too = false;  // a DST that the primitive also reads (in-place sum post-op)
  // Added to the slot's address: a view's offset moved out of `md` (without_offset), for primitives that
  // ignore a descriptor's offset0 (oneDNN 2.6's brg matmul does for its weights).
  std::size_t offset_bytes = 0;
};

// `md` without its offset0, and that offset in bytes: the view then starts at its first element. oneDNN 2.6's
// brg matmul ignores the weights' offset0 (bench/onednn_matmul_offset_repro.cpp: it read the Q part of a fused
// QKV projection as V at sequence length 1), so matmul operands read through views pass it this way.
inline std::pair<memory::desc, std::size_t> without_offset(memory::desc md) {
  const std::size_t bytes = static_cast<std::size_t>(md.data.offset0) * dnnl_data_type_size(md.data.data_type);
  md.data.offset0 = 0;
  return {md, bytes};
}

// One oneDNN primitive. Constant arguments (weights reordered at compile time) are shared by all
// contexts; slot arguments and the scratchpad get per-context memory objects, and those of caller
// tensors (graph inputs/outputs) are re-pointed at every run.
class PrimitiveStep : public runtime::Step {
 public:
  // `extra_reads`: slots a derived step reads itself before running the primitive (run-time scales).
  // `scratchpad_offset`: where in the context's scratchpad this primitive's begins (steps that run at
  // the same time as others, ConcurrentStep, each get their own part).
  PrimitiveStep(runtime::StepInfo info, const Node* node, dnnl::engine engine, dnnl::primitive prim,
                std::vector<SlotArg> slot_args, std::vector<std::pair<int, memory>> const_args,
                memory::desc scratchpad, const std::vector<SlotId>& extra_reads = {}, std::size_t scratchpad_offset = 0)
      : Step(std::move(info), reads_of(slot_args, extra_reads), writes_of(slot_args)),
        node_(node),
        engine_(std::move(engine)),
        prim_(std::move(prim)),
        slot_args_(std::move(slot_args)),
        const_args_(std::move(const_args)),
        scratchpad_(std::move(scratchpad)),
        scratchpad_offset_(scratchpad_offset) {}

  struct State : runtime::StepState {
    std::unordered_map<int, memory> args;
    struct External {
      memory m;
      SlotId slot;
      std::size_t offset_bytes;
    };
    std::vector<External> external;
  };

  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext& ctx) const override {
    auto st = std::make_unique<State>();
    for (auto& a : slot_args_) {
      bool external = ctx.is_external(a.slot);
      memory m(a.md, engine_, external ? DNNL_MEMORY_NONE : static_cast<char*>(ctx.ptr(a.slot)) + a.offset_bytes);
      if (external) st->external.push_back({m, a.slot, a.offset_bytes});
      st->args.emplace(a.arg, m);
    }
    for (auto& [arg, m] : const_args_) st->args.emplace(arg, m);
    if (scratchpad_.get_size() > 0)
      st->args.emplace(DNNL_ARG_SCRATCHPAD,
                       memory(scratchpad_, engine_, static_cast<char*>(ctx.scratchpad()) + scratchpad_offset_));
    return st;
  }

  void execute(runtime::ExecContext& ctx) const override { run(ctx, ctx.state<State>(*this)); }

  const dnnl::engine& engine() const { return engine_; }

  // On `stream` instead of the context's (a ConcurrentStep runs each part on a stream of its own).
  void run(runtime::ExecContext& ctx, State& st, dnnl::stream* stream = nullptr) const {
    for (auto& e : st.external) e.m.set_data_handle(static_cast<char*>(ctx.ptr(e.slot)) + e.offset_bytes);
    try {
      prim_.execute(stream ? *stream : static_cast<DnnlBackend*>(ctx.backend())->stream, st.args);
    } catch (const dnnl::error& e) {
      Error err("oneDNN " + op() + " (" + implementation() + ") failed: " + e.what());
      if (node_) err.at_node(node_->name(), node_->op_type());
      throw err;
    }
  }

 private:
  static std::vector<SlotId> reads_of(const std::vector<SlotArg>& args, const std::vector<SlotId>& extra) {
    std::vector<SlotId> out = extra;
    for (auto& a : args)
      if (a.arg != DNNL_ARG_DST || a.read_too) out.push_back(a.slot);
    return out;
  }
  static std::vector<SlotId> writes_of(const std::vector<SlotArg>& args) {
    std::vector<SlotId> out;
    for (auto& a : args)
      if (a.arg == DNNL_ARG_DST) out.push_back(a.slot);
    return out;
  }

  const Node* node_;
  dnnl::engine engine_;
  dnnl::primitive prim_;
  std::vector<SlotArg> slot_args_;
  std::vector<std::pair<int, memory>> const_args_;
  memory::desc scratchpad_;
  std::size_t scratchpad_offset_ = 0;
};

// Independent primitives run at the same time, one OpenMP thread each: the two directions of a
// bidirectional RNN layer, which oneDNN 2.6 runs one after the other, each a chain of small per-step
// GEMMs that a second thread barely speeds up (one LSTM layer, T 128, H 256, batch 1, 2 cores: 6.2 ms
// as one bidirectional primitive on 2 threads, 5.0 ms as two primitives side by side). A primitive
// called inside an OpenMP parallel region runs on its calling thread alone. With one thread the parts
// run one after the other. Each part has its own scratchpad range and stream.
class ConcurrentStep : public runtime::Step {
 public:
  ConcurrentStep(runtime::StepInfo info, std::vector<std::unique_ptr<PrimitiveStep>> parts)
      : Step(std::move(info), union_of(parts, true), union_of(parts, false)), parts_(std::move(parts)) {}

  struct State : runtime::StepState {
    std::vector<std::unique_ptr<runtime::StepState>> parts;
    std::vector<dnnl::stream> streams;
  };

  std::unique_ptr<runtime::StepState> make_state(runtime::ExecContext& ctx) const override {
    auto st = std::make_unique<State>();
    for (auto& part : parts_) {
      st->parts.push_back(part->make_state(ctx));
      st->streams.emplace_back(part->engine());
    }
    return st;
  }

  void execute(runtime::ExecContext& ctx) const override {
    State& st = ctx.state<State>(*this);
    const int n = static_cast<int>(parts_.size());
    auto run_part = [&](int i) {
      parts_[static_cast<std::size_t>(i)]->run(ctx, static_cast<PrimitiveStep::State&>(*st.parts[static_cast<std::size_t>(i)]),
                                                &st.streams[static_cast<std::size_t>(i)]);
      st.streams[static_cast<std::size_t>(i)].wait();
    };
    if (omp_get_max_threads() < 2 || omp_in_parallel()) {
      for (int i = 0; i < n; ++i) run_part(i);
      return;
    }
    std::vector<std::exception_ptr> errors(parts_.size());
#pragma omp parallel for num_threads(std::min(n, omp_get_max_threads())) schedule(static, 1)
    for (int i = 0; i < n; ++i) {
      try {
        run_part(i);
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
      }
    }
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  static std::vector<SlotId> union_of(const std::vector<std::unique_ptr<PrimitiveStep>>& parts, bool reads) {
    std::vector<SlotId> out;
    for (auto& part : parts)
      for (SlotId s : reads ? part->reads() : part->writes())
        if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    return out;
  }

  std::vector<std::unique_ptr<PrimitiveStep>> parts_;
};

// Byte copy between two slots of equal size (graph outputs that are inputs, views, or constants).
class CopyStep : public runtime::Step {
 public:
  CopyStep(runtime::StepInfo info, SlotId from, SlotId to, std::size_t bytes)
      : Step(std::move(info), {from}, {to}), from_(from), to_(to), bytes_(bytes) {}
  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    if (bytes_) std::memcpy(ctx.ptr(to_), ctx.ptr(from_), bytes_);
  }

 private:
  SlotId from_, to_;
  std::size_t bytes_;
};

// A node run by its reference kernel on row-major tensors wrapped around the slots (no input copy);
// the kernel's results are copied into the output slots.
class ReferenceStep : public runtime::Step {
 public:
  struct Operand {
    bool present = false;
    SlotId slot = 0;
    DType dtype = DType::Undefined;
    Dims dims;
  };
  ReferenceStep(runtime::StepInfo info, const Node* node, reference::Kernel kernel, std::vector<Operand> inputs,
                std::vector<Operand> outputs)
      : Step(std::move(info), slots_of(inputs), slots_of(outputs)),
        node_(node),
        kernel_(std::move(kernel)),
        inputs_(std::move(inputs)),
        outputs_(std::move(outputs)) {}

  void execute(runtime::ExecContext& ctx) const override {
    ctx.backend()->wait();
    std::vector<Tensor> args;
    args.reserve(inputs_.size());
    for (auto& in : inputs_)
      args.push_back(in.present ? Tensor(in.dtype, in.dims, ctx.ptr(in.slot), nullptr) : Tensor());
    std::vector<Tensor> results;
    try {
      results = compute(ctx, args);
    } catch (Error& e) {
      if (e.node().empty() && e.op().empty()) e.at_node(node_->name(), node_->op_type());
      throw;
    } catch (const std::exception& e) {
      throw node_->error(e.what());
    }
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      const Operand& out = outputs_[i];
      if (!out.present) continue;
      if (i >= results.size() || results[i].empty())
        throw node_->error("the reference kernel did not compute output #" + std::to_string(i));
      const Tensor& r = results[i];
      if (r.dtype() != out.dtype || r.dims() != out.dims)
        throw node_->error("the reference kernel computed output #" + std::to_string(i) + " as " +
                           std::string(dtype_name(r.dtype())) + dims_str(r.dims()) + ", compiled for " +
                           std::string(dtype_name(out.dtype)) + dims_str(out.dims));
      void* dst = ctx.ptr(out.slot);
      if (r.nbytes() && dst != r.raw()) std::memmove(dst, r.raw(), r.nbytes());
    }
  }

 protected:
  // The node's outputs from its inputs: the reference kernel, or what a derived step does instead.
  virtual std::vector<Tensor> compute(runtime::ExecContext& ctx, const std::vector<Tensor>& args) const {
    (void)ctx;
    return kernel_(*node_, args);
  }
  const Node* node() const { return node_; }

 private:
  static std::vector<SlotId> slots_of(const std::vector<Operand>& ops) {
    std::vector<SlotId> out;
    for (auto& o : ops)
      if (o.present) out.push_back(o.slot);
    return out;
  }
  const Node* node_;
  reference::Kernel kernel_;
  std::vector<Operand> inputs_, outputs_;
};

// A step that does nothing at run time: a zero-copy view, listed so that inspection shows it.
class ViewStep : public runtime::Step {
 public:
  ViewStep(runtime::StepInfo info, SlotId from, SlotId to) : Step(std::move(info), {from}, {to}) {}
  ViewStep(runtime::StepInfo info, std::vector<SlotId> from, SlotId to) : Step(std::move(info), std::move(from), {to}) {}
  void execute(runtime::ExecContext&) const override {}
};

}  // namespace detail
}  // namespace ondine::lower
