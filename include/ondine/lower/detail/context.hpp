// SPDX-License-Identifier: Apache-2.0
// ondine/lower/detail/context.hpp - the machinery shared by the per-op lowerings: oneDNN memory
// descriptor helpers, the step types (oneDNN primitive, reference kernel, copy), the per-context
// oneDNN backend (stream, OpenMP threads), and the Lowering state that maps graph values to slots
// and layouts while the program is built.
//
// Layout policy: each value is produced in the layout its producer chose (conv/matmul pick theirs
// through format_tag::any; layout-agnostic ops inherit their input's). A consumer that needs another
// layout asks Lowering::slot_in(value, desc), which inserts one reorder per (value, layout) and reuses it.
// Row-major-equivalent layouts (e.g. NHWC and NCHW of a [N,C,1,1] tensor) are recognised as the same
// bytes, so no reorder is inserted for them.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "oneapi/dnnl/dnnl_debug.h"
#include "ondine/ir/graph.hpp"
#include "ondine/lower/detail/layout_name.hpp"
#include "ondine/lower/options.hpp"
#include "ondine/lower/packed_weights.hpp"
#include "ondine/reference/executor.hpp"
#include "ondine/runtime/compiled_model.hpp"

namespace ondine::lower {

namespace detail {

using dnnl::memory;
using runtime::SlotId;
using runtime::SlotKind;
using Dims = std::vector<std::int64_t>;

// --- memory descriptors ---------------------------------------------------------------------------

inline bool dnnl_dtype(DType t, memory::data_type& out) {
  switch (t) {
    case DType::Float32: out = memory::data_type::f32; return true;
    case DType::BFloat16: out = memory::data_type::bf16; return true;
    case DType::Float16: out = memory::data_type::f16; return true;
    case DType::Int8: out = memory::data_type::s8; return true;
    case DType::UInt8: out = memory::data_type::u8; return true;
    case DType::Int32: out = memory::data_type::s32; return true;
    default: return false;
  }
}

inline Dims at_least_1d(Dims d) { return d.empty() ? Dims{1} : d; }

inline Dims row_major_strides(const Dims& d) {
  Dims s(d.size(), 1);
  for (std::size_t i = d.size(); i-- > 1;) s[i - 1] = s[i] * std::max<std::int64_t>(d[i], 1);
  return s;
}

inline memory::desc plain_md(const Dims& dims, memory::data_type dt = memory::data_type::f32) {
  Dims d = at_least_1d(dims);
  return memory::desc(d, dt, row_major_strides(d));
}
inline memory::desc any_md(const Dims& dims, memory::data_type dt = memory::data_type::f32) {
  return memory::desc(at_least_1d(dims), dt, memory::format_tag::any);
}

// The descriptor a layout-choosing primitive (conv, pooling, ...) asks for activation `v`: the layout
// the layout pass chose (ondine/passes/layout.hpp), else format_tag::any so oneDNN picks.
inline memory::desc activation_md(const Value* v, const Dims& dims, memory::data_type dt = memory::data_type::f32) {
  using tag = memory::format_tag;
  switch (v ? v->layout() : Layout::Unset) {
    case Layout::RowMajor:
      return plain_md(dims, dt);
    case Layout::ChannelsLast:
      if (dims.size() == 3) return memory::desc(dims, dt, tag::nwc);
      if (dims.size() == 4) return memory::desc(dims, dt, tag::nhwc);
      if (dims.size() == 5) return memory::desc(dims, dt, tag::ndhwc);
      return plain_md(dims, dt);
    case Layout::Blocked:
    case Layout::Unset:
      break;
  }
  return any_md(dims, dt);
}

// True when the descriptor's bytes are exactly the row-major bytes of its dims (strides of size-1
// dims do not matter; no blocking, padding or offset).
inline bool is_row_major(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.offset0 != 0 || d.extra.flags != 0) return false;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  if (b.inner_nblks != 0) return false;
  std::int64_t expect = 1;
  for (int i = d.ndims; i-- > 0;) {
    if (d.padded_dims[i] != d.dims[i]) return false;
    if (d.dims[i] > 1 && b.strides[i] != expect) return false;
    expect *= d.dims[i];
  }
  return true;
}

inline std::int64_t md_numel(const memory::desc& md) {
  std::int64_t n = 1;
  for (int i = 0; i < md.data.ndims; ++i) n *= md.data.dims[i];
  return n;
}

// Two descriptors whose memory can be used interchangeably.
inline bool same_layout(const memory::desc& a, const memory::desc& b) {
  if (a == b) return true;
  return a.data.data_type == b.data.data_type && is_row_major(a) && is_row_major(b) && md_numel(a) == md_numel(b);
}

// An unblocked layout as "[dims] strides [strides] +offset" (compile logs and step details).
inline std::string strided_str(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  std::string dims = "[", strides = "[";
  for (int i = 0; i < d.ndims; ++i) {
    dims += (i ? "," : "") + std::to_string(d.dims[i]);
    strides += (i ? "," : "") + std::to_string(d.format_desc.blocking.strides[i]);
  }
  return dims + "] strides " + strides + "]" + (d.offset0 ? " +" + std::to_string(d.offset0) : "");
}

inline std::string plain_layout_name(std::size_t rank) {
  std::string s;
  for (std::size_t i = 0; i < rank; ++i) s += static_cast<char>('a' + i);
  return s.empty() ? "scalar" : s;
}

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

// --- the lowering state ---------------------------------------------------------------------------

struct ValueState {
  SlotId slot = 0;
  bool has_md = false;
  memory::desc md;  // its layout in `slot` (for dtypes oneDNN knows)
  std::vector<std::pair<memory::desc, SlotId>> copies;  // the same value reordered into other layouts
  // Set for a strided view not copied yet (Lowering::define_strided_view): `md` reads another value's
  // bytes through strides and an offset. The first reader that needs the value in a layout of its own
  // gets it copied by one reorder, labelled with this node.
  const Node* view_of = nullptr;
};

// An unblocked layout with its dims grouped: `ends` lists where each group ends (ascending, the last
// is the rank; an empty group is a dim of size 1). A group merges into one dim when its dims nest in
// memory (each dim's stride is the next one's times that one's size; dims of size 1 impose nothing).
// Empty when the strides do not allow it. The offset and data type are kept.
inline std::optional<memory::desc> regroup_md(const memory::desc& md, const std::vector<std::size_t>& ends) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.extra.flags != 0) return std::nullopt;
  if (ends.empty() || ends.back() != static_cast<std::size_t>(d.ndims)) return std::nullopt;
  memory::dims dims, strides;
  std::size_t begin = 0;
  for (std::size_t end : ends) {
    if (end < begin) return std::nullopt;
    std::int64_t size = 1, stride = 0;  // stride 0: no dim above 1 seen yet
    for (std::size_t i = end; i-- > begin;) {
      const std::int64_t n = d.dims[i], st = d.format_desc.blocking.strides[i];
      if (n == 1) continue;
      if (stride == 0) stride = st;  // the group's stride is its innermost dim's
      else if (st != stride * size) return std::nullopt;
      size *= n;
    }
    dims.push_back(size);
    strides.push_back(stride);
    begin = end;
  }
  for (std::size_t i = dims.size(); i-- > 0;)  // a dim of size 1: the stride a row-major layout would give it
    if (dims[i] == 1) strides[i] = i + 1 < dims.size() ? strides[i + 1] * dims[i + 1] : 1;
  memory::desc out(dims, md.data_type(), strides);
  out.data.offset0 = d.offset0;
  return out;
}

// `md` with the same elements in the dims `to`, without a copy (NumPy's no-copy reshape: each group of
// dims that multiplies to the same count on both sides must nest in memory). Empty when it cannot.
inline std::optional<memory::desc> reshape_md(const memory::desc& md, const Dims& to) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.extra.flags != 0) return std::nullopt;
  Dims old_dims, old_strides;
  for (int i = 0; i < d.ndims; ++i) {
    if (d.dims[i] == 0) return std::nullopt;
    if (d.dims[i] == 1) continue;
    old_dims.push_back(d.dims[i]);
    old_strides.push_back(d.format_desc.blocking.strides[i]);
  }
  std::int64_t count = 1;
  for (auto x : to) count *= x;
  std::int64_t old_count = 1;
  for (auto x : old_dims) old_count *= x;
  if (count != old_count || count == 0) return std::nullopt;
  Dims strides(to.size(), 1);
  std::size_t oi = 0, ni = 0;
  while (oi < old_dims.size() && ni < to.size()) {
    std::size_t oj = oi + 1, nj = ni + 1;
    std::int64_t op = old_dims[oi], np = to[ni];
    while (np != op) {
      if (np < op) np *= to[nj++];
      else op *= old_dims[oj++];
    }
    for (std::size_t k = oi; k + 1 < oj; ++k)
      if (old_strides[k] != old_dims[k + 1] * old_strides[k + 1]) return std::nullopt;
    strides[nj - 1] = old_strides[oj - 1];
    for (std::size_t k = nj - 1; k > ni; --k) strides[k - 1] = strides[k] * to[k];
    ni = nj;
    oi = oj;
  }
  for (std::size_t k = to.size(); k-- > 0;)  // trailing dims of size 1 left by the loop
    if (k >= ni) strides[k] = k + 1 < to.size() ? strides[k + 1] * to[k + 1] : 1;
  memory::desc out(to, md.data_type(), strides);
  out.data.offset0 = d.offset0;
  return out;
}

struct ConcatHost;  // shape_ops.hpp

class Lowering {
 public:
  Lowering(const Graph& graph, const CompileOptions& options, std::shared_ptr<Library> library,
           runtime::Program& program)
      : graph(graph), options(options), library(std::move(library)), program(program) {
    for (Value* v : graph.outputs()) {
      if (output_slot_.count(v)) continue;
      std::size_t index = program.outputs.size();
      SlotId slot = add_slot(slot_for(v, SlotKind::Output, index));
      program.outputs.push_back({v->name(), v->dtype(), v->shape().sizes(), slot});
      output_slot_[v] = slot;
      output_order_.push_back(v);
    }
    for (Value* v : graph.inputs()) {
      std::size_t index = program.inputs.size();
      SlotId slot = add_slot(slot_for(v, SlotKind::Input, index));
      program.inputs.push_back({v->name(), v->dtype(), v->shape().sizes(), slot});
      define_plain(v, slot);
    }
  }

  const Graph& graph;
  const CompileOptions& options;
  std::shared_ptr<Library> library;
  runtime::Program& program;
  std::vector<std::unique_ptr<runtime::Step>> steps;
  std::size_t scratchpad_bytes = 0;
  std::size_t constant_bytes = 0;
  std::set<const Node*> fused;  // nodes folded into an earlier primitive (post-ops); not lowered again
  CompileFn compile_body = nullptr;  // compiles control-flow subgraphs: the driver (lower/compiler.hpp)
  const Node* current = nullptr;  // the node being lowered (names the step in PackedWeights::repacks())
  // Concats that share one buffer (shape_ops.hpp), by member node.
  std::map<const Node*, std::shared_ptr<ConcatHost>> concat_hosts;

  const dnnl::engine& engine() const { return library->engine; }

  // Attributes every primitive gets: the scratchpad is the context's (user mode), so that concurrent
  // runs of one primitive never share library-owned scratch memory.
  static dnnl::primitive_attr base_attr() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  // --- slots ---
  SlotId add_slot(runtime::Slot s) {
    program.slots.push_back(std::move(s));
    return static_cast<SlotId>(program.slots.size() - 1);
  }
  static runtime::Slot slot_for(const Value* v, SlotKind kind, std::size_t index) {
    runtime::Slot s;
    s.name = v->name();
    s.dtype = v->dtype();
    s.dims = v->shape().sizes();
    s.bytes = static_cast<std::size_t>(v->shape().numel().value_or(0)) * dtype_size(v->dtype());
    s.layout = plain_layout_name(s.dims.size());
    s.kind = kind;
    s.index = index;
    return s;
  }
  SlotId root(SlotId id) const {
    const runtime::Slot& s = program.slots[id];
    return s.kind == SlotKind::Alias ? static_cast<SlotId>(s.index) : id;
  }
  // A slot for `v` sharing `src`'s bytes from their start: an Alias of src's root at src's offset.
  runtime::Slot alias_slot(const Value* v, SlotId src) const {
    runtime::Slot s = slot_for(v, SlotKind::Alias, root(src));
    if (program.slots[src].kind == SlotKind::Alias) s.offset = program.slots[src].offset;
    return s;
  }
  bool is_output_slot_of(const Value* v, SlotId slot) const {
    auto it = output_slot_.find(v);
    return it != output_slot_.end() && it->second == slot;
  }

  // A slot for value `v` produced in layout `md` (row-major when `md` is null). A graph output in a
  // row-major layout is written straight into the caller's output tensor.
  SlotId new_plain_slot(const Value* v) { return new_value_slot(v, nullptr); }
  SlotId new_value_slot(const Value* v, const memory::desc& md) { return new_value_slot(v, &md); }
  SlotId new_value_slot(const Value* v, const memory::desc* md) {
    bool row_major = !md || is_row_major(*md);
    auto it = output_slot_.find(v);
    if (row_major && it != output_slot_.end() && !output_taken_.count(v)) {
      output_taken_.insert(v);
      return it->second;
    }
    runtime::Slot s = slot_for(v, SlotKind::Arena, 0);
    if (md && !row_major) {
      s.bytes = md->get_size();
      s.layout = layout_name(*md);
    }
    return add_slot(std::move(s));
  }

  // --- values ---
  bool known(const Value* v) const { return values_.count(v) != 0; }
  void define(const Value* v, SlotId slot, const memory::desc& md) {
    ValueState st;
    st.slot = slot;
    st.has_md = true;
    st.md = md;
    values_[v] = st;
  }
  void define_plain(const Value* v, SlotId slot) {
    ValueState st;
    st.slot = slot;
    memory::data_type dt;
    if (dnnl_dtype(v->dtype(), dt)) {
      st.has_md = true;
      st.md = plain_md(v->shape().sizes(), dt);
    }
    values_[v] = st;
  }
  ValueState& state(const Value* v) {
    auto it = values_.find(v);
    if (it != values_.end()) {
      if (it->second.view_of) materialize(v, it->second);
      return it->second;
    }
    if (v->is_constant()) {  // constants read through slots (by reference kernels, views, copies)
      std::size_t index = program.constants.size();
      program.constants.push_back(v->constant());
      define_plain(v, add_slot(slot_for(v, SlotKind::Constant, index)));
      return values_.at(v);
    }
    throw Error("internal: value '" + v->name() + "' is used before it is computed");
  }
  // A value's bytes as an unblocked, possibly strided layout over a slot, without a copy: a strided
  // view not copied yet, or a value its producer wrote row-major or strided. Empty for a blocked
  // layout or a dtype oneDNN does not know.
  std::optional<std::pair<SlotId, memory::desc>> strided_source(const Value* v) {
    auto it = values_.find(v);
    const ValueState& st = it != values_.end() ? it->second : state(v);
    const dnnl_memory_desc_t& d = st.md.data;
    if (!st.has_md || d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.extra.flags != 0)
      return std::nullopt;
    for (int i = 0; i < d.ndims; ++i)
      if (d.padded_dims[i] != d.dims[i]) return std::nullopt;
    return std::make_pair(st.slot, st.md);
  }

  // Defines `y` (not a graph output) as `md` over `src`'s bytes, copying nothing: a zero-copy alias when
  // `md` is row-major, else a strided view that readers able to take strides read as it is (attention,
  // Transpose, Slice, Reshape) and any other reader gets copied once (state()).
  void define_strided_view(const Node& n, const Value* y, SlotId src, const memory::desc& md, const std::string& detail) {
    if (output_slot_.count(y)) throw Error("internal: graph output '" + y->name() + "' defined as a strided view");
    SlotId view = add_slot(alias_slot(y, src));
    add_step(std::make_unique<ViewStep>(runtime::StepInfo{n.name(), n.op_type(), "view", detail}, src, view));
    ValueState st;
    st.slot = view;
    st.has_md = true;
    st.md = is_row_major(md) ? plain_md(y->shape().sizes(), md.data_type()) : md;
    if (!is_row_major(md)) st.view_of = &n;
    values_[y] = st;
  }

  // The layout of a value (its producer's choice).
  memory::desc md_of(const Value* v) { return state(v).md; }

  // The value in layout `want`, reordering (once per layout) when its layout differs. A strided view not
  // copied yet is reordered from its strides straight into `want` when that is another layout or dtype
  // (a bf16 matmul source: one pass, not a row-major copy and then a conversion).
  SlotId slot_in(const Value* v, const memory::desc& want) {
    auto view = values_.find(v);
    const bool direct = view != values_.end() && view->second.view_of &&
                        !(is_row_major(want) && want.data_type() == view->second.md.data_type());
    ValueState& st = direct ? view->second : state(v);
    if (!st.has_md) throw Error("internal: value '" + v->name() + "' has no oneDNN layout");
    if (same_layout(st.md, want)) return st.slot;
    for (auto& [md, slot] : st.copies)
      if (same_layout(md, want)) return slot;
    runtime::Slot s = slot_for(v, SlotKind::Arena, 0);
    s.name = v->name() + "." + layout_name(want);
    s.bytes = want.get_size();
    s.layout = is_row_major(want) ? plain_layout_name(s.dims.size()) : layout_name(want);
    SlotId slot = add_slot(std::move(s));
    add_reorder(v->name(), st.slot, st.md, slot, want);
    st.copies.emplace_back(want, slot);
    return slot;
  }
  // The value as row-major bytes (any dtype).
  // A float32 value held in bfloat16 (Precision::Bf16) is converted back: row-major readers (the
  // reference kernels, copies) read the value's own dtype.
  SlotId row_major_slot(const Value* v) {
    ValueState& st = state(v);
    memory::data_type dt = st.md.data_type();
    if (st.has_md && dt == memory::data_type::bf16 && v->dtype() == DType::Float32) dt = memory::data_type::f32;
    if (!st.has_md || (is_row_major(st.md) && dt == st.md.data_type())) return st.slot;
    return slot_in(v, plain_md(v->shape().sizes(), dt));
  }

  // Whether conv/matmul `n`, which could compute in bfloat16 (`eligible`: float32 with constant weights),
  // does: runs_bf16(n). Under Precision::Bf16 the choice is recorded for the plan's precision summary.
  bool choose_bf16(const Node& n, bool eligible) {
    if (options.precision != Precision::Bf16 || !eligible) return false;
    const bool bf16 = runs_bf16(n);
    std::vector<const Node*>& list = bf16 ? bf16_nodes : kept_fp32_nodes;
    if (std::find(list.begin(), list.end(), &n) == list.end()) list.push_back(&n);  // once per node (retries)
    return bf16;
  }
  std::vector<const Node*> bf16_nodes, kept_fp32_nodes;
  // A node choose_bf16 counted as bf16 that runs in float32 after all (oneDNN has no fast bf16 primitive
  // for it): the plan lists it with the nodes kept float32.
  void record_fp32_fallback(const Node& n) {
    bf16_nodes.erase(std::remove(bf16_nodes.begin(), bf16_nodes.end(), &n), bf16_nodes.end());
    if (std::find(kept_fp32_nodes.begin(), kept_fp32_nodes.end(), &n) == kept_fp32_nodes.end())
      kept_fp32_nodes.push_back(&n);
  }

  // Whether node `n` computes in bfloat16: Precision::Bf16 and not kept float32 (CompileOptions::keep_fp32).
  bool runs_bf16(const Node& n) const {
    if (options.precision != Precision::Bf16 || options.fp32_nodes.count(n.name())) return false;
    for (const std::string& pattern : options.keep_fp32)
      if (glob_match(pattern, n.name())) return false;
    return true;
  }

  // What decided knob `knob` (a CompileOptions field, by its tuner name) for StepInfo::choice: "tuned" /
  // "heuristic" as CompileOptions::choice_origins says, else "option" where the caller set it (`set`), else
  // "heuristic".
  std::string choice_origin(const std::string& knob, bool set) const {
    auto it = options.choice_origins.find(knob);
    if (it != options.choice_origins.end()) return it->second;
    return set ? "option" : "heuristic";
  }
  // A 3x3 convolution's algorithm: its own (the tuner's, per node) or the model-wide one; and what decided it.
  ConvAlgorithm conv_algorithm_for(const Node& n) const {
    auto it = options.conv_algorithm_per_node.find(n.name());
    return it != options.conv_algorithm_per_node.end() ? it->second : options.conv_algorithm;
  }
  std::string conv_algorithm_origin(const Node& n) const {
    if (options.conv_algorithm_per_node.count(n.name())) return "tuned";
    return choice_origin("conv_algorithm", options.conv_algorithm != ConvAlgorithm::Auto);
  }
  // "bf16 (option)", "fp32 (keep_fp32)": the precision node `n` computes in, where the model runs bf16; ""
  // in a float32 compile (nothing was chosen per step).
  std::string precision_choice(const Node& n) const {
    if (options.precision != Precision::Bf16) return "";
    if (options.fp32_nodes.count(n.name())) return "fp32 (tuned)";
    if (!runs_bf16(n)) return "fp32 (keep_fp32)";
    return "bf16 (" + choice_origin("precision", true) + ")";
  }

  // The ops that only re-label or re-stride their input's bytes (shape_ops.hpp), whose output keeps the
  // input's dtype as held.
  static bool is_view_op(const Node& n) {
    const std::string& key = n.op_key();
    if (key == "Slice") {  // constant parameters only: the view's strides and offset are known
      for (std::size_t i = 1; i < n.num_inputs(); ++i)
        if (n.input(i) && !n.input(i)->is_constant()) return false;
      return true;
    }
    return n.num_outputs() == 1 && (key == "Transpose" || key == "Reshape" || key == "Flatten" || key == "Squeeze" ||
                                    key == "Unsqueeze" || key == "Identity");
  }
  // Whether `v` may be held in bfloat16: Precision::Bf16, float32, not a graph output, and every reader takes
  // it in bf16 as it is (reads_bf16), so its producer writes bf16 and no reader converts it.
  bool bf16_activation(const Value* v) const {
    if (options.precision != Precision::Bf16 || !v || v->dtype() != DType::Float32 || v->is_graph_output() ||
        !v->has_uses())
      return false;
    for (const Use& u : v->uses())
      if (!reads_bf16(u)) return false;
    return true;
  }
  // Whether reader `u` computes in bf16 on its operand as bf16: a convolution's source (or a FusedConv's Sum),
  // or the source of a matrix product with constant float32 weights (emit_matmul's condition for bf16).
  bool reads_bf16(const Use& u) const {
    const std::string& key = u.node->op_key();
    if (options.reference_ops.count(key)) return false;
    // A view (Slice, Transpose, Reshape, ...) carries bf16 bytes as they are (shape_ops.hpp) to readers that
    // all take bf16: a fused QKV projection's slices and head transposes on their way to attention.
    if (u.index == 0 && is_view_op(*u.node)) return bf16_activation(u.node->output(0));
    if (!runs_bf16(*u.node)) return false;
    // Attention reads Q, K and V in bf16 (attention.hpp: bf16 products, float32 scores and softmax).
    if (key == "ondine.Attention") return u.index <= 2;
    if (key == "Conv" || key == "ondine.FusedConv") return u.index == 0 || (key == "ondine.FusedConv" && u.index == 3);
    if (key == "MatMul" || key == "Gemm" || key == "ondine.FusedMatMul" || key == "ondine.FusedGemm") {
      const Value* w = u.node->input(1);
      return u.index == 0 && w && w->is_constant() && w->dtype() == DType::Float32;
    }
    return false;
  }

  void add_reorder(const std::string& what, SlotId from, const memory::desc& from_md, SlotId to,
                   const memory::desc& to_md) {
    dnnl::primitive_attr attr = base_attr();
    dnnl::reorder::primitive_desc pd(engine(), from_md, engine(), to_md, attr);
    runtime::StepInfo info{"reorder:" + what, "Reorder", pd.impl_info_str(),
                           layout_name(from_md) + " -> " + layout_name(to_md)};
    add_primitive(std::move(info), nullptr, dnnl::reorder(pd), pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, from, from_md}, {DNNL_ARG_DST, to, to_md}}, {});
  }

  // --- constants ---
  // The constant's data as a oneDNN memory in layout `want` (reordered now, once). `want` may have
  // other dims with the same element count (grouped conv weights, unsqueezed biases): the tensor is
  // read as the row-major form of `want`'s dims.
  // `source` (optional): how t's bytes are laid out when they are not row-major of want's dims (a
  // transposed constant read through strides, so the constant itself is packed, not a transposed copy).
  // A float32 constant may be packed into a bfloat16 layout (Precision::Bf16 weights): the reorder converts.
  memory constant_memory(const Tensor& t, const memory::desc& want, const std::optional<memory::desc>& source = {}) {
    memory::data_type dt;
    const bool to_bf16 = t.dtype() == DType::Float32 && want.data_type() == memory::data_type::bf16;
    if (!dnnl_dtype(t.dtype(), dt) || (dt != want.data_type() && !to_bf16))
      throw Error("internal: constant of " + std::string(dtype_name(t.dtype())) + " for a oneDNN layout of another type");
    if (t.numel() != md_numel(want))
      throw Error("internal: constant of " + std::to_string(t.numel()) + " elements for a layout of " +
                  std::to_string(md_numel(want)));
    std::uint64_t layout = 0;  // the source strides, hashed: tells the packings of two readings apart
    if (source)
      for (int i = 0; i < source->data.ndims; ++i)
        layout = (layout ^ static_cast<std::uint64_t>(source->data.format_desc.blocking.strides[i] + 1)) * 0x100000001b3ull;
    auto pack = [&] {
      memory::desc from = source ? *source : plain_md(want.dims(), dt);
      memory src(from, engine(), const_cast<void*>(t.raw()));
      memory dst(want, engine());
      dnnl::stream s(engine());
      dnnl::reorder(src, dst).execute(s, src, dst);
      s.wait();
      return dst;
    };
    constant_bytes += want.get_size();
    return options.packed_weights
               ? options.packed_weights->get(t, want, pack, layout,
                                             current ? current->name() + " (" + current->op_type() + ")" : std::string())
               : pack();
  }
  memory constant_memory(const std::vector<float>& values, const memory::desc& want) {
    return constant_memory(Tensor::from_vector<float>({static_cast<std::int64_t>(values.size())}, values), want);
  }

  // --- steps ---
  void add_step(std::unique_ptr<runtime::Step> step) { steps.push_back(std::move(step)); }

  void add_primitive(runtime::StepInfo info, const Node* node, dnnl::primitive prim, const memory::desc& scratchpad,
                     std::vector<SlotArg> slot_args, std::vector<std::pair<int, memory>> const_args) {
    scratchpad_bytes = std::max(scratchpad_bytes, scratchpad.get_size());
    add_step(std::make_unique<PrimitiveStep>(std::move(info), node, engine(), std::move(prim), std::move(slot_args),
                                             std::move(const_args), scratchpad));
  }

  // Defines `out` as a zero-copy view (same bytes, new dims) of `in`'s row-major bytes, or as a copy
  // when `out` is a graph output (those live in the caller's tensor).
  void define_view(const Node& n, const Value* in, const Value* out, const char* op) {
    SlotId src = row_major_slot(in);
    if (output_slot_.count(out) && !output_taken_.count(out)) {
      SlotId dst = new_plain_slot(out);
      add_step(std::make_unique<CopyStep>(runtime::StepInfo{n.name(), op, "memcpy", "copy into the output tensor"},
                                          src, dst, program.slots[dst].bytes));
      define_plain(out, dst);
      return;
    }
    runtime::Slot s = alias_slot(out, src);
    SlotId dst = add_slot(std::move(s));
    add_step(std::make_unique<ViewStep>(runtime::StepInfo{n.name(), op, "view", "zero-copy alias of '" + in->name() + "'"},
                                        src, dst));
    define_plain(out, dst);
  }

  // Defines `out` as the same bytes and layout as `in` (Identity, Dropout at inference).
  void define_alias(const Node& n, const Value* in, const Value* out) {
    ValueState st = state(in);
    if (output_slot_.count(out) && !output_taken_.count(out)) {
      if (st.has_md && !is_row_major(st.md)) {
        SlotId dst = new_plain_slot(out);
        add_reorder(out->name(), st.slot, st.md, dst, plain_md(out->shape().sizes(), st.md.data_type()));
        define_plain(out, dst);
        return;
      }
      define_view(n, in, out, n.op_type().c_str());
      return;
    }
    runtime::Slot s = program.slots[st.slot];
    s.name = out->name();
    s.kind = SlotKind::Alias;
    s.index = root(st.slot);
    SlotId dst = add_slot(std::move(s));
    add_step(std::make_unique<ViewStep>(
        runtime::StepInfo{n.name(), n.op_type(), "view", "zero-copy alias of '" + in->name() + "'"}, st.slot, dst));
    ValueState copy;
    copy.slot = dst;
    copy.has_md = st.has_md;
    copy.md = st.md;
    values_[out] = copy;
  }

  // Makes sure every graph output ends in its output slot (row-major, the caller's tensor).
  void finish_outputs() {
    for (const Value* v : output_order_) {
      SlotId slot = output_slot_.at(v);
      if (output_taken_.count(v)) continue;
      ValueState& st = state(v);
      if (st.has_md && !is_row_major(st.md)) {
        add_reorder(v->name(), st.slot, st.md, slot, plain_md(v->shape().sizes(), st.md.data_type()));
      } else {
        add_step(std::make_unique<CopyStep>(runtime::StepInfo{"output:" + v->name(), "Copy", "memcpy", ""}, st.slot,
                                            slot, program.slots[slot].bytes));
      }
      output_taken_.insert(v);
    }
  }

  void log(const std::string& line) const {
    if (options.log) options.log(line);
  }

 private:
  // Copies a strided view into row-major bytes of its own, for a reader that needs them.
  void materialize(const Value* v, ValueState& st) {
    const Node& n = *st.view_of;
    const memory::desc from = st.md, plain = plain_md(v->shape().sizes(), st.md.data_type());
    SlotId dst = new_value_slot(v, plain);
    dnnl::reorder::primitive_desc pd(engine(), from, engine(), plain, base_attr());
    add_primitive({n.name(), n.op_type(), pd.impl_info_str(), "copy of the strided view " + strided_str(from)}, &n,
                  dnnl::reorder(pd), pd.scratchpad_desc(), {{DNNL_ARG_SRC, st.slot, from}, {DNNL_ARG_DST, dst, plain}}, {});
    st.slot = dst;
    st.md = plain;
    st.view_of = nullptr;
  }

  std::unordered_map<const Value*, ValueState> values_;
  std::unordered_map<const Value*, SlotId> output_slot_;
  std::vector<const Value*> output_order_;
  std::set<const Value*> output_taken_;
};

}  // namespace detail
}  // namespace ondine::lower
