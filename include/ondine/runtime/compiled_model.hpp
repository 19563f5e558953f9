// SPDX-License-Identifier: Apache-2.0
// ondine/runtime/compiled_model.hpp - a compiled model: an immutable list of steps over planned memory,
// and the per-call state (ExecContext) that runs it.
//
// A CompiledModel never changes after compile: its methods are const, and it holds no mutable state,
// so any number of threads may run the same model at once, each with its own ExecContext (its own
// arena, library stream and per-step library objects). An ExecContext is used by one thread at a time;
// keep one per thread to avoid re-creating it on every call.
//
// Memory: every value a step produces lives in a *slot*. Intermediate slots are placed in one arena by
// the static memory plan (runtime/memory_plan.hpp); slots of graph inputs point at the caller's input
// tensors (read only), slots of graph outputs at the caller's output tensors, which the producing step
// writes in place. A view (Reshape of row-major data) is an alias of another slot and costs nothing.
//
// This header knows nothing about oneDNN: library objects live behind Step (virtual execute) and
// behind the type-erased per-context ContextBackend and StepState.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ondine/ir/allocate.hpp"
#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/ir/tensor.hpp"
#include "ondine/runtime/memory_plan.hpp"

namespace ondine::runtime {

using SlotId = std::uint32_t;

enum class SlotKind : std::uint8_t {
  Arena,     // index: byte offset in the context's arena
  Input,     // index: position in Program::inputs (the caller's tensor; never written)
  Output,    // index: position in Program::outputs (the caller's tensor, written in place)
  Constant,  // index: position in Program::constants (never written)
  Alias,     // index: the slot whose bytes it shares (always a non-alias slot)
};

struct Slot {
  std::string name;                 // the graph value it holds (reorder copies get a suffix)
  DType dtype = DType::Undefined;
  std::vector<std::int64_t> dims;   // logical dims
  std::size_t bytes = 0;            // bytes in its layout (blocked layouts may pad)
  std::string layout;               // "abcd" (row-major), "acdb" (channels last), "aBcd16b", ...
  SlotKind kind = SlotKind::Arena;
  std::size_t index = 0;
  std::size_t offset = 0;           // Alias: where its bytes start in the root's (a Concat's piece)
};

// What a step is, for logs and `ondine inspect --compiled`.
struct StepInfo {
  StepInfo() = default;
  StepInfo(std::string name_, std::string op_, std::string implementation_, std::string detail_ = "",
           std::string choice_ = "")
      : name(std::move(name_)), op(std::move(op_)), implementation(std::move(implementation_)),
        detail(std::move(detail_)), choice(std::move(choice_)) {}

  std::string name;            // the node's name, or a generated one for inserted reorders/copies
  std::string op;              // the ONNX op, or "Reorder" / "Copy" / "View"
  std::string implementation;  // the library's choice (oneDNN's impl_info_str, e.g. "brgconv:avx512_core"),
                               // "reference" for the reference kernel, "memcpy", ...
  std::string detail;          // layouts and shapes, e.g. "src acdb [1,64,56,56] -> dst acdb [1,64,56,56]"
  // Where the compiler had alternatives for this step: which it took and what decided, e.g. "layout blocked
  // (heuristic), direct (tuned), bf16 (option)": "heuristic" the built-in rule for this CPU, "tuned" measured by
  // lower::tune (or stored so in an artifact), "option" set by the caller. Empty where there was no choice.
  std::string choice;

  // A slow path: Ondine's reference kernel, or one of oneDNN's reference implementations ("ref:any"), which run
  // at a fraction of its jit kernels' speed (a binary op or concat in a layout no jit kernel takes). oneDNN
  // also names its GEMM-based recurrent kernels "ref"; those are fast and not counted.
  bool slow_path() const { return is_slow_path(op, implementation); }
  static bool is_slow_path(const std::string& op, const std::string& implementation) {
    if (implementation == "reference") return true;
    if (implementation.rfind("ref", 0) != 0) return false;
    return op != "LSTM" && op != "GRU" && op != "RNN" && op != "QLSTM";
  }
};

class ExecContext;

// Where the later stages of a staged model (lower/staged.hpp) spent a profiled run's time, per step:
// they run models compiled per shape and nodes on reference kernels, after the first stage's steps,
// and a profile that stopped at the first stage would call their time framework overhead.
class StageTimes {
 public:
  struct Entry {
    double seconds = 0;
    bool slow_path = false;
  };
  using Key = std::tuple<std::string, std::string, std::string>;  // op, implementation, step name
  void add(const std::string& op, const std::string& implementation, const std::string& name, double seconds) {
    Entry& e = entries_[Key{op, implementation, name}];
    e.seconds += seconds;
    e.slow_path = StepInfo::is_slow_path(op, implementation);
  }
  void merge(const StageTimes& other) {
    for (auto& [key, e] : other.entries_) add(std::get<0>(key), std::get<1>(key), std::get<2>(key), e.seconds);
  }
  void clear() { entries_.clear(); }
  const std::map<Key, Entry>& entries() const { return entries_; }

 private:
  std::map<Key, Entry> entries_;
};

// The rest of a model whose shapes depend on data (lower/staged.hpp): it runs after the steps, on the
// graph inputs and the values the steps computed (all in `values`, by name), and adds what it computes.
// With `times` (a profiled run), it adds the time of every step it ran.
class Continuation {
 public:
  virtual ~Continuation() = default;
  virtual void run(std::map<std::string, Tensor>& values, StageTimes* times) const = 0;
  virtual std::string to_text() const = 0;
  // True for a graph input that only the continuation reads (a sequence: the compiled part has no slot).
  virtual bool reads_input(const std::string& name) const {
    (void)name;
    return false;
  }
};

// Per-context mutable state of one step (e.g. library memory objects bound to the context's arena).
class StepState {
 public:
  virtual ~StepState() = default;
};

// Per-context library state (e.g. a oneDNN stream) and the run's thread setting.
class ContextBackend {
 public:
  virtual ~ContextBackend() = default;
  // Called around a run with the thread count to use (0: leave the library default).
  virtual void enter(int threads) { (void)threads; }
  virtual void leave() {}
  // Finishes queued library work before host code reads its results.
  virtual void wait() {}
};

// One unit of work. Steps are created by the compiler and immutable afterwards: all per-call state
// lives in the ExecContext (see make_state).
class Step {
 public:
  Step(StepInfo info, std::vector<SlotId> reads, std::vector<SlotId> writes)
      : info_(std::move(info)), reads_(std::move(reads)), writes_(std::move(writes)) {}
  virtual ~Step() = default;
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  virtual void execute(ExecContext& ctx) const = 0;
  // Called once per context, after its arena exists; the result is ctx.state<T>(*this) in execute().
  virtual std::unique_ptr<StepState> make_state(ExecContext& ctx) const {
    (void)ctx;
    return nullptr;
  }

  const StepInfo& info() const { return info_; }
  const std::string& name() const { return info_.name; }
  const std::string& op() const { return info_.op; }
  const std::string& implementation() const { return info_.implementation; }
  const std::vector<SlotId>& reads() const { return reads_; }
  const std::vector<SlotId>& writes() const { return writes_; }
  std::size_t index() const { return index_; }
  // Set once by the compiler when the step takes its place in the program.
  void set_index(std::size_t i) { index_ = i; }

 private:
  StepInfo info_;
  std::vector<SlotId> reads_, writes_;
  std::size_t index_ = 0;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::Undefined;
  std::vector<std::int64_t> dims;
  SlotId slot = 0;
};

struct MemoryStats {
  std::size_t arena_bytes = 0;       // one context's arena (planned intermediates)
  std::size_t peak_bytes = 0;        // the most intermediate bytes live at one step (lower bound of the arena)
  std::size_t total_bytes = 0;       // sum of all intermediates (what one buffer per value would take)
  std::size_t scratchpad_bytes = 0;  // one context's library scratchpad (shared by its steps)
  std::size_t constant_bytes = 0;    // weights in their compiled layouts, shared by all contexts
};

// The compiled form. Built once by the compiler (lower/compiler.hpp), then frozen behind a
// shared_ptr<const Program>.
struct Program {
  std::shared_ptr<const Graph> graph;  // keeps the nodes that reference-kernel steps run alive
  std::vector<Slot> slots;
  std::vector<std::unique_ptr<Step>> steps;
  std::vector<TensorInfo> inputs, outputs;
  std::vector<Tensor> constants;  // constants read through Constant slots
  MemoryPlan plan;                // over the Arena slots
  MemoryStats memory;
  std::string isa;                // the ISA the library dispatches to, e.g. "avx512_core_vnni"
  int threads = 0;                // default thread count of a run (0: the library's default)
  // Reduced precision: the nodes computing in bfloat16 (names, in lowering order; empty in fp32).
  std::vector<std::string> bf16_nodes;
  std::function<std::unique_ptr<ContextBackend>()> make_backend;
  std::shared_ptr<void> library;  // library objects every context shares (e.g. the engine)
};

class ExecContext {
 public:
  ExecContext(ExecContext&&) = default;
  ExecContext& operator=(ExecContext&&) = default;

  // Threads for runs with this context; 0 uses the model's setting (CompileOptions::threads).
  int threads = 0;
  // With profile on, every run adds each step's wall time to step_seconds() and the whole run's to
  // run_seconds() (CompiledModel::profile_text summarises them). Off by default: it costs two clock
  // reads per step.
  bool profile = false;
  const std::vector<double>& step_seconds() const { return step_seconds_; }
  double run_seconds() const { return run_seconds_; }
  std::size_t profiled_runs() const { return profiled_runs_; }
  void reset_profile() {
    step_seconds_.assign(step_seconds_.size(), 0.0);
    run_seconds_ = 0;
    profiled_runs_ = 0;
    later_stages_.clear();
  }
  // A staged model's later stages, per step (summed over the profiled runs).
  const StageTimes& later_stage_times() const { return later_stages_; }

  // The address of a slot's bytes for the current run.
  void* ptr(SlotId id) const {
    const Slot& s = program_->slots[id];
    switch (s.kind) {
      case SlotKind::Arena: return arena_.get() + s.index;
      case SlotKind::Input: return inputs_[s.index];
      case SlotKind::Output: return outputs_[s.index];
      case SlotKind::Constant: return const_cast<void*>(program_->constants[s.index].raw());
      case SlotKind::Alias: return static_cast<char*>(ptr(static_cast<SlotId>(s.index))) + s.offset;
    }
    return nullptr;
  }
  // True when the slot's address can change between runs (caller tensors).
  bool is_external(SlotId id) const {
    const Slot* s = &program_->slots[id];
    if (s->kind == SlotKind::Alias) s = &program_->slots[s->index];
    return s->kind == SlotKind::Input || s->kind == SlotKind::Output;
  }
  void* scratchpad() const { return scratch_.get(); }
  std::size_t scratchpad_bytes() const { return program_->memory.scratchpad_bytes; }
  std::size_t arena_bytes() const { return program_->memory.arena_bytes; }
  ContextBackend* backend() const { return backend_.get(); }
  const Program& program() const { return *program_; }

  template <typename State>
  State& state(const Step& step) const {
    return static_cast<State&>(*states_[step.index()]);
  }

 private:
  friend class CompiledModel;
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;
  static Buffer allocate(std::size_t bytes) {
    if (!bytes) return Buffer();
    return Buffer(static_cast<std::byte*>(ondine::detail::aligned_allocate(bytes)));
  }

  explicit ExecContext(std::shared_ptr<const Program> program) : program_(std::move(program)) {
    arena_ = allocate(program_->memory.arena_bytes);
    scratch_ = allocate(program_->memory.scratchpad_bytes);
    inputs_.assign(program_->inputs.size(), nullptr);
    outputs_.assign(program_->outputs.size(), nullptr);
    backend_ = program_->make_backend ? program_->make_backend() : std::make_unique<ContextBackend>();
    states_.reserve(program_->steps.size());
    for (auto& s : program_->steps) states_.push_back(s->make_state(*this));
    step_seconds_.assign(program_->steps.size(), 0.0);
  }

  std::shared_ptr<const Program> program_;
  Buffer arena_, scratch_;
  std::vector<void*> inputs_, outputs_;
  std::vector<std::unique_ptr<StepState>> states_;
  std::unique_ptr<ContextBackend> backend_;
  std::vector<double> step_seconds_;
  double run_seconds_ = 0;
  std::size_t profiled_runs_ = 0;
  StageTimes later_stages_;
  std::unique_ptr<std::atomic<bool>> busy_ = std::make_unique<std::atomic<bool>>(false);
};

class CompiledModel {
 public:
  static constexpr std::size_t kProfileNodes = 10;  // profile_text's "slowest nodes" lines

  CompiledModel() = default;
  explicit CompiledModel(std::shared_ptr<const Program> program) : p_(std::move(program)) {}

  // Makes this the first stage of a staged model (lower/staged.hpp): after the steps, `next` computes the
  // rest, and run() returns `outputs` (the model's outputs; the steps' own outputs are what `next` reads).
  void set_continuation(std::shared_ptr<const Continuation> next, std::vector<std::string> outputs) {
    next_ = std::move(next);
    final_outputs_ = std::move(outputs);
  }
  // The later stages of a staged model, or nullptr when the steps compute everything.
  const Continuation* continuation() const { return next_.get(); }

  bool empty() const { return !p_; }
  const Program& program() const { return *p_; }
  const std::string& isa() const { return p_->isa; }
  const std::vector<std::string>& bf16_nodes() const { return p_->bf16_nodes; }
  const std::vector<TensorInfo>& inputs() const { return p_->inputs; }
  const std::vector<TensorInfo>& outputs() const { return p_->outputs; }
  const MemoryStats& memory() const { return p_->memory; }
  // The default thread count of a run (CompileOptions::threads; 0: OpenMP's default).
  int threads() const { return p_->threads; }
  std::vector<StepInfo> steps() const {
    std::vector<StepInfo> out;
    for (auto& s : p_->steps) out.push_back(s->info());
    return out;
  }
  // Steps per implementation (e.g. {"brgconv:avx512_core": 53, "reference": 2}).
  std::map<std::string, std::size_t> implementation_histogram() const {
    std::map<std::string, std::size_t> h;
    for (auto& s : p_->steps) ++h[s->implementation()];
    return h;
  }

  // A fresh per-call state. Keep one per thread and pass it to run() to avoid re-creating it.
  ExecContext make_context() const {
    check_compiled();
    return ExecContext(p_);
  }

  // Runs with a fresh context; returns the outputs by name.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const {
    ExecContext ctx = make_context();
    return run(ctx, inputs);
  }
  std::map<std::string, Tensor> run(ExecContext& ctx, const std::map<std::string, Tensor>& inputs) const {
    std::map<std::string, Tensor> outputs;
    run(ctx, inputs, outputs);
    return outputs;
  }
  // Writes the outputs in place into the caller's tensors: an output present in `outputs` must have
  // the exact dtype and dims (it is written without a copy); a missing or empty() one is allocated.
  // Output tensors must not share storage with the inputs or with each other.
  void run(ExecContext& ctx, const std::map<std::string, Tensor>& inputs, std::map<std::string, Tensor>& outputs) const {
    check_compiled();
    if (ctx.program_ != p_) throw Error("run: the ExecContext was made by another compiled model");
    if (ctx.busy_->exchange(true))
      throw Error("run: this ExecContext is already running on another thread; make one context per thread");
    struct Release {
      std::atomic<bool>& busy;
      ~Release() { busy.store(false); }
    } release{*ctx.busy_};

    using Clock = std::chrono::steady_clock;
    auto run_start = Clock::now();
    bind_inputs(ctx, inputs);
    bind_outputs(ctx, outputs);
    ContextBackend& backend = *ctx.backend_;
    backend.enter(ctx.threads > 0 ? ctx.threads : p_->threads);
    struct Leave {
      ContextBackend& b;
      ~Leave() { b.leave(); }
    } leave{backend};
    if (!ctx.profile) {
      for (auto& step : p_->steps) step->execute(ctx);
      backend.wait();
    } else {
      for (std::size_t i = 0; i < p_->steps.size(); ++i) {
        auto t0 = Clock::now();
        p_->steps[i]->execute(ctx);
        backend.wait();
        ctx.step_seconds_[i] += std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
    if (next_) {  // a staged model: the steps computed the static part; the rest runs now
      std::map<std::string, Tensor> values = inputs;
      for (auto& [name, t] : outputs) values[name] = t;
      next_->run(values, ctx.profile ? &ctx.later_stages_ : nullptr);
      outputs.clear();
      for (const std::string& name : final_outputs_) outputs[name] = values.at(name);
    }
    if (ctx.profile) {
      ctx.run_seconds_ += std::chrono::duration<double>(Clock::now() - run_start).count();
      ++ctx.profiled_runs_;
    }
  }
  void run(const std::map<std::string, Tensor>& inputs, std::map<std::string, Tensor>& outputs) const {
    ExecContext ctx = make_context();
    run(ctx, inputs, outputs);
  }

  // Where a profiled context's time went: per op and implementation (descending), then the share of
  // time in library primitives, in reference kernels / copies, and outside every step (binding,
  // dispatch, thread setup: the framework's own overhead), the slow paths, and the slowest nodes (a node's
  // steps summed: a Winograd conv's transforms and products, a fused chain under its first node's name).
  std::string profile_text(const ExecContext& ctx) const {
    check_compiled();
    if (ctx.program_ != p_) throw Error("profile_text: the ExecContext was made by another compiled model");
    std::ostringstream os;
    if (!ctx.profiled_runs_) return "no profiled runs (set ExecContext::profile = true before running)\n";
    double runs = static_cast<double>(ctx.profiled_runs_), total = ctx.run_seconds_ / runs;
    std::map<std::pair<std::string, std::string>, std::pair<double, std::size_t>> by_kind;
    double in_steps = 0, in_fallback = 0, in_onednn_ref = 0;
    std::vector<std::pair<double, std::string>> slow;  // the slow-path steps, by time
    struct NodeTime {
      double seconds = 0;
      std::size_t steps = 0;
      std::string op, implementations;
    };
    std::map<std::string, NodeTime> by_node;
    auto add_node_time = [&](const std::string& name, const std::string& op, const std::string& implementation,
                             double t) {
      NodeTime& e = by_node[name];
      if (e.op.empty()) e.op = op;
      e.seconds += t;
      ++e.steps;
      if (("+" + e.implementations + "+").find("+" + implementation + "+") == std::string::npos)
        e.implementations += (e.implementations.empty() ? "" : "+") + implementation;
    };
    for (std::size_t i = 0; i < p_->steps.size(); ++i) {
      const Step& s = *p_->steps[i];
      double t = ctx.step_seconds_[i] / runs;
      auto& e = by_kind[{s.op(), s.implementation()}];
      e.first += t;
      ++e.second;
      add_node_time(s.name(), s.op(), s.implementation(), t);
      in_steps += t;
      const bool slow_path = StepInfo::is_slow_path(s.op(), s.implementation());
      if (s.implementation() == "reference" || s.implementation() == "memcpy") in_fallback += t;
      else if (slow_path) in_onednn_ref += t;
      if (slow_path) slow.emplace_back(t, s.op() + " '" + s.name() + "' " + s.implementation());
    }
    for (auto& [key, e] : ctx.later_stages_.entries()) {  // a staged model's later stages
      auto& [op, implementation, name] = key;
      double t = e.seconds / runs;
      auto& k = by_kind[{op, implementation}];
      k.first += t;
      ++k.second;
      add_node_time(name, op, implementation, t);
      in_steps += t;
      if (implementation == "reference" || implementation == "memcpy") in_fallback += t;
      else if (e.slow_path) in_onednn_ref += t;
      if (e.slow_path) slow.emplace_back(t, op + " '" + name + "' " + implementation + " (a later stage)");
    }
    std::vector<std::pair<double, std::string>> rows;
    for (auto& [key, v] : by_kind) {
      char line[200];
      std::snprintf(line, sizeof line, "  %-22s %-28s %5zu steps %9.3f ms %5.1f%%\n", key.first.c_str(),
                    key.second.c_str(), v.second, v.first * 1e3, total > 0 ? 100.0 * v.first / total : 0.0);
      rows.emplace_back(v.first, line);
    }
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.first > b.first; });
    char head[200];
    std::snprintf(head, sizeof head, "profile: %.3f ms per run (mean of %zu runs)\n", total * 1e3, ctx.profiled_runs_);
    os << head;
    for (auto& r : rows) os << r.second;
    double outside = std::max(0.0, total - in_steps);
    auto pct = [&](double t) { return total > 0 ? 100.0 * t / total : 0.0; };
    char tail[300];
    std::snprintf(tail, sizeof tail,
                  "  library primitives %.1f%% (oneDNN ref kernels %.1f%%), reference kernels and copies %.1f%%, "
                  "outside steps (framework overhead) %.1f%%\n",
                  pct(in_steps - in_fallback), pct(in_onednn_ref), pct(in_fallback), pct(outside));
    os << tail;
    // Every slow path by name, the slowest first (five, then a count).
    std::sort(slow.begin(), slow.end(), [](auto& a, auto& b) { return a.first > b.first; });
    double slow_total = 0;
    for (auto& [t, what] : slow) slow_total += t;
    if (slow.empty()) os << "  slow paths: none\n";
    else {
      char line[120];
      std::snprintf(line, sizeof line, "  slow paths %.1f%% (%zu steps):", pct(slow_total), slow.size());
      os << line;
      for (std::size_t i = 0; i < std::min<std::size_t>(slow.size(), 5); ++i) {
        std::snprintf(line, sizeof line, " %.3f ms", slow[i].first * 1e3);
        os << (i ? ";" : "") << " " << slow[i].second << line;
      }
      os << (slow.size() > 5 ? "; ..." : "") << "\n";
    }
    std::vector<std::pair<double, std::string>> nodes;
    for (auto& [name, e] : by_node) {
      if (e.seconds <= 0) continue;
      char line[120];
      std::snprintf(line, sizeof line, "    %9.3f ms %5.1f%%  ", e.seconds * 1e3, pct(e.seconds));
      nodes.emplace_back(e.seconds, line + e.op + " '" + name + "' " + e.implementations +
                                        (e.steps > 1 ? " (" + std::to_string(e.steps) + " steps)" : "") + "\n");
    }
    std::sort(nodes.begin(), nodes.end(), [](auto& a, auto& b) { return a.first > b.first; });
    if (!nodes.empty()) {
      os << "  slowest nodes:\n";
      for (std::size_t i = 0; i < std::min<std::size_t>(nodes.size(), kProfileNodes); ++i) os << nodes[i].second;
    }
    return os.str();
  }

  // A readable listing: ISA, memory, then one line per step (op, name, implementation, layouts).
  std::string to_text() const {
    check_compiled();
    std::ostringstream os;
    os << "compiled model: " << p_->steps.size() << " steps, isa " << p_->isa << "\n";
    os << "  memory: arena " << p_->memory.arena_bytes << " B (peak live " << p_->memory.peak_bytes
       << " B, sum of buffers " << p_->memory.total_bytes << " B), scratchpad " << p_->memory.scratchpad_bytes
       << " B, constants " << p_->memory.constant_bytes << " B\n";
    for (auto& s : p_->steps) {
      os << "  [" << s->index() << "] " << s->op() << " '" << s->name() << "': " << s->implementation();
      if (!s->info().detail.empty()) os << "  (" << s->info().detail << ")";
      if (!s->info().choice.empty()) os << "  [" << s->info().choice << "]";
      os << "\n";
    }
    if (next_) os << next_->to_text();
    return os.str();
  }

 private:
  void check_compiled() const {
    if (!p_) throw Error("run: the CompiledModel is empty (default-constructed)");
  }

  void bind_inputs(ExecContext& ctx, const std::map<std::string, Tensor>& inputs) const {
    for (std::size_t i = 0; i < p_->inputs.size(); ++i) {
      const TensorInfo& info = p_->inputs[i];
      auto it = inputs.find(info.name);
      if (it == inputs.end())
        throw Error("missing input '" + info.name + "' (" + std::string(dtype_name(info.dtype)) +
                    dims_str(info.dims) + ")");
      const Tensor& t = it->second;
      if (t.dtype() != info.dtype || t.dims() != info.dims)
        throw Error("input '" + info.name + "' is " + std::string(dtype_name(t.dtype())) + dims_str(t.dims()) +
                    ", the compiled model expects " + std::string(dtype_name(info.dtype)) + dims_str(info.dims) +
                    " (compile again for other shapes)");
      ctx.inputs_[i] = const_cast<void*>(t.raw());
    }
    if (inputs.size() != p_->inputs.size()) {  // every declared input was found, so some name is extra
      for (auto& [name, t] : inputs) {
        (void)t;
        bool known = false;
        for (auto& info : p_->inputs) known = known || info.name == name;
        if (!known && !(next_ && next_->reads_input(name)))
          throw Error("'" + name + "' is not an input of the compiled model");
      }
    }
  }

  void bind_outputs(ExecContext& ctx, std::map<std::string, Tensor>& outputs) const {
    for (std::size_t i = 0; i < p_->outputs.size(); ++i) {
      const TensorInfo& info = p_->outputs[i];
      auto it = outputs.find(info.name);
      // Every step writes its whole result (the arena is not zeroed either), so outputs are not zero-filled
      // first; their blocks come back from the allocator's cache run after run (ir/allocate.hpp).
      if (it == outputs.end()) {
        it = outputs.emplace(info.name, Tensor::uninitialized(info.dtype, info.dims)).first;
      } else if (it->second.empty()) {
        it->second = Tensor::uninitialized(info.dtype, info.dims);
      } else if (it->second.dtype() != info.dtype || it->second.dims() != info.dims) {
        throw Error("output tensor '" + info.name + "' is " + std::string(dtype_name(it->second.dtype())) +
                    dims_str(it->second.dims()) + ", the compiled model writes " +
                    std::string(dtype_name(info.dtype)) + dims_str(info.dims));
      }
      ctx.outputs_[i] = it->second.raw();
    }
  }

  std::shared_ptr<const Program> p_;
  std::shared_ptr<const Continuation> next_;
  std::vector<std::string> final_outputs_;
};

}  // namespace ondine::runtime

namespace ondine {
using runtime::CompiledModel;
using runtime::ExecContext;
using runtime::StepInfo;
}  // namespace ondine
